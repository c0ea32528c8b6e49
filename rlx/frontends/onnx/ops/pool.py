"""Pooling that rlx's ``pool`` op cannot express (3-D windows, dilations, ceil_mode with
count_include_pad, LpPool with those) as a gather of each window's taps along every
spatial axis, then a reduction over the tap axes. Which taps count follows the ONNX
reference exactly: ceil_mode's extra padding is split between head and tail, taps past
the explicitly padded extent never count, padding counts in an average only with
count_include_pad (as zeros), and never in a max."""

from __future__ import annotations

import numpy as np

from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops.util import bin_, scalar, un, where
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.movement import Gather, Reshape
from rlx.ops.reduce import Reduce, ReduceKind

__all__ = ["window_pool"]


def _axis_taps(n: int, k: int, s: int, d: int, lo: int, hi: int, ceil: bool):  # noqa: ANN202
    """(index [o, k] into x (clamped), real [o, k], in_extent [o, k]) for one axis."""
    sw = d * (k - 1) + 1
    size = (n + lo + hi - sw) / s + 1
    out = int(np.ceil(size)) if ceil else int(np.floor(size))
    if ceil and (out - 1) * s >= n + lo:
        out -= 1
    extra = max((out - 1) * s + sw - n - lo - hi, 0)
    head = lo + extra // 2
    p = np.arange(out)[:, None] * s + np.arange(k)[None, :] * d  # position in the padded x
    q = p - head  # position in x
    real = (q >= 0) & (q < n)
    in_extent = p < n + lo + hi
    return np.clip(q, 0, n - 1), real, in_extent


def window_pool(
    ctx: NodeCtx, x: int, kind: str, k, strides, dil, pads, ceil: bool, include_pad: bool,
    p: float = 2.0,
) -> int:  # noqa: ANN001  # fmt: skip
    """``kind`` 'max', 'avg' or 'lp' pooling of ``x [N, C, *sp]`` (see the docstring)."""
    g = ctx.g
    dims = [int(v) for v in ctx.shape(x).dims]
    nd = len(k)
    reals, incl, outs = [], [], []
    y = x
    for a in range(nd):
        idx, real, ext = _axis_taps(dims[2 + a], k[a], strides[a], dil[a], *pads[a], ceil)
        o = idx.shape[0]
        outs.append(o)
        ax = 2 + 2 * a  # x is [N, C, o1, k1, ..., o_a-1, k_a-1, n_a, ...]
        y = g.apply(Gather(ax), [y, g.constant(idx.reshape(-1).astype(np.int64))])
        shp = list(g.shape(y).dims)
        y = g.apply(Reshape((*shp[:ax], o, k[a], *shp[ax + 1 :])), [y])
        reals.append(real)
        incl.append(ext & (real | (include_pad and kind != "max")))
    real_all = _outer(reals)
    incl_all = _outer(incl)
    tap_axes = tuple(3 + 2 * a for a in range(nd))
    dt = ctx.dtype(x)
    if kind == "max":
        low = -np.inf if dt.is_float else np.iinfo(dt.np).min
        keep = g.constant(real_all & incl_all)
        y = where(g, keep, y, scalar(g, low, y))
        return g.apply(Reduce(ReduceKind.MAX, tap_axes, False), [y])
    y = where(g, g.constant(real_all & incl_all), y, scalar(g, 0, y))
    if kind == "lp":
        y = bin_(g, B.POW, un(g, U.ABS, y), scalar(g, p, y))
        s = g.apply(Reduce(ReduceKind.SUM, tap_axes, False), [y])
        return bin_(g, B.POW, s, scalar(g, 1.0 / p, s))
    s = g.apply(Reduce(ReduceKind.SUM, tap_axes, False), [y])
    count = incl_all.sum(axis=tuple(2 * a + 1 for a in range(nd)))
    return bin_(g, B.DIV, s, g.constant(count.astype(dt.np).reshape(outs)))


def _outer(per_axis: list[np.ndarray]) -> np.ndarray:
    """[o1, k1, o2, k2, ...] from per-axis [o, k] masks (logical and of all)."""
    out = np.ones((), bool)
    for m in per_axis:
        out = out[..., None, None] & m
    return out
