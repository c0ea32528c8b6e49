"""Matrix products, convolution and pooling ONNX ops -> rlx matmul / conv / pool (MatMul,
Gemm, Conv, MaxPool, AveragePool, Global*Pool, LpPool). Spatial attributes (auto_pad, pads,
strides, dilations, ceil_mode, count_include_pad) become explicit rlx attributes; forms rlx
has no op for (3-D conv, dilated pooling, MaxPool's indices output) are named unsupported."""

from __future__ import annotations

import math

from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.pool import window_pool
from rlx.frontends.onnx.ops.util import bin_, scalar, un
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Pad, Transpose
from rlx.ops.nn import Conv, Pool, PoolKind
from rlx.ops.reduce import Reduce, ReduceKind


@converter("MatMul", since=1)
def matmul(ctx: NodeCtx) -> int:
    return ctx.g.apply(MatMul(), [ctx.x(0), ctx.x(1)])


@converter("Gemm", since=7)
def gemm(ctx: NodeCtx) -> int:
    g, a, b = ctx.g, ctx.x(0), ctx.x(1)
    if ctx.attr("transA", 0):
        a = g.apply(Transpose((1, 0)), [a])
    if ctx.attr("transB", 0):
        b = g.apply(Transpose((1, 0)), [b])
    y = g.apply(MatMul(), [a, b])
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if alpha != 1.0:
        y = bin_(g, B.MUL, y, scalar(g, alpha, y))
    if ctx.has(2) and beta != 0.0:
        c = ctx.x(2)
        if beta != 1.0:
            c = bin_(g, B.MUL, c, scalar(g, beta, c))
        y = bin_(g, B.ADD, y, c)
    return y


