"""Common subexpression elimination. In: a graph. Out: an equivalent graph where two pure
nodes with the same op (attributes included), the same inputs and the same shape are one
node. Constants with equal values merge too (a Constant is pure; its value is an
attribute). Inputs of commutative binaries (add, mul, max, min, and, or, eq, ne) are
compared as an unordered pair, so ``a + b`` and ``b + a`` merge.
"""

from __future__ import annotations

from collections.abc import Hashable

from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.elementwise import Binary, BinaryKind, Compare, CompareKind
from rlx.passes.base import Rewriter

__all__ = ["CommonSubexpressionElimination"]

_COMMUTATIVE_BIN = frozenset(
    {BinaryKind.ADD, BinaryKind.MUL, BinaryKind.MAX, BinaryKind.MIN, BinaryKind.AND, BinaryKind.OR}
)
_COMMUTATIVE_CMP = frozenset({CompareKind.EQ, CompareKind.NE})


def _commutative(node: Node) -> bool:
    op = node.op
    if isinstance(op, Binary):
        return op.fn in _COMMUTATIVE_BIN
    if isinstance(op, Compare):
        return op.fn in _COMMUTATIVE_CMP
    return False


class CommonSubexpressionElimination:
    """Merge structurally equal pure nodes."""

    name = "cse"

    def __init__(self) -> None:
        self.notes: list[str] = []

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        rw = Rewriter(graph)
        seen: dict[Hashable, NodeId] = {}
        merged = 0
        for nid in graph.topo_order():
            node = graph.nodes[nid]
            if not node.op.pure:
                rw.copy(node)
                continue
            ins = tuple(rw.map[i] for i in node.inputs)
            key_ins = tuple(sorted(ins)) if _commutative(node) else ins
            key = (node.op, key_ins, node.shape)
            hit = seen.get(key)
            if hit is not None:
                rw.map[nid] = hit
                merged += 1
            else:
                seen[key] = rw.copy(node)
        if merged:
            self.notes.append(f"merged {merged} duplicate nodes")
        return rw.finish()
