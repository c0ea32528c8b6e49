"""Channel-blocked (NCHWc) activations, as the layout pass (``rlx/passes/layout.py``) writes
them: a 2-D image ``[N, C, H, W]`` held as ``[N, ceil(C / b), H, W, b]`` (channel ``c`` at
block ``c // b``, lane ``c % b``; the lanes past C of the last block are padding), so a
vector of ``b`` channels of one position is contiguous (oneDNN's and ONNX Runtime MLAS's
layout for convolutions).

* ``to_nchwc`` (:class:`ToNchwc`): ``[N, C, H, W]`` -> blocked, padding lanes zero;
* ``from_nchwc`` (:class:`FromNchwc`): blocked -> ``[N, C, H, W]`` (padding dropped);
* ``conv_nchwc`` (:class:`ConvNchwc`): a :class:`~rlx.ops.nn.Conv` (bias, residual and
  activation included) from blocked input to blocked output. Lanes past O of the output
  hold ``act(0 + residual lane)`` (0 for relu / relu6 and without a residual).

No derivative rules: the pass runs on inference graphs after autodiff.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from rlx.errors import ShapeError
from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.ops.linalg import upcast
from rlx.ops.nn import Conv, ConvAct
from rlx.shape import Dim, Shape

__all__ = ["Nchwc", "ToNchwc", "FromNchwc", "ConvNchwc", "to_blocked", "from_blocked"]


@dataclass(frozen=True)
class Nchwc:
    """The blocked layout: ``block`` channels per block (16 on AVX-512, 8 on AVX2, 4 on
    the aarch64 / portable targets: the conv kernels' own block)."""

    block: int

    def blocks(self, channels: int) -> int:
        """ceil(channels / block)."""
        return -(-channels // self.block)


def to_blocked(x: np.ndarray, layout: Nchwc) -> np.ndarray:
    """``[N, C, H, W]`` -> ``[N, ceil(C / b), H, W, b]``, padding lanes zero (NumPy)."""
    n, c, h, w = x.shape
    b = layout.block
    full = np.zeros((n, layout.blocks(c) * b, h, w), x.dtype)
    full[:, :c] = x
    return np.ascontiguousarray(full.reshape(n, -1, b, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked(x: np.ndarray, channels: int) -> np.ndarray:
    """``[N, Cb, H, W, b]`` -> ``[N, channels, H, W]`` (NumPy)."""
    n, cb, h, w, b = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)[:, :channels])


def _blocked_shape(op: Op, x: Shape, layout: Nchwc, channels: int, what: str) -> None:
    expect(x.rank == 5, op, f"{what} must be [N, Cb, H, W, {layout.block}], got {x}")
    expect(
        x.dims[1] == layout.blocks(channels) and x.dims[4] == layout.block,
        op,
        f"{what} of {channels} channels in blocks of {layout.block} must be "
        f"[N, {layout.blocks(channels)}, H, W, {layout.block}], got {x}",
    )


@register
class ToNchwc(Op):
    """``[N, C, H, W]`` -> ``[N, ceil(C / b), H, W, b]`` (``layout.block`` = b), the lanes
    past C zero."""

    mnemonic: ClassVar[str] = "to_nchwc"
    nondiff: ClassVar[str] = (
        "made only by the inference layout pass nchwc_layout, after differentiation"
    )
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    layout: Nchwc

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        expect(x.rank == 4, self, f"input must be [N, C, H, W], got {x}")
        n, c, h, w = x.dims
        if not isinstance(c, int):
            raise ShapeError(f"{self.mnemonic}: channels of {x} must be static")
        expect(self.layout.block >= 1, self, f"block must be >= 1, got {self.layout.block}")
        return Shape((n, self.layout.blocks(c), h, w, self.layout.block), x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return to_blocked(np.asarray(xs[0]), self.layout).astype(ctx.out_dtype)


@register
class FromNchwc(Op):
    """``[N, ceil(C / b), H, W, b]`` -> ``[N, C, H, W]`` (C = ``channels``; the padding
    lanes dropped)."""

    mnemonic: ClassVar[str] = "from_nchwc"
    nondiff: ClassVar[str] = (
        "made only by the inference layout pass nchwc_layout, after differentiation"
    )
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    layout: Nchwc
    channels: int

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        _blocked_shape(self, x, self.layout, self.channels, "input")
        n, _, h, w, _ = x.dims
        return Shape((n, self.channels, h, w), x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return from_blocked(np.asarray(xs[0]), self.channels).astype(ctx.out_dtype)


@register
class ConvNchwc(Op):
    """``conv`` (a 2-D :class:`~rlx.ops.nn.Conv`, its bias, residual and activation) on
    blocked activations: inputs ``x [N, ceil(C / b), H, W, b]`` (C = ``in_channels``; with
    ``nchw_input`` ``x [N, C, H, W]``: a chain's first conv reordering its own input), the
    conv's ``w [O, C / groups, KH, KW]``, ``bias [O]`` (``conv.has_bias``), ``residual``
    (``conv.has_residual``, the output's shape); output ``[N, ceil(O / b), OH, OW, b]``
    (b = ``layout.block``), the lanes past O ``act(residual lane)`` (0 without one)."""

    mnemonic: ClassVar[str] = "conv_nchwc"
    nondiff: ClassVar[str] = (
        "made only by the inference layout pass nchwc_layout, after differentiation"
    )
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    conv: Conv
    layout: Nchwc
    in_channels: int
    nchw_input: bool = False

    def num_inputs(self) -> int:
        return self.conv.num_inputs()

    def _plain(self) -> Conv:
        return replace(self.conv, act=ConvAct.NONE, clip=(0.0, 0.0), has_residual=False)

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, w = ins[:2]
        expect(len(self.conv.stride) == 2, self, f"needs a 2-D conv, got {self.conv}")
        expect(x.dtype.is_float, self, f"x must be a float tensor, got {x}")
        if self.nchw_input:
            expect(
                x.rank == 4 and x.dims[1] == self.in_channels,
                self,
                f"x must be [N, {self.in_channels}, H, W], got {x}",
            )
            n, _, h, wd = x.dims
        else:
            _blocked_shape(self, x, self.layout, self.in_channels, "x")
            n, _, h, wd, _ = x.dims
        plain: tuple[Shape, ...] = (Shape((n, self.in_channels, h, wd), x.dtype), w)
        if self.conv.has_bias:
            plain += (ins[2],)
        y = self._plain().infer(plain)
        o = w.dims[0]
        assert isinstance(o, int)  # Conv.infer: the weight's dims are static
        out_dims: tuple[Dim, ...] = (n, self.layout.blocks(o), *y.dims[2:], self.layout.block)
        out = Shape(out_dims, x.dtype)
        expect(
            not self.conv.has_residual or ins[-1] == out,
            self,
            f"residual must be {out}, got {ins[-1]}",
        )
        return out

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = upcast(np.asarray(xs[0]))
        x = x if self.nchw_input else from_blocked(x, self.in_channels)
        rest = [upcast(np.asarray(a)) for a in xs[1 : 2 + int(self.conv.has_bias)]]
        y = self._plain().reference([x, *rest], replace(ctx, out_dtype=np.dtype(np.float64)))
        b = self.layout.block
        yb = to_blocked(np.asarray(y, np.float64), self.layout)
        if self.conv.has_residual:
            yb = yb + upcast(np.asarray(xs[-1]))
        if self.conv.act is not ConvAct.NONE:
            lo, hi = (0.0, np.inf) if self.conv.act is ConvAct.RELU else self.conv.clip
            yb = np.minimum(np.maximum(yb, lo), hi)
        assert yb.shape[-1] == b
        return yb.astype(ctx.out_dtype)
