"""Native (C) kernels: build, cache and load. In: C source text, a build target and a
name. Out: a verified library path (:func:`build`) and a loaded ``ctypes.CDLL``
(:func:`load`).

Targets (``native/cpu.py``). Code is never built with ``-march=native``: every library is
built for the :class:`Target` that :func:`selected_target` picks from the CPU flags and
``RLX_ISA`` (auto | avx512 | avx2 | portable): PORTABLE (``-march=x86-64``), AVX2
(``-march=x86-64-v3``: AVX2 + FMA + F16C), AVX512 (``-march=x86-64-v4``, plus
``-mavx512vnni`` / ``-mavx512bf16`` when the CPU has them). Every native path follows it:
regions, row kernels and epilogues (through :func:`build`), the bf16/f16 casts and GEMM
(``vdpbf16ps`` only when the target has BF16), and the int8 GEMM (:class:`Isa` VNNI512
only on AVX512 with VNNI, AVX2 from the AVX2 target, PLAIN on portable). Forcing a target
the CPU lacks is a ConfigError. :func:`target_description` says which path was taken.

Build. ``gcc -O3 <target flags> -fPIC -shared -ffp-contract=off`` (plus ``-fopenmp`` when
gcc supports it). The file name is ``<name>-<key>.so`` with ``key = sha256(source +
command line (so the target's flags) + gcc version)``: a changed source, target or
compiler rebuilds. A failed build raises :class:`CompileError` with the command and gcc's
message. Without gcc, :func:`available` is False and callers use their NumPy path.

Cache (``native/cache.py``, see docs/security.md). Lives in ``rlx.config.cache_dir()/
native``, used only when owned by this user and not group/other-writable (otherwise a
warning and a private per-user directory; when nothing is usable, CompileError, so every
caller falls back to NumPy kernels). Builds run under an ``O_NOFOLLOW`` file lock and
are renamed into place; a sha256 digest recorded beside each library is checked before
it is loaded, and a damaged entry is rebuilt. The cache is pruned by age and size
(``RLX_CACHE_MAX_MB``) once per process; :func:`cache_info` and :func:`clear_cache`
(``rlx.native_cache_info`` / ``rlx.clear_native_cache``) inspect and empty it.

OpenMP wait policy. :func:`load` sets ``OMP_WAIT_POLICY=PASSIVE`` in the process
environment before the first native library (and so libgomp) is loaded, unless the
variable is already set; ``OMP_WAIT_POLICY=ACTIVE`` (or any value) set by the user wins.
libgomp reads the variable once, when it initialises: if another module loaded libgomp
first, the setting has no effect, and it also applies to OpenMP libraries loaded later
in the process. Kept because it was measured to matter: an int8 GEMM (libgomp, 2
threads) followed by an f32 sgemm (NumPy's OpenBLAS, pthreads, 2 threads), alternating,
median of 200 pairs per process, 4 interleaved rounds per setting, on this project's
2-core VM (AVX-512 VNNI; shared with other jobs, load average 4-6). Pair time, min /
median / max of the rounds, in ms:

==================  =====================  ==================
shape (M x K x N)   libgomp default spin   PASSIVE
==================  =====================  ==================
64 x 768 x 768      64.0 / 72.0 / 84.0     0.80 / 1.02 / 1.17
256 x 1024 x 1024   90.0 / 109.5 / 176.0   8.3 / 23.8 / 56.4
==================  =====================  ==================

(A single earlier run at load average 2: 12.6 ms default vs 2.3 ms PASSIVE for the
small shape; ``ACTIVE``: 72 ms.) With the default policy a finished GEMM's OpenMP
workers spin for a while and take the cores OpenBLAS's threads (and the next GEMM's
OpenMP barrier) need, so on a core-starved machine each kernel waits for scheduler time
slices; PASSIVE workers sleep at once. The cost of PASSIVE is a futex wake-up per
parallel region (microseconds), invisible at these sizes.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from rlx import config
from rlx.backends.cpu.native import cache
from rlx.backends.cpu.native.cache import CacheInfo
from rlx.backends.cpu.native.cpu import (
    Isa,
    Target,
    cpu_flags,
    detect_isa,
    isas_for,
    runnable_targets,
    selected_target,
    supported_isas,
    target_description,
    target_spec,
)
from rlx.errors import CompileError

__all__ = [
    "CSRC",
    "Isa",
    "Target",
    "CacheInfo",
    "detect_isa",
    "supported_isas",
    "isas_for",
    "runnable_targets",
    "selected_target",
    "target_spec",
    "target_description",
    "cpu_flags",
    "gcc_path",
    "gcc_version",
    "openmp_supported",
    "available",
    "compile_command",
    "build",
    "load",
    "cache_info",
    "clear_cache",
    "native_cache_info",
    "clear_native_cache",
    "QGemmLib",
    "qgemm_lib",
]

CSRC = Path(__file__).with_name("csrc")
_LOCK = threading.Lock()
_LOADED: dict[Path, ctypes.CDLL] = {}
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def gcc_path() -> str | None:
    """Path of gcc (``CC`` is not consulted: the flags are gcc's)."""
    return shutil.which("gcc")


@functools.cache
def gcc_version() -> str:
    """``gcc --version`` first line; CompileError when gcc is missing."""
    gcc = gcc_path()
    if gcc is None:
        raise CompileError(
            "native kernels need gcc, which is not on PATH; install gcc "
            "or compile with CompileOptions(native=False)"
        )
    out = subprocess.run([gcc, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else "gcc (unknown version)"


@functools.cache
def openmp_supported() -> bool:
    """Whether gcc can build and link an ``-fopenmp`` shared object here."""
    gcc = gcc_path()
    if gcc is None:
        return False
    try:
        with tempfile.TemporaryDirectory() as d:
            src = Path(d, "t.c")
            src.write_text("#include <omp.h>\nint f(void){return omp_get_max_threads();}\n")
            r = subprocess.run(
                [gcc, "-fopenmp", "-fPIC", "-shared", str(src), "-o", str(Path(d, "t.so"))],
                capture_output=True,
                check=False,
            )
    except OSError:  # no usable temporary directory: builds fail anyway
        return False
    return r.returncode == 0


def available() -> bool:
    """True when native kernels can be built (gcc present)."""
    return gcc_path() is not None


def compile_command(
    src: Path, out: Path, isa: Isa | None = Isa.PLAIN, target: Target | None = None
) -> list[str]:
    """The exact gcc command line for ``src`` built for ``target`` (default: the
    selected one) with the int8 GEMM path ``isa`` (the C macro ``RLX_ISA``; None: not
    defined). Part of the cache key."""
    spec = target_spec(selected_target() if target is None else target)
    cmd = [gcc_path() or "gcc", "-O3", *spec.flags, "-fPIC", "-shared", "-ffp-contract=off"]
    if openmp_supported():
        cmd.append("-fopenmp")
    if isa is not None:
        cmd.append(f"-DRLX_ISA={isa.value}")
    return [*cmd, str(src), "-o", str(out)]


def build(
    source: str,
    isa: Isa | Target = Isa.PLAIN,
    name: str = "kernel",
    *,
    target: Target | None = None,
) -> Path:
    """Compile ``source`` (cached by content, target flags and compiler) and return the
    verified library's path. ``isa`` is the int8 GEMM macro or, given a :class:`Target`,
    the target itself; ``target`` defaults to :func:`selected_target`. CompileError when
    gcc fails, the target cannot hold ``isa``, or no cache directory is usable."""
    if isinstance(isa, Target):
        target, gemm_isa = isa, None
    else:
        gemm_isa = isa
    if not _NAME.fullmatch(name):
        raise CompileError(f"native library name {name!r} must be letters, digits, _ . -")
    target = selected_target() if target is None else target
    if gemm_isa is not None and gemm_isa not in isas_for(target):
        raise CompileError(
            f"the {target.name} target cannot hold the {gemm_isa.name} int8 GEMM "
            f"(it holds {[i.name for i in isas_for(target)]})"
        )
    key_cmd = compile_command(Path("SRC.c"), Path("OUT.so"), gemm_isa, target)
    key = hashlib.sha256("\0".join([source, " ".join(key_cmd), gcc_version()]).encode()).hexdigest()
    for attempt in range(2):
        root = cache.cache_root()
        lib = root / f"{name}-{key[:24]}.so"
        if cache.verify(lib, key):
            cache.touch(lib)
            return lib
        try:
            with cache.build_lock(root, name):
                if not cache.verify(lib, key):  # not built meanwhile by another process
                    _build_entry(source, lib, key, gemm_isa, target, name)
        except OSError as e:
            if attempt == 0 and cache.untrusted_reason(root) is not None:
                cache.forget(root)  # removed or replaced since it was checked: check again
                continue
            raise CompileError(f"native build of {name!r} in {root} failed: {e}") from e
        with _LOCK:
            keep = set(_LOADED)
        cache.prune_once(root, keep | {lib})
        return lib
    raise AssertionError("unreachable")


def _build_entry(
    source: str, lib: Path, key: str, isa: Isa | None, target: Target, name: str
) -> None:
    """Compile into a temporary directory beside ``lib``, rename into place, record the
    digest. Called under the build lock; a damaged old entry is removed first."""
    cache.discard(lib)
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        src = Path(tmp, f"{name}.c")
        src.write_text(source)
        tmp_lib = Path(tmp, f"{name}.so")
        cmd = compile_command(src, tmp_lib, isa, target)
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise CompileError(
                f"native build of {name!r} failed (exit {r.returncode})\n"
                f"  command: {' '.join(cmd)}\n{r.stderr.strip()}"
            )
        os.replace(tmp_lib, lib)
    cache.record_digest(lib, key)


def load(path: Path) -> ctypes.CDLL:
    """Load (once per process) a library made by :func:`build`, after checking it
    against its recorded digest. CompileError when it does not match or cannot load.

    Sets ``OMP_WAIT_POLICY=PASSIVE`` first unless the variable is set (see the module
    docstring for why and the measurements)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    path = Path(path)
    with _LOCK:
        if path not in _LOADED:
            if not cache.verify(path):
                raise CompileError(
                    f"native library {path} is missing or does not match the digest recorded "
                    "when it was built (changed or damaged since); not loading it"
                )
            try:
                _LOADED[path] = ctypes.CDLL(str(path))
            except OSError as e:
                raise CompileError(f"cannot load native library {path}: {e}") from e
        return _LOADED[path]


def cache_info() -> CacheInfo:
    """The native cache in use: directory, library count, bytes, size bound and the
    selected target. CompileError when no cache directory is usable."""
    root = cache.cache_root()
    ents = cache.entries(root)
    return CacheInfo(
        dir=root,
        libraries=len(ents),
        bytes=sum(e[2] for e in ents),
        max_bytes=config.cache_max_bytes(),
        target=selected_target().value,
        description=target_description(),
    )


def clear_cache() -> int:
    """Delete every library (and digest) of the native cache in use; returns how many.
    Libraries already loaded stay mapped in this process (and are rebuilt when needed)."""
    root = cache.cache_root()
    with _LOCK:
        keep = set(_LOADED)
    removed = cache.prune(root, set(), 0, 0)
    with _LOCK:
        for p in removed:
            if p in keep:
                del _LOADED[p]
    return len(removed)


native_cache_info = cache_info
clear_native_cache = clear_cache

from rlx.backends.cpu.native.qgemm import QGemmLib, qgemm_lib  # noqa: E402
