"""Derivative formulas of the pointwise ops (``Unary``, ``Binary``, ``Trig``), as graph
builders their ``vjp`` / ``jvp`` methods share (a unary kind's ``f'`` is the
``derivative`` of its row in ``unary_kinds.py``).

Relu and the smooth activations (``activation_grad.ACTIVATIONS``) of real floats emit one
backward op (``ReluBackward``, ``ActivationBackward``) instead of the derivative's graph.

In: the graph being extended, the forward node (``node.inputs`` the primal inputs,
``node.id`` the primal output ``y``) and a tangent or cotangent ``t``. Out: ``t * f'(x)``
as a node (None when the derivative is zero everywhere: round, floor, ceil, sign).

Conventions at the kinks, as PyTorch: ``relu'(0) = 0``, ``abs'(0) = sign(0) = 0``;
``max`` / ``min`` of two equal operands split the gradient evenly (0.5 each, as
``torch.maximum`` and JAX); ``pow``'s base derivative is 0 where the exponent is 0 and
its exponent derivative is 0 where the base is 0 and the exponent >= 0 (else
``y log a``, NaN for a negative base); ``mod`` is C's ``fmod`` (the dividend's sign):
``d/da = 1``, ``d/db = -trunc(a / b)``, computed as ``-(a - y) / b``.

Complex values (c64): the holomorphic ones (add, sub, mul, div, pow, exp, log, sqrt,
rsqrt, recip, square, neg, sin, cos, tanh, sigmoid) take ``t * f'(z)`` forward and
``ct * conj(f'(z))`` in reverse (the adjoint for ``Re <u, v>``, as JAX); the others
(abs, relu, max...) have no complex rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlx.dtype import DType
from rlx.ops.activation_grad import FROM_OUTPUT, ActivationBackward, ReluBackward, emits_backward
from rlx.ops.elementwise import BinaryKind, Cast, UnaryKind
from rlx.ops.trig import Trig, TrigKind
from rlx.ops.unary_kinds import UNARY

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["unary_times", "binary_times", "trig_times"]


def _indicator(g: Graph, cond: NodeId, like: NodeId) -> NodeId:
    """``cond`` (bool) as 0/1 in ``like``'s dtype."""
    return g.apply(Cast(g.node(like).dtype), [cond])


def conj(g: Graph, z: NodeId) -> NodeId:
    """The complex conjugate of ``z`` (``2 re(z) - z``; ``z`` itself when real)."""
    dt = g.node(z).dtype
    if not dt.is_complex:
        return z
    re = g.apply(Cast(dt), [g.apply(Cast(DType.F32), [z])])
    return g.sub(g.mul(re, 2.0), z)


def _times(g: Graph, t: NodeId, d: NodeId, adjoint: bool) -> NodeId:
    """``t * d``, or ``t * conj(d)`` for a complex cotangent (``adjoint``: reverse mode,
    the adjoint for the real inner product ``Re <u, v>``, as JAX)."""
    return g.mul(t, conj(g, d) if adjoint else d)


def unary_times(
    g: Graph, fn: UnaryKind, node: Node, t: NodeId, adjoint: bool = False
) -> NodeId | None:
    """``t * f'(x)`` for ``y = fn(x)``, ``f'`` the ``derivative`` of the kind's row
    (None: zero derivative); ``adjoint``: reverse mode (the derivative conjugated for
    complex values)."""
    d = UNARY[fn].derivative
    if d is None:
        return None
    if emits_backward(fn, g.node(t).dtype) and g.node(t).shape == node.shape:
        # one backward op instead of the derivative's primitive graph (t * f' is linear in
        # t, so forward mode emits it too)
        if fn is UnaryKind.RELU:
            return g.apply(ReluBackward(), [node.id, t])
        v = node.id if fn in FROM_OUTPUT else node.inputs[0]
        return g.apply(ActivationBackward(fn), [v, t])
    if isinstance(d, float):  # a constant derivative
        return t if d == 1.0 else g.neg(t) if d == -1.0 else g.mul(t, d)
    (x,) = node.inputs
    return _times(g, t, d(g, x, node.id), adjoint)


