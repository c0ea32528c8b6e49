"""Running product along an axis (``CumProd``): the multiplicative twin of ``cumsum``.
``reverse`` multiplies from the end; ``exclusive`` leaves each element out of its own
product (the first output is 1). Integers wrap; 16-bit floats multiply in f32."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.ops.elementwise import _wide
from rlx.ops.reduce import norm_axis, running
from rlx.shape import Shape

__all__ = ["CumProd", "cumprod"]


def cumprod(x: np.ndarray, axis: int, reverse: bool, exclusive: bool) -> np.ndarray:
    """NumPy twin of :class:`CumProd` (also the CPU kernel's computation)."""
    return running(
        _wide(x), axis, reverse, exclusive, 1, lambda v, ax: np.cumprod(v, axis=ax, dtype=v.dtype)
    )


@register
class CumProd(Op):
    """Running product along ``axis`` (see the module docstring)."""

    mnemonic: ClassVar[str] = "cumprod"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    axis: int
    reverse: bool = False
    exclusive: bool = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        norm_axis(self, x, self.axis)
        expect(not x.dtype.is_bool, self, f"cumprod of a bool tensor {x} (cast it first)")
        expect(x.rank >= 1, self, f"needs an input of rank >= 1, got {x}")
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return cumprod(xs[0], self.axis, self.reverse, self.exclusive)
