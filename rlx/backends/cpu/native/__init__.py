"""Native (C) kernels: build, cache and load. In: C source text and an ISA choice.
Out: a loaded ``ctypes.CDLL``.

``build(source, isa)`` compiles with ``gcc -O3 -march=native -fPIC -shared`` (plus
``-fopenmp`` when the compiler supports it) into ``rlx.config.cache_dir()/native``. The
library file name is ``sha256(source + command + gcc version)``, so a changed source,
flag or compiler rebuilds; the build runs under an ``fcntl`` file lock and writes to a
temporary file that is renamed into place (atomic: concurrent processes never load a
half-written library). A failed build raises :class:`CompileError` with the command and
gcc's message. Without gcc, :func:`available` is False and callers use their NumPy path
(the quantized matmul kernels fall back to an exact NumPy integer matmul).

The ISA is detected at run time from ``/proc/cpuinfo`` flags (:func:`detect_isa`):
``avx512_vnni`` (with avx512bw) selects the VNNI int8 GEMM, ``avx2`` the AVX2 one (int16
multiply-add), anything else the plain-C path (auto-vectorised by gcc for the host).

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
import enum
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from rlx import config
from rlx.errors import CompileError, InputError

__all__ = [
    "Isa",
    "detect_isa",
    "supported_isas",
    "cpu_flags",
    "gcc_path",
    "gcc_version",
    "openmp_supported",
    "available",
    "compile_command",
    "build",
    "QGemmLib",
    "qgemm_lib",
]

CSRC = Path(__file__).with_name("csrc")
_LOCK = threading.Lock()
_LOADED: dict[Path, ctypes.CDLL] = {}


class Isa(enum.Enum):
    """Instruction set of the int8 GEMM (the value is the C ``RLX_ISA`` macro)."""

    PLAIN = 0
    AVX2 = 1
    VNNI512 = 2


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The host CPU's feature flags from /proc/cpuinfo (empty when unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def detect_isa(flags: frozenset[str] | None = None) -> Isa:
    """The best int8 GEMM path for ``flags`` (default: this CPU)."""
    f = cpu_flags() if flags is None else flags
    if {"avx512_vnni", "avx512bw", "avx512f"} <= f:
        return Isa.VNNI512
    if "avx2" in f:
        return Isa.AVX2
    return Isa.PLAIN


def supported_isas(flags: frozenset[str] | None = None) -> list[Isa]:
    """Every int8 GEMM path this CPU can run (the plain-C one always)."""
    f = cpu_flags() if flags is None else flags
    return [Isa.PLAIN] + [Isa.AVX2] * ("avx2" in f) + [Isa.VNNI512] * (detect_isa(f) is Isa.VNNI512)


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
    with tempfile.TemporaryDirectory() as d:
        src = Path(d, "t.c")
        src.write_text("#include <omp.h>\nint f(void){return omp_get_max_threads();}\n")
        r = subprocess.run(
            [gcc, "-fopenmp", "-fPIC", "-shared", str(src), "-o", str(Path(d, "t.so"))],
            capture_output=True,
            check=False,
        )
    return r.returncode == 0


def available() -> bool:
    """True when native kernels can be built (gcc present)."""
    return gcc_path() is not None


def compile_command(src: Path, out: Path, isa: Isa) -> list[str]:
    """The exact gcc command line used for ``src`` (part of the cache key)."""
    cmd = [gcc_path() or "gcc", "-O3", "-march=native", "-fPIC", "-shared", "-ffp-contract=off"]
    if openmp_supported():
        cmd.append("-fopenmp")
    cmd += [f"-DRLX_ISA={isa.value}", str(src), "-o", str(out)]
    return cmd


def _cache_root() -> Path:
    root = config.cache_dir() / "native"
    root.mkdir(parents=True, exist_ok=True)
    return root


def build(source: str, isa: Isa, name: str = "kernel") -> Path:
    """Compile ``source`` for ``isa`` (cached by content); returns the library path."""
    root = _cache_root()
    key_cmd = compile_command(Path("SRC.c"), Path("OUT.so"), isa)
    key = hashlib.sha256("\0".join([source, " ".join(key_cmd), gcc_version()]).encode()).hexdigest()
    lib = root / f"{name}-{key[:24]}.so"
    if lib.exists():
        return lib
    with open(root / f"{name}.lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        try:
            if lib.exists():  # another process built it while we waited
                return lib
            with tempfile.TemporaryDirectory(dir=root) as tmp:
                src = Path(tmp, f"{name}.c")
                src.write_text(source)
                tmp_lib = Path(tmp, f"{name}.so")
                cmd = compile_command(src, tmp_lib, isa)
                r = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if r.returncode != 0:
                    raise CompileError(
                        f"native build of {name!r} failed (exit {r.returncode})\n"
                        f"  command: {' '.join(cmd)}\n{r.stderr.strip()}"
                    )
                os.replace(tmp_lib, lib)
        finally:
            fcntl.flock(lockf, fcntl.LOCK_UN)
    return lib


def load(path: Path) -> ctypes.CDLL:
    """Load (once per process) a built library.

    Sets ``OMP_WAIT_POLICY=PASSIVE`` first unless the variable is set (see the module
    docstring for why and the measurements)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with _LOCK:
        if path not in _LOADED:
            _LOADED[path] = ctypes.CDLL(str(path))
        return _LOADED[path]


# ---- the int8 GEMM library ---------------------------------------------------------

_P = ctypes.c_void_p
_L = ctypes.c_long


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


