"""``Bitcast``: the same bytes read as another dtype of the same width (f32 <-> i32,
f64 <-> i64, i8 <-> u8, bool -> u8, ...): ``x.view(to)``, dims unchanged. A bool made
from bytes other than 0 and 1 is not a valid bool; casting to bool is refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.ops.axis_batch import batch_same
from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.shape import Shape

__all__ = ["Bitcast"]


@register
class Bitcast(Op):
    """Reinterpret ``x``'s bytes as dtype ``to`` (same item size; see the module)."""

    mnemonic: ClassVar[str] = "bitcast"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    nondiff: ClassVar[str] = "bitcast: the bytes reread as another type, not a numeric function"
    to: DType

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        expect(
            x.dtype.itemsize == self.to.itemsize,
            self,
            f"{x} has {x.dtype.itemsize}-byte items, {self.to} has {self.to.itemsize}",
        )
        expect(self.to is not DType.BOOL, self, f"bitcast to bool of {x} (use a compare)")
        return x.with_dtype(self.to)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = xs[0]
        return np.ascontiguousarray(x).view(self.to.np).reshape(x.shape)

    batch = batch_same
