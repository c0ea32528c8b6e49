"""Native low-precision CPU kernels. In: bf16/f16 nodes (the Cast kernel of
``kernels/elementwise.py``, the MatMul/DotGeneral kernels of ``kernels/linalg.py`` through
``engines.lowp_gemm``) and their arena views. Out: closures calling the C library
built from ``native/csrc/lowp_cast.c`` + ``native/csrc/lowp_gemm.c`` (through
``native.build``, for the selected native target: ``RLX_ISA``).

* **Cast** f32 <-> bf16 and f32 <-> f16 (and bf16 <-> f16 through an f32 scratch) run
  natively: vectorised (AVX-512 on the AVX512 target, AVX2 + F16C on the AVX2 target,
  NEON on the aarch64 targets, scalar C on portable) and split over the run's threads for large arrays. The bits
  equal ``ml_dtypes`` (bf16: round to nearest even, NaN -> canonical quiet NaN) and
  NumPy (f16) exactly, NaN payloads included.
  Other casts are NumPy copies (through f32 for bf16/fp8, as the reference).
* **GEMM** on bf16, three paths (:class:`GemmPath`): ``DPBF16`` when the native
  target has BF16 (the i8mm target on aarch64: ``bfdot``, ``csrc/lowp_neon.h``;
  AVX512 on a CPU with avx512_bf16; ``vdpbf16ps``, or AMX tiles
  (``tdpbf16ps``) for the rows of M rounded down to 16 when K is a multiple of 32 and
  the CPU has amx_bf16: bf16 products, f32
  accumulation, the weight packed into 32-column panels: once at compile time when it
  is a constant, once per param change when it is a param or param-derived
  (``KernelCtx.stable``), every run otherwise);
  ``CONVERT`` elsewhere and for f16: a weight that does not change between runs (a
  constant, or a param / param-derived one, repacked once per param change) is widened
  and packed into rlx sgemm f32 panels once, and each run widens the activations and
  runs the f32 micro-kernel, which rounds a bf16 output once in its epilogue
  (``engines.lowp_gemm._f32_panels``: without avx512_bf16 a bf16 product costs the f32
  one plus the widening of the activations, never more); any other weight: native
  widening of both operands into f32 scratch, f32 BLAS sgemm, native rounding. Either
  way the same f32 products as the reference interpreter; ``NUMPY`` when the library cannot be built (no gcc, failed
  build) or ``CompileOptions.native`` is False: the ``lowp`` NumPy widening of
  ``dispatch.py``.
The matmul kernels live in :mod:`rlx.backends.cpu.engines.lowp_gemm`; this module holds
the library and the path choice (the Cast kernel, ``kernels/elementwise.py``, calls its
conversions).

* **matmul + bias + activation** (``lowp_fused_matmul``, called by the
  FusedMatMulBiasAct kernel of ``kernels/fused.py``): the GEMM above, the bias added in f32,
  and the activation looked up in a 2^16-entry table of the op's reference
  (``activation_table``): the reference applies it to a rounded 16-bit value, so the
  table is exact. On the ``DPBF16`` path with a bias of N values, both are applied as
  the GEMM writes its output tile (one pass); elsewhere by passes over the output.

Kernels use ``KernelCtx.num_threads`` OpenMP threads. ``lowp_override`` forces a path or
SIMD level (tests run every path on one machine; benchmarks compare them); it is read
when kernels are built (at compile).
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlx import config
from rlx.backends.cpu import native
from rlx.backends.cpu.dispatch import KernelCtx
from rlx.backends.cpu.native import bindings
from rlx.backends.cpu.native.cpu import amx_prelude
from rlx.dtype import is_bf16
from rlx.errors import CompileError, InputError

if TYPE_CHECKING:
    pass

__all__ = [
    "SimdLevel",
    "GemmPath",
    "LowpOverride",
    "LowpLib",
    "lowp_lib",
    "lowp_override",
    "gemm_path",
    "lib_or_none",
    "cast_name",
    "is_half",
    "is_half_or_f32",
    "F16",
]

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
# bf16 is tested with rlx.dtype.is_bf16 (ml_dtypes is imported only when bf16 is used)


def is_half(dt: np.dtype) -> bool:
    """bf16 or f16."""
    return dt == F16 or is_bf16(dt)


def is_half_or_f32(dt: np.dtype) -> bool:
    """bf16, f16 or f32."""
    return dt == F32 or dt == F16 or is_bf16(dt)


class SimdLevel(enum.IntEnum):
    """Vector width of the conversion loops (the C ``level`` argument)."""

    SCALAR = 0
    AVX2 = 1  # AVX2 + F16C, 8 lanes
    AVX512 = 2  # AVX-512 F/BW/VL, 16 lanes
    NEON = 3  # aarch64 NEON, 8 elements per step (csrc/lowp_neon.h)


class GemmPath(enum.Enum):
    """How a bf16/f16 matmul is computed (see the module docstring)."""

    DPBF16 = "native bf16 dot products, f32 accumulation"
    CONVERT = "native widening to f32 + f32 BLAS sgemm + native rounding"
    NUMPY = "NumPy widening to f32 + f32 BLAS sgemm + NumPy rounding"


@dataclass(frozen=True)
class LowpOverride:
    """Forced choices (None: pick from the CPU). ``native=False`` acts as if the library
    could not be built."""

    gemm: GemmPath | None = None
    simd: SimdLevel | None = None
    native: bool = True


_override = LowpOverride()


@contextlib.contextmanager
def lowp_override(
    gemm: GemmPath | None = None, simd: SimdLevel | None = None, native: bool = True
) -> Iterator[LowpOverride]:
    """Within the block, kernels built (graphs compiled) use the forced path / level.
    A forced DPBF16 on a CPU without avx512_bf16 raises CompileError at kernel build."""
    global _override
    prev = _override
    _override = LowpOverride(gemm, simd, native)
    try:
        yield _override
    finally:
        _override = prev


# (source dtype, target dtype) -> C function name; f32 <-> bf16 in ``cast_name``
_CASTS_F16 = {
    (F32, F16): "rlx_f32_to_f16",
    (F16, F32): "rlx_f16_to_f32",
}


def cast_name(src: np.dtype, dst: np.dtype) -> str | None:
    """The C conversion function ``src -> dst`` of the library (None: there is none)."""
    if src == F32 and is_bf16(dst):
        return "rlx_f32_to_bf16"
    if is_bf16(src) and dst == F32:
        return "rlx_bf16_to_f32"
    return _CASTS_F16.get((src, dst))


class LowpLib:
    """Typed wrapper over the built low-precision library."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.max_level = SimdLevel(int(lib.rlx_lowp_max_level()))
        self.has_dpbf16 = bool(lib.rlx_lowp_has_dpbf16())
        self.openmp = bool(lib.rlx_lowp_openmp())

    @property
    def levels(self) -> tuple[SimdLevel, ...]:
        """The SIMD levels this library runs: SCALAR and the x86 ones up to
        ``max_level``, or SCALAR and NEON on aarch64."""
        if self.max_level is SimdLevel.NEON:
            return (SimdLevel.SCALAR, SimdLevel.NEON)
        return tuple(lv for lv in SimdLevel if lv <= self.max_level and lv is not SimdLevel.NEON)

    def level(self) -> SimdLevel:
        """The SIMD level to use: the override's, clamped to what the library has."""
        want = _override.simd if _override.simd is not None else self.max_level
        return SimdLevel(min(int(want), int(self.max_level)))

    def cast_fn(self, src: np.dtype, dst: np.dtype) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
        """The C conversion ``src -> dst`` (None when this library has none)."""
        name = cast_name(np.dtype(src), np.dtype(dst))
        return None if name is None else getattr(self.lib, name)

    def cast(self, x: np.ndarray, out: np.ndarray, threads: int = 1) -> None:
        """Convert C-contiguous ``x`` into C-contiguous ``out`` (same element count)."""
        fn = self.cast_fn(x.dtype, out.dtype)
        if fn is None:
            raise InputError(f"lowp cast: no native conversion {x.dtype} -> {out.dtype}")
        if x.size != out.size or not (x.flags.c_contiguous and out.flags.c_contiguous):
            raise InputError(
                f"lowp cast: C-contiguous arrays of equal size needed, given {x.shape} -> {out.shape}"
            )
        fn(x.ctypes.data, out.ctypes.data, x.size, int(self.level()), max(1, threads))

    def lookup(self, x: np.ndarray, table: np.ndarray, out: np.ndarray, threads: int = 1) -> None:
        """``out = table[x]`` over the 16-bit codes of C-contiguous bf16/f16 ``x`` (``out``
        may be ``x``): applies an :func:`activation_table`."""
        if (
            not is_half(x.dtype)
            or out.dtype != x.dtype
            or out.size != x.size
            or not (x.flags.c_contiguous and out.flags.c_contiguous)
        ):
            raise InputError(
                f"lowp lookup: C-contiguous bf16/f16 x and out of one dtype and size needed, "
                f"given {x.dtype} {x.shape} -> {out.dtype} {out.shape}"
            )
        if table.dtype != np.uint16 or table.shape != (2**16,) or not table.flags.c_contiguous:
            raise InputError(
                f"lowp lookup: table must be uint16 [65536], given {table.dtype} {table.shape}"
            )
        self.lib.rlx_lut16(
            x.ctypes.data, table.ctypes.data, out.ctypes.data, x.size, max(1, threads)
        )

    def packed_size(self, k: int, n: int) -> int:
        """bf16 elements of a packed [k, n] weight."""
        return int(self.lib.rlx_bf16_packed_size(k, n))

    def pack_b(self, b: np.ndarray, out: np.ndarray, threads: int = 1) -> None:
        """Pack a bf16 [K, N] matrix (unit column stride) into ``out`` (uint16)."""
        k, n = b.shape
        _check_rows("pack_b", "b", b)
        if out.dtype != np.uint16 or out.size != self.packed_size(k, n):
            raise InputError(
                f"lowp pack_b: out must be uint16 [{self.packed_size(k, n)}], given {out.dtype} {out.shape}"
            )
        self.lib.rlx_bf16_pack_b(
            b.ctypes.data, b.strides[0] // 2, k, n, out.ctypes.data, max(1, threads)
        )

    @functools.cached_property
    def has_amx(self) -> bool:
        """Whether :meth:`gemm` runs on AMX tiles (CPU with amx_bf16 whose kernel grants
        this process the tile state): the rows ``[0, M // 16 * 16)`` of GEMMs whose K is
        a multiple of 32; the vdpbf16ps kernel does the rest."""
        return bool(self.lib.rlx_bf16_has_amx())

    def gemm(
        self,
        a: np.ndarray,
        packed: np.ndarray,
        out: np.ndarray,
        threads: int = 1,
        bias: np.ndarray | None = None,
        act_table: np.ndarray | None = None,
    ) -> None:
        """``out = a @ b`` for bf16 ``a`` [M, K] and ``b`` packed by :meth:`pack_b`;
        ``out`` [M, N] is f32 or bf16 (rounded once). For a bf16 ``out``, ``bias`` (f32
        [N]) is added to the rounded product and rounded again, then ``act_table`` (uint16
        [65536], as :func:`activation_table`) maps each code."""
        m, k = a.shape
        n = out.shape[1]
        if (bias is not None or act_table is not None) and not is_bf16(out.dtype):
            raise InputError(f"lowp gemm: bias/act_table need a bf16 out, given {out.dtype}")
        if bias is not None and (bias.dtype != F32 or bias.shape != (n,)):
            raise InputError(f"lowp gemm: bias f32 [{n}] needed, given {bias.dtype} {bias.shape}")
        if act_table is not None and (act_table.dtype != np.uint16 or act_table.shape != (2**16,)):
            raise InputError(
                f"lowp gemm: act_table uint16 [65536] needed, given {act_table.dtype} {act_table.shape}"
            )
        _check_rows("gemm", "a", a)
        _check_rows("gemm", "out", out)
        if (
            not is_bf16(a.dtype)
            or not (out.dtype == F32 or is_bf16(out.dtype))
            or out.shape[0] != m
        ):
            raise InputError(
                f"lowp gemm: a bf16 [M, K] and out f32/bf16 [M, N] needed, given {a.dtype} {a.shape} -> {out.dtype} {out.shape}"
            )
        if packed.size != self.packed_size(k, n):
            raise InputError(f"lowp gemm: the packed weight is not a packed [{k}, {n}] matrix")
        if not self.has_dpbf16 or not cpu_has_bf16():
            raise CompileError("lowp gemm: this CPU or library has no avx512_bf16 (aarch64: bf16)")
        bias = None if bias is None else np.ascontiguousarray(bias)
        lut = None if act_table is None else _padded_table(act_table)
        rc = self.lib.rlx_bf16_gemm_ep(
            m, n, k, a.ctypes.data, a.strides[0] // 2, packed.ctypes.data,
            out.ctypes.data, out.strides[0] // out.itemsize, int(is_bf16(out.dtype)),
            max(1, threads), None if bias is None else bias.ctypes.data,
            None if lut is None else lut.ctypes.data,
        )  # fmt: skip
        if rc != 0:
            raise MemoryError(f"lowp gemm: could not allocate the packed activations ({m}x{k})")


