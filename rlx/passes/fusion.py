"""Fusion infrastructure and the list of fusion passes.

In: a graph. Out: a graph where matched patterns are single fused nodes, plus entries in
a shared :class:`~rlx.passes.report.FusionReport`.

A pattern pass finds :class:`Match` es (an anchor node, the fused op, its inputs, the
nodes it replaces); :func:`apply_matches` rebuilds the graph with each anchor replaced by
the fused op and the other matched nodes dropped. A node is only swallowed when all its
users are inside the match and it is not a graph output (:meth:`FusionView.why_not_inner`
says why otherwise), so a fusion never duplicates work or hides a value someone reads.

The passes, in pipeline order (pattern fusions first, then elementwise regions): the
recognition of spelled-out GELU and layer norm (``fusion_gelu``, ``fusion_layernorm``:
what importers write as formulas becomes the op the later fusions take), cross-entropy
(``fusion_loss``: ``-log_softmax(x)[label]`` -> ``softmax_cross_entropy``), attention, SwiGLU,
residual + norm, integer matmul epilogues (``fusion_quant``), conv + residual + activation
(``fusion_conv``), matmul + bias + activation, the
opt-in block fusions (``fusion_blocks``: attention block and transformer layer, with
``CompileOptions.fuse_blocks``), elementwise regions.
SwiGLU runs before matmul + activation so ``silu(x @ w_gate)`` is not taken first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rlx import source
from rlx.errors import RlxError
from rlx.ir.mir import Graph, Node, NodeId, op_name
from rlx.ops.base import Op
from rlx.passes.base import Rewriter, use_counts
from rlx.passes.report import FusionPattern, FusionReport

__all__ = ["Match", "FusionView", "PatternFusion", "apply_matches", "fusion_passes", "dims_str"]


def dims_str(dims: Iterable[object]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


@dataclass(frozen=True, slots=True)
class Match:
    """One fusion: ``anchor`` (the last node of the pattern) becomes ``op(inputs)``;
    ``nodes`` are all replaced nodes (anchor included). Ids are the pass's input ids."""

    anchor: NodeId
    op: Op
    inputs: tuple[NodeId, ...]
    nodes: frozenset[NodeId]
    description: str


class FusionView:
    """Read-only queries a matcher needs: users, outputs, node descriptions."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.uses = use_counts(graph)
        self.consumers = graph.consumers()
        self.outputs = frozenset(graph.outputs)

    def node(self, nid: NodeId) -> Node:
        return self.graph.nodes[nid]

    def desc(self, nid: NodeId) -> str:
        """How reports name a node: by the user's graph, ``'%5 matmul (model.py:42)'``
        (:attr:`Node.label`), whatever this pass's input graph numbered it."""
        return self.graph.nodes[nid].label

    def ref(self, nid: NodeId) -> str:
        """Short form of :meth:`desc`: ``'%5'`` (the user's id) for a node with provenance,
        ``'#5'`` (this graph's id) for one without."""
        n = self.graph.nodes[nid]
        if n.loc is None or n.loc.node is None:
            return f"#{nid}"
        own = f"%{n.loc.node}"
        name = op_name(n.op)
        return own if name == n.loc.op else f"{name} for {own}"

    def sole_user(self, nid: NodeId) -> NodeId | None:
        """The one node reading ``nid``, when exactly one does and it is not an output."""
        users = self.consumers[nid]
        if nid in self.outputs or len(users) != 1:
            return None
        return users[0]

    def why_not_inner(self, nid: NodeId) -> str | None:
        """Why ``nid`` cannot disappear into a fusion (None when it can)."""
        if nid in self.outputs:
            return f"intermediate {self.ref(nid)} is a graph output"
        if self.uses[nid] != 1:
            return f"intermediate {self.ref(nid)} has {self.uses[nid]} users"
        return None

    def why_escapes(self, nid: NodeId, inside: frozenset[NodeId] | set[NodeId]) -> str | None:
        """Why ``nid`` cannot disappear into a fusion of the nodes ``inside`` (a user
        outside them, or being a graph output); None when it can."""
        if nid in self.outputs:
            return f"intermediate {self.ref(nid)} is a graph output"
        users = self.consumers[nid]
        outside = sorted({u for u in users if u not in inside})
        if outside:
            others = ", ".join(self.ref(u) for u in outside)
            return (
                f"intermediate {self.ref(nid)} has {len(users)} users "
                f"({others} outside the pattern)"
            )
        return None

    def infer(self, op: Op, inputs: Sequence[NodeId]) -> str | None:
        """None when ``op`` accepts these inputs, else the shape rule's message."""
        try:
            op.infer(tuple(self.graph.nodes[i].shape for i in inputs))
        except RlxError as e:
            return e.bare_message
        return None


