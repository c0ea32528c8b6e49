"""CPU kernels of the blocked-layout ops (``rlx/ops/layout.py``: ``to_nchwc``,
``from_nchwc``, ``conv_nchwc``). In: the node and its arena views. Out: a closure writing
``out``.

First attempt: the native NCHWc library (``engines/conv_nchwc.py``: the reorders, the
direct conv and the depthwise conv reading and writing blocks, f32, the library's own
block). Otherwise NumPy: the reorders as a transposing copy, the conv through its
reference on f64 temporaries (the path of other dtypes and blocks, and of machines
without gcc; the layout pass only writes these ops where the native kernels run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind
from rlx.backends.cpu.engines.conv import ConvAct, Geometry
from rlx.backends.cpu.engines.conv_nchwc import Blocked, depthwise, nchwc, nchwc_block, reorder
from rlx.ops.base import RefCtx
from rlx.ops.layout import ConvNchwc, FromNchwc, ToNchwc

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["native_reorder", "numpy_reorder", "native_conv_nchwc", "numpy_conv_nchwc"]

_F32 = np.dtype(np.float32)


def _f32(*xs: np.ndarray) -> bool:
    return all(x.dtype == _F32 and x.flags.c_contiguous for x in xs)


@kind(KernelKind.NATIVE)
def native_reorder(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """NCHW <-> NCHWc by the native library (f32, the library's block), or None."""
    (x,) = ins
    if not _f32(x, out) or x.size == 0:
        return None
    to = isinstance(node.op, ToNchwc)
    nchw = x.shape if to else out.shape
    return reorder(x, out, tuple(int(d) for d in nchw), to, ctx)  # type: ignore[arg-type]


def numpy_reorder(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """NCHW <-> NCHWc as a NumPy copy through a transposed view of ``out`` / ``x``."""
    (x,) = ins
    op = node.op
    if isinstance(op, ToNchwc):
        n, c, h, w = x.shape
        cb, b = out.shape[1], out.shape[4]
        full = ctx.scratch((n, cb * b, h, w), x.dtype, node.id * 8 + 1)  # padded channels
        dst = out.transpose(0, 1, 4, 2, 3)  # [N, Cb, b, H, W], a view of out

        def to() -> None:
            full[:, c:] = 0
            full[:, :c] = x
            np.copyto(dst, full.reshape(n, cb, b, h, w))

        return to
    src = x.transpose(0, 1, 4, 2, 3)

    def back() -> None:
        n, cb, h, w, b = x.shape
        np.copyto(out, src.reshape(n, cb * b, h, w)[:, : out.shape[1]])

    return back


@kind(KernelKind.NATIVE)
def native_conv_nchwc(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The native direct / depthwise conv reading and writing NCHWc blocks, or None."""
    op: ConvNchwc = node.op  # type: ignore[assignment]
    conv = op.conv
    x, w = ins[:2]
    bias = ins[2] if conv.has_bias else None
    res = ins[-1] if conv.has_residual else None
    extra = tuple(a for a in (bias, res) if a is not None)
    if not _f32(x, w, out, *extra) or x.size == 0 or out.size == 0:
        return None
    n, _, h, wd = x.shape[:4]
    o, _, kh, kw = w.shape
    oh, ow = out.shape[2:4]
    (sh, sw), (dh, dw) = conv.stride, conv.dilation
    (ph, _), (pw, _) = conv.padding
    if not op.nchw_input and (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0):
        # a 1x1 stride-1 unpadded conv as one row of H*W positions (whole register tiles of
        # 12, not 7 + 7 on a 14-wide row): the blocked image is the same bytes either way
        h, wd, oh, ow = 1, h * wd, 1, oh * ow
    geo = Geometry(n, op.in_channels, h, wd, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, conv.groups)
    if not ctx.native or nchwc_block() != op.layout.block:
        return None
    act, lo, hi = ConvAct.of(conv)
    blocked = Blocked(x=not op.nchw_input)
    k = nchwc(node, geo, x, w, bias, out, ctx, act, lo, hi, res, blocked)
    return k or depthwise(node, geo, x, w, bias, out, ctx, act, lo, hi, res, blocked)


def numpy_conv_nchwc(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The op's reference (unblock, convolve in f64, block, epilogue), copied into
    ``out``: the path of other dtypes, blocks and machines without the native library."""
    op: ConvNchwc = node.op  # type: ignore[assignment]
    rctx = RefCtx(tuple(out.shape), np.dtype(np.float64), {}, {}, {})
    ctx.notes.append("conv_nchwc by NumPy (its reference, f64)")

    def run() -> None:
        np.copyto(out, op.reference(ins, rctx), casting="unsafe")

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    ToNchwc: (native_reorder, numpy_reorder),
    FromNchwc: (native_reorder, numpy_reorder),
    ConvNchwc: (native_conv_nchwc, numpy_conv_nchwc),
}
