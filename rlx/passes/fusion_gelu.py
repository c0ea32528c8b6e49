"""GELU recognition: a spelled-out GELU -> one ``gelu`` / ``gelu_tanh`` unary node, so the
matmul fusion can apply it in the SGEMM's output tile.

Importers write GELU as the chain of its formula (ONNX before opset 20, PyTorch's
exporters, hand-written graphs). Recognised, with the multiplications in any order and
grouping, division by a constant read as multiplication by its reciprocal, and each
constant within f32 rounding::

    0.5 * x * (1 + erf(x * 0.70710678))              ->  gelu(x)         (x / 1.41421356 too)
    0.5 * x * (1 + tanh(0.79788456 * (x + 0.044715 * x*x*x)))  ->  gelu_tanh(x)
                                                     (x ** 3 or x * x * x)

In: a graph. Out: the same graph with each match's last multiplication replaced by the
unary op on ``x``; every other node of the chain must have no user outside it (the
fusion report names the one that does). The unary computes the same formula (see
:mod:`rlx.ops.elementwise`).
"""

from __future__ import annotations

import math

from rlx.ir.mir import Node, NodeId
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind
from rlx.passes.algebra import Product, close, plus_const, product, scalar
from rlx.passes.fusion import FusionView, Match, PatternFusion
from rlx.passes.report import FusionPattern

__all__ = ["GeluFusion"]

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715


def _unary(view: FusionView, nid: NodeId, fn: UnaryKind) -> bool:
    op = view.node(nid).op
    return isinstance(op, Unary) and op.fn is fn


def _cube_of(view: FusionView, nid: NodeId) -> tuple[NodeId, list[NodeId]] | None:
    """``0.044715 * x**3`` (as ``pow(x, 3)`` or ``x * x * x``) -> (x, nodes)."""
    p = product(view, nid)
    if not close(p.coef, _CUBIC):
        return None
    if len(p.factors) == 3 and len(set(p.factors)) == 1:
        return p.factors[0], list(p.nodes)
    if len(p.factors) == 1:
        f = p.factors[0]
        op = view.node(f).op
        if isinstance(op, Binary) and op.fn is BinaryKind.POW and view.why_not_inner(f) is None:
            base, e = view.node(f).inputs
            if close(scalar(view, e), 3.0):
                return base, [*p.nodes, f]
    return None


class GeluFusion(PatternFusion):
    """``0.5 * x * (1 + erf(x / sqrt 2))`` (or its tanh form) -> ``gelu`` (``gelu_tanh``)."""

    name = "fuse_gelu"
    pattern = FusionPattern.GELU

    def match_at(self, view: FusionView, node: Node, claimed: set[NodeId]) -> Match | None:
        op = node.op
        if not (isinstance(op, Binary) and op.fn is BinaryKind.MUL and node.dtype.is_float):
            return None
        p = product(view, node.id)
        if len(p.factors) != 2 or not close(p.coef, 0.5):
            return None
        for x, one_plus in (p.factors, p.factors[::-1]):
            got = self._one_plus(view, x, one_plus)
            if got is not None:
                return self._finish(view, node, x, got[0], [*p.nodes, *got[1]])
        return None

    def _one_plus(
        self, view: FusionView, x: NodeId, nid: NodeId
    ) -> tuple[UnaryKind, list[NodeId]] | None:
        """``1 + erf(x / sqrt 2)`` or ``1 + tanh(...)`` of ``x`` -> (gelu kind, nodes)."""
        s = plus_const(view, nid)
        if s is None or not close(s[1], 1.0):
            return None
        f = s[0]
        arg = view.node(f).inputs[0] if view.node(f).inputs else None
        if arg is None:
            return None
        nodes = [nid, f]
        if _unary(view, f, UnaryKind.ERF):
            a = product(view, arg)
            if a.factors == (x,) and close(a.coef, _SQRT1_2):
                return UnaryKind.GELU, [*nodes, *a.nodes]
            return None
        if _unary(view, f, UnaryKind.TANH):
            return self._tanh_arg(view, x, product(view, arg), nodes)
        return None

    def _tanh_arg(
        self, view: FusionView, x: NodeId, a: Product, nodes: list[NodeId]
    ) -> tuple[UnaryKind, list[NodeId]] | None:
        """``sqrt(2/pi) * (x + 0.044715 * x**3)`` -> (gelu_tanh, nodes)."""
        if len(a.factors) != 1 or not close(a.coef, _SQRT_2_PI):
            return None
        inner = a.factors[0]
        op = view.node(inner).op
        if not (isinstance(op, Binary) and op.fn is BinaryKind.ADD):
            return None
        for lin, cub in (view.node(inner).inputs, view.node(inner).inputs[::-1]):
            c = _cube_of(view, cub)
            if lin == x and c is not None and c[0] == x:
                return UnaryKind.GELU_TANH, [*nodes, *a.nodes, inner, *c[1]]
        return None

    def _finish(
        self, view: FusionView, node: Node, x: NodeId, kind: UnaryKind, nodes: list[NodeId]
    ) -> Match | None:
        inside = frozenset(nodes) | {node.id}
        desc = f"{kind.value} spelled out at {view.desc(node.id)} ({len(inside)} nodes)"
        if view.node(x).shape != node.shape:
            self.miss(sorted(inside), desc, f"the product broadcasts {view.node(x).shape}")
            return None
        if self.escapes(view, inside, node.id, desc):
            return None
        return Match(node.id, Unary(kind), (x,), inside, desc)
