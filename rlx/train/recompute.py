"""Activation recomputation (rematerialization). In: a graph whose first ``nforward``
nodes are the forward pass and the rest the backward pass built from it, and the forward
nodes to keep. Out: an equivalent graph in which the backward pass reads a recomputed copy
of every other forward node instead of the forward's value, so that the forward's value
dies as soon as the forward is done with it: the memory planner then holds only the kept
values across the forward/backward boundary, at the cost of computing the rest twice.

The recomputed copies are built from the kept values read through ``barrier`` nodes
(``rlx/ops/state.py``: an identity that is not pure), so common-subexpression elimination
cannot merge a copy back into its original; each copy is inserted right before the first
backward node that needs it, so the planner computes it late (the schedule follows
insertion order). One copy per forward node is shared by every backward reader.

What is kept by default (``keep=None``): inputs, params and constants, nodes that depend
on no input (param-derived: computed once per step in the prologue), impure nodes (a
random sample must not be drawn twice), nodes with subgraphs, ``COMPUTE`` ops (matmul,
convolution, attention: expensive to redo) and nodes read by two or more forward nodes
(the residual stream, a layer norm's output feeding q/k/v). Everything else (elementwise
ops, activations, reductions, softmax, norms, data movement) is recomputed. Given
``keep`` (forward node ids), exactly those plus the always-kept ones (inputs, params,
constants, param-derived, impure) are kept: ``keep=[]`` recomputes every activation from
the inputs.
"""

from __future__ import annotations

from collections.abc import Iterable

from rlx.errors import InputError
from rlx.ir.mir import Graph, NodeId
from rlx.ops.base import OpKind
from rlx.ops.core import Input
from rlx.ops.state import Barrier

__all__ = ["recompute_activations", "default_keep"]


def _always_kept(g: Graph, nforward: int) -> set[NodeId]:
    """Forward nodes that are never recomputed: boundary, impure, param-derived."""
    keep: set[NodeId] = set()
    from_input: set[NodeId] = set()
    for n in g.nodes[:nforward]:
        if isinstance(n.op, Input) or any(i in from_input for i in n.inputs):
            from_input.add(n.id)
        if not n.op.pure or n.op.kind is OpKind.BOUNDARY or n.id not in from_input:
            keep.add(n.id)
    return keep


def default_keep(g: Graph, nforward: int) -> set[NodeId]:
    """The forward nodes kept by default (module docstring)."""
    keep = _always_kept(g, nforward)
    uses: dict[NodeId, int] = {}
    for n in g.nodes[:nforward]:
        for i in set(n.inputs):
            uses[i] = uses.get(i, 0) + 1
        if n.op.kind is OpKind.COMPUTE or n.op.subgraphs():
            keep.add(n.id)
    keep |= {k for k, c in uses.items() if c >= 2}
    return keep


def recompute_activations(
    g: Graph, nforward: int, keep: Iterable[NodeId] | None = None
) -> tuple[Graph, dict[NodeId, NodeId]]:
    """``g`` rebuilt with the backward pass reading recomputed forward values (module
    docstring). Returns the new graph and old node id -> new node id."""
    if not 0 < nforward <= len(g.nodes):
        raise InputError(f"recompute: nforward {nforward} outside 1..{len(g.nodes)}")
    if keep is None:
        kept = default_keep(g, nforward)
    else:
        ids = list(keep)
        bad = [k for k in ids if not (isinstance(k, int) and 0 <= k < nforward)]
        if bad:
            raise InputError(f"recompute: keep ids {bad} are not forward nodes (0..{nforward - 1})")
        kept = set(ids) | _always_kept(g, nforward)
    out = Graph(g.name)
    out.sym_bounds = dict(g.sym_bounds)
    new: dict[NodeId, NodeId] = {}
    for n in g.nodes[:nforward]:
        new[n.id] = out.add_node(n.op, [new[i] for i in n.inputs], n.shape, n.loc)
    again: dict[NodeId, NodeId] = {}
    barriers: dict[NodeId, NodeId] = {}

    def through(i: NodeId) -> NodeId:
        b = barriers.get(i)
        if b is None:
            n = g.nodes[i]
            b = barriers[i] = out.add_node(Barrier(), [new[i]], n.shape, n.loc)
        return b

    def recomputed(fid: NodeId) -> NodeId:
        if fid in kept:
            return new[fid]
        stack = [fid]
        while stack:
            k = stack[-1]
            if k in again:
                stack.pop()
                continue
            n = g.nodes[k]
            todo = [i for i in n.inputs if i not in kept and i not in again]
            if todo:
                stack.extend(todo)
                continue
            ins = [through(i) if i in kept else again[i] for i in n.inputs]
            again[k] = out.add_node(n.op, ins, n.shape, n.loc)
            stack.pop()
        return again[fid]

    for n in g.nodes[nforward:]:
        ins = [recomputed(i) if i < nforward else new[i] for i in n.inputs]
        new[n.id] = out.add_node(n.op, ins, n.shape, n.loc)
    out.set_outputs([new[o] for o in g.outputs])
    return out.verify(), new
