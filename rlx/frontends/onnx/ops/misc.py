"""ONNX ops that build constants or fixed index patterns: Range, EyeLike, Trilu,
DepthToSpace, SpaceToDepth, CenterCropPad, Compress, NonZero, ReverseSequence. Values that
decide a shape (Range's bounds, NonZero's input) must be known at import."""

from __future__ import annotations

import math

import numpy as np

from rlx.dtype import DType
from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.dtypes import to_dtype
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import axis_of, scalar, where
from rlx.ops.movement import Gather, Pad, Reshape, Slice, Transpose


@converter("Range", since=11)
def range_(ctx: NodeCtx) -> np.ndarray | int:
    if ctx.node.input[1] in ctx.st.syms:  # 0, 1, ..., n-1 for a symbolic n
        from rlx.frontends.onnx.ops.shape import arange

        (n,) = ctx.dims(1, "limit")
        start, delta = (np.asarray(ctx.value(i)).reshape(-1)[0] for i in (0, 2))
        if start != 0 or delta != 1:
            raise ctx.unsupported(f"Range({start}, {n}, {delta}) with a symbolic limit")
        out = arange(ctx, n)
        dt = DType.from_numpy(start.dtype)
        return out if dt is DType.I64 else ctx.g.cast(out, dt)
    start, limit, delta = (np.asarray(ctx.value(i)).reshape(-1)[0] for i in range(3))
    dt = start.dtype
    n = max(math.ceil((float(limit) - float(start)) / float(delta)), 0)
    return (start + np.arange(n, dtype=dt) * delta).astype(dt)


@converter("EyeLike", since=9)
def eye_like(ctx: NodeCtx) -> np.ndarray:
    s = ctx.in_shape(0)
    if not s.is_static:
        raise ctx.unsupported(f"EyeLike of the symbolic shape {s}")
    dt = to_dtype(ctx.attr("dtype"), "EyeLike dtype") if ctx.has_attr("dtype") else s.dtype
    r, c = (int(d) for d in s.dims)
    return np.eye(r, c, k=int(ctx.attr("k", 0)), dtype=dt.np)


@converter("Trilu", since=14)
def trilu(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    s = ctx.shape(x)
    k = int(np.asarray(ctx.value(1, "k")).reshape(-1)[0]) if ctx.has(1) else 0
    n, m = (int(d) for d in s.dims[-2:])
    keep = (
        np.triu(np.ones((n, m), bool), k)
        if ctx.attr("upper", 1)
        else np.tril(np.ones((n, m), bool), k)
    )
    return where(g, g.constant(keep), x, scalar(g, 0, x))


@converter("DepthToSpace", since=11)
def depth_to_space(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    b = int(ctx.attr("blocksize"))
    n, c, h, w = ctx.shape(x).dims
    c2 = int(c) // (b * b)
    if ctx.attr("mode", "DCR") == "DCR":
        y = g.apply(Reshape((n, b, b, c2, h, w)), [x])
        y = g.apply(Transpose((0, 3, 4, 1, 5, 2)), [y])
    else:
        y = g.apply(Reshape((n, c2, b, b, h, w)), [x])
        y = g.apply(Transpose((0, 1, 4, 2, 5, 3)), [y])
    return g.apply(Reshape((n, c2, h * b, w * b)), [y])


@converter("SpaceToDepth", since=13)
def space_to_depth(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    b = int(ctx.attr("blocksize"))
    n, c, h, w = ctx.shape(x).dims
    y = g.apply(Reshape((n, c, int(h) // b, b, int(w) // b, b)), [x])
    if ctx.attr("mode", "DCR") == "DCR":
        y = g.apply(Transpose((0, 3, 5, 1, 2, 4)), [y])
    else:
        y = g.apply(Transpose((0, 1, 3, 5, 2, 4)), [y])
    return g.apply(Reshape((n, c * b * b, int(h) // b, int(w) // b)), [y])


@converter("CenterCropPad", since=18)
def center_crop_pad(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    s = ctx.shape(x)
    want = ctx.ints(1, "shape")
    axes = [axis_of(a, s.rank) for a in (ctx.attr("axes") or range(s.rank))]
    st: list[int | None] = [None] * s.rank
    en: list[int | None] = [None] * s.rank
    pads = [(0, 0)] * s.rank
    for a, w in zip(axes, want, strict=True):
        n = int(s.dims[a])
        if w < n:
            lo = (n - w) // 2
            st[a], en[a] = lo, lo + w
        elif w > n:
            lo = (w - n) // 2
            pads[a] = (lo, w - n - lo)
    y = g.apply(Slice(tuple(st), tuple(en), (1,) * s.rank), [x])
    return g.apply(Pad(tuple(pads), 0.0), [y])


@converter("Compress", since=9)
def compress(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    cond = np.asarray(ctx.value(1, "condition")).astype(bool).reshape(-1)
    ax = ctx.attr("axis")
    if ax is None:
        x = g.apply(Reshape((int(np.prod(ctx.shape(x).concrete())),)), [x])
        ax = 0
    ax = axis_of(ax, ctx.shape(x).rank)
    n = int(ctx.shape(x).dims[ax])
    idx = np.nonzero(cond[:n])[0].astype(np.int64)
    return g.apply(Gather(ax), [x, g.constant(idx)])


@converter("NonZero", since=9)
def nonzero(ctx: NodeCtx) -> np.ndarray:
    return np.asarray(np.nonzero(np.asarray(ctx.value(0, "input"))), dtype=np.int64)


@converter("ReverseSequence", since=10)
def reverse_sequence(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    lens = ctx.ints(1, "sequence_lens")
    s = ctx.shape(x)
    bax, tax = int(ctx.attr("batch_axis", 1)), int(ctx.attr("time_axis", 0))
    nb, nt = int(s.dims[bax]), int(s.dims[tax])
    # a flat gather over (batch, time) pairs: row b reads time t' = len-1-t for t < len
    perm = [bax, tax] + [i for i in range(s.rank) if i not in (bax, tax)]
    y = g.apply(Transpose(tuple(perm)), [x])
    rest = tuple(s.dims[i] for i in perm[2:])
    flat = g.apply(Reshape((nb * nt, *rest)), [y])
    idx = np.array(
        [b * nt + (lens[b] - 1 - t if t < lens[b] else t) for b in range(nb) for t in range(nt)],
        np.int64,
    )
    y = g.apply(Reshape((nb, nt, *rest)), [g.apply(Gather(0), [flat, g.constant(idx)])])
    inv = tuple(int(i) for i in np.argsort(perm))
    return g.apply(Transpose(inv), [y])
