"""Native row-wise kernels. In: Softmax / LogSoftmax (last axis), LayerNorm, RmsNorm,
FusedResidualLN, FusedResidualRmsNorm, FusedMatMulBiasAct and FusedSwiGLU nodes with
their arena views. Out: closures calling one generated C function each (``codegen.rows``), built
and loaded like the elementwise regions (``kernels.region.load_function``: cached by
content, libmvec SIMD math) with their pointers bound at schedule-build time.

* softmax / log-softmax / norms: one C call walks each row two or three times (max,
  sum of exp, write; or sum, sum of squares, write) in f32 registers (f64 for f64),
  vectorised, rows split over an OpenMP team of ``KernelCtx.num_threads`` when the work
  estimate reaches ``kernels.region.PARALLEL_MIN_WORK`` (same rule as the regions).
  f16/bf16 load into f32 and round once into the output, as their references do.
* FusedMatMulBiasAct: f32 on rlx's packed sgemm (``kernels.sgemm``) with the bias and
  activation applied as each output tile is finished, when it beat BLAS on the shape
  class; otherwise the BLAS matmul into ``out``, then ONE native pass adding the bias
  and applying the activation in place (f32/f64). bf16/f16 nodes take
  the low-precision native GEMM of ``kernels.lowp_lib`` (``lowp_fused_matmul``), which rounds
  where the reference rounds.
* FusedSwiGLU: the two BLAS matmuls, then one native pass ``out = silu(gate) * up``
  (f32/f64; bf16/f16 keep the NumPy kernel, which rounds the gate as the reference).

Each factory supersedes the NumPy factory of its op (``kernels.tensor``,
``kernels.fused``) and falls back to it, with a note saying why, when native kernels are
off (``CompileOptions.native=False``), gcc is missing or the build fails, or the layout
is not one it handles (softmax over another axis, non-contiguous views, broadcast
residuals, integer dtypes); the report's kind is then the NumPy kernel's.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.backends.cpu.codegen.elementwise import C_TYPES, CodegenUnsupported
from rlx.backends.cpu.codegen.rows import RowKind, RowSpec, render_rows
from rlx.backends.cpu.kernels import Kernel, KernelCtx, KernelFactory, KernelKind, kernel
from rlx.backends.cpu.kernels.fused import (
    fused_matmul_kernel,
    fused_residual_ln_kernel,
    fused_residual_rms_norm_kernel,
    fused_swiglu_kernel,
)
from rlx.backends.cpu.kernels.linalg import matmul_into
from rlx.backends.cpu.kernels.lowp_gemm import lowp_fused_matmul
from rlx.backends.cpu.kernels.lowp_lib import BF16, F16
from rlx.backends.cpu.kernels.region import (
    CALL_WEIGHT,
    PARALLEL_MIN_WORK,
    bind,
    load_function,
)
from rlx.backends.cpu.kernels.sgemm import EPILOGUE_ACTS, weight_matmul
from rlx.backends.cpu.kernels.tensor import (
    layer_norm_kernel,
    log_softmax_kernel,
    rms_norm_kernel,
    softmax_kernel,
)
from rlx.dtype import DType
from rlx.errors import CompileError
from rlx.ops.elementwise import UnaryKind
from rlx.ops.fused import FusedMatMulBiasAct, FusedResidualLN, FusedResidualRmsNorm, FusedSwiGLU
from rlx.ops.norm import LayerNorm, RmsNorm
from rlx.ops.reduce import LogSoftmax, Softmax

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "row_function",
    "row_kernel",
    "native_softmax_kernel",
    "native_log_softmax_kernel",
    "native_layer_norm_kernel",
    "native_rms_norm_kernel",
    "native_residual_ln_kernel",
    "native_residual_rms_norm_kernel",
    "native_fused_matmul_kernel",
    "native_swiglu_kernel",
]

_ROW_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.float16, BF16))


class _Decline(Exception):
    """This node's layout or dtype has no native row kernel (the message says why)."""


