"""Running product along an axis (``CumProd``): the multiplicative twin of ``cumsum``.
``reverse`` multiplies from the end; ``exclusive`` leaves each element out of its own
product (the first output is 1). Integers wrap; 16-bit floats multiply in f32.

Derivative: ``dy_j / dx_i = y_j / x_i``, a running sum of ``ct * y`` the other way divided
by ``x`` (vjp), ``y`` times a running sum of ``t / x`` (jvp): exact for non-zero inputs;
a zero input gives inf / NaN there (PyTorch's zero-safe rule is a quadratic-cost
special case not built here; ``Reduce`` prod is zero-safe)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.axis_batch import batch_axis
from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.ops.elementwise import _wide
from rlx.ops.reduce import Cumsum, norm_axis, running
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

    # y_j = prod of x_i over i in S_j, so dy_j / dx_i = y_j / x_i for i in S_j: exact
    # for non-zero inputs (a zero input gives inf / NaN, see the module docstring)
    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        back = Cumsum(self.axis, not self.reverse, self.exclusive)
        return (g.div(g.apply(back, [g.mul(ct, node.id)]), node.inputs[0]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        (t,) = tangents
        if t is None:
            return None
        run = Cumsum(self.axis, self.reverse, self.exclusive)
        return g.mul(node.id, g.apply(run, [g.div(t, node.inputs[0])]))

    batch = batch_axis
