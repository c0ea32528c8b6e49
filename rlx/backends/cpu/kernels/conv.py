"""CPU kernels for convolution and pooling (1-D and 2-D): f32 through the native direct
loops of ``kernels/conv_native.py`` when they apply (small convolutions, every pool),
else by im2col + BLAS as below.

Each kernel owns a zero- (or -inf-) bordered copy of its input, allocated when the
schedule is built (private, not pooled, so its border survives between runs); a run
copies the input into its interior and reads every window through a strided view.

Conv: the windows are gathered into a ``[G, N*L, C/G*K]`` column buffer (L output
positions, K kernel taps) and multiplied by the ``[G, C/G*K, O/G]`` weights, one 2-D GEMM
per group, then scattered into ``[N, O, *out]`` (plus bias). Pool: max or sum over the
window axes with ``out=``; average divides by the precomputed count of real (unpadded)
elements per window, as the reference. f16/bf16 compute in f32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.kernels import Kernel, KernelCtx, KernelKind, kernel, lowp
from rlx.backends.cpu.kernels.conv_native import native_conv, native_pool
from rlx.ops.nn import Conv, Pool, PoolKind

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["conv_kernel", "pool_kernel", "window_view"]


def window_view(
    xp: np.ndarray, k: Sequence[int], stride: Sequence[int], dil: Sequence[int]
) -> np.ndarray:
    """``[N,C,*sp]`` -> ``[N,C,*out,*k]``: every (strided, dilated) window, as a view."""
    nd = len(k)
    spans = [d * (kk - 1) + 1 for kk, d in zip(k, dil, strict=True)]
    v = np.lib.stride_tricks.sliding_window_view(xp, spans, axis=tuple(range(2, 2 + nd)))
    idx = (
        slice(None),
        slice(None),
        *(slice(None, None, s) for s in stride),
        *(slice(None, None, d) for d in dil),
    )
    return v[idx]


def _bordered(
    x: np.ndarray, pads: Sequence[tuple[int, int]], fill: float
) -> tuple[np.ndarray, np.ndarray]:
    """A private buffer of ``x``'s shape plus ``pads`` on the spatial axes, filled with
    ``fill``, and the view of its interior where ``x`` goes."""
    shape = x.shape[:2] + tuple(n + lo + hi for n, (lo, hi) in zip(x.shape[2:], pads, strict=True))
    buf = np.full(shape, fill, dtype=x.dtype)
    inner = buf[
        (
            slice(None),
            slice(None),
            *(slice(lo, lo + n) for n, (lo, _) in zip(x.shape[2:], pads, strict=True)),
        )
    ]
    return buf, inner


@kernel(Conv, KernelKind.BLAS)
@lowp
def conv_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The native direct loop for small f32 convolutions (``kernels/conv_native.py``),
    else im2col + one GEMM per group (see module docstring)."""
    direct = native_conv(node, ins, out, ctx)
    if direct is not None:
        return direct
    op: Conv = node.op  # type: ignore[assignment]
    x, w = ins[:2]
    bias = ins[2] if len(ins) == 3 else None
    if x.dtype.kind != "f":
        return None
    n, c = x.shape[:2]
    o, g = w.shape[0], op.groups
    k = w.shape[2:]
    nd = len(k)
    cg, og, kk = c // g, o // g, math.prod(k)
    buf, inner = _bordered(x, op.padding, 0.0)
    win = window_view(buf, k, op.stride, op.dilation)  # [N, C, *out, *k]
    out_sp = win.shape[2 : 2 + nd]
    length = math.prod(out_sp)
    cols = ctx.scratch((g, n, *out_sp, cg, *k), x.dtype, 72)
    src = win.reshape(n, g, cg, *out_sp, *k)
    if not np.may_share_memory(src, buf):  # splitting C is always a view; stay safe
        return None
    perm = (1, 0, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd))
    src_t = src.transpose(perm)
    cols2 = cols.reshape(g, n * length, cg * kk)
    wt = ctx.scratch((g, cg * kk, og), x.dtype, 70)
    w_src = w.reshape(g, og, cg * kk).transpose(0, 2, 1)
    ys = ctx.scratch((g, n * length, og), x.dtype, 71)
    y_src = ys.reshape(g, n, length, og).transpose(1, 0, 3, 2)
    o4 = out.reshape(n, g, og, length)
    b_view = None if bias is None else bias.reshape((o,) + (1,) * nd)

    def run() -> None:
        np.copyto(inner, x)
        np.copyto(cols.reshape(src_t.shape), src_t)
        np.copyto(wt, w_src)
        for gi in range(g):
            np.matmul(cols2[gi], wt[gi], out=ys[gi])
        np.copyto(o4, y_src)
        if b_view is not None:
            np.add(out, b_view, out=out)

    return run


@kernel(Pool)
@lowp
def pool_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The native f32 pool (``kernels/conv_native.py``), else max or average over a
    strided window view of a bordered private copy."""
    fast = native_pool(node, ins, out, ctx)
    if fast is not None:
        return fast
    op: Pool = node.op  # type: ignore[assignment]
    (x,) = ins
    if x.dtype.kind not in "fiu":
        return None
    nd = len(op.window)
    axes = tuple(range(-nd, 0))
    ones = (1,) * nd
    if op.fn is PoolKind.MAX:
        low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        buf, inner = _bordered(x, op.padding, low)
        win = window_view(buf, op.window, op.stride, ones)

        def max_pool() -> None:
            np.copyto(inner, x)
            np.max(win, axis=axes, out=out)

        return max_pool
    buf, inner = _bordered(x, op.padding, 0.0)
    win = window_view(buf, op.window, op.stride, ones)
    count_buf, count_inner = _bordered(np.ones((1, 1, *x.shape[2:]), x.dtype), op.padding, 0.0)
    count_inner[...] = 1
    count = window_view(count_buf, op.window, op.stride, ones).sum(axis=axes)

    def avg_pool() -> None:
        np.copyto(inner, x)
        np.sum(win, axis=axes, out=out)
        np.divide(out, count, out=out)

    return avg_pool
