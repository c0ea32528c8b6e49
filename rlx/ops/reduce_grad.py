"""Backward ops and derivative helpers of the reduction family (``rlx/ops/reduce.py``).

* :class:`SoftmaxBackward` ``(dy, y) -> dx = y * (dy - sum(dy * y, axis))``: the vjp of
  softmax from its output ``y`` (and, the Jacobian being symmetric, its jvp too).
* :class:`LogSoftmaxBackward` ``(dy, y) -> dx = dy - exp(y) * sum(dy, axis)``: the vjp of
  log-softmax from its output ``y``.

Both are one row pass each on the CPU (``backends/cpu/kernels/reduce_grad.py``) instead
of the chain of temporaries the primitive ops would allocate. ``reduce_vjp`` /
``reduce_jvp`` are ``Reduce``'s rules: sum and mean broadcast the cotangent back (mean
divides by the count, read from the dims at run time when one is symbolic); max / min
send it to every position holding the extremum, split evenly among ties (as
``torch.amax``; JAX does the same); prod uses the product of the other elements
(exclusive running products from both ends), so zeros in the input are handled exactly.
Complex (c64) prod conjugates that product in reverse mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.ops.axis_batch import batch_axis
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.elementwise import _wide
from rlx.ops.pointwise_grad import conj
from rlx.ops.reduce import Reduce, ReduceKind, canon_axis, norm_axes, norm_axis
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["SoftmaxBackward", "LogSoftmaxBackward", "reduce_vjp", "reduce_jvp"]


def _pair_infer(op: Op, ins: tuple[Shape, ...], axis: int) -> Shape:
    dy, y = ins
    norm_axis(op, y, axis)
    expect(y.dtype.is_float, op, f"needs float inputs, got {y}")
    expect(dy == y, op, f"the cotangent {dy} must have the output's shape and dtype {y}")
    return y


def _rowsum(g: Graph, x: NodeId, axis: int) -> NodeId:
    return g.sum(x, axis, keepdims=True)


@register
class SoftmaxBackward(Op):
    """``(dy, y) -> y * (dy - sum(dy * y, axis))``: the cotangent of softmax's input from
    the cotangent ``dy`` of its output ``y`` (both of one float shape)."""

    mnemonic: ClassVar[str] = "softmax_backward"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    axis: int = -1

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return _pair_infer(self, ins, self.axis)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        dy, y = _wide(xs[0]), _wide(xs[1])
        return y * (dy - np.sum(dy * y, axis=self.axis, keepdims=True))

    # dx = y dy - y s with s = sum(dy y): linear in dy (symmetric), and in y
    # d dx = dy dy' - s dy' - y sum(dy dy')
    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        dy, y = node.inputs
        s = _rowsum(g, g.mul(dy, y), self.axis)
        d_y = g.sub(g.mul(ct, g.sub(dy, s)), g.mul(dy, _rowsum(g, g.mul(ct, y), self.axis)))
        return g.apply(self, [ct, y]), d_y

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.rules import add_any

        dy, y = node.inputs
        tdy, ty = tangents
        terms = [None if tdy is None else g.apply(self, [tdy, y])]
        if ty is not None:
            s = _rowsum(g, g.mul(dy, y), self.axis)
            terms.append(g.mul(ty, g.sub(dy, s)))
            terms.append(g.neg(g.mul(y, _rowsum(g, g.mul(dy, ty), self.axis))))
        return add_any(g, terms)

    batch = batch_axis


@register
class LogSoftmaxBackward(Op):
    """``(dy, y) -> dy - exp(y) * sum(dy, axis)``: the cotangent of log-softmax's input
    from the cotangent ``dy`` of its output ``y`` (both of one float shape)."""

    mnemonic: ClassVar[str] = "log_softmax_backward"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    axis: int = -1

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return _pair_infer(self, ins, self.axis)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        dy, y = _wide(xs[0]), _wide(xs[1])
        with np.errstate(all="ignore"):
            return dy - np.exp(y) * np.sum(dy, axis=self.axis, keepdims=True)

    # d dx = dy' - e sum(dy') - e y' sum(dy), e = exp(y)
    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        dy, y = node.inputs
        e = g.exp(y)
        d_dy = g.sub(ct, _rowsum(g, g.mul(ct, e), self.axis))
        d_y = g.neg(g.mul(g.mul(ct, e), _rowsum(g, dy, self.axis)))
        return d_dy, d_y

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.rules import add_any

        dy, y = node.inputs
        tdy, ty = tangents
        e = g.exp(y)
        terms = []
        if tdy is not None:
            terms.append(g.sub(tdy, g.mul(e, _rowsum(g, tdy, self.axis))))
        if ty is not None:
            terms.append(g.neg(g.mul(g.mul(e, ty), _rowsum(g, dy, self.axis))))
        return add_any(g, terms)

    batch = batch_axis


@graph_method
def softmax_backward(g: Graph, dy: NodeId, y: NodeId, axis: int = -1) -> NodeId:
    """Softmax's input cotangent from ``dy`` and the softmax output ``y`` along ``axis``."""
    return g.apply(SoftmaxBackward(canon_axis(g, y, axis)), [dy, y])