class QGemmLib:
    """Typed wrapper over ``csrc/qgemm.c``: pack a weight once, then run GEMMs."""

    def __init__(self, lib: ctypes.CDLL, isa: Isa):
        self.lib = lib
        self.isa = isa
        lib.rlx_qgemm_packed_size.restype = _L
        lib.rlx_qgemm_packed_size.argtypes = [_L, _L]
        lib.rlx_qgemm_pack_b.restype = None
        lib.rlx_qgemm_pack_b.argtypes = [_P, _L, _L, _L, _P, _P]
        lib.rlx_qgemm.restype = ctypes.c_int
        lib.rlx_qgemm.argtypes = [
            _L,
            _L,
            _L,
            _P,
            _L,
            ctypes.c_int32,
            _P,
            _P,
            _P,
            _P,
            _L,
            _P,
            _P,
            ctypes.c_int,
        ]
        lib.rlx_quantize_f32_q8.restype = None
        lib.rlx_quantize_f32_q8.argtypes = [
            _P,
            _L,
            ctypes.c_float,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int32,
            _P,
        ]
        self.openmp = bool(lib.rlx_qgemm_openmp())

    def quantize(self, x: np.ndarray, scale: float, zero_point: int, out: np.ndarray) -> None:
        """Per-tensor ``clip(rint(x / scale) + zero_point)`` of C-contiguous f32 ``x`` into
        int8 or uint8 ``out`` (same shape), exactly as ``rlx.ops.quant.quantize_array``."""
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            raise InputError(f"quantize: x must be C-contiguous f32, given {x.dtype} {x.shape}")
        if (
            out.dtype not in (np.int8, np.uint8)
            or out.shape != x.shape
            or not out.flags.c_contiguous
        ):
            raise InputError(
                f"quantize: out must be C-contiguous i8/u8 {x.shape}, given {out.dtype} {out.shape}"
            )
        qmin, qmax = (-128, 127) if out.dtype == np.int8 else (0, 255)
        self.lib.rlx_quantize_f32_q8(
            _ptr(x), x.size, float(scale), int(zero_point), qmin, qmax, _ptr(out)
        )

    def pack(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pack an int8 weight [K, N]; returns (packed bytes, column sums int32 [N])."""
        w = np.ascontiguousarray(w, dtype=np.int8)
        k, n = w.shape
        packed = np.empty(int(self.lib.rlx_qgemm_packed_size(k, n)), np.uint8)
        colsum = np.empty(n, np.int32)
        self.lib.rlx_qgemm_pack_b(_ptr(w), n, k, n, _ptr(packed), _ptr(colsum))
        return packed, colsum

    def gemm(
        self,
        a: np.ndarray,
        packed: tuple[np.ndarray, np.ndarray],
        n: int,
        *,
        a_zero_point: int = 0,
        out_i32: np.ndarray | None = None,
        out_f32: np.ndarray | None = None,
        scale: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        num_threads: int = 1,
    ) -> None:
        """``(a - a_zero_point) @ w`` for int8 ``a`` [M, K] (C-contiguous) into ``out_i32``
        [M, N] and/or ``out_f32`` [M, N] (``f32(acc) * scale[n] + bias[n]``)."""
        m, k = a.shape
        bp, colsum = packed
        if a.dtype != np.int8 or not a.flags.c_contiguous:
            raise InputError(
                f"qgemm: activations must be C-contiguous int8, given {a.dtype} {a.shape}"
            )
        if colsum.shape != (n,) or bp.nbytes != self.lib.rlx_qgemm_packed_size(k, n):
            raise InputError(
                f"qgemm: the packed weight is not a [{k}, {n}] weight packed by this library"
            )
        for name, o, dt in (("out_i32", out_i32, np.int32), ("out_f32", out_f32, np.float32)):
            if o is not None and (o.dtype != dt or o.shape != (m, n) or not o.flags.c_contiguous):
                raise InputError(
                    f"qgemm: {name} must be C-contiguous {np.dtype(dt)} [{m}, {n}], given {o.dtype} {o.shape}"
                )
        if out_f32 is not None:
            if scale is None or scale.dtype != np.float32 or scale.shape != (n,):
                raise InputError(f"qgemm: out_f32 needs scale f32 [{n}]")
            if bias is not None and (bias.dtype != np.float32 or bias.shape != (n,)):
                raise InputError(f"qgemm: bias must be f32 [{n}], given {bias.dtype} {bias.shape}")
        rc = self.lib.rlx_qgemm(
            m, n, k, _ptr(a), k, int(a_zero_point), _ptr(bp), _ptr(colsum),
            _ptr(out_i32), _ptr(out_f32), n, _ptr(scale), _ptr(bias), int(num_threads),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError(f"qgemm: could not allocate the packed activations ({m}x{k})")


@functools.cache
def qgemm_lib(isa: Isa | None = None) -> QGemmLib:
    """Build (cached) and load the int8 GEMM for ``isa`` (default: :func:`detect_isa`).
    CompileError without gcc or when the build fails."""
    isa = detect_isa() if isa is None else isa
    usable = supported_isas()
    if isa not in usable:
        raise CompileError(
            f"this CPU cannot run the {isa.name} int8 GEMM; usable paths: {[i.name for i in usable]}"
        )
    source = (CSRC / "qgemm.c").read_text()
    try:
        return QGemmLib(load(build(source, isa, "qgemm")), isa)
    except OSError as e:  # unwritable cache dir, unloadable library
        raise CompileError(f"native int8 GEMM: {e} (cache dir {config.cache_dir()})") from e
