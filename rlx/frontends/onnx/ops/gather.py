"""Gather / scatter ONNX ops -> rlx gather and the indexing ops (gather_elements,
scatter_elements, gather_nd, scatter_nd), plus OneHot, Compress and NonZero (the last two
need their data-dependent input known at import)."""

from __future__ import annotations

import numpy as np

from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import axis_of, cast, cmp, scalar, where
from rlx.ops.elementwise import CompareKind as C
from rlx.ops.indexing import (
    GatherElements,
    GatherNd,
    ScatterElements,
    ScatterNd,
    ScatterReduction,
)
from rlx.ops.movement import Gather, Reshape


@converter("Gather", since=1)
def gather(ctx: NodeCtx) -> int:
    x, idx = ctx.x(0), ctx.x(1)
    ax = axis_of(ctx.attr("axis", 0), ctx.shape(x).rank)
    return ctx.g.apply(Gather(ax), [x, idx])


@converter("OneHot", since=9)
def one_hot(ctx: NodeCtx) -> int:
    g, idx = ctx.g, ctx.x(0)
    depth = int(np.asarray(ctx.value(1, "depth")).reshape(-1)[0])
    vals = ctx.x(2)
    s = ctx.shape(idx)
    r = s.rank + 1
    ax = axis_of(ctx.attr("axis", -1), r)
    from rlx.frontends.onnx.ops.util import bin_
    from rlx.ops.elementwise import BinaryKind as B

    idx = (
        cast(g, idx, ctx.dtype(idx))
        if ctx.dtype(idx).is_int
        else cast(g, idx, __import__("rlx").DType.I64)
    )
    neg = cmp(g, C.LT, idx, scalar(g, 0, idx))
    idx = where(g, neg, bin_(g, B.ADD, idx, scalar(g, depth, idx)), idx)
    dims = list(s.dims)
    dims.insert(ax, 1)
    idx = g.apply(Reshape(tuple(dims)), [idx])
    iota = np.arange(depth).reshape([depth if i == ax else 1 for i in range(r)])
    hot = cmp(g, C.EQ, g.constant(iota.astype(ctx.dtype(idx).np)), idx)
    off = g.apply(Gather(0), [vals, g.constant(np.asarray(0, np.int64))])
    on = g.apply(Gather(0), [vals, g.constant(np.asarray(1, np.int64))])
    return where(g, hot, on, off)


_RED = {"none": ScatterReduction.NONE, "add": ScatterReduction.ADD,
        "mul": ScatterReduction.MUL, "max": ScatterReduction.MAX, "min": ScatterReduction.MIN}  # fmt: skip


def _reduction(ctx: NodeCtx) -> ScatterReduction:
    r = ctx.attr("reduction", "none")
    if r not in _RED:
        raise ctx.unsupported(f"reduction {r!r}")
    return _RED[r]


@converter("GatherElements", since=11)
def gather_elements(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    ax = axis_of(ctx.attr("axis", 0), ctx.shape(x).rank)
    return ctx.g.apply(GatherElements(ax), [x, ctx.x(1)])


@converter("ScatterElements", "Scatter", since=9)
def scatter_elements(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    ax = axis_of(ctx.attr("axis", 0), ctx.shape(x).rank)
    return ctx.g.apply(ScatterElements(ax, _reduction(ctx)), [x, ctx.x(1), ctx.x(2)])


@converter("GatherND", since=11)
def gather_nd(ctx: NodeCtx) -> int:
    return ctx.g.apply(GatherNd(int(ctx.attr("batch_dims", 0))), [ctx.x(0), ctx.x(1)])


@converter("ScatterND", since=11)
def scatter_nd(ctx: NodeCtx) -> int:
    return ctx.g.apply(ScatterNd(_reduction(ctx)), [ctx.x(0), ctx.x(1), ctx.x(2)])