@graph_method
def log_softmax_backward(g: Graph, dy: NodeId, y: NodeId, axis: int = -1) -> NodeId:
    """Log-softmax's input cotangent from ``dy`` and its output ``y`` along ``axis``."""
    return g.apply(LogSoftmaxBackward(canon_axis(g, y, axis)), [dy, y])


# ---- Reduce's rules ------------------------------------------------------------------


def reduce_vjp(g: Graph, op: Reduce, node: Node, ct: NodeId) -> NodeId:
    """The cotangent of a reduction's input from the cotangent ``ct`` of its output."""
    (x,) = node.inputs
    axes = norm_axes(op, g.shape(x), op.axes)
    if not axes:
        return ct
    ck = _kept(g, op, ct, axes)
    if op.fn in (ReduceKind.SUM, ReduceKind.MEAN):
        dx = g.expand(ck, list(g.shape(x).dims))
        return dx if op.fn is ReduceKind.SUM else g.div(dx, _count(g, x, axes))
    return g.mul(ck, conj(g, _weight(g, op, node, axes)))


def reduce_jvp(g: Graph, op: Reduce, node: Node, t: NodeId) -> NodeId:
    """The tangent of a reduction's output from the tangent ``t`` of its input."""
    if op.fn in (ReduceKind.SUM, ReduceKind.MEAN):
        return g.apply(op, [t])
    axes = norm_axes(op, g.shape(node.inputs[0]), op.axes)
    if not axes:
        return t
    w = _weight(g, op, node, axes)
    return g.apply(Reduce(ReduceKind.SUM, axes, op.keepdims), [g.mul(t, w)])


def _kept(g: Graph, op: Reduce, ct: NodeId, axes: tuple[int, ...]) -> NodeId:
    """``ct`` (a reduction's output) with the reduced ``axes`` back as size 1."""
    return ct if op.keepdims else g.unsqueeze(ct, sorted(axes))


def _count(g: Graph, x: NodeId, axes: tuple[int, ...]) -> NodeId:
    """How many elements of ``x`` each output of a reduction over ``axes`` combines: a
    scalar constant, or the product of the reduced dims read by ``shape_of`` at run time
    when one is symbolic."""
    from rlx.ops.rules import scalar

    dims = [g.shape(x).dims[a] for a in axes]
    if all(isinstance(d, int) for d in dims):
        return scalar(g, float(np.prod(dims)), x)
    sizes = g.gather(g.shape_of(x), g.constant(np.asarray(axes, np.int64)), 0)
    return g.cast(g.prod(sizes, 0), g.shape(x).dtype)


def _weight(g: Graph, op: Reduce, node: Node, axes: tuple[int, ...]) -> NodeId:
    """``d y / d x`` of a max / min / prod reduction, in ``x``'s dims."""
    (x,) = node.inputs
    if op.fn is ReduceKind.PROD:
        return _others(g, x, axes)
    hit = g.cast(g.eq(x, _kept(g, op, node.id, axes)), g.shape(x).dtype)
    return g.div(hit, g.sum(hit, list(axes), keepdims=True))


def _others(g: Graph, x: NodeId, axes: tuple[int, ...]) -> NodeId:
    """The product over ``axes`` of every element but each one itself (zero-safe): the
    exclusive running products from both ends along one axis; over several axes
    ``others_a(prod_rest(x)) * others_rest(x)``."""
    from rlx.ops.cumulative import CumProd

    a, rest = axes[0], axes[1:]
    if rest:
        r = g.apply(Reduce(ReduceKind.PROD, rest, True), [x])
        return g.mul(_others(g, r, (a,)), _others(g, x, rest))
    return g.mul(g.apply(CumProd(a, False, True), [x]), g.apply(CumProd(a, True, True), [x]))
