"""Native (C) kernels: build, cache and load. In: C source text, a build target and a
name. Out: a verified library path (:func:`build`) and a loaded ``ctypes.CDLL``
(:func:`load`).

Targets (``native/cpu.py``). Code is never built with ``-march=native``: every library is
built for the :class:`Target` that :func:`selected_target` picks from the CPU flags and
``RLX_ISA`` (auto | avx512 | avx2 | portable | neon | dotprod | i8mm): PORTABLE
(``-march=x86-64``), AVX2 (``-march=x86-64-v3``: AVX2 + FMA + F16C), AVX512
(``-march=x86-64-v4``, plus ``-mavx512vnni`` / ``-mavx512bf16`` when the CPU has them);
on aarch64 NEON (``-march=armv8-a``), DOTPROD (``+dotprod``), I8MM (``+i8mm+bf16``);
see docs/platforms.md. Every native path follows it:
regions, row kernels and epilogues (through :func:`build`), the bf16/f16 casts and GEMM
(``vdpbf16ps`` only when the target has BF16), and the int8 GEMM (:class:`Isa` VNNI512
only on AVX512 with VNNI, AVX2 from the AVX2 target, PLAIN on portable). Forcing a target
the CPU lacks is a ConfigError. :func:`target_description` says which path was taken.

Build. ``gcc -O3 <target flags> -fPIC -shared -ffp-contract=off`` plus the threading
runtime's flags (:func:`thread_runtime`, ``native/omp_shim.py``): ``-fopenmp`` when the
compiler links it (libgomp); for a clang without libomp (Apple's), ``-Xclang -fopenmp``
and rlx's own pool ``csrc/rlx_omp.c``, loaded before any kernel library; with neither
(or ``RLX_OPENMP=off``) every ``omp`` pragma is ignored and the kernels run on the calling
thread with the same results. ``RLX_CC``
names another compiler (a cross ``aarch64-linux-gnu-gcc`` under qemu-user, or clang). The file name is ``<name>-<key>.so`` with ``key = sha256(source +
command line (so the target's flags) + gcc version)``: a changed source, target or
compiler rebuilds. A failed build raises :class:`CompileError` with the command and gcc's
message. Without gcc, :func:`available` is False and callers use their NumPy path.

Prebuilt libraries (``native/prebuilt.py``). The fixed kernel libraries (sgemm,
attention, the int8 / bf16 / dequant GEMMs, conv, the backward kernels, Adam) are built
at install time (``setup.py``) for every target into ``_prebuilt/<target>/`` with a
manifest of source hashes and gcc options. :func:`build` returns such a library, without
running gcc, when its manifest entry has the same source hash and the same options as this
build would use; otherwise (an edited source, other flags, no install-time build) it builds
into the cache as below. Generated regions, row kernels and schedules are always built here.

Cache (``native/cache.py``, see docs/security.md). Lives in ``rlx.config.cache_dir()/
native``, used only when owned by this user and not group/other-writable (otherwise a
warning and a private per-user directory; when nothing is usable, CompileError, so every
caller falls back to NumPy kernels). Builds run under an ``O_NOFOLLOW`` file lock and
are renamed into place; a sha256 digest recorded beside each library is checked before
it is loaded, and a damaged entry is rebuilt. The cache is pruned by age and size
(``RLX_CACHE_MAX_MB``) once per process; :func:`cache_info` and :func:`clear_cache`
(``native_cache_info`` / ``clear_native_cache`` here, ``rlx cache info`` / ``rlx cache clear``) inspect and empty it.

One thread pool. Every native kernel (regions, rows, GEMMs, attention, int8, bf16)
runs its threads as an OpenMP team (``#pragma omp parallel num_threads(n)``, ``n`` from
``KernelCtx.num_threads``), so libgomp's workers are rlx's one pool; BLAS gets threads
only for schedules that call it, and then only while libgomp's workers spin briefly
(``rlx/backends/cpu/threads.py``), so OpenBLAS's pthreads do not run beside spinning ones.

OpenMP wait policy. :func:`load` calls :func:`set_wait_policy` before the first native
library (and so libgomp) loads: it sets ``GOMP_SPINCOUNT=<SPIN_COUNT>`` (10000) in the
process environment unless the user set ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` (theirs
wins). An idle worker then spins 10000 ``pause`` iterations (~0.1-0.2 ms: libgomp's
default 300000 burned 3.7-4.7 ms of a core after each team here) and sleeps on a futex.
libgomp reads the variables once, when it initialises: if another module loaded a
``libgomp.so.1`` first (torch ships one with that soname, and rlx's libraries then bind
to it), its settings apply and :func:`wait_policy` records ``libgomp_preloaded``. The
variable stays in the environment, so child processes and OpenMP libraries loaded later
in the process inherit it.

Measured (2-core VM, AVX-512, shared with other jobs: load average 4.5-6.7; a
``parallel for`` over an f32 array on 2 threads called back to back, best of 7 x 200
calls; an OpenBLAS sgemm 64x768x768 on 2 threads alternating with that region, median of
200 pairs; the CPU the process used in the 100 ms after its last team; a fresh process
per setting, 3 interleaved rounds, min-max of the rounds):

=========================  ============  =============  ==============  ==============
setting                    16K elements  262K elements  sgemm + region  idle CPU after
=========================  ============  =============  ==============  ==============
libgomp default (300000)   1.8-2.1 us    10.2-10.6 us   44-68 ms        0.07-4.7 ms
GOMP_SPINCOUNT=10000       1.6-558 us    9.7-10.1 us    0.65-36 ms      0.06-0.25 ms
OMP_WAIT_POLICY=PASSIVE    4.7-121 us    21-41 us       0.38-0.51 ms    0.06-0.07 ms
=========================  ============  =============  ==============  ==============

The large maxima are rounds where other jobs held the second core (a team then waits
for its worker to be scheduled). With libgomp's default a finished team's workers spin
for milliseconds and take the cores OpenBLAS's threads need: the sgemm + region pair
takes 100x longer. PASSIVE avoids that but pays a futex wake-up per team (+3 us at 16K
elements, +11-30 us at 262K), which a small model with dozens of teams per run feels.
The short spin keeps teams as cheap as the default while a run dispatches its kernels
back to back and frees the core within ~0.2 ms after it; OpenBLAS's workers spinning
after a BLAS call still conflict with it (the 36 ms round), which is why BLAS gets one
thread when rlx's own kernels do the work, or when libgomp spins long (a ``libgomp.so.1``
loaded before rlx, ``ACTIVE``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from rlx import config
from rlx.backends.cpu.native import cache, omp_shim, prebuilt
from rlx.backends.cpu.native.cache import CacheInfo
from rlx.backends.cpu.native.cpu import (
    Arch,
    Isa,
    Target,
    cpu_flags,
    detect_isa,
    isas_for,
    machine_arch,
    runnable_targets,
    selected_target,
    supported_isas,
    target_description,
    target_spec,
)
from rlx.backends.cpu.native.omp_shim import ThreadRuntime
from rlx.backends.cpu.native.prebuilt import CSRC, csrc_source
from rlx.errors import CompileError

__all__ = [
    "CSRC",
    "csrc_source",
    "Arch",
    "Isa",
    "Target",
    "CacheInfo",
    "machine_arch",
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
    "ThreadRuntime",
    "thread_runtime",
    "thread_runtime_description",
    "available",
    "compile_command",
    "build",
    "load",
    "SPIN_COUNT",
    "set_wait_policy",
    "wait_policy",
    "cache_info",
    "clear_cache",
    "native_cache_info",
    "clear_native_cache",
    "QGemmLib",
    "qgemm_lib",
]

_LOCK = threading.Lock()
_LOADED: dict[Path, ctypes.CDLL] = {}
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


_WHICH: dict[tuple[str | None, str], str | None] = {}
# build() calls whose library this process loaded: (source, isa, target, name, gcc,
# cache dir) -> its path. Such a call returns at once (schedules of new shapes rebuild
# their kernels; the code that runs is the one verified when it was loaded).
_BUILT: dict[tuple[object, ...], Path] = {}


def gcc_path() -> str | None:
    """Path of the C compiler: ``RLX_CC`` (``rlx.config.cc()``: a command on ``PATH`` or
    a path; default ``gcc``). ``CC`` is not consulted: the flags are gcc's (clang takes
    them too), and a ``CC`` meant for another build should not change rlx's. Looked up
    once per value of ``PATH`` and ``RLX_CC``."""
    key = (os.environ.get("PATH"), config.cc())
    if key not in _WHICH:
        _WHICH[key] = shutil.which(key[1])
    return _WHICH[key]


def _gcc_probe_file(gcc: str) -> Path | None:
    """Where the facts probed about this gcc binary are kept: a JSON file in the trusted
    native cache named by the binary's path, size, mtime and inode (a new gcc probes
    again); None when there is no usable cache."""
    try:
        key = prebuilt.gcc_key(gcc)
        root = cache.cache_root()
    except (OSError, CompileError):
        return None
    return root / f"gcc-probe-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


@functools.cache
def _gcc_facts(gcc: str) -> dict[str, object]:
    """``{"version": str, "openmp": bool}`` for ``gcc``: read from the cache when an
    earlier process probed this binary, else taken from the install-time build's record
    when it probed this binary (``prebuilt.gcc_facts``), else probed (two gcc runs,
    ~0.3 s); stored in the cache."""
    where = _gcc_probe_file(gcc)
    if where is not None:
        try:
            facts = json.loads(where.read_text())
            if isinstance(facts.get("version"), str) and isinstance(facts.get("openmp"), bool):
                return facts
        except (OSError, ValueError, AttributeError):
            pass
    facts = prebuilt.gcc_facts(gcc)
    if facts is None:
        out = subprocess.run([gcc, "--version"], capture_output=True, text=True, check=False)
        version = out.stdout.splitlines()[0] if out.stdout else "gcc (unknown version)"
        facts = {"version": version, "openmp": _probe_openmp(gcc)}
    if where is not None:
        with contextlib.suppress(OSError):
            cache.write_atomic(where, json.dumps(facts).encode())
    return facts


def gcc_version() -> str:
    """``gcc --version`` first line; CompileError when gcc is missing."""
    gcc = gcc_path()
    if gcc is None:
        raise CompileError(
            "native kernels need gcc, which is not on PATH; install gcc "
            "or compile with CompileOptions(native=False)"
        )
    return str(_gcc_facts(gcc)["version"])


def openmp_supported() -> bool:
    """Whether gcc can build and link an ``-fopenmp`` shared object here."""
    gcc = gcc_path()
    return gcc is not None and bool(_gcc_facts(gcc)["openmp"])


def _probe_openmp(gcc: str) -> bool:
    return prebuilt.probe_openmp(gcc)


@functools.cache
def _shim_supported(gcc: str) -> bool:
    """Whether ``gcc`` (a clang) builds OpenMP code for rlx's pool; probed once per binary
    and kept beside its other facts in the cache."""
    facts = dict(_gcc_facts(gcc))
    if isinstance(facts.get("shim"), bool):
        return bool(facts["shim"])
    facts["shim"] = omp_shim.probe_shim(gcc)
    where = _gcc_probe_file(gcc)
    if where is not None:
        with contextlib.suppress(OSError):
            cache.write_atomic(where, json.dumps(facts).encode())
    return bool(facts["shim"])


def thread_runtime() -> ThreadRuntime:
    """The runtime the native kernels' ``#pragma omp`` run on (``RLX_OPENMP``): with
    ``auto``, the compiler's OpenMP when it links (libgomp with gcc), else rlx's pool when
    the compiler is a clang (``-Xclang -fopenmp``), else none; ``shim``: rlx's pool
    (CompileError when the compiler cannot build for it); ``off``: none."""
    mode = config.openmp()
    gcc = gcc_path()
    if mode == "off" or gcc is None:
        return ThreadRuntime.NONE
    if mode == "shim":
        if not _shim_supported(gcc):
            raise CompileError(
                f"RLX_OPENMP=shim: the compiler {gcc} cannot build OpenMP code for rlx's "
                "pool (it needs clang's -Xclang -fopenmp); set RLX_CC to a clang or unset "
                "RLX_OPENMP"
            )
        return ThreadRuntime.POOL
    if openmp_supported():
        return ThreadRuntime.OPENMP
    return ThreadRuntime.POOL if _shim_supported(gcc) else ThreadRuntime.NONE


def thread_runtime_description() -> str:
    """One line for ``rlx info``: the threading runtime and its library."""
    rt = thread_runtime()
    if rt is ThreadRuntime.OPENMP:
        lib = "libomp" if "clang" in gcc_version() else "libgomp"
        return f"{lib} (the compiler's OpenMP, -fopenmp)"
    if rt is ThreadRuntime.POOL:
        return "rlx pool (csrc/rlx_omp.c: the compiler has no OpenMP runtime, or RLX_OPENMP=shim)"
    why = "RLX_OPENMP=off" if config.openmp() == "off" else "the compiler has no OpenMP"
    return f"none ({why}): each kernel runs on its calling thread"


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
    flags = omp_shim.build_flags(spec, isa, thread_runtime())
    return [gcc_path() or "gcc", *flags, str(src), "-o", str(out)]


def build(
    source: str,
    isa: Isa | Target = Isa.PLAIN,
    name: str = "kernel",
    *,
    target: Target | None = None,
) -> Path:
    """Compile ``source`` (cached by content, target flags and compiler) and return the
    verified library's path. ``isa`` is the int8 GEMM macro or, given a :class:`Target`,
    the target itself; ``target`` defaults to :func:`selected_target`. A library prebuilt
    at install time from the same source with the same options is returned without
    running gcc (``prebuilt.find``). CompileError when gcc fails, the target cannot hold
    ``isa``, or no cache directory is usable."""
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
    memo = (source, gemm_isa, target, name, gcc_path(), str(config.cache_dir()), thread_runtime())
    with _LOCK:
        done = _BUILT.get(memo)
        if done is not None and done in _LOADED and done.exists():
            return done
    lib = prebuilt.find(source, gemm_isa, target, name, thread_runtime())
    if lib is None:
        prebuilt.warn_if_install_build_failed()
        lib = _build(source, gemm_isa, target, name)
    prebuilt.record_origin(
        name, gemm_isa, "prebuilt" if lib.parent.parent == prebuilt.PREBUILT_DIR else "cache"
    )
    with _LOCK:
        _BUILT[memo] = lib
    return lib


def _build(source: str, gemm_isa: Isa | None, target: Target, name: str) -> Path:
    """:func:`build` without the in-process memo."""
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
        if omp_shim.runtime_of_flags(cmd) is ThreadRuntime.POOL:
            omp_shim.prepare_build_dir(Path(tmp))
        r = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp)
        if r.returncode != 0:
            raise CompileError(
                f"native build of {name!r} failed (exit {r.returncode})\n"
                f"  command: {' '.join(cmd)}\n{r.stderr.strip()}"
            )
        os.replace(tmp_lib, lib)
    cache.record_digest(lib, key)


#: libgomp spin iterations (one ``pause`` each) before an idle worker sleeps on a futex.
SPIN_COUNT = 10000
_POLICY: dict[str, object] = {}


def _libgomp_loaded() -> bool:
    """Whether a ``libgomp.so.1`` is mapped in this process already (then it has read its
    environment and a variable set now changes nothing)."""
    try:
        ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return False
    return True


def set_wait_policy() -> dict[str, object]:
    """Before the first native library loads: set ``GOMP_SPINCOUNT`` to
    :data:`SPIN_COUNT` in the process environment unless ``GOMP_SPINCOUNT`` or
    ``OMP_WAIT_POLICY`` is set (the user's choice wins). Returns what was found and done
    (the first call's record): ``libgomp_preloaded`` (another module loaded libgomp first,
    so its own settings apply), ``set_by_rlx``, and the two variables."""
    with _LOCK:
        if not _POLICY:
            user = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            preloaded = _libgomp_loaded()
            ours = all(v is None for v in user.values())
            if ours:
                os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
            _POLICY.update(
                libgomp_preloaded=preloaded,
                set_by_rlx=ours,
                OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY"),
                GOMP_SPINCOUNT=os.environ.get("GOMP_SPINCOUNT"),
            )
        return dict(_POLICY)


def wait_policy() -> dict[str, object]:
    """:func:`set_wait_policy`'s record; empty before the first native library loads."""
    with _LOCK:
        return dict(_POLICY)


def load(path: Path) -> ctypes.CDLL:
    """Load (once per process) a library made by :func:`build`, after checking it
    against its recorded digest. CompileError when it does not match or cannot load.

    Sets the OpenMP wait policy first (:func:`set_wait_policy`: ``GOMP_SPINCOUNT``
    unless the user set it or ``OMP_WAIT_POLICY``; see the module docstring)."""
    set_wait_policy()
    path = Path(path)
    if path not in _LOADED and not path.name.startswith(omp_shim.POOL_LIBRARY):
        if thread_runtime() is ThreadRuntime.POOL:
            _load_pool()
    with _LOCK:
        if path not in _LOADED:
            ok = prebuilt.verify(path) if prebuilt.is_prebuilt(path) else cache.verify(path)
            if not ok:
                raise CompileError(
                    f"native library {path} is missing or does not match the digest recorded "
                    "when it was built (changed or damaged since); not loading it"
                )
            mode = os.RTLD_GLOBAL if path.name.startswith(omp_shim.POOL_LIBRARY) else 0
            try:
                _LOADED[path] = ctypes.CDLL(str(path), mode=mode or ctypes.DEFAULT_MODE)
            except OSError as e:
                raise CompileError(f"cannot load native library {path}: {e}") from e
        return _LOADED[path]


_POOL: list[ctypes.CDLL] = []


def _load_pool() -> ctypes.CDLL:
    """rlx's thread pool (``csrc/rlx_omp.c``) built for the selected target and loaded
    with ``RTLD_GLOBAL``, so the ``__kmpc_*`` / ``omp_*`` references of the kernel
    libraries built for it bind to it. Once per process."""
    if not _POOL:
        src = omp_shim.SHIM_SOURCE.read_text()
        lib = load(build(src, selected_target(), name=omp_shim.POOL_LIBRARY))
        with _LOCK:
            if not _POOL:
                _POOL.append(lib)
    return _POOL[0]


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
