"""Reverse mode. In: a MIR graph, the node(s) to differentiate and the nodes to
differentiate with respect to. Out: the same graph extended with the backward pass built
from each op's ``vjp`` rule (rules live beside the ops, ``rlx/ops/<family>.py``).

Only nodes on a path from a ``wrt`` node to the differentiated output take part; a
cotangent flows only through float (and complex) values. Cotangents reaching a node
from several consumers are summed. Every node a rule adds carries the forward node's
source location, so reports name backward nodes by the user's line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rlx.autodiff.call import call_rule
from rlx.errors import AutodiffError
from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.core import Input, Param
from rlx.ops.rules import add_any, is_diff_dtype, zeros

__all__ = ["backward", "resolve_wrt", "grad", "value_and_grad", "vjp"]


def resolve_wrt(graph: Graph, wrt: Sequence[NodeId | str] | NodeId | str | None) -> list[NodeId]:
    """Node ids for ``wrt``: input / param names or node ids (None: every float param).
    Raises AutodiffError for an unknown name or a value that cannot carry a gradient."""
    named = {
        n.op.name: n.id  # type: ignore[attr-defined]
        for n in graph.nodes
        if isinstance(n.op, (Input, Param))
    }
    if wrt is None:
        ids = [n.id for n in graph.param_nodes() if is_diff_dtype(n.dtype)]
        if not ids:
            raise AutodiffError(f"graph {graph.name!r} has no float params to differentiate")
        return ids
    items = [wrt] if isinstance(wrt, (str, int)) else list(wrt)
    out = []
    for w in items:
        if isinstance(w, str):
            if w not in named:
                raise AutodiffError(
                    f"wrt: no input or param named {w!r} in graph {graph.name!r}; "
                    f"inputs and params: {sorted(named)}"
                )
            nid = named[w]
        elif isinstance(w, (int, np.integer)) and not isinstance(w, bool):
            nid = int(w)
            if not 0 <= nid < len(graph.nodes):
                raise AutodiffError(f"wrt: node id {nid} does not exist in graph {graph.name!r}")
        else:
            raise AutodiffError(f"wrt: expected input/param names or node ids, got {w!r}")
        node = graph.nodes[nid]
        if not is_diff_dtype(node.dtype):
            raise AutodiffError(
                f"wrt: {node.label} has dtype {node.dtype.name.lower()}; gradients need a "
                f"float input (cast it to f32 in the graph, or leave it out of wrt)",
                node=nid,
                loc=node.loc,
            )
        out.append(nid)
    return out


def _carries(node: Node) -> bool:
    return is_diff_dtype(node.dtype)


def _on_path(graph: Graph, outs: Sequence[NodeId], wrt: Sequence[NodeId]) -> set[NodeId]:
    """Float nodes that depend on some ``wrt`` node and that some ``out`` depends on."""
    after: set[NodeId] = set(wrt)
    for nid in graph.topo_order():
        node = graph.nodes[nid]
        if nid not in after and _carries(node) and any(i in after for i in node.inputs):
            after.add(nid)
    before: set[NodeId] = set()
    stack = [o for o in outs if o in after]
    while stack:
        k = stack.pop()
        if k in before:
            continue
        before.add(k)
        stack.extend(i for i in graph.nodes[k].inputs if i in after)
    return before


def backward(g: Graph, cts: Mapping[NodeId, NodeId], wrt: Sequence[NodeId]) -> list[NodeId | None]:
    """Extend ``g`` with the reverse pass: ``cts`` maps output node -> its cotangent node.
    Returns the cotangent of each ``wrt`` node (None where no path reaches it)."""
    nforward = len(g.nodes)
    path = _on_path(g, list(cts), wrt)
    acc: dict[NodeId, list[NodeId]] = {}
    for o, c in cts.items():
        if o in path:
            acc.setdefault(o, []).append(c)
    want = set(wrt)
    done: dict[NodeId, NodeId | None] = {}
    order = [k for k in g.topo_order() if k < nforward]
    for nid in reversed(order):
        if nid not in path:
            continue
        ct = add_any(g, acc.pop(nid, []))
        if nid in want:
            done[nid] = ct
        node = g.nodes[nid]
        feeds = [i for i in node.inputs if i in path]
        if ct is None or not feeds:
            continue
        for i, c in zip(node.inputs, _rule(g, node, ct), strict=True):
            if c is not None and i in path:
                acc.setdefault(i, []).append(c)
    return [done.get(w) for w in wrt]


def _rule(g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
    """``node.op.vjp`` through :func:`call_rule`, one cotangent per input checked against
    its shape."""

    def check(out: tuple[NodeId | None, ...]) -> str | None:
        if len(out) != len(node.inputs):
            return f"returned {len(out)} cotangents for {len(node.inputs)} inputs"
        for i, c in zip(node.inputs, out, strict=True):
            if c is not None and g.nodes[c].shape != g.nodes[i].shape:
                return (
                    f"gave a cotangent {g.nodes[c].shape} for input %{i} of shape "
                    f"{g.nodes[i].shape}"
                )
        return None

    return call_rule(g, node, "vjp", lambda: tuple(node.op.vjp(g, node, ct)), check)


def _loss(g: Graph, output: int) -> NodeId:
    if not g.outputs:
        raise AutodiffError(f"graph {g.name!r} has no outputs to differentiate")
    if not -len(g.outputs) <= output < len(g.outputs):
        raise AutodiffError(f"output {output} out of range: graph {g.name!r} has {len(g.outputs)}")
    loss = g.outputs[output]
    node = g.nodes[loss]
    dims = node.shape.dims
    if not all(isinstance(d, int) and d == 1 for d in dims):
        raise AutodiffError(
            f"grad: the loss {node.label} has shape {node.shape}, not a scalar; reduce it "
            f"(g.sum / g.mean) or use rlx.vjp with a cotangent",
            node=loss,
            loc=node.loc,
        )
    if not _carries(node):
        raise AutodiffError(
            f"grad: the loss {node.label} has dtype {node.dtype.name.lower()}; it must be float",
            node=loss,
            loc=node.loc,
        )
    return loss


def value_and_grad(
    graph: Graph,
    wrt: Sequence[NodeId | str] | NodeId | str | None = None,
    *,
    output: int = 0,
) -> Graph:
    """A new graph whose outputs are ``[loss, d loss / d w for w in wrt]``. ``loss`` is
    output ``output`` of ``graph`` (one element); ``wrt``: input / param names or node
    ids (None: every float param). A ``wrt`` the loss does not depend on gets zeros."""
    g = graph.copy(f"{graph.name}.grad")
    ids = resolve_wrt(g, wrt)
    loss = _loss(g, output)
    seed = g.constant(np.ones(g.shape(loss).dims, dtype=g.shape(loss).dtype.np))
    grads = backward(g, {loss: seed}, ids)
    g.set_outputs([loss] + [c if c is not None else zeros(g, w) for c, w in zip(grads, ids)])
    return g.verify()


def grad(
    graph: Graph,
    wrt: Sequence[NodeId | str] | NodeId | str | None = None,
    *,
    output: int = 0,
) -> Graph:
    """A new graph whose outputs are the gradients of the scalar output ``output`` of
    ``graph`` with respect to each of ``wrt`` (see :func:`value_and_grad`)."""
    g = value_and_grad(graph, wrt, output=output)
    g.outputs = g.outputs[1:]
    return g.verify()


def vjp(graph: Graph, wrt: Sequence[NodeId | str] | NodeId | str | None = None) -> Graph:
    """A new graph with one more input per output, ``ct0``, ``ct1``, ... (the cotangents,
    each of its output's shape), whose outputs are ``[*outputs, *cotangents of wrt]``."""
    g = graph.copy(f"{graph.name}.vjp")
    ids = resolve_wrt(g, wrt)
    outs = list(g.outputs)
    if not outs:
        raise AutodiffError(f"graph {g.name!r} has no outputs to differentiate")
    taken = set(g.input_names) | set(g.param_names)
    cts: dict[NodeId, NodeId] = {}
    for k, o in enumerate(outs):
        name = f"ct{k}"
        while name in taken:
            name = "_" + name
        c = g.input(name, g.shape(o))
        cts[o] = c if o not in cts else g.add(cts[o], c)
    grads = backward(g, cts, ids)
    g.set_outputs(outs + [c if c is not None else zeros(g, w) for c, w in zip(grads, ids)])
    return g.verify()
