"""Native low-precision CPU kernels. In: bf16/f16 nodes (Cast, and the MatMul/DotGeneral
kernels of ``kernels_linalg``) and their arena views. Out: closures calling the C library
built from ``native/csrc/lowp_cast.c`` + ``native/csrc/lowp_gemm.c`` (through
``native.build``, for the selected native target: ``RLX_ISA``).

* **Cast** f32 <-> bf16 and f32 <-> f16 (and bf16 <-> f16 through an f32 scratch) run
  natively: vectorised (AVX-512 on the AVX512 target, AVX2 + F16C on the AVX2 target,
  scalar C on portable) and split over the run's threads for large arrays. The bits
  equal ``ml_dtypes`` (bf16: round to nearest even, NaN -> canonical quiet NaN) and
  NumPy (f16) exactly, NaN payloads included.
  Other casts are NumPy copies (through f32 for bf16/fp8, as the reference).
* **GEMM** on bf16, three paths (:class:`GemmPath`): ``DPBF16`` when the native
  target has BF16 (AVX512 on a CPU with avx512_bf16; ``vdpbf16ps``, or AMX tiles
  (``tdpbf16ps``) for the rows of M rounded down to 16 when K is a multiple of 32 and
  the CPU has amx_bf16: bf16 products, f32
  accumulation, the weight packed into 32-column panels: once at compile time when it
  is a constant, once per param change when it is a param or param-derived
  (``KernelCtx.stable``), every run otherwise);
  ``CONVERT`` elsewhere and for f16 (native widening of both operands into f32 scratch,
  f32 BLAS sgemm, native rounding of the result: the same f32 products as the
  reference interpreter); ``NUMPY`` when the library cannot be built (no gcc, failed
  build) or ``CompileOptions.native`` is False: the ``lowp`` NumPy widening of
  ``kernels.py``.
* **matmul + bias + activation** (``lowp_fused_matmul``, called by the
  FusedMatMulBiasAct kernel of ``kernels_rows``): the GEMM above, the bias added in f32,
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from rlx import config
from rlx.backends.cpu import native
from rlx.backends.cpu.kernels import Kernel, KernelCtx, KernelKind, kernel
from rlx.errors import CompileError, InputError
from rlx.ops.base import RefCtx
from rlx.ops.core import Constant
from rlx.ops.elementwise import Cast, Unary, UnaryKind, f64_to_bf16, int_to_bf16

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "SimdLevel",
    "GemmPath",
    "LowpOverride",
    "LowpLib",
    "lowp_lib",
    "lowp_override",
    "gemm_path",
    "lowp_matmul",
    "lowp_fused_matmul",
    "activation_table",
    "cast_kernel",
    "BF16",
    "F16",
]

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)


class SimdLevel(enum.IntEnum):
    """Vector width of the conversion loops (the C ``level`` argument)."""

    SCALAR = 0
    AVX2 = 1  # AVX2 + F16C, 8 lanes
    AVX512 = 2  # AVX-512 F/BW/VL, 16 lanes


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


_P = ctypes.c_void_p
_L = ctypes.c_long
_I = ctypes.c_int

# (source dtype, target dtype) -> C function name
_CASTS = {
    (F32, BF16): "rlx_f32_to_bf16",
    (BF16, F32): "rlx_bf16_to_f32",
    (F32, F16): "rlx_f32_to_f16",
    (F16, F32): "rlx_f16_to_f32",
}


class LowpLib:
    """Typed wrapper over the built low-precision library."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        for name in _CASTS.values():
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [_P, _P, _L, _I, _I]
        lib.rlx_lut16.restype = None
        lib.rlx_lut16.argtypes = [_P, _P, _P, _L, _I]
        lib.rlx_bf16_packed_size.restype = _L
        lib.rlx_bf16_packed_size.argtypes = [_L, _L]
        lib.rlx_bf16_pack_b.restype = None
        lib.rlx_bf16_pack_b.argtypes = [_P, _L, _L, _L, _P, _I]
        lib.rlx_bf16_gemm.restype = _I
        lib.rlx_bf16_gemm.argtypes = [_L, _L, _L, _P, _L, _P, _P, _L, _I, _I]
        lib.rlx_bf16_gemm_ep.restype = _I
        lib.rlx_bf16_gemm_ep.argtypes = [_L, _L, _L, _P, _L, _P, _P, _L, _I, _I, _P, _P]
        lib.rlx_bf16_has_amx.restype = _I
        self.max_level = SimdLevel(int(lib.rlx_lowp_max_level()))
        self.has_dpbf16 = bool(lib.rlx_lowp_has_dpbf16())
        self.openmp = bool(lib.rlx_lowp_openmp())

    def level(self) -> SimdLevel:
        """The SIMD level to use: the override's, clamped to what the library has."""
        want = _override.simd if _override.simd is not None else self.max_level
        return SimdLevel(min(int(want), int(self.max_level)))

    def cast_fn(self, src: np.dtype, dst: np.dtype) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
        """The C conversion ``src -> dst`` (None when this library has none)."""
        name = _CASTS.get((np.dtype(src), np.dtype(dst)))
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
            x.dtype not in (BF16, F16)
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
        if (bias is not None or act_table is not None) and out.dtype != BF16:
            raise InputError(f"lowp gemm: bias/act_table need a bf16 out, given {out.dtype}")
        if bias is not None and (bias.dtype != F32 or bias.shape != (n,)):
            raise InputError(f"lowp gemm: bias f32 [{n}] needed, given {bias.dtype} {bias.shape}")
        if act_table is not None and (act_table.dtype != np.uint16 or act_table.shape != (2**16,)):
            raise InputError(
                f"lowp gemm: act_table uint16 [65536] needed, given {act_table.dtype} {act_table.shape}"
            )
        _check_rows("gemm", "a", a)
        _check_rows("gemm", "out", out)
        if a.dtype != BF16 or out.dtype not in (F32, BF16) or out.shape[0] != m:
            raise InputError(
                f"lowp gemm: a bf16 [M, K] and out f32/bf16 [M, N] needed, given {a.dtype} {a.shape} -> {out.dtype} {out.shape}"
            )
        if packed.size != self.packed_size(k, n):
            raise InputError(f"lowp gemm: the packed weight is not a packed [{k}, {n}] matrix")
        if not self.has_dpbf16 or "avx512_bf16" not in native.cpu_flags():
            raise CompileError("lowp gemm: this CPU or library has no avx512_bf16")
        bias = None if bias is None else np.ascontiguousarray(bias)
        lut = None if act_table is None else _padded_table(act_table)
        rc = self.lib.rlx_bf16_gemm_ep(
            m, n, k, a.ctypes.data, a.strides[0] // 2, packed.ctypes.data,
            out.ctypes.data, out.strides[0] // out.itemsize, int(out.dtype == BF16),
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
    target (``RLX_ISA``: its SIMD levels and BF16 follow the target). CompileError
    without gcc or when the build fails."""
    return _lowp_lib(native.selected_target())


@functools.cache
def _lowp_lib(target: native.Target) -> LowpLib:
    if not native.available():
        raise CompileError("native low-precision kernels need gcc, which is not on PATH")
    source = (native.CSRC / "lowp_cast.c").read_text() + (native.CSRC / "lowp_gemm.c").read_text()
    try:
        return LowpLib(native.load(native.build(source, target, "lowp")))
    except OSError as e:
        raise CompileError(
            f"native low-precision kernels: {e} (cache dir {config.cache_dir()})"
        ) from e


lowp_lib.cache_clear = _lowp_lib.cache_clear  # type: ignore[attr-defined]


def _lib_or_none(ctx: KernelCtx | None = None) -> LowpLib | None:
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


def gemm_path(dtype: np.dtype, lib: LowpLib | None) -> GemmPath:
    """The matmul path for ``dtype`` operands with ``lib`` (None: not built)."""
    if lib is None:
        return GemmPath.NUMPY
    dpbf16 = lib.has_dpbf16 and "avx512_bf16" in native.cpu_flags()
    forced = _override.gemm
    if forced is not None:
        if forced is GemmPath.DPBF16 and not dpbf16:
            raise CompileError("GemmPath.DPBF16 forced on a CPU or library without avx512_bf16")
        if forced is GemmPath.DPBF16 and np.dtype(dtype) != BF16:
            return GemmPath.CONVERT
        return forced
    return GemmPath.DPBF16 if dpbf16 and np.dtype(dtype) == BF16 else GemmPath.CONVERT


# ---- cast ------------------------------------------------------------------------------


def _native_cast(x: np.ndarray, out: np.ndarray, ctx: KernelCtx, lib: LowpLib) -> Kernel | None:
    """A native conversion closure, or None when the pair has none."""
    pair = (x.dtype, out.dtype)
    if not (x.flags.c_contiguous and out.flags.c_contiguous) or x.size == 0:
        return None
    level, nt = int(lib.level()), ctx.num_threads
    n = x.size
    if pair in _CASTS and not (
        x.dtype.itemsize != out.dtype.itemsize and np.may_share_memory(x, out)
    ):
        fn = lib.cast_fn(*pair)
        ps, pd = x.ctypes.data, out.ctypes.data
        return lambda: fn(ps, pd, n, level, nt)  # type: ignore[misc]
    if {x.dtype, out.dtype} <= {BF16, F16, F32}:  # bf16 <-> f16, or an aliased pair
        s = ctx.scratch(x.shape, F32, 310)
        up = lib.cast_fn(x.dtype, F32) if x.dtype != F32 else None
        down = lib.cast_fn(F32, out.dtype) if out.dtype != F32 else None
        ps, pm, pd = x.ctypes.data, s.ctypes.data, out.ctypes.data

        def run() -> None:
            if up is None:
                np.copyto(s, x)
            else:
                up(ps, pm, n, level, nt)
            if down is None:
                np.copyto(out, s)
            else:
                down(pm, pd, n, level, nt)

        return run
    return None


@kernel(Cast)
def cast_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """A converting copy: native between f32/bf16/f16; f64 and integers -> bf16 rounded
    once (``f64_to_bf16`` / ``int_to_bf16``, as the reference); otherwise NumPy, bf16/fp8
    sources or fp8 targets through f32 as the reference."""
    (x,) = ins
    if x.dtype.kind == "c" and out.dtype.kind != "c":
        x = x.real  # a view: complex -> real keeps the real part, without NumPy's warning
    if x.dtype != out.dtype and {x.dtype, out.dtype} <= {BF16, F16, F32}:
        lib = _lib_or_none(ctx)
        if lib is not None:
            fn = _native_cast(x, out, ctx, lib)
            if fn is not None:
                ctx.kind = KernelKind.NATIVE
                return fn
    if x.dtype == np.float64 and out.dtype == BF16:  # rounded once (ml_dtypes: twice)
        return lambda: np.copyto(out, f64_to_bf16(x))  # type: ignore[return-value]
    if x.dtype.kind in "iu" and out.dtype == BF16:  # rounded once (ml_dtypes: twice)
        return lambda: np.copyto(out, int_to_bf16(x))  # type: ignore[return-value]
    via_f32 = x.dtype.name in (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
    ) or out.dtype.name.startswith("float8")
    if via_f32:
        wide = np.float64 if out.dtype == np.float64 else np.float32
        s = ctx.scratch(x.shape, wide, 1)

        def run() -> None:
            np.copyto(s, x, casting="unsafe")
            np.copyto(out, s, casting="unsafe")

        return run
    return lambda: np.copyto(out, x, casting="unsafe")  # type: ignore[return-value]


# ---- matmul ----------------------------------------------------------------------------


def _is_constant(ctx: KernelCtx, node: Node, i: int) -> bool:
    return isinstance(ctx.graph.nodes[node.inputs[i]].op, Constant)


def _is_stable(ctx: KernelCtx, node: Node, i: int) -> bool:
    """Input ``i`` changes only when a param does (``KernelCtx.stable``)."""
    return node.inputs[i] in ctx.stable


def lowp_matmul(
    node: Node,
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    ctx: KernelCtx,
    *,
    b_constant: bool | None = None,
    preps: tuple[Kernel, ...] = (),
    b_prep: Kernel | None = None,
    epilogue: _Epilogue | None = None,
) -> Kernel | None:
    """``out = matmul(a, b)`` (NumPy semantics) for bf16/f16 ``a``, ``b``, ``out``, or None
    when the native library is unavailable (the caller keeps its NumPy path).

    ``preps`` run before every product (they fill ``a``); ``b_prep`` fills ``b`` (once at
    build time when ``b`` is constant, else before every product). ``b_constant``
    defaults to whether input 1 of ``node`` is a Constant. A ``b`` that changes only
    with the params (``KernelCtx.stable``, no ``b_prep``) is prepared (packed or
    widened, into private buffers) in a ``KernelCtx.prologue`` step: once per param
    change. ``epilogue`` (bf16 only) is applied by the vdpbf16ps/AMX GEMM as it writes
    ``out`` when that path is taken (then ``epilogue.fused`` is set)."""
    if a.dtype != b.dtype or a.dtype != out.dtype or a.dtype not in (BF16, F16):
        return None
    lib = _lib_or_none(ctx)
    if lib is None:
        return None
    const = _is_constant(ctx, node, 1) if b_constant is None else b_constant
    if const and b_prep is not None:
        b_prep()
    per_call = tuple(preps) + ((b_prep,) if b_prep is not None and not const else ())
    defer: list[Kernel] | None = (
        [] if not const and b_prep is None and _is_stable(ctx, node, 1) else None
    )
    path = gemm_path(a.dtype, lib)
    fn = _dpbf16(a, b, out, ctx, lib, const, defer, epilogue) if path is GemmPath.DPBF16 else None
    if fn is None:
        fn = _convert(a, b, out, ctx, lib, const, defer)
        path = GemmPath.CONVERT
    ctx.kind = KernelKind.NATIVE
    if const:
        when = "at compile time"
    elif defer:
        when = "once per param change"
        ctx.prologue.extend(defer)
    else:
        when = "every run"
    how = path.value
    if path is GemmPath.DPBF16 and lib is not None:
        k = a.shape[-1]
        if not lib.has_amx:
            how += " (vdpbf16ps)"
        elif k % 32 == 0:
            how += " (AMX tiles; vdpbf16ps for the last M % 16 rows)"
        else:
            how += f" (vdpbf16ps: K={k} is not a multiple of 32 for AMX)"
    ctx.notes.append(f"{a.dtype.name} matmul: {how}, weight prepared {when}")
    if not per_call:
        return fn

    def run() -> None:
        for p in per_call:
            p()
        fn()

    return run


def _convert(
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    ctx: KernelCtx,
    lib: LowpLib,
    const: bool,
    defer: list[Kernel] | None = None,
) -> Kernel:
    """Widen natively, f32 BLAS matmul into scratch, round natively into ``out``. With
    ``defer`` (a list), ``b`` is widened into a private buffer by a step appended there."""
    from rlx.backends.cpu.kernels_linalg import matmul_into

    level, nt = int(lib.level()), ctx.num_threads
    up = lib.cast_fn(a.dtype, F32)
    down = lib.cast_fn(F32, out.dtype)
    if not (a.flags.c_contiguous and (const or b.flags.c_contiguous)):
        return _convert_strided(a, b, out, ctx, matmul_into)
    if defer is not None and not b.flags.c_contiguous:
        defer = None
    a32 = ctx.scratch(a.shape, F32, 300)
    o32 = ctx.scratch(out.shape, F32, 302)
    if const:
        b32 = np.empty(b.shape, F32)  # private: the pool's buffers are rewritten by others
        lib.cast(np.ascontiguousarray(b), b32, nt)
        b_steps: list[tuple[int, int, int]] = []
    elif defer is not None:
        b32 = np.empty(b.shape, F32)  # private: kept from one param change to the next
        b_steps = []
        pb, pb32, nb = b.ctypes.data, b32.ctypes.data, b.size
        defer.append(lambda: up(pb, pb32, nb, level, nt))  # type: ignore[arg-type, return-value]
    else:
        b32 = ctx.scratch(b.shape, F32, 301)
        b_steps = [(b.ctypes.data, b32.ctypes.data, b.size)]
    mm = matmul_into(a32, b32, o32)
    pa, pa32, na = a.ctypes.data, a32.ctypes.data, a.size
    po32, po, no = o32.ctypes.data, out.ctypes.data, out.size
    out_c = out.flags.c_contiguous

    def run() -> None:
        up(pa, pa32, na, level, nt)
        for s, d, n in b_steps:
            up(s, d, n, level, nt)
        mm()
        if out_c:
            down(po32, po, no, level, nt)
        else:
            np.copyto(out, o32, casting="unsafe")

    return run


def _convert_strided(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, ctx: KernelCtx, matmul_into: Callable
) -> Kernel:
    """The convert path for non-contiguous operands (NumPy widening and rounding)."""
    a32 = ctx.scratch(a.shape, F32, 300)
    b32 = ctx.scratch(b.shape, F32, 301)
    o32 = ctx.scratch(out.shape, F32, 302)
    mm = matmul_into(a32, b32, o32)

    def run() -> None:
        np.copyto(a32, a, casting="unsafe")
        np.copyto(b32, b, casting="unsafe")
        mm()
        np.copyto(out, o32, casting="unsafe")

    return run


def _dpbf16(
    a: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    ctx: KernelCtx,
    lib: LowpLib,
    const: bool,
    defer: list[Kernel] | None = None,
    epilogue: _Epilogue | None = None,
) -> Kernel | None:
    """vdpbf16ps/AMX GEMMs, one per batch of the broadcast, or None for shapes it does not
    take (1-D operands, empty dims, rows that are not contiguous). With ``defer`` (a
    list), ``b`` is packed into private buffers by a step appended there. ``epilogue``
    (bias and activation) is applied as the GEMM writes ``out``; it is marked fused."""
    if a.ndim < 2 or b.ndim < 2 or out.ndim < 2 or 0 in a.shape or 0 in b.shape:
        return None
    k, n = b.shape[-2], b.shape[-1]
    lead = out.shape[:-2]
    a_list: list[np.ndarray] = []
    b_list: list[np.ndarray] = []
    o_list: list[np.ndarray] = []
    one_b = all(d == 1 for d in b.shape[:-2])
    rows = a.shape[:-2] == lead or (not a.shape[:-2] and all(d == 1 for d in lead))
    if one_b and rows and a.flags.c_contiguous and out.flags.c_contiguous:
        # one GEMM over all rows of a (the weight is shared by every batch)
        a_list.append(a.reshape(-1, k))
        b_list.append(b.reshape(k, n))
        o_list.append(out.reshape(-1, n))
    else:
        ab = np.broadcast_to(a, lead + a.shape[-2:])
        bb = np.broadcast_to(b, lead + b.shape[-2:])
        for idx in np.ndindex(*lead):
            a_list.append(ab[idx])
            b_list.append(bb[idx])
            o_list.append(out[idx])
    for x in (*a_list, *b_list, *o_list):
        if x.strides[1] != x.itemsize or x.strides[0] % x.itemsize:
            return None
    size, nt = lib.packed_size(k, n), ctx.num_threads
    packs: dict[int, np.ndarray] = {}
    todo: list[tuple[np.ndarray, np.ndarray]] = []
    for i, bm in enumerate(b_list):
        key = bm.ctypes.data
        if key not in packs:
            if const:
                packs[key] = np.empty(size, np.uint16)
                lib.pack_b(bm, packs[key], nt)
            elif defer is not None:
                packs[key] = np.empty(size, np.uint16)  # private: kept between runs
                todo.append((bm, packs[key]))
            else:
                packs[key] = ctx.scratch((size,), np.uint16, 320 + i)
                todo.append((bm, packs[key]))
    calls = [
        (am, packs[bm.ctypes.data], om) for am, bm, om in zip(a_list, b_list, o_list, strict=True)
    ]
    raw = lib.lib.rlx_bf16_gemm_ep
    pack = lib.lib.rlx_bf16_pack_b
    ep = (None, None) if epilogue is None else (epilogue.bias_ptr, epilogue.lut_ptr)
    args = [
        (am.shape[0], n, k, am.ctypes.data, am.strides[0] // 2, pm.ctypes.data, om.ctypes.data,
         om.strides[0] // om.itemsize, 1)
        for am, pm, om in calls
    ]  # fmt: skip
    pargs = [(bm.ctypes.data, bm.strides[0] // 2, k, n, pm.ctypes.data) for bm, pm in todo]
    if defer is not None:
        deferred, pargs = pargs, []

        def pack_all() -> None:
            for p in deferred:
                pack(*p, nt)

        pack_all.packed = list(packs.values())  # type: ignore[attr-defined]  # args hold only pointers
        defer.append(pack_all)

    def run() -> None:
        for p in pargs:
            pack(*p, nt)
        for g in args:
            if raw(*g, nt, *ep) != 0:
                raise MemoryError(
                    f"bf16 gemm: could not allocate the packed activations ({g[0]}x{k})"
                )

    run.packed = list(packs.values())  # type: ignore[attr-defined]  # args hold only pointers
    if epilogue is not None:
        epilogue.fused = True
        run.epilogue = epilogue  # type: ignore[attr-defined]  # ep holds only pointers
    return run


# ---- matmul + bias + activation ------------------------------------------------------------


@functools.cache
def activation_table(act: UnaryKind, dtype: np.dtype) -> np.ndarray:
    """``act`` of every 16-bit ``dtype`` (bf16/f16) value, as the op's reference computes
    and rounds it: uint16 [65536] codes, so ``table[x.view(uint16)]`` is ``act(x)``
    bit for bit."""
    dt = np.dtype(dtype)
    vals = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dt)
    with np.errstate(all="ignore"):
        r = np.asarray(Unary(act).reference([vals], RefCtx((2**16,), dt, {}, {}, {})))
        table = r.astype(dt).view(np.uint16)
    table.flags.writeable = False
    return table


def lowp_fused_matmul(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``FusedMatMulBiasAct`` on bf16/f16 with the native GEMM, rounding where the op's
    reference rounds: the product, the biased product (bias added in f32), the
    activation (looked up in :func:`activation_table`: its input is a rounded 16-bit
    value). None when the node is not bf16/f16 throughout or the library is unavailable
    (the caller keeps its own path).

    ``kernels_fused`` may call this first from its FusedMatMulBiasAct factory."""
    x, w = ins[:2]
    bias = ins[2] if len(ins) == 3 else None
    dt = out.dtype
    if dt not in (BF16, F16) or any(t.dtype != dt for t in ins) or not out.flags.c_contiguous:
        return None
    if bias is not None and not bias.flags.c_contiguous:
        return None
    lib = _lib_or_none(ctx)
    if lib is None:
        return None
    act = node.op.act  # type: ignore[attr-defined]
    level, nt = int(lib.level()), ctx.num_threads
    up, down = lib.cast_fn(dt, F32), lib.cast_fn(F32, dt)
    b32: np.ndarray | None = None
    preps: list[Kernel] = []
    if bias is not None:
        if _is_constant(ctx, node, 2):
            b32 = np.empty(bias.shape, F32)
            lib.cast(bias, b32)
        elif _is_stable(ctx, node, 2):  # widened once per param change, kept private
            b32 = np.empty(bias.shape, F32)
            pb, pb32, nb = bias.ctypes.data, b32.ctypes.data, bias.size
            ctx.prologue.append(lambda: up(pb, pb32, nb, level, 1))  # type: ignore[arg-type, return-value]
        else:
            b32 = ctx.scratch(bias.shape, F32, 331)
            pb, pb32, nb = bias.ctypes.data, b32.ctypes.data, bias.size
            preps.append(lambda: up(pb, pb32, nb, level, 1))  # type: ignore[arg-type, return-value]
    table = activation_table(act, dt) if act is not None else None
    ep: _Epilogue | None = None
    if (
        (bias is not None or act is not None)
        and dt == BF16
        and (bias is None or bias.shape[-1:] == (out.shape[-1],) and bias.size == out.shape[-1])
    ):
        ep = _Epilogue(b32, None if table is None else _padded_table(table))
    mm = lowp_matmul(node, x, w, out, ctx, epilogue=ep)
    if mm is None:
        return None
    if ep is not None and ep.fused:  # bias and act applied as the GEMM writes out
        if not preps:
            return mm
        pre = preps[0]

        def run_fused() -> None:
            pre()
            mm()

        return run_fused
    if bias is None and act is None:
        return mm
    po, n = out.ctypes.data, out.size
    steps: list[Kernel] = [*preps, mm]
    if b32 is not None:
        y = ctx.scratch(out.shape, F32, 330)
        py = y.ctypes.data
        bb = b32
        steps.append(lambda: up(po, py, n, level, nt))  # type: ignore[arg-type, return-value]
        steps.append(lambda: np.add(y, bb, out=y))  # type: ignore[arg-type, return-value]
        steps.append(lambda: down(py, po, n, level, nt))  # type: ignore[arg-type, return-value]
    if table is not None:
        # the reference applies act to the rounded (biased) product: one of 2^16 values
        lut, pt = lib.lib.rlx_lut16, table.ctypes.data
        steps.append(lambda: lut(po, pt, po, n, nt))  # type: ignore[arg-type, return-value]

    def run() -> None:
        for f in steps:
            f()

    return run


@dataclass
class _Epilogue:
    """Bias (f32 [N], or None) and activation table (uint16 [65537] padded, or None) for
    the bf16 GEMM to apply as it writes its output; ``fused`` once a GEMM took them."""

    bias: np.ndarray | None
    table: np.ndarray | None
    fused: bool = False

    @property
    def bias_ptr(self) -> int | None:
        return None if self.bias is None else self.bias.ctypes.data

    @property
    def lut_ptr(self) -> int | None:
        return None if self.table is None else self.table.ctypes.data