def _extreme_weight(g: Graph, fn: BinaryKind, a: NodeId, b: NodeId) -> NodeId:
    """Share of the gradient ``a`` gets in ``max`` / ``min``: 1 where it wins, 0.5 on ties."""
    wins = g.gt(a, b) if fn is BinaryKind.MAX else g.lt(a, b)
    return g.add(_indicator(g, wins, a), g.mul(_indicator(g, g.eq(a, b), a), 0.5))


def binary_times(
    g: Graph,
    fn: BinaryKind,
    node: Node,
    ta: NodeId | None,
    tb: NodeId | None,
    adjoint: bool = False,
) -> tuple[NodeId | None, NodeId | None]:
    """``(ta * dy/da, tb * dy/db)`` for ``y = a (fn) b`` (None where ``t`` is None or the
    partial is zero; ``adjoint`` as :func:`unary_times`). The products broadcast;
    callers unbroadcast or expand them."""
    a, b = node.inputs
    y = node.id

    def times(t: NodeId | None, d: Callable[[], NodeId]) -> NodeId | None:
        return None if t is None else _times(g, t, d(), adjoint)

    if fn is BinaryKind.ADD:
        return ta, tb
    if fn is BinaryKind.SUB:
        return ta, None if tb is None else g.neg(tb)
    if fn is BinaryKind.MUL:
        return times(ta, lambda: b), times(tb, lambda: a)
    if fn is BinaryKind.DIV:
        return times(ta, lambda: g.recip(b)), times(tb, lambda: g.neg(g.div(y, b)))
    if fn in (BinaryKind.MAX, BinaryKind.MIN):
        if ta is None and tb is None:
            return None, None
        w = _extreme_weight(g, fn, a, b)
        return times(ta, lambda: w), times(tb, lambda: g.sub(1.0, w))
    if fn is BinaryKind.POW:

        def da() -> NodeId:
            return g.where(g.eq(b, 0.0), 0.0, g.mul(b, g.pow(a, g.sub(b, 1.0))))

        def db() -> NodeId:
            base0 = g.logical_and(g.eq(a, 0.0), g.ge(b, 0.0))
            return g.where(base0, 0.0, g.mul(y, g.log(a)))

        return times(ta, da), times(tb, db)
    if fn is BinaryKind.MOD:
        return ta, times(tb, lambda: g.neg(g.div(g.sub(a, y), b)))
    return None, None  # and / or: bool


# f'(x) from x and y = f(x)
_TRIG: dict[TrigKind, Callable[[Graph, NodeId, NodeId], NodeId]] = {
    TrigKind.TAN: lambda g, x, y: g.add(g.square(y), 1.0),
    TrigKind.ASIN: lambda g, x, y: g.rsqrt(g.sub(1.0, g.square(x))),
    TrigKind.ACOS: lambda g, x, y: g.neg(g.rsqrt(g.sub(1.0, g.square(x)))),
    TrigKind.ATAN: lambda g, x, y: g.recip(g.add(g.square(x), 1.0)),
    TrigKind.SINH: lambda g, x, y: g.apply(Trig(TrigKind.COSH), [x]),
    TrigKind.COSH: lambda g, x, y: g.apply(Trig(TrigKind.SINH), [x]),
    TrigKind.ASINH: lambda g, x, y: g.rsqrt(g.add(g.square(x), 1.0)),
    TrigKind.ACOSH: lambda g, x, y: g.rsqrt(g.sub(g.square(x), 1.0)),
    TrigKind.ATANH: lambda g, x, y: g.recip(g.sub(1.0, g.square(x))),
}


def trig_times(g: Graph, fn: TrigKind, node: Node, t: NodeId) -> NodeId:
    """``t * f'(x)`` for ``y = fn(x)`` (real floats only)."""
    return g.mul(t, _TRIG[fn](g, node.inputs[0], node.id))
