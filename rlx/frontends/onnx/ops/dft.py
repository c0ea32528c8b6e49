"""DFT (opsets 17 and 20) and STFT as matmuls with constant cosine / sine matrices: the
transform is linear in the real and imaginary parts, and its length is known at import.
Forward (full or one-sided), inverse (complex output) and the one-sided inverse (a real
output, each inner frequency counted twice as the Hermitian half it stands for), with
zero-padding or truncation to ``dft_length``; STFT frames are gathered first."""

from __future__ import annotations

import numpy as np

from rlx.dtype import DType
from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import axis_of, bin_, cast
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import Unary, UnaryKind
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Concat, Gather, Reshape, Slice, Transpose


def _matrices(n_in: int, length: int, inverse: bool, onesided: bool):  # noqa: ANN202
    """(cos, sin) [n_in, n_out] such that out_re = re@C + im@S, out_im = im@C - re@S."""
    t = np.arange(n_in)[:, None].astype(np.float64)
    if not inverse:
        k = np.arange(length // 2 + 1 if onesided else length)[None, :]
        ang = 2 * np.pi * t * k / length
        valid = (t < length).astype(np.float64)
        return np.cos(ang) * valid, np.sin(ang) * valid
    # inverse: rows are frequencies k (the input), columns are times
    out_t = np.arange(length)[None, :]
    ang = 2 * np.pi * t * out_t / length
    if not onesided:
        valid = (t < length).astype(np.float64)
        return np.cos(ang) * valid / length, -np.sin(ang) * valid / length
    m = length // 2 + 1
    w = np.where((t == 0) | ((length % 2 == 0) & (t == length // 2)), 1.0, 2.0) * (t < m)
    return np.cos(ang) * w / length, -np.sin(ang) * w / length


def _last_part(g, x: int, i: int) -> int:  # noqa: ANN001
    r = g.shape(x).rank
    y = g.apply(Slice((None,) * (r - 1) + (i,), (None,) * (r - 1) + (i + 1,), (1,) * r), [x])
    return g.apply(Reshape(g.shape(y).dims[:-1]), [y])


def dft(ctx: NodeCtx, x: int, axis: int, length: int | None, inverse: bool, onesided: bool) -> int:
    """``x [..., n, 1|2]`` transformed along ``axis`` -> ``[..., n_out, 2]`` (or ``[..., L, 1]``
    for a one-sided inverse)."""
    g = ctx.g
    dt = ctx.dtype(x)
    r = ctx.shape(x).rank
    c = int(ctx.shape(x).dims[-1])
    n_in = int(ctx.shape(x).dims[axis])
    if length is None:
        length = 2 * (n_in - 1) if inverse and onesided else n_in
    cm, sm = _matrices(n_in, length, inverse, onesided)
    ct = DType.F32 if dt in (DType.F16, DType.BF16) else dt
    perm = tuple(i for i in range(r - 1) if i != axis) + (axis,)
    inv = tuple(int(i) for i in np.argsort(perm))
    re = g.apply(Transpose(perm), [cast(g, _last_part(g, x, 0), ct)])
    im = g.apply(Transpose(perm), [cast(g, _last_part(g, x, 1), ct)]) if c == 2 else None
    C, S = g.constant(cm.astype(ct.np)), g.constant(sm.astype(ct.np))  # noqa: N806

    def mm(a: int, m: int) -> int:
        return g.apply(MatMul(), [a, m])

    out_re = mm(re, C) if im is None else bin_(g, B.ADD, mm(re, C), mm(im, S))
    parts = [out_re]
    if not (inverse and onesided):
        neg = mm(re, S)
        if im is not None:
            out_im = bin_(g, B.SUB, mm(im, C), neg)
        else:  # -re@S
            out_im = g.apply(Unary(UnaryKind.NEG), [neg])
        parts.append(out_im)
    outs = []
    for p in parts:
        p = g.apply(Transpose(inv), [p])
        outs.append(g.apply(Reshape((*g.shape(p).dims, 1)), [p]))
    y = outs[0] if len(outs) == 1 else g.apply(Concat(r - 1), outs)
    return cast(g, y, dt)


def _length(ctx: NodeCtx, i: int) -> int | None:
    if not ctx.has(i):
        return None
    return int(np.asarray(ctx.value(i, "dft_length")).reshape(-1)[0])


@converter("DFT", since=17, until=20)
def dft_17(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    ax = axis_of(ctx.attr("axis", 1), ctx.shape(x).rank)
    return dft(
        ctx, x, ax, _length(ctx, 1), bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    )


@converter("DFT", since=20)
def dft_20(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    a = int(np.asarray(ctx.value(2, "axis")).reshape(-1)[0]) if ctx.has(2) else -2
    ax = axis_of(a, ctx.shape(x).rank)
    return dft(
        ctx, x, ax, _length(ctx, 1), bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    )


@converter("STFT", since=17)
def stft(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    step = int(np.asarray(ctx.value(1, "frame_step")).reshape(-1)[0])
    b, n, c = (int(v) for v in ctx.shape(x).dims)
    window = ctx.x(2) if ctx.has(2) else None
    if ctx.has(3):
        flen = int(np.asarray(ctx.value(3, "frame_length")).reshape(-1)[0])
    else:
        flen = int(ctx.shape(window).dims[0])
    frames = (n - flen) // step + 1
    idx = (np.arange(frames)[:, None] * step + np.arange(flen)[None, :]).reshape(-1)
    f = g.apply(Gather(1), [x, g.constant(idx.astype(np.int64))])
    f = g.apply(Reshape((b, frames, flen, c)), [f])
    if window is not None:
        f = bin_(g, B.MUL, f, g.apply(Reshape((1, 1, flen, 1)), [window]))
    return dft(ctx, f, 2, flen, False, bool(ctx.attr("onesided", 1)))
