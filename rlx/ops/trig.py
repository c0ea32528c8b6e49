"""Trigonometric and hyperbolic functions beyond the unary set (which has sin, cos, tanh):
tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh, elementwise on floats (16-bit
floats computed in f32 and rounded once). Out-of-domain inputs give NaN, as NumPy. Derivative rules: the
formulas of ``rlx.ops.pointwise_grad`` (``tan' = 1 + tan^2``, ``acosh' = 1/sqrt(x^2 - 1)``...)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.ops.axis_batch import batch_same
from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.ops.elementwise import _wide
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["TrigKind", "Trig", "TRIG_FNS"]


class TrigKind(enum.Enum):
    """The function :class:`Trig` applies."""

    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"


TRIG_FNS: dict[TrigKind, Callable[[np.ndarray], np.ndarray]] = {
    TrigKind.TAN: np.tan,
    TrigKind.ASIN: np.arcsin,
    TrigKind.ACOS: np.arccos,
    TrigKind.ATAN: np.arctan,
    TrigKind.SINH: np.sinh,
    TrigKind.COSH: np.cosh,
    TrigKind.ASINH: np.arcsinh,
    TrigKind.ACOSH: np.arccosh,
    TrigKind.ATANH: np.arctanh,
}


@register
class Trig(Op):
    """``y = fn(x)`` elementwise on a float tensor, ``fn`` one of :class:`TrigKind`."""

    mnemonic: ClassVar[str] = "trig"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE
    fn: TrigKind

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        expect(x.dtype.is_float, self, f"{self.fn.value} needs a float input, got {x}")
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        with np.errstate(all="ignore"):
            return TRIG_FNS[self.fn](_wide(xs[0]))

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops.pointwise_grad import trig_times

        return (trig_times(g, self.fn, node, ct),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.pointwise_grad import trig_times

        (t,) = tangents
        return None if t is None else trig_times(g, self.fn, node, t)

    def __str__(self) -> str:
        return self.fn.value

    batch = batch_same
