"""Matrix products -> rlx matmul: linear (``x @ W.T + b``; the transposed weight depends
on the param only, so the compiled graph computes it once, in its prologue), matmul, mm,
bmm, mv, dot, addmm / addmv / baddbmm (``beta * input + alpha * product``)."""

from __future__ import annotations

from rlx.frontends.torch.aten import aten
from rlx.frontends.torch.context import NodeCtx
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Transpose

__all__: list[str] = []


def _t(ctx: NodeCtx, w: int) -> int:
    r = ctx.shape(w).rank
    if r < 2:
        return w
    return ctx.g.apply(Transpose((*range(r - 2), r - 1, r - 2)), [w])


def _mm(ctx: NodeCtx, a: int, b: int) -> int:
    dt = ctx.out_dtype
    return ctx.g.apply(MatMul(), [ctx.cast(a, dt), ctx.cast(b, dt)])


@aten("linear")
def linear(ctx: NodeCtx) -> int:
    y = _mm(ctx, ctx.t(0), _t(ctx, ctx.t(1)))
    b = ctx.opt_t(2, "bias")
    return y if b is None else ctx.g.apply(Binary(BinaryKind.ADD), [y, ctx.cast(b, ctx.out_dtype)])


@aten("matmul", "mm", "bmm", "mv", "dot", "vdot", "inner.default")
def matmul(ctx: NodeCtx) -> int:
    return _mm(ctx, ctx.t(0), ctx.t(1))


@aten("addmm", "addmv", "baddbmm", "addbmm")
def addmm(ctx: NodeCtx) -> int:
    if ctx.op.startswith("aten.addbmm"):
        raise ctx.unsupported("addbmm (a sum over the batch of products)")
    dt = ctx.out_dtype
    y = _mm(ctx, ctx.t(1), ctx.t(2))
    beta, alpha = ctx.kw("beta", 1), ctx.kw("alpha", 1)
    if alpha != 1:
        y = ctx.g.apply(Binary(BinaryKind.MUL), [y, ctx.const(alpha, dt)])
    if beta == 0:
        return y
    c = ctx.cast(ctx.t(0), dt)
    if beta != 1:
        c = ctx.g.apply(Binary(BinaryKind.MUL), [c, ctx.const(beta, dt)])
    return ctx.g.apply(Binary(BinaryKind.ADD), [y, c])
