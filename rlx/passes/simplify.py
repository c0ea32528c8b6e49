"""Algebraic simplification. In: a graph. Out: an equivalent graph with identities removed:

* ``x * 1``, ``1 * x``, ``x + 0``, ``0 + x``, ``x - 0``, ``x / 1`` -> ``x`` when the
  constant is all ones / zeros and the result has exactly ``x``'s shape and dtype (a
  constant that broadcasts ``x`` to a bigger shape is kept);
* ``transpose(transpose(x, p), q)`` -> one transpose (or ``x`` when the composed
  permutation is the identity); an identity transpose -> ``x``;
* ``reshape(reshape(x))`` -> one reshape; a reshape to ``x``'s own dims -> ``x``;
* ``cast(x, x.dtype)`` -> ``x``;
* ``neg(neg(x))`` -> ``x``.

``x + 0`` may turn ``-0.0`` into ``+0.0``; removing it changes that sign and nothing else
(the same identity XLA and Inductor apply). Rewrites chain: ``transpose`` three times
collapses in one run because each node sees its already-simplified input.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.elementwise import Binary, BinaryKind, Cast, Unary, UnaryKind
from rlx.ops.movement import Reshape, Transpose
from rlx.passes.base import Rewriter, const_array

__all__ = ["AlgebraicSimplification"]


def _all(arr: np.ndarray | None, value: float) -> bool:
    if arr is None or arr.size == 0:
        return False
    if arr.dtype.kind == "c":  # 1+2j is not 1: compare both parts
        return bool(np.all(arr == value))
    return bool(np.all(arr.astype(np.float64) == value))


class AlgebraicSimplification:
    """Remove arithmetic identities and collapse transpose/reshape/cast/neg chains."""

    name = "simplify"

    def __init__(self) -> None:
        self.notes: list[str] = []
        self._counts: dict[str, int] = {}

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        self._counts = {}
        rw = Rewriter(graph)
        rules: dict[type, Callable[[Rewriter, Node], NodeId | None]] = {
            Binary: self._binary,
            Transpose: self._transpose,
            Reshape: self._reshape,
            Cast: self._cast,
            Unary: self._neg,
        }
        for nid in graph.topo_order():
            node = graph.nodes[nid]
            rule = rules.get(type(node.op))
            new = rule(rw, node) if rule is not None else None
            if new is None:
                rw.copy(node)
            else:
                rw.map[nid] = new
        for what, k in self._counts.items():
            self.notes.append(f"{what}: {k}")
        return rw.finish()

    def _hit(self, what: str) -> None:
        self._counts[what] = self._counts.get(what, 0) + 1

    def _binary(self, rw: Rewriter, node: Node) -> NodeId | None:
        fn = node.op.fn  # type: ignore[attr-defined]
        a, b = (rw.map[i] for i in node.inputs)
        ca, cb = const_array(rw.dst, a), const_array(rw.dst, b)
        candidates: list[tuple[NodeId, np.ndarray | None, float]] = []
        if fn is BinaryKind.ADD:
            candidates = [(a, cb, 0.0), (b, ca, 0.0)]
        elif fn is BinaryKind.MUL:
            candidates = [(a, cb, 1.0), (b, ca, 1.0)]
        elif fn is BinaryKind.SUB:
            candidates = [(a, cb, 0.0)]
        elif fn is BinaryKind.DIV:
            candidates = [(a, cb, 1.0)]
        for keep, other, ident in candidates:
            if _all(other, ident) and rw.new_shape(keep) == node.shape:
                self._hit(f"x {fn.value} {ident:g}")
                return keep
        return None

    def _transpose(self, rw: Rewriter, node: Node) -> NodeId | None:
        x = rw.map[node.inputs[0]]
        rank = node.shape.rank
        perm = tuple(p % rank for p in node.op.perm) if rank else ()  # type: ignore[attr-defined]
        inner = rw.dst.nodes[x]
        if isinstance(inner.op, Transpose):
            p1 = tuple(p % rank for p in inner.op.perm)
            perm = tuple(p1[q] for q in perm)
            x = inner.inputs[0]
            self._hit("transpose of transpose")
        elif perm != tuple(range(rank)):
            return None
        if perm == tuple(range(rank)):
            self._hit("identity transpose")
            return x
        return rw.emit(Transpose(perm), [x], node.loc, node.shape)

    def _reshape(self, rw: Rewriter, node: Node) -> NodeId | None:
        x = rw.map[node.inputs[0]]
        inner = rw.dst.nodes[x]
        collapsed = isinstance(inner.op, Reshape)
        if collapsed:
            x = inner.inputs[0]
        if rw.new_shape(x).dims == node.shape.dims:
            self._hit("identity reshape")
            return x
        if not collapsed:
            return None
        self._hit("reshape of reshape")
        return rw.emit(node.op, [x], node.loc, node.shape)

    def _cast(self, rw: Rewriter, node: Node) -> NodeId | None:
        x = rw.map[node.inputs[0]]
        if rw.new_shape(x).dtype is node.dtype:
            self._hit("cast to same dtype")
            return x
        return None

    def _neg(self, rw: Rewriter, node: Node) -> NodeId | None:
        if node.op.fn is not UnaryKind.NEG:  # type: ignore[attr-defined]
            return None
        inner = rw.dst.nodes[rw.map[node.inputs[0]]]
        if isinstance(inner.op, Unary) and inner.op.fn is UnaryKind.NEG:
            self._hit("double negation")
            return inner.inputs[0]
        return None
