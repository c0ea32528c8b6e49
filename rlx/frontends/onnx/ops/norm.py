"""Normalisation ONNX ops -> rlx layer_norm / rms_norm / group_norm, or reductions and
elementwise chains where rlx has no single op (BatchNormalization in inference,
MeanVarianceNormalization, LpNormalization). Chains over 16-bit floats run in f32."""

from __future__ import annotations

from rlx.dtype import DType
from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.errors import OnnxImportError
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.elementwise import in_f32
from rlx.frontends.onnx.ops.util import axis_of, bin_, cast, scalar, un
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.movement import Reshape
from rlx.ops.norm import GroupNorm, LayerNorm, RmsNorm
from rlx.ops.reduce import Reduce, ReduceKind
from rlx.shape import dims_product


def _per_channel(g, v: int, rank: int) -> int:  # noqa: ANN001
    c = g.shape(v).dims[0]
    return g.apply(Reshape((1, c) + (1,) * (rank - 2)), [v])


@converter("BatchNormalization", since=7)
@in_f32
def batch_norm(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    r = ctx.shape(x).rank
    if ctx.attr("training_mode", 0):
        return _batch_norm_training(ctx, x, r)
    scale, bias, mean, var = (_per_channel(g, ctx.x(i), r) for i in (1, 2, 3, 4))
    eps = scalar(g, ctx.attr("epsilon", 1e-5), x)
    inv = un(g, U.RSQRT, bin_(g, B.ADD, var, eps))
    y = bin_(g, B.MUL, bin_(g, B.SUB, x, mean), bin_(g, B.MUL, inv, scale))
    return bin_(g, B.ADD, y, bias)


def _batch_norm_training(ctx: NodeCtx, x: int, r: int) -> list[int]:
    """Batch statistics (population variance) and the momentum-updated running stats."""
    g = ctx.g
    axes = (0, *range(2, r))
    mean = g.apply(Reduce(ReduceKind.MEAN, axes, True), [x])
    d = bin_(g, B.SUB, x, mean)
    var = g.apply(Reduce(ReduceKind.MEAN, axes, True), [bin_(g, B.MUL, d, d)])
    scale, bias = (_per_channel(g, ctx.x(i), r) for i in (1, 2))
    inv = un(g, U.RSQRT, bin_(g, B.ADD, var, scalar(g, ctx.attr("epsilon", 1e-5), x)))
    y = bin_(g, B.ADD, bin_(g, B.MUL, d, bin_(g, B.MUL, inv, scale)), bias)
    c = ctx.shape(x).dims[1]
    m = float(ctx.attr("momentum", 0.9))
    mean1, var1 = g.apply(Reshape((c,)), [mean]), g.apply(Reshape((c,)), [var])

    def run(old: int, new: int) -> int:
        a = bin_(g, B.MUL, old, scalar(g, m, old))
        return bin_(g, B.ADD, a, bin_(g, B.MUL, new, scalar(g, 1 - m, new)))

    return [y, run(ctx.x(3), mean1), run(ctx.x(4), var1)]


def _flat_norm(ctx: NodeCtx, rms: bool) -> list[int | None]:
    """LayerNormalization / RMSNormalization over dims ``axis..`` as one last axis."""
    g, x = ctx.g, ctx.x(0)
    s = ctx.shape(x)
    ax = axis_of(ctx.attr("axis", -1), s.rank)
    eps = float(ctx.attr("epsilon", 1e-5))
    dt = s.dtype
    if dt in (DType.BF16, DType.F16):
        x = cast(g, x, DType.F32)
    n = dims_product(s.dims[ax:])
    flat = g.apply(Reshape((*s.dims[:ax], n)), [x])
    outs: list[int | None] = []
    gamma = ctx.x(1)
    gshape = ctx.shape(gamma)
    if gshape.dims != s.dims[ax:]:
        gamma = g.apply(_expand_to(ctx, "scale", s.dims[ax:], gshape), [gamma])
    gamma = cast(g, g.apply(Reshape((n,)), [gamma]), g.shape(flat).dtype)
    beta = None
    if not rms and ctx.has(2):
        beta = ctx.x(2)
        if ctx.shape(beta).dims != s.dims[ax:]:
            beta = g.apply(_expand_to(ctx, "bias", s.dims[ax:], ctx.shape(beta)), [beta])
        beta = cast(g, g.apply(Reshape((n,)), [beta]), g.shape(flat).dtype)
    if rms:
        y = g.apply(RmsNorm(eps, False), [flat, gamma])
    elif beta is None:
        y = g.apply(LayerNorm(eps, False), [flat, gamma])
    else:
        y = g.apply(LayerNorm(eps, True), [flat, gamma, beta])
    y = cast(g, g.apply(Reshape(s.dims), [y]), dt)
    outs.append(y)
    want_stats = len(ctx.node.output) > 1 and any(ctx.node.output[1:])
    if want_stats:
        kd = tuple(s.dims[:ax]) + (1,) * (s.rank - ax)
        mean = g.apply(Reduce(ReduceKind.MEAN, (ax,), True), [flat])
        d = bin_(g, B.SUB, flat, mean)
        var = g.apply(Reduce(ReduceKind.MEAN, (ax,), True), [bin_(g, B.MUL, d, d)])
        inv = un(g, U.RSQRT, bin_(g, B.ADD, var, scalar(g, eps, var)))
        sdt = DType.F32 if ctx.attr("stash_type", 1) == 1 else dt
        outs.append(cast(g, g.apply(Reshape(kd), [mean]), sdt))
        outs.append(cast(g, g.apply(Reshape(kd), [inv]), sdt))
    return outs


def _expand_to(ctx: NodeCtx, what: str, dims, shape):  # noqa: ANN001, ANN202
    """Expand of ``what`` (scale or bias) to the normalized dims; OnnxImportError when its
    rank exceeds theirs (it cannot broadcast to them)."""
    from rlx.ops.movement import Expand

    if len(shape.dims) > len(dims):
        raise OnnxImportError(
            f"{ctx.node.op_type} node {ctx.node.name!r}: {what} of shape {list(shape.dims)} "
            f"does not broadcast to the normalized dims {list(dims)}"
        )
    return Expand(tuple(dims))


@converter("LayerNormalization", since=17)
def layer_norm(ctx: NodeCtx) -> list[int | None]:
    return _flat_norm(ctx, rms=False)


@converter("RMSNormalization", since=23)
def rms_norm(ctx: NodeCtx) -> list[int | None]:
    return _flat_norm(ctx, rms=True)


@converter("GroupNormalization", since=18)
@in_f32
def group_norm(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    s = ctx.shape(x)
    groups = int(ctx.attr("num_groups"))
    c = s.dims[1]
    gamma, beta = ctx.x(1), ctx.x(2)
    if ctx.opset < 21:  # scale / bias per group: repeat each over its channels
        from rlx.ops.movement import Expand

        per = int(c) // groups
        gamma = g.apply(
            Reshape((c,)),
            [g.apply(Expand((groups, per)), [g.apply(Reshape((groups, 1)), [gamma])])],
        )
        beta = g.apply(
            Reshape((c,)), [g.apply(Expand((groups, per)), [g.apply(Reshape((groups, 1)), [beta])])]
        )
    gamma, beta = cast(g, gamma, g.shape(x).dtype), cast(g, beta, g.shape(x).dtype)
    return g.apply(GroupNorm(groups, float(ctx.attr("epsilon", 1e-5))), [x, gamma, beta])


@converter("InstanceNormalization", since=6)
@in_f32
def instance_norm(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    c = int(ctx.shape(x).dims[1])
    gamma, beta = cast(g, ctx.x(1), ctx.dtype(x)), cast(g, ctx.x(2), ctx.dtype(x))
    return g.apply(GroupNorm(c, float(ctx.attr("epsilon", 1e-5))), [x, gamma, beta])


@converter("MeanVarianceNormalization", since=9)
@in_f32
def mvn(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    axes = tuple(axis_of(a, ctx.shape(x).rank) for a in (ctx.attr("axes") or [0, 2, 3]))
    mean = g.apply(Reduce(ReduceKind.MEAN, axes, True), [x])
    d = bin_(g, B.SUB, x, mean)
    var = g.apply(Reduce(ReduceKind.MEAN, axes, True), [bin_(g, B.MUL, d, d)])
    return bin_(g, B.DIV, d, bin_(g, B.ADD, un(g, U.SQRT, var), scalar(g, 1e-9, x)))


@converter("LpNormalization", since=1)
@in_f32
def lp_norm(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    ax = axis_of(ctx.attr("axis", -1), ctx.shape(x).rank)
    p = ctx.attr("p", 2)
    if p == 1:
        n = g.apply(Reduce(ReduceKind.SUM, (ax,), True), [un(g, U.ABS, x)])
    elif p == 2:
        n = un(g, U.SQRT, g.apply(Reduce(ReduceKind.SUM, (ax,), True), [bin_(g, B.MUL, x, x)]))
    else:
        raise ctx.unsupported(f"p={p} (ONNX allows 1 or 2)")
    from rlx.frontends.onnx.ops.util import cmp, where
    from rlx.ops.elementwise import CompareKind as C

    zero = cmp(g, C.EQ, n, scalar(g, 0, n))
    return where(g, zero, scalar(g, 0, x), bin_(g, B.DIV, x, n))