@functools.cache
def row_function(spec: RowSpec) -> Any:
    """Build (cached on disk by content) and load the C function of ``spec``; the ctypes
    function with its argtypes set. CompileError without gcc or when the build fails."""
    return load_function(render_rows(spec))


def row_kernel(
    spec: RowSpec,
    rows: list[np.ndarray],
    cols: list[np.ndarray],
    eps: float,
    ctx: KernelCtx,
    *,
    scale: float = 1.0,
) -> Kernel:
    """Bind ``spec``'s function: ``rows`` are the row operands (C-contiguous, all of the
    first one's dims, the output last), ``cols`` the per-column operands (gamma, beta,
    bias: ``n`` contiguous elements), in the function's operand order (row inputs,
    columns, output). ``eps``/``scale`` are the run-time constants ``c[0]``/``c[1]``.
    Chooses the thread count and notes it in ``ctx``."""
    n = rows[0].shape[-1] if rows[0].ndim else 1
    nrows = rows[0].size // n
    fn = row_function(spec)
    meta = np.array([nrows, n], dtype=np.int64)
    consts = np.array([eps, scale], dtype=np.float64)
    work = rows[0].size * (1 + CALL_WEIGHT * spec.calls_per_element)
    threads = ctx.num_threads if work >= PARALLEL_MIN_WORK and nrows > 1 else 1
    *row_ins, out = rows
    team = f", OpenMP x{threads}" if threads > 1 else ""
    ctx.notes.append(f"native: {spec.kind.value} over {nrows} rows of {n}{team}")
    if spec.kind is RowKind.BIAS_ACT:  # the output (in place) comes first
        return bind(fn, [meta, out, *cols, consts], threads)
    return bind(fn, [meta, *row_ins, *cols, out, consts], threads)


def _ctype_of(out: np.ndarray, ins: list[np.ndarray]) -> Any:
    dt = out.dtype
    if dt not in _ROW_DTYPES:
        raise _Decline(f"dtype {dt} has no native row kernel")
    bad = [x.dtype for x in ins if x.dtype != dt]
    if bad:
        raise _Decline(f"mixed dtypes {bad[0]} and {dt}")
    return C_TYPES[DType.from_numpy(dt)]


def _rows_of(out: np.ndarray, xs: list[np.ndarray], what: str) -> None:
    if out.ndim == 0 or out.size == 0:
        raise _Decline(f"{what}: output dims {out.shape} (empty or scalar)")
    for x in [*xs, out]:
        if x.shape != out.shape or not x.flags.c_contiguous:
            raise _Decline(f"{what}: operand {x.shape} is not C-contiguous of dims {out.shape}")


def _col(a: np.ndarray, n: int, what: str) -> np.ndarray:
    if a.size != n or (a.ndim and a.shape[-1] != n) or not a.flags.c_contiguous:
        raise _Decline(f"{what} has dims {a.shape}, not {n} contiguous elements")
    return a.reshape(n)


def _native(
    fallback: KernelFactory,
    fallback_kind: KernelKind,
    build: Any,
    node: Node,
    ins: list[np.ndarray],
    out: np.ndarray,
    ctx: KernelCtx,
) -> Kernel | None:
    """``build()`` as the node's native kernel, or ``fallback``'s kernel with a note."""
    why = "native kernels disabled (CompileOptions.native)"
    if ctx.native:
        try:
            fn = build()
        except _Decline as e:
            why = str(e)
        except CodegenUnsupported as e:
            why = f"no C rendering: {e}"
        except CompileError as e:
            why = f"native build failed: {e.bare_message.splitlines()[0]}"
        else:
            ctx.kind = KernelKind.NATIVE
            return fn  # type: ignore[no-any-return]
    ctx.kind = fallback_kind
    ctx.notes.append(f"NumPy kernel ({why})")
    return fallback(node, ins, out, ctx)


# ---- softmax -------------------------------------------------------------------------------


