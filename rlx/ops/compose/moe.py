"""The sparse mixture-of-experts block as a graph builder (``g.moe_block``), over the
existing ops: no op class, no kernel of its own.

For tokens ``x [T, H]`` (or ``[..., H]``), a router weight ``router [E, H]`` (PyTorch's
``nn.Linear`` layout) and three GGUF-packed expert stacks (see :mod:`rlx.ops.moe`:
``gate`` and ``up`` ``[E, I, H/qk * bb]``, ``down`` ``[E, H, I/qk * bb]``), the block
computes what ``transformers``' ``MixtralSparseMoeBlock`` does::

    p       = softmax(x @ router.T)                  [T, E], f32
    w, e    = topk(p, top_k)                         best first, ties to the lower id
    w       = w / sum(w)        (renormalize=True: Mixtral; False: Qwen-MoE's default
                                 norm_topk_prob=False)
    y[t]    = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = e[t, j]

Each expert projection is one ``dequant_grouped_matmul`` over the ``T * top_k``
(token, slot) rows, so only the selected experts' blocks are decoded. (Qwen-MoE's
shared expert and its sigmoid gate are an ordinary gated FFN added beside the block.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlx.dtype import DType
from rlx.errors import ShapeError
from rlx.formats.schemes import QuantScheme
from rlx.ops.base import graph_method

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId

__all__ = ["moe_block", "moe_route"]


def moe_route(
    g: Graph, x: NodeId, router: NodeId, top_k: int, renormalize: bool = True
) -> tuple[NodeId, NodeId]:
    """Router of ``x [T, H]`` with ``router [E, H]``: ``(weights [T, top_k] f32, expert
    ids [T, top_k] i64)``, the softmax probabilities of the ``top_k`` best experts
    (renormalized to sum 1 when ``renormalize``)."""
    experts = g.shape(router).dims[0]
    if not isinstance(top_k, int) or not (isinstance(experts, int) and 1 <= top_k <= experts):
        raise ShapeError(
            f"moe_block: top_k must be an int in [1, {experts}] (the router has {experts} "
            f"experts), given {top_k!r}"
        )
    logits = g.matmul(x, g.transpose(router, [1, 0]))
    if g.shape(logits).dtype is not DType.F32:
        logits = g.cast(logits, DType.F32)
    probs = g.softmax(logits, -1)
    weights, ids = g.topk(probs, top_k, -1)
    if renormalize:
        weights = g.div(weights, g.sum(weights, [-1], keepdims=True))
    return weights, ids


@graph_method
def moe_block(
    g: Graph,
    x: NodeId,
    router: NodeId,
    gate: NodeId,
    up: NodeId,
    down: NodeId,
    scheme: QuantScheme,
    top_k: int = 2,
    renormalize: bool = True,
) -> NodeId:
    """The sparse MoE block (see the module docstring): ``x [..., H]`` -> f32 ``[..., H]``."""
    xs = g.shape(x)
    h = xs.dims[-1]
    if xs.rank < 1 or not isinstance(h, int):
        raise ShapeError(f"moe_block: x must be [..., H] with a static H, given {xs}")
    flat = x if xs.rank == 2 else g.reshape(x, [-1, h])
    weights, ids = moe_route(g, flat, router, top_k, renormalize)
    # one row per (token, slot): token t's slots j = 0..top_k-1 are rows t*top_k + j
    t = g.shape(flat).dims[0]
    rows = g.reshape(g.expand(g.unsqueeze(flat, 1), [t, top_k, h]), [-1, h])
    slot_ids = g.reshape(ids, [-1])
    a = g.dequant_grouped_matmul(rows, scheme, gate, slot_ids)
    b = g.dequant_grouped_matmul(rows, scheme, up, slot_ids)
    y = g.dequant_grouped_matmul(g.mul(g.silu(a), b), scheme, down, slot_ids)
    y = g.mul(g.reshape(y, [t, top_k, h]), g.unsqueeze(weights, -1))
    out = g.sum(y, [1])
    return out if xs.rank == 2 else g.reshape(out, list(xs.dims))
