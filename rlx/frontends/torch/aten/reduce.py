"""Reductions and scans -> rlx reduce / softmax / log_softmax / argmax / cumsum / topk:
sum, mean, amax, amin, prod, max/min (with and without dim), var / std (through mean),
any / all on bools (max / min), cumsum, topk."""

from __future__ import annotations

from typing import Any

from rlx.dtype import DType
from rlx.frontends.torch.aten import aten
from rlx.frontends.torch.context import NodeCtx
from rlx.ops.cumulative import CumProd
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind
from rlx.ops.movement import Reshape
from rlx.ops.reduce import ArgMax, ArgMin, Cumsum, LogSoftmax, Reduce, ReduceKind, Softmax, TopK

__all__: list[str] = []


def _axes(ctx: NodeCtx, x: int, dims: Any) -> tuple[int, ...]:
    r = ctx.shape(x).rank
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return tuple(range(r))
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(sorted(int(d) % max(r, 1) for d in dims))


def _reduce(ctx: NodeCtx, fn: ReduceKind, x: int, dims: Any, keep: bool) -> int:
    if ctx.shape(x).rank == 0:
        return x
    return ctx.g.apply(Reduce(fn, _axes(ctx, x, dims), bool(keep)), [x])


_KIND = {"sum": ReduceKind.SUM, "mean": ReduceKind.MEAN, "amax": ReduceKind.MAX,
         "amin": ReduceKind.MIN, "prod": ReduceKind.PROD}  # fmt: skip


@aten("sum", "mean", "amax", "amin", "prod")
def reduce(ctx: NodeCtx) -> int:
    name = ctx.op.removeprefix("aten.").split(".")[0]
    dt = ctx.out_dtype
    x = ctx.cast(ctx.t(0), dt)
    keep = ctx.arg(2, False, name="keepdim")
    if name in ("sum", "mean", "prod") and ctx.op.split(".")[-1] in ("default", "dtype"):
        return _reduce(ctx, _KIND[name], x, None, False)  # the overloads without dims
    if name == "prod":
        return _reduce(ctx, _KIND[name], x, [ctx.arg(1)], keep)
    return _reduce(ctx, _KIND[name], x, ctx.arg(1, name="dim"), keep)


@aten("any", "all")
def any_all(ctx: NodeCtx) -> int:
    fn = ReduceKind.MAX if ctx.op.startswith("aten.any") else ReduceKind.MIN
    x = ctx.cast(ctx.t(0), DType.BOOL)
    u8 = ctx.cast(x, DType.U8)
    dims = None if ctx.op.endswith(".default") else ctx.arg(1, name="dim")
    y = _reduce(ctx, fn, u8, dims, ctx.arg(2, False, name="keepdim"))
    return ctx.cast(y, DType.BOOL)


@aten("max.dim", "min.dim")
def max_dim(ctx: NodeCtx) -> tuple[int, int]:
    is_max = ctx.op.startswith("aten.max")
    x = ctx.t(0)
    ax = ctx.arg(1) % ctx.shape(x).rank
    keep = bool(ctx.arg(2, False))
    v = ctx.g.apply(Reduce(ReduceKind.MAX if is_max else ReduceKind.MIN, (ax,), keep), [x])
    i = ctx.g.apply((ArgMax if is_max else ArgMin)(ax, keep), [x])
    return v, i


@aten("max.default", "min.default")
def max_all(ctx: NodeCtx) -> int:
    fn = ReduceKind.MAX if ctx.op.startswith("aten.max") else ReduceKind.MIN
    return _reduce(ctx, fn, ctx.t(0), None, False)


@aten("max.other", "min.other")
def max_other(ctx: NodeCtx) -> int:
    dt = ctx.out_dtype
    fn = BinaryKind.MAX if ctx.op.startswith("aten.max") else BinaryKind.MIN
    return ctx.g.apply(Binary(fn), [ctx.cast(ctx.t(0), dt), ctx.cast(ctx.t(1), dt)])


@aten("argmax", "argmin")
def argmax(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    ax = ctx.arg(1, name="dim")
    keep = bool(ctx.arg(2, False, name="keepdim"))
    cls = ArgMax if ctx.op.startswith("aten.argmax") else ArgMin
    if ax is None:
        x = ctx.g.apply(Reshape((ctx.shape(x).numel,)), [x])
        ax, keep = 0, False
    return ctx.g.apply(cls(ax % ctx.shape(x).rank, keep), [x])


@aten("var", "std", "var_mean", "std_mean")
def var(ctx: NodeCtx) -> Any:
    name = ctx.op.removeprefix("aten.").split(".")[0]
    x = ctx.t(0)
    dims = ctx.arg(1, name="dim")
    corr = ctx.kw("correction", None)
    if corr is None:
        unbiased = (
            ctx.arg(2, True) if ctx.op.endswith(".dim") or ctx.op.endswith(".default") else True
        )
        corr = 1 if unbiased is True else 0
    keep = bool(ctx.kw("keepdim", False))
    axes = _axes(ctx, x, dims)
    s = ctx.shape(x)
    n = 1
    for a in axes:
        if not isinstance(s.dims[a], int):
            raise ctx.unsupported(f"{name} over the symbolic axis {a} of {s}")
        n *= s.dims[a]
    dt = ctx.dtype(x)
    mean = ctx.g.apply(Reduce(ReduceKind.MEAN, axes, True), [x])
    d = ctx.g.apply(Binary(BinaryKind.SUB), [x, mean])
    ss = ctx.g.apply(
        Reduce(ReduceKind.SUM, axes, keep), [ctx.g.apply(Unary(UnaryKind.SQUARE), [d])]
    )
    v = ctx.g.apply(Binary(BinaryKind.DIV), [ss, ctx.const(max(n - corr, 0), dt)])
    if name.startswith("std"):
        v = ctx.g.apply(Unary(UnaryKind.SQRT), [v])
    if name.endswith("_mean"):
        m = mean if keep else ctx.g.apply(Reduce(ReduceKind.MEAN, axes, False), [x])
        return v, m
    return v


@aten("_softmax", "softmax.int", "_log_softmax", "log_softmax.int")
def softmax(ctx: NodeCtx) -> int:
    dt = ctx.out_dtype
    x = ctx.cast(ctx.t(0), dt)
    ax = ctx.arg(1) % max(ctx.shape(x).rank, 1)
    cls = LogSoftmax if "log_softmax" in ctx.op else Softmax
    return ctx.g.apply(cls(ax), [x])


@aten("cumsum", "cumprod")
def cumsum(ctx: NodeCtx) -> int:
    x = ctx.cast(ctx.t(0), ctx.out_dtype)
    ax = ctx.arg(1) % max(ctx.shape(x).rank, 1)
    cls = CumProd if ctx.op.startswith("aten.cumprod") else Cumsum
    return ctx.g.apply(cls(ax), [x])


@aten("topk")
def topk(ctx: NodeCtx) -> tuple[int, int]:
    x = ctx.t(0)
    k = int(ctx.arg(1))
    ax = ctx.arg(2, -1) % ctx.shape(x).rank
    largest = bool(ctx.arg(3, True))
    v = ctx.g.apply(TopK(k, ax, largest, False), [x])
    i = ctx.g.apply(TopK(k, ax, largest, True), [x])
    return v, i
