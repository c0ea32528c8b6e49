"""CPU kernels for reductions, softmax, normalisations and data movement. Each writes its
output view with NumPy calls taking ``out=`` (temporaries in build-time scratch);
f16/bf16 go through f32 (``lowp``). Nodes a kernel has no fast path for (complex or bool
inputs, out-of-range indices found at run time) use the reference kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.kernels import Kernel, KernelCtx, kernel, lowp
from rlx.ops.movement import Concat, Expand, Gather, Narrow, Pad, ShapeOf, Slice, Transpose
from rlx.ops.norm import LayerNorm, RmsNorm
from rlx.ops.reduce import ArgMax, ArgMin, Cumsum, LogSoftmax, Reduce, ReduceKind, Softmax

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["norm_into", "softmax_into"]


def _kept(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


@kernel(Reduce)
@lowp
def reduce_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """sum/mean/max/min/prod with ``out=``; integer sums and products wrap in the input
    dtype and empty max/min give the identity, as the reference."""
    (x,) = ins
    if x.dtype.kind not in "fiu":
        return None
    op = node.op
    axes = tuple(a % x.ndim for a in op.axes) if x.ndim else ()  # type: ignore[attr-defined]
    kd: bool = op.keepdims  # type: ignore[attr-defined]
    fn: ReduceKind = op.fn  # type: ignore[attr-defined]
    acc = x.dtype if x.dtype.kind in "iu" else None
    if fn is ReduceKind.SUM:
        return lambda: np.sum(x, axis=axes, keepdims=kd, dtype=acc, out=out)  # type: ignore[return-value]
    if fn is ReduceKind.PROD:
        return lambda: np.prod(x, axis=axes, keepdims=kd, dtype=acc, out=out)  # type: ignore[return-value]
    if fn is ReduceKind.MEAN:
        return lambda: np.mean(x, axis=axes, keepdims=kd, out=out)  # type: ignore[return-value]
    if x.dtype.kind == "f":
        init = -np.inf if fn is ReduceKind.MAX else np.inf
    else:
        info = np.iinfo(x.dtype)
        init = info.min if fn is ReduceKind.MAX else info.max
    uf = np.maximum if fn is ReduceKind.MAX else np.minimum
    return lambda: uf.reduce(x, axis=axes, keepdims=kd, out=out, initial=init)  # type: ignore[return-value]


@kernel(Cumsum)
@lowp
def cumsum_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``np.cumsum(out=)``; ``reverse`` runs on flipped views of input and output.
    Exclusive sums keep the reference kernel."""
    (x,) = ins
    op = node.op
    if op.exclusive or x.dtype.kind not in "fiu" or x.ndim == 0:  # type: ignore[attr-defined]
        return None
    ax = op.axis % x.ndim  # type: ignore[attr-defined]
    acc = x.dtype if x.dtype.kind in "iu" else None
    src, dst = (np.flip(x, ax), np.flip(out, ax)) if op.reverse else (x, out)  # type: ignore[attr-defined]
    return lambda: np.cumsum(src, axis=ax, dtype=acc, out=dst)  # type: ignore[return-value]


def _arg_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, fn: object) -> Kernel | None:
    (x,) = ins
    if x.dtype.kind not in "fiub" or out.dtype != np.intp or x.shape[node.op.axis % x.ndim] == 0:  # type: ignore[attr-defined]
        return None
    ax = node.op.axis % x.ndim  # type: ignore[attr-defined]
    kd = node.op.keepdims  # type: ignore[attr-defined]
    return lambda: fn(x, axis=ax, out=out, keepdims=kd)  # type: ignore[operator, return-value]


@kernel(ArgMax)
@lowp
def argmax_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``np.argmax(out=)`` into the I64 output (first index on ties and NaN, as NumPy)."""
    return _arg_kernel(node, ins, out, np.argmax)


@kernel(ArgMin)
@lowp
def argmin_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``np.argmin(out=)`` into the I64 output."""
    return _arg_kernel(node, ins, out, np.argmin)


def softmax_into(
    x: np.ndarray, out: np.ndarray, axis: int, ctx: KernelCtx, log: bool = False
) -> Kernel:
    """Stable (log-)softmax of ``x`` along ``axis`` into ``out`` (scratch: the max/sum
    row and one full-size temporary). An empty ``x`` (a 0-size axis) has nothing to
    compute: NumPy's max of an empty axis would raise."""
    if x.size == 0:
        return lambda: None
    ax = axis % x.ndim
    m = ctx.scratch(_kept(x.shape, (ax,)), x.dtype, 30)
    t = ctx.scratch(x.shape, x.dtype, 31)
    if not log:

        def softmax() -> None:
            np.max(x, axis=ax, keepdims=True, out=m)
            np.subtract(x, m, out=t)
            np.exp(t, out=t)
            np.sum(t, axis=ax, keepdims=True, out=m)
            np.divide(t, m, out=out)

        return softmax
    e = ctx.scratch(x.shape, x.dtype, 32)

    def log_softmax() -> None:
        np.max(x, axis=ax, keepdims=True, out=m)
        np.subtract(x, m, out=t)
        np.exp(t, out=e)
        np.sum(e, axis=ax, keepdims=True, out=m)
        np.log(m, out=m)
        np.subtract(t, m, out=out)

    return log_softmax


