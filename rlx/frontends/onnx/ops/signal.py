"""Signal and grid ONNX ops: the window functions (Hann, Hamming, Blackman: constants of a
size known at import), AffineGrid (a constant base grid times theta, one matmul), SwiGLU,
and LRN (the channel-window sum of squares as a matmul with a constant band matrix)."""

from __future__ import annotations

import numpy as np

from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.dtypes import to_dtype
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.elementwise import in_f32
from rlx.frontends.onnx.ops.util import bin_, scalar, un
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Reshape, Transpose


@converter("HannWindow", "HammingWindow", "BlackmanWindow", since=17)
def window(ctx: NodeCtx) -> np.ndarray:
    size = int(np.asarray(ctx.value(0, "size")).reshape(-1)[0])
    dt = to_dtype(ctx.attr("output_datatype", 1), "window output_datatype")
    n1 = size if ctx.attr("periodic", 1) else size - 1
    ni = np.arange(size, dtype=np.float64)
    op = ctx.node.op_type
    if op == "HannWindow":
        w = np.sin(ni * np.pi / n1) ** 2
    elif op == "HammingWindow":
        a = 25.0 / 46.0
        w = a - np.cos(ni * np.pi * 2 / n1) * (1 - a)
    else:
        w = 0.42 - 0.5 * np.cos(ni * np.pi * 2 / n1) + 0.08 * np.cos(ni * np.pi * 4 / n1)
    return w.astype(dt.np)


@converter("AffineGrid", since=20)
def affine_grid(ctx: NodeCtx) -> int:
    g, theta = ctx.g, ctx.x(0)
    size = ctx.ints(1, "size")
    spatial = size[2:]
    align = bool(ctx.attr("align_corners", 0))

    def axis(n: int) -> np.ndarray:
        if n == 1:
            return np.zeros(1)
        if align:
            return np.linspace(-1.0, 1.0, n)
        return (2 * np.arange(n) + 1) / n - 1

    # coordinates in (x, y[, z]) order: x runs along the last spatial dim
    mesh = np.meshgrid(*[axis(n) for n in spatial], indexing="ij")
    coords = [m.reshape(-1) for m in reversed(mesh)]
    base = np.stack([*coords, np.ones_like(coords[0])], axis=-1)  # [P, nd+1]
    dt = ctx.dtype(theta)
    n = size[0]
    th = g.apply(Transpose((0, 2, 1)), [theta])  # [N, nd+1, nd]
    y = g.apply(MatMul(), [g.constant(base.astype(dt.np)), th])  # [N, P, nd]
    return g.apply(Reshape((n, *spatial, len(spatial))), [y])


@converter("SwiGLU", since=24)
@in_f32
def swiglu(ctx: NodeCtx) -> int:
    g, a, b = ctx.g, ctx.x(0), ctx.x(1)
    alpha = float(ctx.attr("alpha", 1.0))
    gate = bin_(g, B.MUL, a, un(g, U.SIGMOID, bin_(g, B.MUL, a, scalar(g, alpha, a))))
    return bin_(g, B.MUL, gate, b)


@converter("LRN", since=1)
@in_f32
def lrn(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    s = ctx.shape(x)
    c = int(s.dims[1])
    size = int(ctx.attr("size"))
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    band = np.zeros((c, c), np.float32)
    for j in range(c):
        band[max(0, j - lo) : min(c, j + hi + 1), j] = 1.0
    r = s.rank
    perm = (0, *range(2, r), 1)
    inv = tuple(int(i) for i in np.argsort(perm))
    sq = g.apply(Transpose(perm), [bin_(g, B.MUL, x, x)])
    ssum = g.apply(Transpose(inv), [g.apply(MatMul(), [sq, g.constant(band.astype(s.dtype.np))])])
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    d = bin_(g, B.ADD, bin_(g, B.MUL, ssum, scalar(g, alpha / size, x)), scalar(g, bias, x))
    return bin_(g, B.DIV, x, bin_(g, B.POW, d, scalar(g, beta, x)))
