"""Derivative rules of backward ops through their lowering: the primitive graph an op
stands for, differentiated by the autodiff drivers.

A backward op (``ActivationBackward``, ``ScanBackward``, ...) is one node with its own
kernel; its own derivative (double backward, Hessian-vector products) is rarely worth a
second dedicated op. Such an op defines ``lower(g, inputs) -> node``: the same value built
from ordinary ops (the graph autodiff emitted before the op existed). Its ``vjp`` / ``jvp``
then lower it beside the node and run reverse / forward mode over the lowering
(:func:`lowered_vjp`, :func:`lowered_jvp`), so the rules are exact by construction and
the op needs no second-derivative formulas of its own.

In: the graph being extended, the node, its cotangent or its inputs' tangents, and the
lowering. Out: node ids (None where the derivative is zero). Each input is fed to the
lowering through a fresh reshape (a view), so a node that feeds two inputs (``op(x, x)``)
gets each input's derivative once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rlx.ops.rules import is_diff_dtype

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

    Lowering = Callable[[Graph, Sequence[NodeId]], NodeId]

__all__ = ["lowered_vjp", "lowered_jvp"]


def _proxies(g: Graph, node: Node) -> list[NodeId]:
    return [g.reshape(i, list(g.shape(i).dims)) for i in node.inputs]


def lowered_vjp(g: Graph, node: Node, ct: NodeId, lower: Lowering) -> tuple[NodeId | None, ...]:
    """The cotangent of each input of ``node``: reverse mode through ``lower``."""
    from rlx.autodiff.reverse import backward

    ins = _proxies(g, node)
    out = lower(g, ins)
    diff = [k for k, i in enumerate(ins) if is_diff_dtype(g.shape(i).dtype)]
    grads = backward(g, {out: ct}, [ins[k] for k in diff]) if diff else []
    found = dict(zip(diff, grads, strict=True))
    return tuple(found.get(k) for k in range(len(ins)))


def lowered_jvp(
    g: Graph, node: Node, tangents: tuple[NodeId | None, ...], lower: Lowering
) -> NodeId | None:
    """The output's tangent: forward mode through ``lower``."""
    from rlx.autodiff.forward import forward

    if all(t is None for t in tangents):
        return None
    ins = _proxies(g, node)
    out = lower(g, ins)
    seeds = {i: t for i, t in zip(ins, tangents, strict=True) if t is not None}
    return forward(g, seeds, [out])[out]
