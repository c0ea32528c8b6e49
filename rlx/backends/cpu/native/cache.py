"""The on-disk cache of native libraries. In: ``rlx.config.cache_dir()`` and built
libraries. Out: a trusted directory to build into, verified entries, locks, pruning and
a summary (:func:`cache_info`, :func:`clear_cache`).

Trust. The cache directory and its ``native`` subdirectory must be directories owned by
this user and not writable by group or others (they are created 0o700). Otherwise a
RuntimeWarning says which path and why, once, and libraries go to a private directory,
``<tempdir>/rlx-cache-<uid>/native`` (checked the same way; if that one is also refused,
a fresh ``mkdtemp`` directory for this process). If no directory is usable either, the
build raises :class:`CompileError` and every caller falls back to its NumPy kernels.

Entries. ``<name>-<key>.so`` sits beside ``<name>-<key>.so.sha256`` (``<sha256 of the
file> <full key>``), written after the library, both atomically (temporary file in the
same directory + ``os.replace``). :func:`verify` re-hashes the library and compares it
with its digest and key before every first load in a process; a damaged, truncated,
swapped or digest-less entry is deleted and rebuilt under the build lock. Lock files are
opened with ``O_NOFOLLOW`` (a planted symlink is refused, never followed).

Pruning (:func:`prune_once`, after the first build of a process): entries unused for
:data:`MAX_AGE_DAYS` days go, then the oldest until the total is under
``rlx.config.cache_max_bytes()``; libraries loaded in this process are never removed.
"Used" is the file's access time, set on every first use in a process.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rlx import config
from rlx.errors import CompileError

__all__ = [
    "MAX_AGE_DAYS",
    "CacheInfo",
    "cache_root",
    "forget",
    "untrusted_reason",
    "verify",
    "write_atomic",
    "record_digest",
    "discard",
    "touch",
    "build_lock",
    "prune",
    "prune_once",
    "entries",
]

MAX_AGE_DAYS = 30
DIGEST_SUFFIX = ".sha256"

_lock = threading.Lock()
_roots: dict[str, Path | CompileError] = {}
_private: list[Path] = []
_warned: set[str] = set()
_touched: set[Path] = set()
_pruned: set[Path] = set()


@dataclass(frozen=True)
class CacheInfo:
    """What :func:`native_cache_info` returns: the directory in use, its library count
    and total bytes (libraries + digests), the size bound, the selected target
    (``portable``, ``avx2`` or ``avx512``) and its one-line description."""

    dir: Path
    libraries: int
    bytes: int
    max_bytes: int
    target: str
    description: str


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=4)


def untrusted_reason(path: Path) -> str | None:
    """Why ``path`` must not hold libraries (None when it may): not a directory, owned by
    another user, or writable by group or others."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot be inspected ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _prepare(base: Path) -> Path:
    """``base/native`` created (0o700) and checked; OSError or CompileError (the reason)."""
    if not base.exists():
        base.parent.mkdir(parents=True, exist_ok=True)
        base.mkdir(mode=0o700, exist_ok=True)
    for p in (base, base / "native"):
        if p is not base and not p.exists():
            p.mkdir(mode=0o700)
        why = untrusted_reason(p)
        if why is not None:
            raise CompileError(f"{p} {why}")
    root = base / "native"
    fd, probe = tempfile.mkstemp(dir=root, prefix=".probe-")  # writable at all?
    os.close(fd)
    os.unlink(probe)
    return root


def _why(e: BaseException) -> str:
    if isinstance(e, CompileError):
        return e.bare_message
    return f"{e.strerror or e}" if isinstance(e, OSError) else str(e)


def _private_root() -> Path:
    """This user's private fallback directory (see the module docstring)."""
    if _private:
        return _private[0]
    base = Path(tempfile.gettempdir()) / f"rlx-cache-{os.geteuid()}"
    try:
        root = _prepare(base)
    except (OSError, CompileError) as e:
        _warn_once(
            f"rlx: the private native cache {base} is unusable ({_why(e)}); "
            "using a new temporary directory for this process"
        )
        try:
            root = _prepare(Path(tempfile.mkdtemp(prefix=f"rlx-cache-{os.geteuid()}-")))
        except (OSError, CompileError) as e2:
            raise CompileError(f"no usable private native cache directory ({_why(e2)})") from e2
    _private.append(root)
    return root


