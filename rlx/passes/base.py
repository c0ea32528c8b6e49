"""Pass protocol, per-pass records and the graph-rebuilding helper every pass uses.

In: nothing (definitions only). Out: :class:`Pass` (the protocol a pass satisfies),
:class:`PassRecord` (what one pass did), :class:`Rewriter` (build a new graph from an
old one, mapping old node ids to new ones) and small graph queries shared by passes.

Passes never mutate their input graph: they build a new one with a :class:`Rewriter`,
so a failed pass leaves the caller's graph as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.base import Op
from rlx.shape import Shape
from rlx.source import SourceLoc

__all__ = ["Pass", "PassRecord", "Rewriter", "use_counts", "live_nodes", "const_array"]


class Pass(Protocol):
    """A graph-to-graph rewrite with a name. ``notes`` lists what the last run changed
    (and, for what it did not, why)."""

    name: str
    notes: list[str]

    def run(self, graph: Graph) -> Graph: ...


@dataclass
class PassRecord:
    """What one pass did: timing, node counts, and its notes."""

    name: str
    seconds: float
    nodes_before: int
    nodes_after: int
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        n = f"{self.nodes_before}->{self.nodes_after} nodes"
        return f"{self.name:<28} {self.seconds * 1e3:8.2f} ms  {n}" + (
            "  " + "; ".join(self.notes[:3]) + (" ..." if len(self.notes) > 3 else "")
            if self.notes
            else ""
        )


class Rewriter:
    """Builds a new graph from ``src``. ``map[old_id]`` is the new id of an old node.

    Typical use: walk ``src`` in topological order, :meth:`copy` the nodes to keep (their
    inputs are remapped), :meth:`emit` new nodes, set ``map`` for replaced nodes, then
    :meth:`finish`, which maps the outputs.
    """

    def __init__(self, src: Graph, name: str | None = None):
        self.src = src
        self.dst = Graph(name or src.name)
        self.dst.sym_bounds = dict(src.sym_bounds)
        self.map: dict[NodeId, NodeId] = {}

    def emit(
        self,
        op: Op,
        inputs: Sequence[NodeId],
        loc: SourceLoc | None = None,
        shape: Shape | None = None,
    ) -> NodeId:
        """Append ``op`` over NEW ids ``inputs``; its shape is inferred unless given."""
        if shape is None:
            shape = op.infer(tuple(self.dst.nodes[i].shape for i in inputs))
        return self.dst.add_node(op, inputs, shape, loc)

    def copy(self, node: Node, op: Op | None = None) -> NodeId:
        """Copy old ``node`` (optionally with another op of the same shape rule result)
        with its inputs remapped; records and returns its new id."""
        nid = self.dst.add_node(
            op if op is not None else node.op,
            [self.map[i] for i in node.inputs],
            node.shape,
            node.loc,
        )
        self.map[node.id] = nid
        return nid

    def new_shape(self, nid: NodeId) -> Shape:
        return self.dst.nodes[nid].shape

    def finish(self, outputs: Iterable[NodeId] | None = None) -> Graph:
        """Map the source outputs (or the given OLD ids) and return the new graph."""
        outs = self.src.outputs if outputs is None else outputs
        self.dst.outputs = [self.map[o] for o in outs]
        return self.dst


def use_counts(graph: Graph) -> list[int]:
    """Per node: how many inputs of other nodes read it, plus one per graph output."""
    counts = [0] * len(graph.nodes)
    for n in graph.nodes:
        for i in n.inputs:
            counts[i] += 1
    for o in graph.outputs:
        counts[o] += 1
    return counts


def live_nodes(graph: Graph) -> set[NodeId]:
    """Ids of the nodes the outputs depend on, and of the effect nodes (they write state,
    ``Op.effect``) and what they depend on."""
    live: set[NodeId] = set()
    stack = list(graph.outputs) + [n.id for n in graph.nodes if n.op.effect]
    while stack:
        k = stack.pop()
        if k in live:
            continue
        live.add(k)
        stack.extend(graph.nodes[k].inputs)
    return live


def const_array(graph: Graph, nid: NodeId) -> np.ndarray | None:
    """The value of node ``nid`` when it is a Constant, else None."""
    from rlx.ops.core import Constant

    op = graph.nodes[nid].op
    return op.value.array() if isinstance(op, Constant) else None