def _spatial(ctx: NodeCtx, x_dims, k: list[int]) -> tuple:  # noqa: ANN001
    """(strides, dilations, [(lo, hi)] pads) from the node's attributes."""
    nd = len(k)
    strides = list(ctx.attr("strides") or [1] * nd)
    dil = list(ctx.attr("dilations") or [1] * nd)
    auto = ctx.attr("auto_pad", "NOTSET")
    if not all(isinstance(d, int) for d in x_dims[2:]):
        dims = ", ".join(str(d) for d in x_dims)
        raise ctx.unsupported(
            f"{ctx.node.op_type} over the symbolic spatial dims of [{dims}] (rlx convolves "
            f"and pools static spatial sizes; fix them with load(..., input_dims=...))"
        )
    sp = [int(d) for d in x_dims[2:]]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for n, kk, s, d in zip(sp, k, strides, dil, strict=True):
            out = -(-n // s)
            total = max((out - 1) * s + (kk - 1) * d + 1 - n, 0)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            pads.append((lo, total - lo))
    elif auto == "VALID":
        pads = [(0, 0)] * nd
    else:
        p = list(ctx.attr("pads") or [0] * (2 * nd))
        pads = [(p[i], p[i + nd]) for i in range(nd)]
    return strides, dil, pads


@converter("Conv", since=1)
def conv(ctx: NodeCtx) -> int:
    g, x, w = ctx.g, ctx.x(0), ctx.x(1)
    ws = ctx.shape(w)
    k = [int(d) for d in ws.dims[2:]]
    if len(k) not in (1, 2):
        raise ctx.unsupported(f"a {len(k)}-D Conv (rlx convolves 1-D and 2-D)")
    strides, dil, pads = _spatial(ctx, ctx.shape(x).dims, k)
    op = Conv(tuple(strides), tuple(pads), tuple(dil), int(ctx.attr("group", 1)), ctx.has(2))
    return g.apply(op, [x, w, ctx.x(2)] if ctx.has(2) else [x, w])


def _ceil_extra(n: int, k: int, s: int, lo: int, hi: int, d: int = 1) -> int:
    """Extra hi padding giving ceil_mode's output size (the last window must start inside
    the input or its left padding, as ONNX and PyTorch require)."""
    span = n + lo + hi - d * (k - 1) - 1
    out = -(-span // s) + 1
    if (out - 1) * s >= n + lo:
        out -= 1
    return max((out - 1) * s + d * (k - 1) + 1 - (n + lo + hi), 0)


@converter("MaxPool", "AveragePool", since=1)
def pool(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    k = [int(v) for v in ctx.attr("kernel_shape")]
    if len(k) not in (1, 2, 3):
        raise ctx.unsupported(f"{len(k)}-D pooling")
    if len([o for o in ctx.node.output if o]) > 1:
        raise ctx.unsupported("MaxPool's Indices output")
    dims = ctx.shape(x).dims
    strides, dil, pads = _spatial(ctx, dims, k)
    avg = ctx.node.op_type == "AveragePool"
    ceil, cip = bool(ctx.attr("ceil_mode", 0)), bool(ctx.attr("count_include_pad", 0))
    if (
        len(k) == 3
        or any(d != 1 for d in dil)
        or (ceil and cip and avg)
        or any(lo >= kk or hi >= kk for (lo, hi), kk in zip(pads, k, strict=True))
    ):
        return window_pool(ctx, x, "avg" if avg else "max", k, strides, dil, pads, ceil, cip)
    if ctx.attr("ceil_mode", 0):
        pads = [
            (lo, hi + _ceil_extra(int(n), kk, s, lo, hi))
            for n, kk, s, (lo, hi) in zip(dims[2:], k, strides, pads, strict=True)
        ]
    if avg and ctx.attr("count_include_pad", 0) and any(lo or hi for lo, hi in pads):
        if ctx.attr("ceil_mode", 0):
            raise ctx.unsupported("AveragePool with both ceil_mode and count_include_pad")
        zero = ((0, 0), (0, 0))
        x = g.apply(Pad(zero + tuple(pads), 0.0), [x])
        pads = [(0, 0)] * len(k)
    if any(lo >= kk or hi >= kk for (lo, hi), kk in zip(pads, k, strict=True)):
        raise ctx.unsupported(f"pads {pads} as large as the window {k}")
    op = Pool(PoolKind.AVG if avg else PoolKind.MAX, tuple(k), tuple(strides), tuple(pads))
    return g.apply(op, [x])


@converter("GlobalAveragePool", "GlobalMaxPool", since=1)
def global_pool(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    r = ctx.shape(x).rank
    kind = ReduceKind.MEAN if ctx.node.op_type == "GlobalAveragePool" else ReduceKind.MAX
    return ctx.g.apply(Reduce(kind, tuple(range(2, r)), True), [x])


@converter("LpPool", since=11)
def lp_pool(ctx: NodeCtx) -> int:
    """``(sum over the window of |x|^p)^(1/p)``: an average pool of |x|^p (padding included
    in the count) times the window size."""
    g, x = ctx.g, ctx.x(0)
    p = float(ctx.attr("p", 2))
    k = [int(v) for v in ctx.attr("kernel_shape")]
    if len(k) not in (1, 2, 3):
        raise ctx.unsupported(f"{len(k)}-D pooling")
    strides, dil, pads = _spatial(ctx, ctx.shape(x).dims, k)
    if len(k) == 3 or any(d != 1 for d in dil) or ctx.attr("ceil_mode", 0):
        ceil = bool(ctx.attr("ceil_mode", 0))
        return window_pool(ctx, x, "lp", k, strides, dil, pads, ceil, True, p)
    xp = bin_(g, B.POW, un(g, U.ABS, x), scalar(g, p, x))
    if any(lo or hi for lo, hi in pads):
        xp = g.apply(Pad(((0, 0), (0, 0), *pads), 0.0), [xp])
    y = g.apply(Pool(PoolKind.AVG, tuple(k), tuple(strides), ((0, 0),) * len(k)), [xp])
    y = bin_(g, B.MUL, y, scalar(g, math.prod(k), y))
    return bin_(g, B.POW, y, scalar(g, 1.0 / p, y))
