"""Derivative formulas of the pointwise ops (``Unary``, ``Binary``, ``Trig``), as graph
builders their ``vjp`` / ``jvp`` methods share.

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

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlx.dtype import DType
from rlx.ops.elementwise import BinaryKind, Cast, UnaryKind
from rlx.ops.trig import Trig, TrigKind

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["unary_times", "binary_times", "trig_times"]

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_TWO_SQRT_PI = 2.0 / math.sqrt(math.pi)
_GELU_K = 0.044715


def _indicator(g: Graph, cond: NodeId, like: NodeId) -> NodeId:
    """``cond`` (bool) as 0/1 in ``like``'s dtype."""
    return g.apply(Cast(g.node(like).dtype), [cond])


def _gelu(g: Graph, x: NodeId, y: NodeId) -> NodeId:
    cdf = g.mul(g.add(g.erf(g.mul(x, _SQRT1_2)), 1.0), 0.5)
    pdf = g.mul(g.exp(g.mul(g.square(x), -0.5)), _INV_SQRT_2PI)
    return g.add(cdf, g.mul(x, pdf))


def _gelu_tanh(g: Graph, x: NodeId, y: NodeId) -> NodeId:
    x2 = g.square(x)
    th = g.tanh(g.mul(g.add(x, g.mul(g.mul(x2, x), _GELU_K)), _SQRT_2_PI))
    du = g.mul(g.add(g.mul(x2, 3.0 * _GELU_K), 1.0), _SQRT_2_PI)
    left = g.mul(g.add(th, 1.0), 0.5)
    right = g.mul(g.mul(g.mul(x, 0.5), g.sub(1.0, g.square(th))), du)
    return g.add(left, right)


def _silu(g: Graph, x: NodeId, y: NodeId) -> NodeId:
    s = g.sigmoid(x)
    return g.mul(s, g.add(g.mul(x, g.sub(1.0, s)), 1.0))


# f'(x) from x and y = f(x)
_UNARY: dict[UnaryKind, Callable[[Graph, NodeId, NodeId], NodeId]] = {
    UnaryKind.RELU: lambda g, x, y: _indicator(g, g.gt(x, 0.0), x),
    UnaryKind.GELU: _gelu,
    UnaryKind.GELU_TANH: _gelu_tanh,
    UnaryKind.SILU: _silu,
    UnaryKind.SIGMOID: lambda g, x, y: g.mul(y, g.sub(1.0, y)),
    UnaryKind.TANH: lambda g, x, y: g.sub(1.0, g.square(y)),
    UnaryKind.EXP: lambda g, x, y: y,
    UnaryKind.LOG: lambda g, x, y: g.recip(x),
    UnaryKind.SQRT: lambda g, x, y: g.div(0.5, y),
    UnaryKind.RSQRT: lambda g, x, y: g.mul(g.mul(g.square(y), y), -0.5),
    UnaryKind.ABS: lambda g, x, y: g.sign(x),
    UnaryKind.SIN: lambda g, x, y: g.cos(x),
    UnaryKind.COS: lambda g, x, y: g.neg(g.sin(x)),
    UnaryKind.RECIP: lambda g, x, y: g.neg(g.square(y)),
    UnaryKind.SQUARE: lambda g, x, y: g.mul(x, 2.0),
    UnaryKind.SOFTPLUS: lambda g, x, y: g.sigmoid(x),
    UnaryKind.ERF: lambda g, x, y: g.mul(g.exp(g.neg(g.square(x))), _TWO_SQRT_PI),
}
# piecewise constant (zero derivative) or bool: no gradient flows
_ZERO = frozenset({UnaryKind.ROUND, UnaryKind.FLOOR, UnaryKind.CEIL, UnaryKind.SIGN, UnaryKind.NOT})


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
    """``t * f'(x)`` for ``y = fn(x)`` (None: zero derivative); ``adjoint``: reverse
    mode (the derivative conjugated for complex values)."""
    if fn in _ZERO:
        return None
    if fn is UnaryKind.NEG:
        return g.neg(t)
    (x,) = node.inputs
    return _times(g, t, _UNARY[fn](g, x, node.id), adjoint)


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
