"""CPU kernels of the conv and pool backward ops (``rlx/ops/nn_grad.py``): im2col + BLAS
for conv, ufunc passes for pooling. In: the node and NumPy views of its input and output
arena slots. Out: a closure writing the gradient into ``out`` (scratch and bordered
buffers allocated when the schedule is built). f16/bf16 compute in f32 (``lowp``).

* Conv backward: the output gradient as ``[G, O/G, N*L]`` against the columns
  ``[G, N*L, C/G*K]`` (one 2-D GEMM per group) gives dw; ``[G, N*L, O/G] @ w[G, O/G, C/G*K]``
  gives the column gradient, scattered back (col2im) tap by tap into a bordered buffer.
* Pool backward / max-pool select: each window's first maximum found tap by tap with
  strict ``>`` (the first wins ties), the gradient added tap by tap.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.kernels import Kernel, KernelCtx, KernelKind, kernel, lowp
from rlx.backends.cpu.kernels.conv import window_view
from rlx.ops.nn import PoolKind
from rlx.ops.nn_grad import (
    ConvBackwardData,
    ConvBackwardWeight,
    MaxPoolSelect,
    PoolBackward,
    window_taps,
)

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["conv_backward_kernel", "conv_backward_data_kernel", "pool_backward_kernel"]

_T = 350  # scratch tags of this module: 350..


# ---- convolution ------------------------------------------------------------------------


class _Cols:
    """im2col geometry of one conv backward node: x ``[N,C,*sp]``, w ``[O,C/G,*k]``,
    ct ``[N,O,*out]``; a zero-bordered copy of x (dw) or of dx (dx)."""

    def __init__(self, node: Node, ins: list[np.ndarray], ctx: KernelCtx) -> None:
        f = node.op.fwd  # type: ignore[attr-defined]
        x, w, ct = ins
        self.f = f
        n, c = x.shape[:2]
        o, g = w.shape[0], f.groups
        self.k = w.shape[2:]
        self.out_sp = ct.shape[2:]
        kk, length = math.prod(self.k), math.prod(self.out_sp)
        self.shape = (n, c, o, g, kk, length)
        dt = x.dtype
        padded = tuple(s + lo + hi for s, (lo, hi) in zip(x.shape[2:], f.padding, strict=True))
        self.xp = np.zeros((n, c, *padded), dt)  # private: its border stays zero
        self.inner = self.xp[
            (..., *(slice(lo, lo + s) for s, (lo, _) in zip(x.shape[2:], f.padding, strict=True)))
        ]
        # [G, N*L, C/G*K] columns and [G, O/G, N*L] output gradient
        self.cols = ctx.scratch((g, n * length, (c // g) * kk), dt, _T)
        self.ctg = ctx.scratch((g, o // g, n * length), dt, _T + 1)
        self.ct_src = ct.reshape(n, g, o // g, length).transpose(1, 2, 0, 3)

    def gather_ct(self) -> None:
        n, _, o, g, _, length = self.shape
        np.copyto(self.ctg.reshape(g, o // g, n, length), self.ct_src)


@kernel(ConvBackwardWeight, KernelKind.BLAS)
@lowp
def conv_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """dw by im2col: ``[G, O/G, N*L] @ [G, N*L, C/G*K]``, one GEMM per group."""
    x = ins[0]
    m = _Cols(node, ins, ctx)
    n, c, o, g, kk, length = m.shape
    win = window_view(m.xp, m.k, m.f.stride, m.f.dilation)  # [N,C,*out,*k], a view
    nd = len(m.k)
    # [N,G,C/G,*out,*k] -> [G,N,*out,C/G,*k]; splitting C keeps it a view of xp
    perm = (1, 0, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd))
    cols_src = win.reshape(n, g, c // g, *win.shape[2:]).transpose(perm)
    cols_dst = m.cols.reshape(g, n, *m.out_sp, c // g, *m.k)
    assert np.may_share_memory(cols_src, m.xp)  # a view: read afresh on every run
    dw = out.reshape(g, o // g, (c // g) * kk)

    def run() -> None:
        np.copyto(m.inner, x)
        np.copyto(cols_dst, cols_src)
        m.gather_ct()
        for gi in range(g):
            np.matmul(m.ctg[gi], m.cols[gi], out=dw[gi])

    return run


@kernel(ConvBackwardData, KernelKind.BLAS)
@lowp
def conv_backward_data_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """dx: the column gradient ``[G, N*L, O/G] @ w[G, O/G, C/G*K]``, then col2im tap by tap
    into a zero-bordered buffer whose interior is dx."""
    w = ins[1]
    m = _Cols(node, ins, ctx)
    n, c, o, g, kk, length = m.shape
    wg = w.reshape(g, o // g, (c // g) * kk)
    # dcols [G, N*L, C/G*K] -> per tap t: [N, G, C/G, *out]
    dcols = m.cols.reshape(g, n, *m.out_sp, c // g, kk)
    nd = len(m.k)
    perm = (1, 0, nd + 2, *range(2, nd + 2))  # [G,N,*out,C/G] -> [N,G,C/G,*out]
    taps = [
        (dcols[..., ti].transpose(perm), sl)
        for ti, (_, sl) in enumerate(window_taps(m.k, m.f.stride, m.f.dilation, m.out_sp))
    ]
    dxp = m.xp.reshape(n, g, c // g, *m.xp.shape[2:])

    def run() -> None:
        m.gather_ct()
        for gi in range(g):
            np.matmul(m.ctg[gi].T, wg[gi], out=m.cols[gi])
        m.xp.fill(0)
        for src, sl in taps:
            view = dxp[(..., *sl)]
            np.add(view, src, out=view)
        np.copyto(out, m.inner)

    return run


# ---- pooling ----------------------------------------------------------------------------


def _pool_geometry(
    f, x: np.ndarray, out_sp: tuple, ctx: KernelCtx, fill: float
) -> tuple[np.ndarray, np.ndarray, list]:  # noqa: ANN001
    """(bordered buffer, its interior view, taps) of a pool over ``x``."""
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(x.shape[2:], f.padding, strict=True))
    buf = np.full((*x.shape[:2], *padded), fill, x.dtype)
    inner = buf[
        (..., *(slice(lo, lo + s) for s, (lo, _) in zip(x.shape[2:], f.padding, strict=True)))
    ]
    taps = [sl for _, sl in window_taps(f.window, f.stride, (1,) * len(f.window), out_sp)]
    return buf, inner, taps


class _FirstMax:
    """Index of each window's first maximum (strict ``>`` tap by tap: the first wins)."""

    def __init__(self, f, x: np.ndarray, out_sp: tuple, ctx: KernelCtx) -> None:  # noqa: ANN001
        self.x = x
        self.xp, self.inner, self.taps = _pool_geometry(f, x, out_sp, ctx, -np.inf)
        shape = (*x.shape[:2], *out_sp)
        self.best = ctx.scratch(shape, x.dtype, _T + 10)
        self.idx = ctx.scratch(shape, np.int32, _T + 11)
        self.gt = ctx.scratch(shape, np.bool_, _T + 12)

    def run(self) -> None:
        np.copyto(self.inner, self.x)
        np.copyto(self.best, self.xp[(..., *self.taps[0])])
        self.idx.fill(0)
        for i, sl in enumerate(self.taps[1:], 1):
            cand = self.xp[(..., *sl)]
            np.greater(cand, self.best, out=self.gt)
            np.copyto(self.best, cand, where=self.gt)
            np.copyto(self.idx, i, where=self.gt)