def cache_root() -> Path:
    """The trusted, writable directory native libraries live in (see the module
    docstring); CompileError, after a warning, when none is usable."""
    base = config.cache_dir()
    with _lock:
        got = _roots.get(str(base))
        if got is None:
            try:
                got = _prepare(base)
            except (OSError, CompileError) as e:
                why = _why(e)
                try:
                    got = _private_root()
                    _warn_once(
                        f"rlx: not using the native cache {base}: {why}; using the private "
                        f"directory {got} instead (set RLX_CACHE_DIR to a 0700 directory you "
                        "own; see docs/security.md)"
                    )
                except CompileError as e2:
                    got = CompileError(
                        f"no usable native cache: {base}: {why}; {e2.bare_message}. "
                        "Native kernels are off, NumPy kernels are used (set RLX_CACHE_DIR "
                        "to a writable 0700 directory you own)"
                    )
                    _warn_once(f"rlx: {got.bare_message}")
            _roots[str(base)] = got
    if isinstance(got, CompileError):
        raise CompileError(got.bare_message)
    return got


def forget(root: Path) -> None:
    """Drop the remembered check of the cache that resolved to ``root`` (it is checked
    again on next use)."""
    with _lock:
        for k, v in list(_roots.items()):
            if v == root:
                del _roots[k]
        if root in _private:
            _private.remove(root)


def _digest_path(lib: Path) -> Path:
    return lib.with_name(lib.name + DIGEST_SUFFIX)


def _sha256(path: Path) -> str | None:
    """Hash of a regular file opened without following a symlink (None otherwise)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(lib: Path, key: str | None = None) -> bool:
    """Whether ``lib`` matches the digest recorded when it was built (and, given, its
    full ``key``). False for a missing, damaged or swapped file or a missing digest."""
    try:
        digest, recorded_key = _digest_path(lib).read_text().split()
    except (OSError, ValueError):
        return False
    if key is not None and recorded_key != key:
        return False
    if not lib.name.removesuffix(".so").endswith(recorded_key[:24]):
        return False
    return _sha256(lib) == digest


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def record_digest(lib: Path, key: str) -> None:
    """Record ``lib``'s sha256 and its key beside it (atomically)."""
    digest = _sha256(lib)
    if digest is None:
        raise CompileError(f"built library {lib} is not a regular file")
    write_atomic(_digest_path(lib), f"{digest} {key}\n".encode())


def discard(lib: Path) -> None:
    """Remove an entry (library and digest), ignoring files already gone."""
    for p in (lib, _digest_path(lib)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def touch(lib: Path) -> None:
    """Mark ``lib`` used now (its access time; once per process)."""
    if lib in _touched:
        return
    _touched.add(lib)
    with contextlib.suppress(OSError):
        os.utime(lib, ns=(time.time_ns(), os.stat(lib).st_mtime_ns))


@contextlib.contextmanager
def build_lock(root: Path, name: str) -> Iterator[None]:
    """Exclusive lock ``root/<name>.lock`` across processes; the file is opened with
    O_NOFOLLOW (a symlink there is an error, never followed or truncated)."""
    path = root / f"{name}.lock"
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CompileError(f"lock file {path} is a symlink; refusing to use it") from e
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def entries(root: Path) -> list[tuple[Path, float, int]]:
    """(library, last use, bytes incl. digest) of every library in ``root``."""
    out = []
    for p in root.glob("*.so"):
        try:
            st = os.lstat(p)
        except OSError:
            continue
        size = st.st_size
        with contextlib.suppress(OSError):
            size += os.lstat(_digest_path(p)).st_size
        out.append((p, max(st.st_atime, st.st_mtime), size))
    return out


def prune(root: Path, keep: set[Path], max_bytes: int, max_age_days: float) -> list[Path]:
    """Delete entries unused for ``max_age_days``, then the least recently used until the
    total is at most ``max_bytes``; never one in ``keep``. Also removes libraries without a
    digest, digests without a library and leftovers of interrupted builds (an hour old). Returns the libraries removed."""
    now = time.time()
    removed = []
    live = sorted(entries(root), key=lambda e: e[1])
    total = sum(e[2] for e in live)
    for lib, used, size in live:
        if lib in keep:
            continue
        stale = now - used > max_age_days * 86400
        orphan = not _digest_path(lib).exists() and now - used > 3600  # never loadable
        if stale or orphan or total > max_bytes:
            discard(lib)
            removed.append(lib)
            total -= size
    for p in root.iterdir():
        with contextlib.suppress(OSError):
            if p.name.endswith(".so" + DIGEST_SUFFIX) and not p.with_suffix("").exists():
                os.unlink(p)
            elif p.name.startswith(("tmp", ".")) and now - os.lstat(p).st_mtime > 3600:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    os.unlink(p)
    return removed


def prune_once(root: Path, keep: set[Path]) -> None:
    """:func:`prune` with the configured bounds, at most once per process and root."""
    if root in _pruned:
        return
    _pruned.add(root)
    with contextlib.suppress(OSError):
        prune(root, keep, config.cache_max_bytes(), MAX_AGE_DAYS)
