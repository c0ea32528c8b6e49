"""Running product along an axis (``CumProd``): the multiplicative twin of ``cumsum``.
``reverse`` multiplies from the end; ``exclusive`` leaves each element out of its own
product (the first output is 1). Integers wrap; 16-bit floats multiply in f32.

Derivative: ``dy_j / dx_i = y_j / x_i`` for non-zero inputs, so the vjp is a running sum
of ``ct * y`` the other way divided by ``x`` and the jvp ``y`` times a running sum of
``t / x``; zeros are handled exactly as PyTorch does (the first zero of a row takes the
running product with itself set to 1; later positions get 0)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.ops.axis_batch import batch_axis
from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.ops.elementwise import _wide
from rlx.ops.reduce import Cumsum, norm_axis, running
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

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

    # y_j = prod of x_k over k in S_j (k <= j, or k < j exclusive, from the end when
    # reverse): dy_j / dx_i = prod over S_j without i. Zero-safe as PyTorch: before the
    # first zero (in scan order) that is y_j / x_i; at the first zero, the products with
    # it set to 1 (y1); after it, 0.
    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        safe, before, first, y1 = self._zero_split(g, node)
        back = Cumsum(self.axis, not self.reverse, self.exclusive)
        left = g.mul(before, g.div(g.apply(back, [g.mul(ct, node.id)]), safe))
        return (g.add(left, g.mul(first, g.apply(back, [g.mul(ct, y1)]))),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        (t,) = tangents
        if t is None:
            return None
        safe, _, first, y1 = self._zero_split(g, node)
        run = Cumsum(self.axis, self.reverse, self.exclusive)
        left = g.mul(node.id, g.apply(run, [g.div(t, safe)]))
        return g.add(left, g.mul(y1, g.apply(run, [g.mul(t, first)])))

    def _zero_split(self, g: Graph, node: Node) -> tuple[NodeId, ...]:
        """``x`` with zeros made 1, the 0/1 masks of the positions before the first zero
        and of the first zero (in scan order), and the running product with the first
        zero made 1."""
        x = node.inputs[0]
        zero = g.eq(x, 0.0)
        seen = g.apply(Cumsum(self.axis, self.reverse), [g.cast(zero, g.node(x).dtype)])
        before = g.cast(g.eq(seen, 0.0), g.node(x).dtype)
        first = g.logical_and(zero, g.eq(seen, 1.0))
        y1 = g.apply(self, [g.where(first, 1.0, x)])
        return g.where(zero, 1.0, x), before, g.cast(first, g.node(x).dtype), y1

    batch = batch_axis
