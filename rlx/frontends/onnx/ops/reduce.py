"""Reductions and softmax-like ONNX ops -> rlx reduce / softmax / log_softmax / argmax /
argmin / topk / cumsum, with each op's opset-versioned axes (attribute before, input
after: ReduceSum at 13, the others at 18; Softmax's 2-D coercion before 13)."""

from __future__ import annotations

import numpy as np

from rlx.dtype import DType
from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import axis_of, bin_, cast, cmp, dtype_of, scalar, un
from rlx.ops.cumulative import CumProd
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import CompareKind as C
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.movement import Reshape, Slice
from rlx.ops.reduce import ArgMax, ArgMin, Cumsum, LogSoftmax, Reduce, ReduceKind, Softmax, TopK

_R = ReduceKind
_REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")  # fmt: skip


def _axes(ctx: NodeCtx, from_input: bool) -> tuple[int, ...] | None:
    """The reduced axes, or None for all (``noop_with_empty_axes`` gives ())."""
    rank = ctx.in_shape(0).rank
    if from_input:
        axes = ctx.ints(1, "axes") if ctx.has(1) else []
    else:
        axes = ctx.attr("axes", [])
    if not axes:
        return () if ctx.attr("noop_with_empty_axes", 0) else tuple(range(rank))
    return tuple(sorted({axis_of(int(a), rank) for a in axes}))


def _reduce(ctx: NodeCtx, from_input: bool) -> int:
    g, x = ctx.g, ctx.x(0)
    axes = _axes(ctx, from_input)
    kd = bool(ctx.attr("keepdims", 1))
    op = ctx.node.op_type
    if not axes:  # noop
        return x if op not in ("ReduceL1", "ReduceL2", "ReduceSumSquare") else _pre(g, op, x)
    pre = _pre(g, op, x)
    kind = {"ReduceMean": _R.MEAN, "ReduceMax": _R.MAX, "ReduceMin": _R.MIN,
            "ReduceProd": _R.PROD}.get(op, _R.SUM)  # fmt: skip
    if kind in (_R.MAX, _R.MIN) and dtype_of(g, pre).is_bool:
        pre8 = cast(g, pre, DType.U8)
        return cast(g, g.apply(Reduce(kind, axes, kd), [pre8]), DType.BOOL)
    y = g.apply(Reduce(kind, axes, kd), [pre])
    if op == "ReduceL2":
        y = un(g, U.SQRT, y) if dtype_of(g, y).is_float else _isqrt(g, y)
    elif op in ("ReduceLogSum", "ReduceLogSumExp"):
        y = un(g, U.LOG, y)
    return y


def _isqrt(g, y: int) -> int:  # noqa: ANN001
    dt = dtype_of(g, y)
    return cast(g, un(g, U.SQRT, cast(g, y, DType.F64)), dt)


def _pre(g, op: str, x: int) -> int:  # noqa: ANN001
    if op == "ReduceL1":
        return un(g, U.ABS, x)
    if op in ("ReduceL2", "ReduceSumSquare"):
        return bin_(g, B.MUL, x, x)
    if op == "ReduceLogSumExp":
        return un(g, U.EXP, x)
    return x


@converter("ReduceSum", since=1, until=13)
@converter(*(r for r in _REDUCE if r != "ReduceSum"), since=1, until=18)
def reduce_attr(ctx: NodeCtx) -> int:
    return _reduce(ctx, from_input=False)


@converter("ReduceSum", since=13)
@converter(*(r for r in _REDUCE if r != "ReduceSum"), since=18)
def reduce_input(ctx: NodeCtx) -> int:
    return _reduce(ctx, from_input=True)


def _coerced(ctx: NodeCtx, op_cls: type, default_axis: int) -> int:
    """Softmax / LogSoftmax before opset 13: over the flattened dims from ``axis`` on."""
    g, x = ctx.g, ctx.x(0)
    shape = ctx.shape(x)
    ax = axis_of(ctx.attr("axis", default_axis), shape.rank)
    dims = shape.concrete()
    lead = int(np.prod(dims[:ax], dtype=np.int64))
    flat = g.apply(Reshape((lead, int(np.prod(dims[ax:], dtype=np.int64)))), [x])
    y = g.apply(op_cls(1), [flat])
    return g.apply(Reshape(tuple(dims)), [y])


