"""Hessian-vector products. In: a MIR graph with a one-element float output and the nodes
to differentiate with respect to. Out: a graph with one more input per ``wrt``,
``v_<name>`` (a direction of that node's shape), whose outputs are ``H v``, one per
``wrt``: the directional derivative of the gradient (forward over reverse: the ``jvp``
rules run over the graph the ``vjp`` rules built, so every op on the backward path,
``*Backward`` ops included, needs a ``jvp`` rule).
"""

from __future__ import annotations

from collections.abc import Sequence

from rlx.autodiff.forward import forward, seed_inputs
from rlx.autodiff.reverse import resolve_wrt, value_and_grad
from rlx.ir.mir import Graph, NodeId
from rlx.ops.rules import zeros

__all__ = ["hvp"]


def hvp(
    graph: Graph,
    wrt: Sequence[NodeId | str] | NodeId | str | None = None,
    *,
    output: int = 0,
) -> Graph:
    """A new graph with inputs ``[*inputs, v_<w> for w in wrt]`` and outputs
    ``[(H v)_w for w in wrt]``, H the Hessian of output ``output`` (one element) with
    respect to the concatenation of ``wrt`` (input / param names or node ids; None: every
    float param), ``v`` the concatenation of the ``v_`` inputs."""
    g = value_and_grad(graph, wrt, output=output)
    g.name = f"{graph.name}.hvp"
    ids = resolve_wrt(g, wrt)
    grads = list(g.outputs[1:])
    seeds = seed_inputs(g, ids, "v_")
    tans = forward(g, seeds, grads)
    g.set_outputs([zeros(g, w) if (t := tans[d]) is None else t for d, w in zip(grads, ids)])
    return g.verify()
