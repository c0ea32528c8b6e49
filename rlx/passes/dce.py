"""Dead code elimination. In: a graph. Out: the same graph without the nodes no output
depends on; node ids are renumbered in topological order.

Every Input and Param node is kept even when unused: they are the graph's interface
(``input_names``, ``set_param``), and dropping one would make feeding it an error. The
notes name unused inputs so a user can see them.
"""

from __future__ import annotations

from rlx.ir.mir import Graph
from rlx.ops.core import Input, Param
from rlx.passes.base import Rewriter, live_nodes

__all__ = ["DeadCodeElimination"]


class DeadCodeElimination:
    """Drop nodes that no graph output depends on (inputs and params are kept)."""

    name = "dce"

    def __init__(self) -> None:
        self.notes: list[str] = []

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        live = live_nodes(graph)
        rw = Rewriter(graph)
        removed = 0
        unused = []
        for nid in graph.topo_order():
            node = graph.nodes[nid]
            boundary = isinstance(node.op, (Input, Param))
            if nid in live or boundary:
                rw.copy(node)
                if boundary and nid not in live:
                    unused.append(f"{node.op.mnemonic} {node.op.name!r}")  # type: ignore[attr-defined]
            else:
                removed += 1
        if removed:
            self.notes.append(f"removed {removed} dead nodes")
        if unused:
            self.notes.append("kept unused " + ", ".join(unused))
        return rw.finish()