@kernel(Softmax)
@lowp
def softmax_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``exp(x - max) / sum`` along the axis, into ``out``."""
    if ins[0].ndim == 0 or ins[0].dtype.kind != "f":
        return None
    return softmax_into(ins[0], out, node.op.axis, ctx)  # type: ignore[attr-defined]


@kernel(LogSoftmax)
@lowp
def log_softmax_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``s - log(sum(exp(s)))`` with ``s = x - max`` along the axis."""
    if ins[0].ndim == 0 or ins[0].dtype.kind != "f":
        return None
    return softmax_into(ins[0], out, node.op.axis, ctx, log=True)  # type: ignore[attr-defined]


def norm_into(
    x: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray | None,
    out: np.ndarray,
    eps: float,
    ctx: KernelCtx,
    *,
    center: bool,
) -> Kernel:
    """Layer norm (``center``) or RMS norm of ``x`` over its last axis into ``out``,
    in the reference's order: ``c / sqrt(mean(c*c) + eps) * gamma (+ beta)``."""
    row = ctx.scratch((*x.shape[:-1], 1), x.dtype, 40)
    c = ctx.scratch(x.shape, x.dtype, 41)
    sq = ctx.scratch(x.shape, x.dtype, 42)
    e = x.dtype.type(eps)
    last = (-1,)

    def norm() -> None:
        if center:
            np.mean(x, axis=last, keepdims=True, out=row)
            np.subtract(x, row, out=c)
        else:
            np.copyto(c, x)
        np.multiply(c, c, out=sq)
        np.mean(sq, axis=last, keepdims=True, out=row)
        np.add(row, e, out=row)
        np.sqrt(row, out=row)
        np.divide(c, row, out=c)
        if beta is None:
            np.multiply(c, gamma, out=out)
        else:
            np.multiply(c, gamma, out=c)
            np.add(c, beta, out=out)

    return norm


@kernel(LayerNorm)
@lowp
def layer_norm_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """Layer norm over the last axis with ``out=`` calls."""
    beta = ins[2] if len(ins) == 3 else None
    return norm_into(ins[0], ins[1], beta, out, node.op.eps, ctx, center=True)  # type: ignore[attr-defined]


@kernel(RmsNorm)
@lowp
def rms_norm_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """RMS norm over the last axis with ``out=`` calls."""
    beta = ins[2] if len(ins) == 3 else None
    return norm_into(ins[0], ins[1], beta, out, node.op.eps, ctx, center=False)  # type: ignore[attr-defined]


def _copy_from(src: np.ndarray, out: np.ndarray) -> Kernel:
    return lambda: np.copyto(out, src)  # type: ignore[return-value]


@kernel(Transpose)
def transpose_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """A strided copy of the permuted view of the input."""
    return _copy_from(ins[0].transpose(node.op.perm), out)  # type: ignore[attr-defined]


@kernel(Expand)
def expand_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """A broadcasting copy into the output."""
    return _copy_from(ins[0], out)


@kernel(ShapeOf)
def shape_of_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """Writes the input view's dims (fixed for the schedule of one binding)."""
    return _copy_from(np.asarray(ins[0].shape, dtype=np.int64), out)


@kernel(Narrow)
def narrow_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """A copy of the narrowed view (out-of-range bounds keep the reference's error)."""
    x = ins[0]
    op = node.op
    ax = op.axis % x.ndim  # type: ignore[attr-defined]
    if op.start + op.length > x.shape[ax]:  # type: ignore[attr-defined]
        return None
    key = (slice(None),) * ax + (slice(op.start, op.start + op.length),)  # type: ignore[attr-defined]
    return _copy_from(x[key], out)


@kernel(Slice)
def slice_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """A copy of the basic-slicing view (a size mismatch keeps the reference's error)."""
    op = node.op
    key = tuple(slice(a, b, c) for a, b, c in zip(op.starts, op.stops, op.steps, strict=True))  # type: ignore[attr-defined]
    src = ins[0][key]
    if src.shape != out.shape:
        return None
    return _copy_from(src, out)


@kernel(Concat)
def concat_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """One copy per input into its slice of the output."""
    ax = node.op.axis % out.ndim  # type: ignore[attr-defined]
    pairs = []
    start = 0
    for x in ins:
        n = x.shape[ax]
        key = (slice(None),) * ax + (slice(start, start + n),)
        pairs.append((out[key], x))
        start += n

    def run() -> None:
        for dst, src in pairs:
            np.copyto(dst, src)

    return run


@kernel(Gather)
def gather_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``np.take(x, idx, axis, out=out)``; an out-of-range index re-runs the reference,
    which raises the InputError naming it."""
    x, idx = ins
    if idx.dtype.kind not in "iu":
        return None
    ax = node.op.axis % x.ndim  # type: ignore[attr-defined]
    op = node.op
    rctx = ctx.ref_ctx(out)

    def run() -> None:
        try:
            np.take(x, idx, axis=ax, out=out)
        except IndexError:
            op.reference([x, idx], rctx)
            raise

    return run


@kernel(Pad)
def pad_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """Fill the output with the pad value, then copy the input into its interior (the
    output slot is shared over time, so the border is rewritten every run)."""
    (x,) = ins
    op = node.op
    fill = op.value if x.dtype.kind in "fcV" else int(op.value)  # type: ignore[attr-defined]
    with np.errstate(over="ignore"):  # a float beyond the dtype becomes +-inf, as a cast
        wide = np.asarray(fill, dtype=np.float64 if x.dtype.kind != "c" else np.complex128)
        value = wide.astype(out.dtype)
    key = tuple(slice(lo, lo + n) for n, (lo, _) in zip(x.shape, op.pads, strict=True))  # type: ignore[attr-defined]
    inner = out[key]

    def run() -> None:
        np.copyto(out, value)
        np.copyto(inner, x)

    return run
