"""Quantized convolution: ``qconv2d``, the integer 2-D convolution of the seed's precision
lists, with :class:`~rlx.ops.quant.QMatMul`'s conventions (integer operands, exact integer
accumulation, an f32 epilogue).

In: ``x_q`` I8/U8 ``[N, C, H, W]`` (per-tensor scale and zero point), ``w_q`` I8
``[O, C/groups, kH, kW]`` (symmetric, per-tensor or per-output-channel scales), an
optional float ``bias [O]``. Out: f32 ``[N, O, H', W']`` with the geometry of
:class:`~rlx.ops.nn.Conv`. The seed's ``QConv2d`` requantizes to i8 (``mult``, ``out_zp``);
here a ``quantize`` after the op does that, as after a ``qmatmul``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.errors import ShapeError
from rlx.ops.base import OpKind, RefCtx, expect, graph_method, register
from rlx.ops.nn import Conv, _window_view
from rlx.ops.nn_builders import _pads, _per_dim
from rlx.ops.quant import IntEpilogueOp, _scales
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId

__all__ = ["QConv2d", "qconv2d_accumulate"]


def qconv2d_accumulate(op: QConv2d, x: np.ndarray, w: np.ndarray, acc_dtype: Any) -> np.ndarray:
    """``sum (x_q - x_zero_point) * w_q`` over each window as ``acc_dtype`` ``[N, O, H',
    W']`` (padding holds the zero point, i.e. a real 0)."""
    n, c = x.shape[:2]
    o, g = w.shape[0], op.groups
    k = w.shape[2:]
    xs = x.astype(acc_dtype) - op.x_zero_point
    xp = np.pad(xs, ((0, 0), (0, 0), *op.padding))
    win = _window_view(xp, k, op.stride, op.dilation)  # [N,C,H',W',kH,kW]
    out_sp = win.shape[2:4]
    length, kk = math.prod(out_sp), math.prod(k)
    cols = win.reshape(n, g, c // g, length, kk).transpose(0, 1, 3, 2, 4)
    cols = cols.reshape(n, g, length, (c // g) * kk)
    wg = w.astype(acc_dtype).reshape(g, o // g, (c // g) * kk)
    y = np.matmul(cols, wg.transpose(0, 2, 1)[None])  # [N,G,L,O/G]
    return y.transpose(0, 1, 3, 2).reshape(n, o, *out_sp)


@register
class QConv2d(IntEpilogueOp):
    """Integer 2-D convolution with an f32 epilogue (see the module docstring)::

        acc[n, o, i, j] = sum (x_q - x_zero_point) * w_q   over the window (exact int)
        y[n, o, i, j]   = f32(acc) * (f32(x_scale) * f32(w_scales[o])) (+ bias[o])

    Inputs ``(x_q, w_q[, bias])``; ``stride``, ``padding`` (``(lo, hi)`` per dim),
    ``dilation`` and ``groups`` as :class:`~rlx.ops.nn.Conv`; ``w_scales`` holds 1 or
    ``O`` values. Output f32."""

    mnemonic: ClassVar[str] = "qconv2d"
    nondiff: ClassVar[str] = (
        "integer convolution of quantized activations and inference-only packed i8 "
        "weights (piecewise constant in a float input); train with fake_quantize"
    )
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]
    x_scale: float
    x_zero_point: int
    w_scales: tuple[float, ...]
    groups: int = 1
    has_bias: bool = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, w = ins[:2]
        expect(
            x.dtype in (DType.I8, DType.U8) and x.rank == 4,
            self,
            f"x_q must be i8 or u8 [N, C, H, W], got {x}",
        )
        expect(
            w.dtype is DType.I8 and w.rank == 4, self, f"w_q must be i8 [O, C/g, kH, kW], got {w}"
        )
        self.check_x_quant(x.dtype)
        o = w.dims[0]
        expect(
            all(math.isfinite(s) and s > 0 for s in self.w_scales) and len(self.w_scales) in (1, o),
            self,
            f"w_scales needs 1 or O={o} finite values > 0, got {len(self.w_scales)}",
        )
        geometry = Conv(self.stride, self.padding, self.dilation, self.groups, False)
        try:
            out = geometry.infer((x.with_dtype(DType.F32), w.with_dtype(DType.F32)))
        except ShapeError as e:
            raise ShapeError(f"{self.mnemonic}: {e.bare_message.removeprefix('conv: ')}") from None
        if self.has_bias:
            b = ins[2]
            expect(b.dtype.is_float and b.dims == (o,), self, f"bias must be float [{o}], got {b}")
        return out

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        acc = qconv2d_accumulate(self, xs[0], xs[1], np.int64)
        o = xs[1].shape[0]
        y = acc.astype(np.float32) * self.combined_scales(o)[:, None, None]
        if self.has_bias:
            y = y + xs[2].astype(np.float32)[:, None, None]
        return y

    def attrs_str(self) -> str:
        ws = self.w_scales if len(self.w_scales) <= 4 else f"({len(self.w_scales)} values)"
        return (
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"groups={self.groups}, x_scale={self.x_scale:g}, x_zero_point={self.x_zero_point}, "
            f"w_scales={ws}, has_bias={self.has_bias}"
        )


@graph_method
def qconv2d(
    g: Graph,
    x_q: NodeId,
    w_q: NodeId,
    x_scale: float,
    w_scales: float | Sequence[float],
    x_zero_point: int = 0,
    bias: NodeId | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[Any] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> NodeId:
    """Integer conv2d rescaled to f32 (see :class:`QConv2d`)."""
    op = QConv2d(
        _per_dim(stride, 2, "qconv2d", "stride"),
        _pads(padding, 2, "qconv2d"),
        _per_dim(dilation, 2, "qconv2d", "dilation"),
        x_scale,
        x_zero_point,
        _scales(w_scales),
        int(groups),
        bias is not None,
    )
    return g.apply(op, [x_q, w_q] + ([bias] if bias is not None else []))