@kernel(PoolBackward)
@lowp
def pool_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Max: the gradient added at each window's first maximum, tap by tap; average: ``ct /
    count`` (count precomputed) added over each window."""
    f = node.op.fwd  # type: ignore[attr-defined]
    x, ct = ins
    out_sp = ct.shape[2:]
    dxp, inner, taps = _pool_geometry(f, x, out_sp, ctx, 0.0)
    share = ctx.scratch(ct.shape, ct.dtype, _T + 13)
    if f.fn is PoolKind.AVG:
        ones = np.pad(np.ones(x.shape[2:], x.dtype), f.padding)
        count = sum(ones[sl] for sl in taps)

        def avg() -> None:
            np.divide(ct, count, out=share)
            dxp.fill(0)
            for sl in taps:
                view = dxp[(..., *sl)]
                np.add(view, share, out=view)
            np.copyto(out, inner)

        return avg
    first = _FirstMax(f, x, out_sp, ctx)
    hit = ctx.scratch(ct.shape, np.bool_, _T + 14)

    def mx() -> None:
        first.run()
        dxp.fill(0)
        for i, sl in enumerate(taps):
            np.equal(first.idx, i, out=hit)
            np.multiply(ct, hit, out=share)
            view = dxp[(..., *sl)]
            np.add(view, share, out=view)
        np.copyto(out, inner)

    return mx


@kernel(MaxPoolSelect)
@lowp
def max_pool_select_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """``t`` read at each window's first maximum of ``x``."""
    f = node.op.fwd  # type: ignore[attr-defined]
    x, t = ins
    out_sp = out.shape[2:]
    first = _FirstMax(f, x, out_sp, ctx)
    tp, tin, taps = _pool_geometry(f, t, out_sp, ctx, 0.0)
    hit = ctx.scratch(out.shape, np.bool_, _T + 14)

    def run() -> None:
        first.run()
        np.copyto(tin, t)
        for i, sl in enumerate(taps):
            np.equal(first.idx, i, out=hit)
            np.copyto(out, tp[(..., *sl)], where=hit)

    return run
