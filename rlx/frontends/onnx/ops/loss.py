"""Loss ONNX ops -> chains over gather_elements and reductions: NegativeLogLikelihoodLoss
(``-input[n, target[n, ...], ...] * weight[target]``, ignore_index, reduction none / sum /
mean, the mean weighted by the kept weights) and SoftmaxCrossEntropyLoss (log_softmax
over axis 1, then the same loss; its optional second output is the log-probabilities)."""

from __future__ import annotations

from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import bin_, cast, cmp, scalar, un, where
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import CompareKind as C
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.indexing import GatherElements
from rlx.ops.movement import Gather, Reshape
from rlx.ops.reduce import LogSoftmax, Reduce, ReduceKind


def _nll(ctx: NodeCtx, x: int, target: int, weight: int | None) -> int:
    g = ctx.g
    xs, ts = ctx.shape(x), ctx.shape(target)
    ii = ctx.attr("ignore_index")
    ign = None
    if ii is not None:
        ign = cmp(g, C.EQ, target, scalar(g, ii, target))
        target = where(g, ign, scalar(g, 0, target), target)
    t1 = g.apply(Reshape((ts.dims[0], 1, *ts.dims[1:])), [target])
    picked = g.apply(Reshape(ts.dims), [g.apply(GatherElements(1), [x, t1])])
    loss = un(g, U.NEG, picked)
    w = None
    if weight is not None:
        w = g.apply(Gather(0), [weight, target])
    if ign is not None:
        keep = cast(g, un(g, U.NOT, ign), xs.dtype)
        w = keep if w is None else bin_(g, B.MUL, w, keep)
    if w is not None:
        loss = bin_(g, B.MUL, loss, w)
    red = ctx.attr("reduction", "mean")
    axes = tuple(range(ts.rank))
    if red == "none":
        return loss
    total = g.apply(Reduce(ReduceKind.SUM, axes, False), [loss])
    if red == "sum":
        return total
    if red != "mean":
        raise ctx.unsupported(f"reduction {red!r}")
    if w is None:
        return g.apply(Reduce(ReduceKind.MEAN, axes, False), [loss])
    return bin_(g, B.DIV, total, g.apply(Reduce(ReduceKind.SUM, axes, False), [w]))


@converter("NegativeLogLikelihoodLoss", since=12)
def nll_loss(ctx: NodeCtx) -> int:
    return _nll(ctx, ctx.x(0), ctx.x(1), ctx.opt(2))


@converter("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy(ctx: NodeCtx) -> list[int]:
    logp = ctx.g.apply(LogSoftmax(1), [ctx.x(0)])
    return [_nll(ctx, logp, ctx.x(1), ctx.opt(2)), logp]
