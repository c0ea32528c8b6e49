"""Matmul FLOPs of a MIR graph at one shape. In: a graph and its symbol bindings
(``{"batch": 8, "seq": 128}``). Out: :class:`FlopCount`: ``2*M*N*K`` summed over every
matrix product, in total and per op.

Counted: ``matmul``, ``fused_matmul_bias_act`` and ``dot_general`` (2 x output elements
x contracted size), ``attention`` (``q·kᵀ`` and ``p·v``: 4 x B x H x Sq x Skv x D, dense:
a causal or padding mask is not discounted), ``qmatmul`` / ``dequant_matmul`` (their
integer / dequantized products, the same count as the float matmul they replace),
``grouped_matmul``, ``lora_matmul`` (base and adapter) and ``fused_swiglu`` (two
products). Everything else (elementwise, norms, softmax's exp, gathers) is not counted:
these are the FLOPs that FMA throughput bounds. Bodies of control-flow ops are not
entered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from rlx.errors import ShapeError
from rlx.ir.mir import Graph, Node

__all__ = ["FlopCount", "matmul_flops"]


@dataclass(frozen=True)
class FlopCount:
    """``total`` FLOPs (a multiply-add counts 2) and the same split by op mnemonic."""

    total: int
    by_op: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        parts = ", ".join(f"{op} {n / 1e9:.3f}" for op, n in sorted(self.by_op.items()))
        return f"{self.total / 1e9:.3f} GFLOP ({parts or 'no matrix products'})"


def _dims(graph: Graph, nid: int, bindings: Mapping[str, int]) -> tuple[int, ...]:
    return graph.nodes[nid].shape.concrete(bindings)


def _node_flops(graph: Graph, n: Node, b: Mapping[str, int]) -> int:
    """FLOPs of one node (0 for ops that are not matrix products)."""
    name = n.op.mnemonic
    out = n.shape.concrete(b)
    if name in ("matmul", "fused_matmul_bias_act", "qmatmul", "dequant_matmul"):
        k = _dims(graph, n.inputs[0], b)[-1]
        return 2 * math.prod(out) * k
    if name == "fused_swiglu":
        return 4 * math.prod(out) * _dims(graph, n.inputs[0], b)[-1]
    if name == "dot_general":
        lhs = _dims(graph, n.inputs[0], b)
        contract = [a % len(lhs) for a in n.op.lhs_contract]  # type: ignore[attr-defined]
        return 2 * math.prod(out) * math.prod(lhs[a] for a in contract)
    if name == "grouped_matmul":
        return 2 * math.prod(out) * _dims(graph, n.inputs[0], b)[-1]
    if name == "lora_matmul":
        x, w, a = (_dims(graph, i, b) for i in n.inputs[:3])
        rows = math.prod(x[:-1])
        k, nn, r = x[-1], w[-1], a[-1]
        return 2 * rows * (k * nn + k * r + r * nn)
    if name == "attention":
        q, kv = _dims(graph, n.inputs[0], b), _dims(graph, n.inputs[1], b)
        h, d = n.op.num_heads, n.op.head_dim  # type: ignore[attr-defined]
        return 4 * q[0] * h * q[1] * kv[1] * d
    return 0


def matmul_flops(graph: Graph, bindings: Mapping[str, int]) -> FlopCount:
    """The matrix-product FLOPs of ``graph`` with its symbols bound by ``bindings``
    (ShapeError naming the symbol when one is unbound)."""
    missing = sorted(
        {s for n in graph.nodes for s in n.shape.symbols} - set(bindings),
    )
    if missing:
        raise ShapeError(
            f"graph {graph.name!r}: counting FLOPs needs a value for every symbolic dim; "
            f"{missing} unbound (given {dict(bindings)})"
        )
    by_op: dict[str, int] = {}
    for n in graph.nodes:
        f = _node_flops(graph, n, bindings)
        if f:
            by_op[n.op.mnemonic] = by_op.get(n.op.mnemonic, 0) + f
    return FlopCount(sum(by_op.values()), by_op)