def _padded_table(table: np.ndarray) -> np.ndarray:
    """``table`` (uint16 [65536]) plus one zero entry: the GEMM epilogue gathers 32 bits at
    each code's offset."""
    return np.append(np.ascontiguousarray(table, np.uint16), np.uint16(0))


def _check_rows(fn: str, name: str, x: np.ndarray) -> None:
    if x.ndim != 2 or x.strides[1] != x.itemsize or x.strides[0] % x.itemsize:
        raise InputError(
            f"lowp {fn}: {name} must be 2-D with contiguous rows, given {x.shape} strides {x.strides}"
        )


def lowp_lib() -> LowpLib:
    """Build (cached on disk by content) and load the library for the selected native
    target (``RLX_ISA``: its SIMD levels and BF16 follow the target; ``RLX_AMX=0``: no
    AMX tiles, see ``native.cpu.amx_prelude``). CompileError
    without gcc or when the build fails."""
    return _lowp_lib(native.selected_target(), amx_prelude())


@functools.cache
def _lowp_lib(target: native.Target, prelude: str = "") -> LowpLib:
    if not native.available():
        raise CompileError("native low-precision kernels need gcc, which is not on PATH")
    source = prelude + native.csrc_source("lowp_cast.c", "lowp_gemm.c")
    try:
        return LowpLib(bindings.typed(native.load(native.build(source, target, "lowp")), source))
    except OSError as e:
        raise CompileError(
            f"native low-precision kernels: {e} (cache dir {config.cache_dir()})"
        ) from e


