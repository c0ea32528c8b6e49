"""Forward mode. In: a MIR graph and the nodes to differentiate with respect to. Out: the
graph extended with the tangent of every node on a path from them, built from each op's
``jvp`` rule (rules live beside the ops, ``rlx/ops/<family>.py``).

``jvp(graph, wrt)`` adds one input per ``wrt``, ``t_<name>`` (its tangent, in ``wrt``
order) and returns outputs ``[*outputs, *their tangents]`` (zeros for an output that does
not depend on ``wrt``). Only float (and complex) values carry tangents; nodes that no
output reads are left alone. Every node a rule adds carries the forward node's source
location, as in reverse mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rlx.autodiff.call import call_rule
from rlx.autodiff.reverse import resolve_wrt
from rlx.errors import AutodiffError
from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.core import Input, Param
from rlx.ops.rules import is_diff_dtype, zeros

__all__ = ["forward", "jvp", "needed", "seed_inputs", "tangent_name"]


def needed(graph: Graph, outs: Sequence[NodeId]) -> set[NodeId]:
    """Every node some ``out`` depends on (itself included)."""
    seen: set[NodeId] = set()
    stack = list(outs)
    while stack:
        k = stack.pop()
        if k not in seen:
            seen.add(k)
            stack.extend(graph.nodes[k].inputs)
    return seen


def forward(
    g: Graph, tangents: Mapping[NodeId, NodeId], outs: Sequence[NodeId]
) -> dict[NodeId, NodeId | None]:
    """Extend ``g`` with the forward pass: ``tangents`` maps a node (an input, a param or
    any node, whose own inputs are then ignored) -> its tangent node. Returns the tangent
    of each node in ``outs`` (None: zero, no path from a seeded node)."""
    nforward = len(g.nodes)
    need = needed(g, outs)
    tan: dict[NodeId, NodeId | None] = dict(tangents)
    for nid in g.topo_order():
        if nid >= nforward or nid in tangents or nid not in need:
            continue
        node = g.nodes[nid]
        ins = tuple(tan.get(i) for i in node.inputs)
        if not is_diff_dtype(node.dtype) or all(t is None for t in ins):
            continue
        tan[nid] = _rule(g, node, ins)
    return {o: tan.get(o) for o in outs}


def _rule(g: Graph, node: Node, ins: tuple[NodeId | None, ...]) -> NodeId | None:
    """``node.op.jvp`` through :func:`call_rule`, the tangent checked against the node's shape."""

    def check(out: NodeId | None) -> str | None:
        if out is not None and g.nodes[out].shape != node.shape:
            return f"gave a tangent {g.nodes[out].shape} for an output of shape {node.shape}"
        return None

    return call_rule(g, node, "jvp", lambda: node.op.jvp(g, node, ins), check)


def tangent_name(g: Graph, nid: NodeId, prefix: str, taken: set[str]) -> str:
    """A fresh input name for the tangent of node ``nid``: ``<prefix><its name>``
    (``_`` prepended until no input or param has it)."""
    op = g.nodes[nid].op
    base = op.name if isinstance(op, (Input, Param)) else str(nid)
    name = f"{prefix}{base}"
    while name in taken:
        name = "_" + name
    taken.add(name)
    return name


def seed_inputs(g: Graph, ids: Sequence[NodeId], prefix: str) -> dict[NodeId, NodeId]:
    """One new input per node of ``ids`` (its shape, named ``<prefix><name>``), in order."""
    taken = set(g.input_names) | set(g.param_names)
    return {w: g.input(tangent_name(g, w, prefix, taken), g.shape(w)) for w in ids}


def jvp(graph: Graph, wrt: Sequence[NodeId | str] | NodeId | str | None = None) -> Graph:
    """A new graph with one more input per ``wrt`` (``t_<name>``, its tangent, in ``wrt``
    order) whose outputs are ``[*outputs, *tangents of the outputs]``. ``wrt``: input /
    param names or node ids (None: every float param)."""
    g = graph.copy(f"{graph.name}.jvp")
    ids = resolve_wrt(g, wrt)
    outs = list(g.outputs)
    if not outs:
        raise AutodiffError(f"graph {g.name!r} has no outputs to differentiate")
    seeds = seed_inputs(g, ids, "t_")
    tans = forward(g, seeds, outs)
    g.set_outputs(outs + [_or_zeros(g, tans[o], o) for o in outs])
    return g.verify()


def _or_zeros(g: Graph, t: NodeId | None, like: NodeId) -> NodeId:
    """``t``, or zeros of ``like``'s shape and dtype (integer outputs too)."""
    return zeros(g, like) if t is None else t
