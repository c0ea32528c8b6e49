"""Layer norm recognition: a layer norm spelled out with reductions -> one ``layer_norm``
node (which the residual-norm fusion and the native row kernel then take).

ONNX before opset 17 has no LayerNormalization, so exporters write (over the last axis,
``keepdims``)::

    mean = reduce_mean(x);  d = x - mean
    var  = reduce_mean(d * d)            (or pow(d, 2))
    n    = d / sqrt(var + eps)           (or d * rsqrt(var + eps), d * recip(sqrt(..)))
    y    = n * gamma [+ beta]            gamma, beta vectors over the last axis

In: a graph. Out: each match's last node replaced by ``layer_norm[eps, has_beta](x, gamma[,
beta])``; every other node of the chain must have no user outside it. A chain without
``gamma`` is left as it is (the report says so). ``layer_norm`` computes the same
formula (see :class:`~rlx.ops.norm.LayerNorm`).
"""

from __future__ import annotations

from rlx.ir.mir import Node, NodeId
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind
from rlx.ops.norm import LayerNorm
from rlx.ops.reduce import Reduce, ReduceKind
from rlx.passes.algebra import close, plus_const, scalar
from rlx.passes.fusion import FusionView, Match, PatternFusion
from rlx.passes.report import FusionPattern

__all__ = ["LayerNormFusion"]


def _fn(view: FusionView, nid: NodeId) -> object:
    op = view.node(nid).op
    return op.fn if isinstance(op, Binary | Unary) else None


def _last_mean(view: FusionView, nid: NodeId) -> NodeId | None:
    """The input of ``reduce_mean(x, last axis, keepdims)``, else None."""
    node = view.node(nid)
    op = node.op
    if not isinstance(op, Reduce) or op.fn is not ReduceKind.MEAN or not op.keepdims:
        return None
    r = view.node(node.inputs[0]).shape.rank
    return node.inputs[0] if r and tuple(a % r for a in op.axes) == (r - 1,) else None


class LayerNormFusion(PatternFusion):
    """``(x - mean) / sqrt(var + eps) * gamma [+ beta]`` over the last axis -> ``layer_norm``."""

    name = "fuse_layer_norm"
    pattern = FusionPattern.LAYER_NORM

    def match_at(self, view: FusionView, node: Node, claimed: set[NodeId]) -> Match | None:
        fn = _fn(view, node.id)
        if fn is BinaryKind.ADD:  # n * gamma + beta
            for scaled, beta in (node.inputs, node.inputs[::-1]):
                if _fn(view, scaled) is BinaryKind.MUL and self._vector(view, beta, node):
                    got = self._scaled(view, scaled, node)
                    if got is not None:
                        x, gamma, eps, nodes = got
                        return self._finish(view, node, x, (gamma, beta), eps, [*nodes, node.id])
            return None
        if fn is BinaryKind.MUL:  # n * gamma, unless a bias add follows (matched there)
            user = view.sole_user(node.id)
            if user is not None and _fn(view, user) is BinaryKind.ADD:
                other = [i for i in view.node(user).inputs if i != node.id]
                if other and self._vector(view, other[0], view.node(user)):
                    return None
            got = self._scaled(view, node.id, node)
            if got is not None:
                x, gamma, eps, nodes = got
                return self._finish(view, node, x, (gamma,), eps, nodes)
        return None

    @staticmethod
    def _vector(view: FusionView, nid: NodeId, out: Node) -> bool:
        s = view.node(nid).shape
        return s.rank == 1 and bool(out.shape.rank) and s.dims[0] == out.shape.dims[-1]

    def _scaled(
        self, view: FusionView, mul: NodeId, out: Node
    ) -> tuple[NodeId, NodeId, float, list[NodeId]] | None:
        """``norm * gamma`` -> (x, gamma, eps, nodes)."""
        for norm, gamma in (view.node(mul).inputs, view.node(mul).inputs[::-1]):
            if not self._vector(view, gamma, out):
                continue
            got = self._norm(view, norm)
            if got is not None:
                return got[0], gamma, got[1], [*got[2], mul]
        return None

    def _norm(self, view: FusionView, nid: NodeId) -> tuple[NodeId, float, list[NodeId]] | None:
        """``d / sqrt(var + eps)`` (or ``d * rsqrt(..)``, ``d * recip(sqrt(..))``) ->
        (x, eps, nodes)."""
        fn = _fn(view, nid)
        a, b = view.node(nid).inputs if fn in (BinaryKind.DIV, BinaryKind.MUL) else (None, None)
        if a is None or b is None:
            return None
        pairs = [(a, b)] if fn is BinaryKind.DIV else [(a, b), (b, a)]
        for d, den in pairs:
            chain = [nid, den]
            if fn is BinaryKind.MUL:
                if _fn(view, den) is UnaryKind.RECIP:
                    den = view.node(den).inputs[0]
                    chain.append(den)
                    if _fn(view, den) is not UnaryKind.SQRT:
                        continue
                elif _fn(view, den) is not UnaryKind.RSQRT:
                    continue
            elif _fn(view, den) is not UnaryKind.SQRT:
                continue
            got = self._variance(view, d, view.node(den).inputs[0])
            if got is not None:
                return got[0], got[1], [*chain, *got[2]]
        return None

    def _variance(
        self, view: FusionView, d: NodeId, var_eps: NodeId
    ) -> tuple[NodeId, float, list[NodeId]] | None:
        """``d = x - mean(x)`` and ``var_eps = mean(d * d) + eps`` -> (x, eps, nodes)."""
        s = plus_const(view, var_eps)
        if s is None or s[1] < 0 or _fn(view, d) is not BinaryKind.SUB:
            return None
        var, eps = s
        sq = _last_mean(view, var)
        x, mean = view.node(d).inputs
        if sq is None or _last_mean(view, mean) != x:
            return None
        a, b = view.node(sq).inputs
        squares = (_fn(view, sq) is BinaryKind.MUL and a == b == d) or (
            _fn(view, sq) is BinaryKind.POW and a == d and close(scalar(view, b), 2.0)
        )
        if not squares:
            return None
        return x, eps, [var_eps, var, sq, d, mean]

    def _finish(
        self,
        view: FusionView,
        node: Node,
        x: NodeId,
        affine: tuple[NodeId, ...],
        eps: float,
        nodes: list[NodeId],
    ) -> Match | None:
        inside = frozenset(nodes) | {node.id}
        desc = f"layer norm spelled out at {view.desc(node.id)} ({len(inside)} nodes)"
        if view.node(x).shape != node.shape or not node.dtype.is_float:
            self.miss(sorted(inside), desc, f"the chain broadcasts {view.node(x).shape}")
            return None
        if self.escapes(view, inside, node.id, desc):
            return None
        op = LayerNorm(eps, len(affine) == 2)
        why = view.infer(op, (x, *affine))
        if why is not None:
            self.miss(sorted(inside), desc, why)
            return None
        return Match(node.id, op, (x, *affine), inside, desc)