lowp_lib.cache_clear = _lowp_lib.cache_clear  # type: ignore[attr-defined]


def lib_or_none(ctx: KernelCtx | None = None) -> LowpLib | None:
    """The library, or None (noted in ``ctx``) when ``CompileOptions.native`` is False, the
    override says so, or it cannot be built."""
    if not _override.native or (ctx is not None and not ctx.native):
        return None
    try:
        return lowp_lib()
    except CompileError as e:
        if ctx is not None:
            ctx.notes.append(
                f"native low-precision kernels unavailable, NumPy path ({e.bare_message.splitlines()[0]})"
            )
        return None


def cpu_has_bf16() -> bool:
    """Whether this CPU runs the bf16 dot products the library's GEMM uses: ``avx512_bf16``
    (x86-64) or ``bf16`` (aarch64's BFDOT)."""
    return bool({"avx512_bf16", "bf16"} & native.cpu_flags())


def gemm_path(dtype: np.dtype, lib: LowpLib | None) -> GemmPath:
    """The matmul path for ``dtype`` operands with ``lib`` (None: not built)."""
    if lib is None:
        return GemmPath.NUMPY
    dpbf16 = lib.has_dpbf16 and cpu_has_bf16()
    forced = _override.gemm
    if forced is not None:
        if forced is GemmPath.DPBF16 and not dpbf16:
            raise CompileError(
                "GemmPath.DPBF16 forced on a CPU or library without avx512_bf16 (aarch64: bf16)"
            )
        if forced is GemmPath.DPBF16 and not is_bf16(np.dtype(dtype)):
            return GemmPath.CONVERT
        return forced
    return GemmPath.DPBF16 if dpbf16 and is_bf16(np.dtype(dtype)) else GemmPath.CONVERT


# ---- cast ------------------------------------------------------------------------------