def apply_matches(
    graph: Graph, matches: Sequence[Match], then: Mapping[NodeId, Op] | None = None
) -> Graph:
    """Rebuild ``graph`` with every match applied (matches must not overlap). ``then``:
    anchor -> an op applied to the fused node's output, which takes the anchor's place
    (``-mean(x)`` fused as ``mean(fused)``)."""
    anchors = {m.anchor: m for m in matches}
    dropped = set().union(*(m.nodes for m in matches)) - set(anchors) if matches else set()
    rw = Rewriter(graph)
    for nid in graph.topo_order():
        node = graph.nodes[nid]
        m = anchors.get(nid)
        if m is not None:
            # the fused node keeps the anchor's provenance and lists the user nodes it replaces
            members = [graph.nodes[i].loc for i in sorted(m.nodes)]
            loc = source.fuse(node.loc, members)
            post = (then or {}).get(nid)
            ins = [rw.map[i] for i in m.inputs]
            if post is None:
                rw.map[nid] = rw.emit(m.op, ins, loc, node.shape)
            else:
                rw.map[nid] = rw.emit(post, [rw.emit(m.op, ins, loc)], loc, node.shape)
        elif nid not in dropped:
            rw.copy(node)
    return rw.finish()


class PatternFusion:
    """Base of the pattern fusion passes: subclasses implement :meth:`match_at` (or
    override :meth:`find`)."""

    name = "fusion"
    pattern: FusionPattern = FusionPattern.MATMUL_BIAS_ACT

    def __init__(self, report: FusionReport | None = None):
        self.report = report if report is not None else FusionReport()
        self.notes: list[str] = []

    def find(self, view: FusionView, claimed: set[NodeId]) -> list[Match]:
        """Greedy in node order: a match from :meth:`match_at` is kept when it shares no
        node with an earlier one; its nodes are then added to ``claimed``."""
        matches = []
        for node in view.graph.nodes:
            m = self.match_at(view, node, claimed)
            if m is not None and not (m.nodes & claimed):
                claimed |= m.nodes
                matches.append(m)
        return matches

    def match_at(
        self, view: FusionView, node: Node, claimed: set[NodeId]
    ) -> Match | None:  # pragma: no cover
        """The fusion anchored at ``node``, or None (near misses go to :meth:`miss`)."""
        raise NotImplementedError

    def miss(self, nodes: Sequence[NodeId], description: str, reason: str) -> None:
        self.report.why_no_fuse(self.pattern, tuple(nodes), description, reason)

    def escapes(
        self, view: FusionView, inside: frozenset[NodeId], anchor: NodeId, description: str
    ) -> bool:
        """True (the miss recorded) when a node of ``inside`` other than ``anchor`` is used
        outside them or is a graph output, so the pattern cannot fuse; False when none is."""
        for n in sorted(inside - {anchor}):
            why = view.why_escapes(n, inside)
            if why:
                self.miss(sorted(inside), description, why)
                return True
        return False

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        view = FusionView(graph)
        claimed: set[NodeId] = set()
        matches = self.find(view, claimed)
        for m in matches:
            self.report.add_fused(self.pattern, tuple(sorted(m.nodes)), m.description, str(m.op))
        if matches:
            self.notes.append(f"fused {len(matches)} x {self.pattern.value}")
        misses = len(self.report.missed_of(self.pattern))
        if misses:
            self.notes.append(f"{misses} near misses (see the fusion report)")
        return self.apply(graph, matches)

    def apply(self, graph: Graph, matches: Sequence[Match]) -> Graph:
        """Rebuild ``graph`` with ``matches`` applied (:func:`apply_matches`)."""
        return apply_matches(graph, matches)


def fusion_passes(report: FusionReport, blocks: bool = False) -> list[PatternFusion]:
    """The fusion passes in pipeline order, all writing into ``report``; ``blocks``
    (``CompileOptions.fuse_blocks``) adds the block fusions before elementwise regions."""
    from rlx.passes.fusion_attention import AttentionFusion
    from rlx.passes.fusion_blocks import AttentionBlockFusion, TransformerLayerFusion
    from rlx.passes.fusion_conv import ConvActFusion
    from rlx.passes.fusion_elementwise import ElementwiseFusion
    from rlx.passes.fusion_gelu import GeluFusion
    from rlx.passes.fusion_layernorm import LayerNormFusion
    from rlx.passes.fusion_loss import CrossEntropyFusion
    from rlx.passes.fusion_patterns import MatMulBiasActFusion, ResidualNormFusion, SwiGLUFusion
    from rlx.passes.fusion_quant import QuantEpilogueFusion

    return [
        GeluFusion(report),
        LayerNormFusion(report),
        CrossEntropyFusion(report),
        AttentionFusion(report),
        SwiGLUFusion(report),
        ResidualNormFusion(report),
        QuantEpilogueFusion(report),
        ConvActFusion(report),
        MatMulBiasActFusion(report),
        *([AttentionBlockFusion(report), TransformerLayerFusion(report)] if blocks else []),
        ElementwiseFusion(report),
    ]
