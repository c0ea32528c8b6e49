"""Indexing ATen ops -> rlx gather / gather_elements / gather_nd: embedding (rows of the
weight), index_select, gather, and advanced indexing ``index.Tensor`` (one index tensor:
a gather along its axis; several adjacent ones: their broadcast index tuples through
gather_nd)."""

from __future__ import annotations

from rlx.dtype import DType
from rlx.frontends.torch.aten import aten
from rlx.frontends.torch.context import NodeCtx, TVal
from rlx.ops.indexing import GatherElements, GatherNd
from rlx.ops.movement import Concat, Expand, Gather, Reshape, Transpose
from rlx.shape import broadcast_dims

__all__: list[str] = []


def _index(ctx: NodeCtx, i: int) -> int:
    x = ctx.t(i)
    dt = ctx.dtype(x)
    if dt is DType.BOOL:
        raise ctx.unsupported("indexing with a bool mask (data-dependent result size)")
    return ctx.cast(x, DType.I64) if dt is not DType.I64 else x


@aten("embedding")
def embedding(ctx: NodeCtx) -> int:
    return ctx.g.apply(Gather(0), [ctx.t(0), _index(ctx, 1)])


@aten("index_select")
def index_select(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    ax = ctx.arg(1) % ctx.shape(x).rank
    return ctx.g.apply(Gather(ax), [x, _index(ctx, 2)])


@aten("gather")
def gather(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    ax = ctx.arg(1) % ctx.shape(x).rank
    return ctx.g.apply(GatherElements(ax), [x, _index(ctx, 2)])


@aten("index.Tensor", "_unsafe_index.Tensor")
def index(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    idx = list(ctx.arg(1))
    where = [k for k, v in enumerate(idx) if isinstance(v, TVal)]
    if not where or where != list(range(where[0], where[-1] + 1)):
        raise ctx.unsupported("index with non-adjacent index tensors")
    ids = []
    for v in idx:
        if isinstance(v, TVal):
            if ctx.dtype(v.id) is DType.BOOL:
                raise ctx.unsupported("indexing with a bool mask (data-dependent result size)")
            ids.append(ctx.cast(v.id, DType.I64))
    first = where[0]
    if len(ids) == 1:
        return ctx.g.apply(Gather(first), [x, ids[0]])
    r = ctx.shape(x).rank
    k = len(ids)
    if first:  # move the indexed axes to the front, gather, then move the result back
        perm = tuple(range(first, first + k)) + tuple(range(first)) + tuple(range(first + k, r))
        x = ctx.g.apply(Transpose(perm), [x])
    bdims: tuple = ()
    for i in ids:
        bdims = broadcast_dims(bdims, ctx.shape(i).dims)
    cols = []
    for i in ids:
        if ctx.shape(i).dims != bdims:
            i = ctx.g.apply(Expand(bdims), [i])
        cols.append(ctx.g.apply(Reshape((*bdims, 1)), [i]))
    tuples = ctx.g.apply(Concat(len(bdims)), cols)
    y = ctx.g.apply(GatherNd(0), [x, tuples])
    if first:
        nb = len(bdims)
        perm = (
            tuple(range(nb, nb + first))
            + tuple(range(nb))
            + tuple(range(nb + first, ctx.shape(y).rank))
        )
        y = ctx.g.apply(Transpose(perm), [y])
    return y