def _softmax_factory(kind: RowKind, fallback: KernelFactory) -> KernelFactory:
    def factory(
        node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
    ) -> Kernel | None:
        def build() -> Kernel:
            x = ins[0]
            axis = node.op.axis  # type: ignore[attr-defined]
            if x.ndim == 0 or axis % x.ndim != x.ndim - 1:
                raise _Decline(f"axis {axis} of a rank-{x.ndim} input is not the last")
            t = _ctype_of(out, ins)
            _rows_of(out, [x], kind.value)
            return row_kernel(RowSpec(kind, t), [x, out], [], 0.0, ctx)

        return _native(fallback, KernelKind.NUMPY, build, node, ins, out, ctx)

    factory.__name__ = f"native_{kind.value}_kernel"
    factory.__doc__ = f"Native {kind.value} over the last axis (NumPy kernel otherwise)."
    return factory


native_softmax_kernel = kernel(Softmax, KernelKind.NATIVE, supersedes=softmax_kernel)(
    _softmax_factory(RowKind.SOFTMAX, softmax_kernel)
)
native_log_softmax_kernel = kernel(LogSoftmax, KernelKind.NATIVE, supersedes=log_softmax_kernel)(
    _softmax_factory(RowKind.LOG_SOFTMAX, log_softmax_kernel)
)


# ---- norms ---------------------------------------------------------------------------------


def _norm_factory(kind: RowKind, residual: bool, fallback: KernelFactory) -> KernelFactory:
    def factory(
        node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
    ) -> Kernel | None:
        def build() -> Kernel:
            nrow = 2 if residual else 1
            xs, cols = ins[:nrow], ins[nrow:]
            t = _ctype_of(out, ins)
            _rows_of(out, xs, kind.value)
            n = out.shape[-1]
            names = ("gamma", "beta")
            cs = [_col(c, n, f"{names[i]} of %{node.id}") for i, c in enumerate(cols)]
            spec = RowSpec(kind, t, residual=residual, beta=len(cols) == 2)
            return row_kernel(spec, [*xs, out], cs, node.op.eps, ctx)  # type: ignore[attr-defined]

        return _native(fallback, KernelKind.NUMPY, build, node, ins, out, ctx)

    label = ("residual_" if residual else "") + kind.value
    factory.__name__ = f"native_{label}_kernel"
    factory.__doc__ = f"Native {label} over the last axis (NumPy kernel otherwise)."
    return factory


native_layer_norm_kernel = kernel(LayerNorm, KernelKind.NATIVE, supersedes=layer_norm_kernel)(
    _norm_factory(RowKind.LAYER_NORM, False, layer_norm_kernel)
)
native_rms_norm_kernel = kernel(RmsNorm, KernelKind.NATIVE, supersedes=rms_norm_kernel)(
    _norm_factory(RowKind.RMS_NORM, False, rms_norm_kernel)
)
native_residual_ln_kernel = kernel(
    FusedResidualLN, KernelKind.NATIVE, supersedes=fused_residual_ln_kernel
)(_norm_factory(RowKind.LAYER_NORM, True, fused_residual_ln_kernel))
native_residual_rms_norm_kernel = kernel(
    FusedResidualRmsNorm, KernelKind.NATIVE, supersedes=fused_residual_rms_norm_kernel
)(_norm_factory(RowKind.RMS_NORM, True, fused_residual_rms_norm_kernel))


# ---- matmul epilogue -----------------------------------------------------------------------


