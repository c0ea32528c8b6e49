"""Bitwise integer ops: and / or / xor / shift-left / shift-right of two broadcasting
integer tensors of one dtype (``Bitwise``), and ``BitwiseNot``. Shifts are logical for
unsigned types (arithmetic for signed right shifts, as NumPy); a shift by the type's
width or more gives 0 (-1 for a negative signed right shift), never C's undefined value."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from rlx.ops.axis_batch import batch_broadcast, batch_same
from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.shape import Shape, broadcast_dims

__all__ = ["BitwiseKind", "Bitwise", "BitwiseNot", "bitwise"]


class BitwiseKind(enum.Enum):
    """What :class:`Bitwise` computes."""

    AND = "bit_and"
    OR = "bit_or"
    XOR = "bit_xor"
    SHL = "shl"
    SHR = "shr"


def _shift(a: np.ndarray, b: np.ndarray, left: bool) -> np.ndarray:
    bits = a.dtype.itemsize * 8
    big = b >= bits
    s = np.where(big, 0, b).astype(a.dtype)
    out = np.left_shift(a, s) if left else np.right_shift(a, s)
    if not big.any():
        return out
    fill = np.zeros((), a.dtype)
    if not left and a.dtype.kind == "i":
        fill = np.where(a < 0, np.array(-1, a.dtype), fill)
    return np.where(big, fill, out).astype(a.dtype)


_FNS: dict[BitwiseKind, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    BitwiseKind.AND: np.bitwise_and,
    BitwiseKind.OR: np.bitwise_or,
    BitwiseKind.XOR: np.bitwise_xor,
    BitwiseKind.SHL: lambda a, b: _shift(a, b, True),
    BitwiseKind.SHR: lambda a, b: _shift(a, b, False),
}


def bitwise(kind: BitwiseKind, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NumPy twin of :class:`Bitwise` (also the CPU kernel's computation)."""
    return np.asarray(_FNS[kind](a, b)).astype(a.dtype, copy=False)


@register
class Bitwise(Op):
    """``y = a (bit op) b`` with broadcasting; integer (or bool for and / or / xor)
    inputs of one dtype; shift counts must be >= 0."""

    mnemonic: ClassVar[str] = "bitwise"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE
    nondiff: ClassVar[str] = "bitwise: integer (or bool) values"
    fn: BitwiseKind

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        a, b = ins
        expect(a.dtype is b.dtype, self, f"needs equal dtypes, got {a} and {b}")
        ok = a.dtype.is_int or (
            a.dtype.is_bool and self.fn not in (BitwiseKind.SHL, BitwiseKind.SHR)
        )
        expect(ok, self, f"{self.fn.value} needs integer inputs, got {a}")
        return Shape(broadcast_dims(a.dims, b.dims), a.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return bitwise(self.fn, xs[0], xs[1])

    batch = batch_broadcast

    def __str__(self) -> str:
        return self.fn.value


@register
class BitwiseNot(Op):
    """``~x`` of an integer tensor (logical not of a bool one)."""

    mnemonic: ClassVar[str] = "bitwise_not"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE
    nondiff: ClassVar[str] = "bitwise not: integer (or bool) values"

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        expect(x.dtype.is_int or x.dtype.is_bool, self, f"needs an integer input, got {x}")
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return np.invert(xs[0])

    batch = batch_same
