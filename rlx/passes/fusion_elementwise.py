"""Elementwise region fusion: maximal connected groups of elementwise ops -> one
``elementwise_region`` node each.

A region is grown from a root (visited in reverse topological order): a producer joins
when it is an elementwise op (the ``elementwise`` flag), is not a graph output and every
one of its users is already in the region. So a region is any DAG (not only a chain)
with exactly ONE externally used value, its root; since every other member's users are
inside, contracting the region can not create a cycle. Regions need at least two ops.
Scalar constants read by members are copied into the body; every other value read from
outside becomes a region input ``in0..inN`` (in first-use order). A region whose input
is not indexable from the flat output index (see :mod:`rlx.passes.broadcast`) is not
formed; the report says which input.
"""

from __future__ import annotations

from rlx.ir.mir import Graph, NodeId
from rlx.ops.core import Constant, Input
from rlx.ops.fused import ElementwiseRegion
from rlx.passes.broadcast import kernel_indexable
from rlx.passes.fusion import FusionView, Match, PatternFusion, apply_matches, dims_str
from rlx.passes.report import FusionPattern

__all__ = ["ElementwiseFusion"]


def _describe(view: FusionView, members: list[NodeId]) -> str:
    names = [view.desc(m) for m in members]
    if len(names) > 6:
        names = [*names[:3], "...", *names[-2:]]
    return " + ".join(names) + f" ({len(members)} ops)"


class ElementwiseFusion(PatternFusion):
    """Group elementwise DAGs with one external output into ``elementwise_region`` nodes."""

    name = "fuse_elementwise"
    pattern = FusionPattern.ELEMENTWISE_REGION

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        view = FusionView(graph)
        order = graph.topo_order()
        pos = {nid: k for k, nid in enumerate(order)}
        assigned: set[NodeId] = set()
        matches: list[Match] = []
        for root in reversed(order):
            if root in assigned or not self._candidate(view, root):
                continue
            members = self._grow(view, root, assigned)
            if len(members) < 2:
                continue
            ordered = sorted(members, key=pos.__getitem__)
            m = self._region(view, root, ordered, len(matches))
            if m is not None:
                assigned |= members
                matches.append(m)
        for m in matches:
            self.report.add_fused(self.pattern, tuple(sorted(m.nodes)), m.description, str(m.op))
        if matches:
            ops = sum(len(m.nodes) for m in matches)
            self.notes.append(f"formed {len(matches)} regions from {ops} elementwise ops")
        misses = len(self.report.missed_of(self.pattern))
        if misses:
            self.notes.append(f"{misses} near misses (see the fusion report)")
        return apply_matches(graph, matches)

    @staticmethod
    def _candidate(view: FusionView, nid: NodeId) -> bool:
        op = view.node(nid).op
        return op.elementwise and not isinstance(op, ElementwiseRegion)

    def _grow(self, view: FusionView, root: NodeId, assigned: set[NodeId]) -> set[NodeId]:
        members = {root}
        work = list(view.node(root).inputs)
        blocked: dict[NodeId, tuple[NodeId, str]] = {}
        while work:
            p = work.pop()
            if p in members or p in assigned or not self._candidate(view, p):
                continue
            why = view.why_escapes(p, members)
            if why is not None:
                user = next(u for u in view.consumers[p] if u in members)
                blocked[p] = (user, why)
                continue
            blocked.pop(p, None)
            members.add(p)
            work.extend(view.node(p).inputs)
        for p, (user, why) in sorted(blocked.items()):
            if p not in members:
                self.miss([p, user], f"{view.desc(p)} -> {view.desc(user)}", why)
        return members

    def _region(
        self, view: FusionView, root: NodeId, ordered: list[NodeId], k: int
    ) -> Match | None:
        body = Graph(f"region{k}")
        body.sym_bounds = dict(view.graph.sym_bounds)
        bmap: dict[NodeId, NodeId] = {}
        ext: list[NodeId] = []
        inside = set(ordered)
        out_dims = view.node(root).shape.dims
        desc = _describe(view, ordered)
        for m in ordered:
            node = view.node(m)
            for i in node.inputs:
                if i in inside or i in bmap:
                    continue
                src = view.node(i)
                if isinstance(src.op, Constant) and src.shape.is_static and src.shape.numel == 1:
                    bmap[i] = body.add_node(src.op, [], src.shape, src.loc)
                    continue
                if not kernel_indexable(src.shape.dims, out_dims):
                    self.miss(
                        ordered,
                        desc,
                        f"region input {view.ref(i)} {dims_str(src.shape.dims)} is not "
                        f"indexable from the output {dims_str(out_dims)}",
                    )
                    return None
                bmap[i] = body.add_node(Input(f"in{len(ext)}", src.shape), [], src.shape)
                ext.append(i)
            bmap[m] = body.add_node(node.op, [bmap[i] for i in node.inputs], node.shape, node.loc)
        body.outputs = [bmap[root]]
        op = ElementwiseRegion(body)
        why = view.infer(op, ext)
        if why is not None:
            self.miss(ordered, desc, why)
            return None
        return Match(root, op, tuple(ext), frozenset(ordered), desc)