@kernel(FusedMatMulBiasAct, KernelKind.NATIVE, supersedes=fused_matmul_kernel)
def native_fused_matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """f32: rlx's packed sgemm with the bias and activation applied in its output tiles
    (``kernels.sgemm``; an activation the tile epilogue lacks runs as one native pass
    after it) when it beat BLAS on the shape class; else the BLAS matmul into ``out``,
    then one native pass ``out = act(out + bias)`` (f32/f64); bf16/f16 through
    ``kernels.lowp_gemm.lowp_fused_matmul``; the NumPy kernel otherwise."""
    x, w = ins[:2]
    bias = ins[2] if len(ins) == 3 else None
    act = node.op.act  # type: ignore[attr-defined]

    def build() -> Kernel:
        if out.dtype in (BF16, F16):
            fn = lowp_fused_matmul(node, ins, out, ctx)
            if fn is None:
                raise _Decline(f"the {out.dtype} matmul has no native low-precision path here")
            ctx.notes.append("native low-precision GEMM and epilogue (kernels.lowp_lib)")
            return fn
        if out.dtype not in (np.float32, np.float64):
            raise _Decline(f"dtype {out.dtype} has no native epilogue")
        t = _ctype_of(out, ins)
        if bias is None and act is None:
            raise _Decline("no bias and no activation: the plain BLAS matmul")
        if out.size == 0 or not out.flags.c_contiguous:
            raise _Decline(f"output {out.shape} is empty or not C-contiguous")
        n = out.shape[-1]
        cols = [] if bias is None else [_col(bias, n, f"bias of %{node.id}")]
        fn = _sgemm_fused(node, x, w, cols, act, out, t, ctx)
        if fn is not None:
            return fn
        mm = matmul_into(x, w, out)
        epi = row_kernel(
            RowSpec(RowKind.BIAS_ACT, t, beta=bias is not None, act=act), [out], cols, 0.0, ctx
        )
        ctx.notes.append("BLAS matmul, then the native bias/activation pass")

        def run() -> None:
            mm()
            epi()

        return run

    return _native(fused_matmul_kernel, KernelKind.BLAS, build, node, ins, out, ctx)


def _sgemm_fused(
    node: Node,
    x: np.ndarray,
    w: np.ndarray,
    cols: list[np.ndarray],
    act: UnaryKind | None,
    out: np.ndarray,
    t: Any,
    ctx: KernelCtx,
) -> Kernel | None:
    """The f32 product on rlx's sgemm with the bias (and the activation when the tile
    epilogue has it) fused, or None for the BLAS path."""
    if out.dtype != np.float32:
        return None
    bias = cols[0] if cols else None
    in_tile = act is None or act.value in EPILOGUE_ACTS
    fn = weight_matmul(node, x, w, out, ctx, bias=bias, act=act.value if in_tile and act else None)
    if fn is None or in_tile:
        return fn
    epi = row_kernel(RowSpec(RowKind.BIAS_ACT, t, beta=False, act=act), [out], [], 0.0, ctx)
    ctx.notes.append(f"then the native {act.value} pass")  # type: ignore[union-attr]

    def run() -> None:
        fn()
        epi()

    return run


@kernel(FusedSwiGLU, KernelKind.NATIVE, supersedes=fused_swiglu_kernel)
def native_swiglu_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """BLAS ``gate = x @ w_gate`` into scratch and ``out = x @ w_up``, then one native
    pass ``out = silu(gate) * out`` (f32/f64); the NumPy kernel otherwise."""

    def build() -> Kernel:
        if out.dtype not in (np.float32, np.float64):
            raise _Decline(f"dtype {out.dtype} has no native SwiGLU epilogue")
        t = _ctype_of(out, ins)
        if out.size == 0 or not out.flags.c_contiguous:
            raise _Decline(f"output {out.shape} is empty or not C-contiguous")
        x, wg, wu = ins
        gate = ctx.scratch(out.shape, out.dtype, 63)
        mm_gate, mm_up = matmul_into(x, wg, gate), matmul_into(x, wu, out)
        spec = RowSpec(RowKind.GATE_MUL, t, act=UnaryKind.SILU)
        epi = row_kernel(spec, [gate, out], [], 0.0, ctx)
        ctx.notes.append("BLAS matmuls, then the native silu(gate) * up pass")

        def run() -> None:
            mm_gate()
            mm_up()
            epi()

        return run

    return _native(fused_swiglu_kernel, KernelKind.BLAS, build, node, ins, out, ctx)
