"""Placement ops as scatters with indices known at import (or computed in the graph):
Col2Im (``scatter_add`` of each block tap to its image position, as ConvTranspose's
col2im), MaxUnpool (``scatter_elements`` of the values to their flat indices, then zero
padding to output_shape) and TensorScatter (a KV-cache write: ``scatter_elements`` along
the sequence axis at ``write_indices[b] + s``, modulo the cache length when circular)."""

from __future__ import annotations

import itertools

import numpy as np

from rlx.dtype import DType
from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import axis_of, bin_, cast, scalar
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.indexing import ScatterElements
from rlx.ops.movement import Expand, Pad, Reshape, ScatterAdd, Slice


@converter("Col2Im", since=18)
def col2im(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    img = ctx.ints(1, "image_shape")
    blk = ctx.ints(2, "block_shape")
    nd = len(img)
    s = list(ctx.attr("strides") or [1] * nd)
    d = list(ctx.attr("dilations") or [1] * nd)
    p = list(ctx.attr("pads") or [0] * (2 * nd))
    n, ck, L = (int(v) for v in ctx.shape(x).dims)
    kk = int(np.prod(blk))
    c = ck // kk
    nblk = [(img[i] + p[i] + p[i + nd] - d[i] * (blk[i] - 1) - 1) // s[i] + 1 for i in range(nd)]
    if int(np.prod(nblk)) != L:
        raise ctx.error(f"{L} blocks given, the image and block shapes make {int(np.prod(nblk))}")
    q = int(np.prod(img))
    idx = np.full((kk, L), q, np.int64)
    for ki, kv in enumerate(itertools.product(*[range(v) for v in blk])):
        for li, lv in enumerate(itertools.product(*[range(v) for v in nblk])):
            pos = [lv[a] * s[a] + kv[a] * d[a] - p[a] for a in range(nd)]
            if all(0 <= pos[a] < img[a] for a in range(nd)):
                idx[ki, li] = int(np.ravel_multi_index(pos, img))
    cols = g.apply(Reshape((n, c, kk * L)), [x])
    zeros = g.constant(np.zeros((n, c, q + 1), ctx.dtype(x).np))
    y = g.apply(ScatterAdd(2), [zeros, g.constant(idx.reshape(-1)), cols])
    y = g.apply(Slice((None, None, 0), (None, None, q), (1, 1, 1)), [y])
    return g.apply(Reshape((n, c, *img)), [y])


@converter("MaxUnpool", since=9)
def max_unpool(ctx: NodeCtx) -> int:
    g, x, ind = ctx.g, ctx.x(0), ctx.x(1)
    xs = [int(v) for v in ctx.shape(x).dims]
    k = [int(v) for v in ctx.attr("kernel_shape")]
    nd = len(k)
    st = list(ctx.attr("strides") or [1] * nd)
    pads = list(ctx.attr("pads") or [0] * (2 * nd))
    inferred = xs[:2] + [
        (xs[2 + i] - 1) * st[i] - (pads[i] + pads[nd + i]) + k[i] for i in range(nd)
    ]
    want = ctx.ints(2, "output_shape") if ctx.has(2) else inferred
    total = int(np.prod(inferred))
    m = int(np.prod(xs))
    y = g.constant(np.zeros((total,), ctx.dtype(x).np))
    flat_i = g.apply(Reshape((m,)), [cast(g, ind, DType.I64)])
    y = g.apply(ScatterElements(0), [y, flat_i, g.apply(Reshape((m,)), [x])])
    y = g.apply(Reshape(tuple(inferred)), [y])
    extra = [(0, w - i) for w, i in zip(want, inferred, strict=True)]
    if any(hi for _, hi in extra):
        y = g.apply(Pad(tuple(extra), 0.0), [y])
    return y


@converter("TensorScatter", since=24)
def tensor_scatter(ctx: NodeCtx) -> int:
    g, past, upd = ctx.g, ctx.x(0), ctx.x(1)
    ps, us = ctx.shape(past), ctx.shape(upd)
    r = ps.rank
    ax = axis_of(ctx.attr("axis", -2), r)
    L, S, nb = int(ps.dims[ax]), int(us.dims[ax]), int(ps.dims[0])
    iota = g.constant(np.arange(S, dtype=np.int64).reshape([S if i == ax else 1 for i in range(r)]))
    if ctx.has(2):
        w = g.apply(Reshape((nb,) + (1,) * (r - 1)), [cast(g, ctx.x(2), DType.I64)])
        idx = bin_(g, B.ADD, iota, w)
    else:
        idx = iota
    if ctx.attr("mode", "linear") == "circular":
        idx = bin_(g, B.MOD, idx, scalar(g, L, idx))
    idx = g.apply(Expand(us.dims), [idx])
    return g.apply(ScatterElements(ax), [past, idx, upd])
