"""ConvTranspose -> a matmul and a col2im. Each input position p and kernel tap k adds
``x[p] * w[k]`` to output position ``p * stride + k * dilation - pad``: the per-tap
products are one (grouped) matmul ``wᵀ · x``, and the placement is a ``scatter_add`` along
the flattened output with indices fixed at import (taps that land outside the output go
to one extra slot, sliced off). Any number of spatial dims, groups, dilations,
output_padding, output_shape and auto_pad, as the ONNX reference computes them."""

from __future__ import annotations

import itertools

import numpy as np

from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import bin_
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Reshape, ScatterAdd, Slice, Transpose


def _geometry(ctx: NodeCtx, sp: list[int], k: list[int]):  # noqa: ANN202
    nd = len(sp)
    s = list(ctx.attr("strides") or [1] * nd)
    d = list(ctx.attr("dilations") or [1] * nd)
    op = list(ctx.attr("output_padding") or [0] * nd)
    out_shape = ctx.attr("output_shape")
    auto = ctx.attr("auto_pad", "NOTSET")
    pads = ctx.attr("pads")
    if pads is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        out = list(out_shape) if out_shape else [sp[i] * s[i] for i in range(nd)]
        total = [s[i] * (sp[i] - 1) + op[i] + (k[i] - 1) * d[i] + 1 - out[i] for i in range(nd)]
        if auto == "SAME_UPPER":
            lo = [t // 2 for t in total]
        else:
            lo = [t - t // 2 for t in total]
        return s, d, lo, out
    pads = list(pads or [0] * (2 * nd))
    lo = pads[:nd]
    if out_shape:
        out = list(out_shape)[-nd:]
    else:
        out = [s[i] * (sp[i] - 1) + op[i] + (k[i] - 1) * d[i] + 1 - pads[i] - pads[i + nd]
               for i in range(nd)]  # fmt: skip
    return s, d, lo, out


@converter("ConvTranspose", since=1)
def conv_transpose(ctx: NodeCtx) -> int:
    g, x, w = ctx.g, ctx.x(0), ctx.x(1)
    xs, ws = ctx.shape(x), ctx.shape(w)
    if not xs.is_static:
        raise ctx.unsupported(f"ConvTranspose of the symbolic shape {xs}")
    n, c = int(xs.dims[0]), int(xs.dims[1])
    sp = [int(v) for v in xs.dims[2:]]
    k = [int(v) for v in ws.dims[2:]]
    grp = int(ctx.attr("group", 1))
    og = int(ws.dims[1])
    o = og * grp
    s, d, lo, out = _geometry(ctx, sp, k)
    p, kk = int(np.prod(sp)), int(np.prod(k))
    xg = g.apply(Reshape((n, grp, c // grp, p)), [x])
    wg = g.apply(Reshape((grp, c // grp, og * kk)), [w])
    cols = g.apply(MatMul(), [g.apply(Transpose((0, 2, 1)), [wg]), xg])  # [n, g, og*kk, p]
    cols = g.apply(Reshape((n, o, kk * p)), [cols])
    q = int(np.prod(out))
    idx = np.full((kk, p), q, np.int64)
    for ki, kv in enumerate(itertools.product(*[range(v) for v in k])):
        for pi, pv in enumerate(itertools.product(*[range(v) for v in sp])):
            pos = [pv[a] * s[a] + kv[a] * d[a] - lo[a] for a in range(len(sp))]
            if all(0 <= pos[a] < out[a] for a in range(len(sp))):
                idx[ki, pi] = int(np.ravel_multi_index(pos, out))
    zeros = g.constant(np.zeros((n, o, q + 1), xs.dtype.np))
    y = g.apply(ScatterAdd(2), [zeros, g.constant(idx.reshape(-1)), cols])
    y = g.apply(Slice((None, None, 0), (None, None, q), (1, 1, 1)), [y])
    y = g.apply(Reshape((n, o, *out)), [y])
    if ctx.has(2):
        y = bin_(g, B.ADD, y, g.apply(Reshape((1, o) + (1,) * len(out)), [ctx.x(2)]))
    return y
