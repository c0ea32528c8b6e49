"""CPU kernels of ``qconv2d`` (``rlx/ops/qconv.py``: an integer 2-D convolution with an
f32 epilogue). In: the node and its arena views. Out: a closure writing the f32 result.

First attempt: im2col of ``x_q`` (the border holds the zero point, a real 0) into int8 /
uint8 scratch, then one native int8 GEMM per group (``engines.qgemm``) with the f32
epilogue. Without the native library: im2col of ``x_q - x_zero_point`` into f64 scratch
and one f64 BLAS gemm per group, exact (integer products and sums below 2**53), then the
reference's f32 epilogue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind
from rlx.backends.cpu.engines.qgemm import as_f32, lib_or_note
from rlx.backends.cpu.engines.weights import packed_weight
from rlx.ops.nn import _window_view
from rlx.ops.qconv import QConv2d

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["qconv2d_kernel", "blas_qconv2d_kernel"]

_F32 = np.dtype(np.float32)


@kind(KernelKind.NATIVE)
def qconv2d_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """im2col of ``x_q`` (the border holds the zero point, a real 0) into int8 / uint8
    scratch, then one native int8 GEMM per group with the f32 epilogue (scale, bias),
    transposed into NCHW; None (noted: ``blas_qconv2d_kernel`` runs) without the native
    library."""
    op: QConv2d = node.op  # type: ignore[assignment]
    lib = lib_or_note(ctx, node)
    if lib is None:
        return None
    x, w = ins[:2]
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g, og = op.groups, o // op.groups
    (pt, pb), (pl, pr) = op.padding
    _, _, ho, wo = out.shape
    length, kk = ho * wo, cg * kh * kw
    xp = ctx.scratch((n, c, h + pt + pb, wd + pl + pr), x.dtype, node.id * 8 + 6)
    inner = xp[:, :, pt : pt + h, pl : pl + wd]
    zp = op.x_zero_point
    win = _window_view(xp, (kh, kw), op.stride, op.dilation)  # [N,C,Ho,Wo,kh,kw]
    cols = ctx.scratch((g, n * length, kk), x.dtype, node.id * 8 + 7)
    srcs = [win[:, i * cg : (i + 1) * cg].transpose(0, 2, 3, 1, 4, 5) for i in range(g)]
    dsts = [cols[i].reshape(n, ho, wo, cg, kh, kw) for i in range(g)]
    tmp = ctx.scratch((g, n * length, og), _F32, node.id * 8 + 8)
    ws = op.w_scale_vector(o)

    def pack_all(wa: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        return [lib.pack(wa[i * og : (i + 1) * og].reshape(og, kk).T) for i in range(g)]

    pack_all.__qualname__ = f"qconv2d.pack.{lib.isa.name}"
    packed = packed_weight(ctx, node, 1, w, pack_all)
    bias = None
    preps: list[Callable[[], None]] = []
    if op.has_bias:
        bias, p = as_f32(ins[2], (o,), ctx, node.id * 8 + 1)
        preps += [p] if p is not None else []
    outv = out.reshape(n, g, og, length)
    threads, run_ = ctx.num_threads, lib.run
    ctx.kind = KernelKind.NATIVE

    def run() -> None:
        for p in preps:
            p()
        xp.fill(zp)  # scratch is shared with other kernels: rewrite the border every run
        np.copyto(inner, x)
        pw = packed()
        for i in range(g):
            np.copyto(dsts[i], srcs[i])
            sl = slice(i * og, (i + 1) * og)
            run_(
                cols[i], pw[i], og, a_zero_point=zp, a_scale=op.x_scale,  # type: ignore[index]
                w_scales=ws[sl], bias=None if bias is None else bias[sl],
                out_f32=tmp[i], num_threads=threads,
            )  # fmt: skip
            np.copyto(outv[:, i], tmp[i].reshape(n, length, og).transpose(0, 2, 1))

    return run


@kind(KernelKind.BLAS)
def blas_qconv2d_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """im2col of ``x_q - x_zero_point`` into f64 scratch and one f64 BLAS gemm per group:
    integer products and sums are exact in f64 (below 2**53), so the accumulator equals
    the integer one; then the reference's f32 epilogue."""
    op: QConv2d = node.op  # type: ignore[assignment]
    x, w = ins[:2]
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g = op.groups
    og = o // g
    (pt, pb), (pl, pr) = op.padding
    _, _, ho, wo = out.shape
    f64 = np.dtype(np.float64)
    xp = ctx.scratch((n, c, h + pt + pb, wd + pl + pr), f64, 80)
    inner = xp[:, :, pt : pt + h, pl : pl + wd]
    # the border is 0 (a padded x_q equals the zero point); rewritten every run, since
    # scratch is shared with other kernels of the schedule
    border = [xp[:, :, :pt], xp[:, :, pt + h :], xp[:, :, :, :pl], xp[:, :, :, pl + wd :]]
    border = [b for b in border if b.size]
    win = _window_view(xp, (kh, kw), op.stride, op.dilation)  # [N,C,Ho,Wo,kh,kw]
    src = win.reshape(n, g, cg, ho, wo, kh, kw)
    cols = ctx.scratch((n, g, ho * wo, cg * kh * kw), f64, 81)
    dst = cols.reshape(n, g, ho, wo, cg, kh, kw).transpose(0, 1, 4, 2, 3, 5, 6)
    wf = ctx.scratch((g, og, cg * kh * kw), f64, 82)
    acc = ctx.scratch((n, g, ho * wo, og), f64, 83)
    outv = out.reshape(n, g, og, ho * wo).transpose(0, 1, 3, 2)  # [N,G,L,Og] view of out
    scales = op.combined_scales(o).reshape(1, g, 1, og)
    bias = ctx.scratch((o,), np.float32, 84) if op.has_bias else None
    zp = f64.type(op.x_zero_point)

    def run() -> None:
        for b in border:
            b.fill(0)
        np.subtract(x, zp, out=inner)
        np.copyto(dst, src)
        np.copyto(wf, w.reshape(g, og, cg * kh * kw))
        np.matmul(cols, wf.transpose(0, 2, 1)[None], out=acc)
        np.copyto(outv, acc, casting="unsafe")  # f32(acc): exact ints rounded once
        np.multiply(outv, scales, out=outv)
        if bias is not None:
            np.copyto(bias, ins[2], casting="unsafe")
            np.add(outv, bias.reshape(1, g, 1, og), out=outv)

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    QConv2d: (qconv2d_kernel, blas_qconv2d_kernel),
}