@converter("Softmax", since=1, until=13)
def softmax_old(ctx: NodeCtx) -> int:
    return _coerced(ctx, Softmax, 1)


@converter("LogSoftmax", since=1, until=13)
def log_softmax_old(ctx: NodeCtx) -> int:
    return _coerced(ctx, LogSoftmax, 1)


@converter("Softmax", since=13)
def softmax(ctx: NodeCtx) -> int:
    return ctx.g.apply(Softmax(ctx.attr("axis", -1)), [ctx.x(0)])


@converter("LogSoftmax", since=13)
def log_softmax(ctx: NodeCtx) -> int:
    return ctx.g.apply(LogSoftmax(ctx.attr("axis", -1)), [ctx.x(0)])


def _hardmax(g, x: int, axis: int) -> int:  # noqa: ANN001
    shape = g.shape(x)
    am = g.apply(ArgMax(axis, True), [x])
    n = shape.dims[axis]
    iota = np.arange(n, dtype=np.int64).reshape([n if i == axis else 1 for i in range(shape.rank)])
    return cast(g, cmp(g, C.EQ, g.constant(iota), am), shape.dtype)


@converter("Hardmax", since=1, until=13)
def hardmax_old(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    dims = ctx.shape(x).concrete()
    ax = axis_of(ctx.attr("axis", 1), len(dims))
    lead = int(np.prod(dims[:ax], dtype=np.int64))
    flat = g.apply(Reshape((lead, int(np.prod(dims[ax:], dtype=np.int64)))), [x])
    return g.apply(Reshape(tuple(dims)), [_hardmax(g, flat, 1)])


@converter("Hardmax", since=13)
def hardmax(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    return _hardmax(ctx.g, x, axis_of(ctx.attr("axis", -1), ctx.shape(x).rank))


def _flip(g, x: int, ax: int) -> int:  # noqa: ANN001
    r = g.shape(x).rank
    starts = tuple(None for _ in range(r))
    steps = tuple(-1 if i == ax else 1 for i in range(r))
    return g.apply(Slice(starts, starts, steps), [x])


@converter("ArgMax", "ArgMin", since=1)
def arg(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    rank = ctx.shape(x).rank
    ax = axis_of(ctx.attr("axis", 0), rank)
    kd = bool(ctx.attr("keepdims", 1))
    cls = ArgMax if ctx.node.op_type == "ArgMax" else ArgMin
    if ctx.attr("select_last_index", 0):
        n = ctx.shape(x).dims[ax]
        idx = g.apply(cls(ax, kd), [_flip(g, x, ax)])
        return bin_(g, B.SUB, scalar(g, n - 1, idx), idx)
    return g.apply(cls(ax, kd), [x])


@converter("TopK", since=1)
def topk(ctx: NodeCtx) -> list[int]:
    g, x = ctx.g, ctx.x(0)
    k = int(ctx.attr("k")) if ctx.opset < 10 else ctx.ints(1, "K")[0]
    ax = axis_of(ctx.attr("axis", -1), ctx.shape(x).rank)
    largest = bool(ctx.attr("largest", 1))
    vals = g.apply(TopK(k, ax, largest, False), [x])
    idx = g.apply(TopK(k, ax, largest, True), [x])
    return [vals, idx]


@converter("CumSum", since=11)
def cumsum(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    ax = axis_of(ctx.ints(1, "axis")[0], ctx.shape(x).rank)
    op = Cumsum(ax, bool(ctx.attr("reverse", 0)), bool(ctx.attr("exclusive", 0)))
    return ctx.g.apply(op, [x])


@converter("CumProd", since=26)
def cumprod(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    ax = axis_of(ctx.ints(1, "axis")[0], ctx.shape(x).rank)
    op = CumProd(ax, bool(ctx.attr("reverse", 0)), bool(ctx.attr("exclusive", 0)))
    return ctx.g.apply(op, [x])
