"""ONNX opset 6 forms (the ``pytorch-operator`` / ``pytorch-converted`` cases of the onnx
wheel are opset 6). In: NodeCtx at opset 6. Out: node ids.

Before opset 7, binary ops broadcast only when ``broadcast=1``, aligning input B with A at
``axis`` (suffix-aligned when ``axis`` is absent): :func:`operand_b` gives B reshaped for
NumPy broadcasting, which the binary, compare and Pow converters use. BatchNormalization-6
runs in inference when ``is_test=1`` (training mode and ``spatial=0`` are named
unsupported), Gemm-6 is Gemm-7 (C broadcasts when ``broadcast=1``), and PRelu-6 applies a
1-D slope per channel (axis 1)."""

from __future__ import annotations

from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.nn import gemm
from rlx.frontends.onnx.ops.norm import batch_norm
from rlx.frontends.onnx.ops.util import bin_, cmp, scalar, where
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import CompareKind as C
from rlx.ops.movement import Reshape

__all__ = ["operand_b"]


def operand_b(ctx: NodeCtx) -> int:
    """Input 1 of a binary op, reshaped so NumPy broadcasting gives the op's semantics
    (opset < 7 with ``broadcast=1`` and ``axis``: B's dims start at A's ``axis``)."""
    b = ctx.x(1)
    if ctx.opset >= 7 or not ctx.attr("broadcast", 0) or not ctx.has_attr("axis"):
        return b
    ra, sb = ctx.shape(ctx.x(0)).rank, ctx.shape(b)
    axis = int(ctx.attr("axis"))
    axis = axis + ra if axis < 0 else axis
    trail = ra - axis - sb.rank
    if not 0 <= axis <= ra or trail < 0:
        raise ctx.error(
            f"legacy broadcast: B {sb} does not fit A (rank {ra}) from axis {ctx.attr('axis')}"
        )
    return ctx.g.apply(Reshape(sb.dims + (1,) * trail), [b]) if trail else b


@converter("BatchNormalization", since=6, until=7)
def batch_norm_6(ctx: NodeCtx) -> int:
    if not ctx.attr("is_test", 0):
        raise ctx.unsupported("BatchNormalization-6 in training mode (is_test=0)")
    if not ctx.attr("spatial", 1):
        raise ctx.unsupported("BatchNormalization with spatial=0 (per-element statistics)")
    return batch_norm(ctx)


@converter("Gemm", since=6, until=7)
def gemm_6(ctx: NodeCtx) -> int:
    return gemm(ctx)


@converter("PRelu", since=6, until=7)
def prelu_6(ctx: NodeCtx) -> int:
    g, x, s = ctx.g, ctx.x(0), ctx.x(1)
    xs, ss = ctx.shape(x), ctx.shape(s)
    if ss.rank == 1 and xs.rank > 2 and ss.dims[0] == xs.dims[1] != 1:
        s = g.apply(Reshape((ss.dims[0],) + (1,) * (xs.rank - 2)), [s])
    if ss.dtype != xs.dtype:
        raise ctx.error(f"slope {ss} and input {xs} have different dtypes")
    return where(g, cmp(g, C.LT, x, scalar(g, 0, x)), bin_(g, B.MUL, x, s), x)
