"""Derivative and batching rules of the neural-network ops (``rlx/ops/nn.py``): the
bodies behind ``Attention.vjp``, ``Rope.jvp``, ``Conv.vjp``, ``Pool.vjp`` and the others.

In: the graph being extended, the forward node, its cotangent or its inputs' tangents.
Out: node ids built from the backward ops of ``rlx/ops/nn_grad.py`` and ordinary ops.

* Attention: one ``AttentionBackward`` node for dq, dk, dv together (self-attention
  shapes) or per gradient, one for an additive mask (reduced to the mask's shape); jvp is one ``AttentionJvp`` node; vmap folds the batch
  axis into the attention's own batch dim.
* Rope: dx is the inverse rotation (``rope`` with ``-sin``); cos / sin get
  ``RopeBackward``; rope is bilinear in x and the tables, so its jvp is two ropes.
* Conv: ``ConvBackwardData`` / ``ConvBackwardWeight`` and ``sum(ct)`` for the bias;
  conv is bilinear, so its jvp is two convs.
* Pool: ``MaxPool2dBackward`` for a 2-D max pool, ``PoolBackward`` otherwise; the jvp
  of an average pool is the pool of the tangent, of a
  max pool ``MaxPoolSelect`` (the tangent at each window's first maximum).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rlx.ops.nn import Attention, Conv, Pool, PoolKind, Rope
from rlx.ops.nn_grad import (
    AttentionBackward,
    AttentionJvp,
    ConvBackwardData,
    ConvBackwardWeight,
    MaxPoolSelect,
    RopeBackward,
    pool_backward_op,
)
from rlx.ops.rules import add_any, unbroadcast, zeros

__all__ = [
    "attention_vjp",
    "attention_jvp",
    "attention_batch",
    "rope_vjp",
    "rope_jvp",
    "conv_vjp",
    "conv_jvp",
    "pool_vjp",
    "pool_jvp",
]

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

    Grads = tuple[NodeId | None, ...]


# ---- attention --------------------------------------------------------------------


def attention_vjp(op: Attention, g: Graph, node: Node, ct: NodeId) -> Grads:
    """Self-attention shapes (q, k, v alike): one stacked ``qkv`` node split by narrow;
    otherwise one node per gradient."""
    ins = list(node.inputs)
    grads: list[NodeId | None]
    if g.shape(ins[0]) == g.shape(ins[1]) == g.shape(ins[2]):
        both = g.apply(AttentionBackward(op, "qkv"), [*ins, ct])
        dims = list(g.shape(ins[0]).dims)
        grads = [g.reshape(g.narrow(both, 0, i, 1), dims) for i in range(3)]
    else:
        grads = [g.apply(AttentionBackward(op, w), [*ins, ct]) for w in ("q", "k", "v")]
    if len(ins) == 4:
        ds = g.apply(AttentionBackward(op, "mask"), [*ins, ct])
        grads.append(unbroadcast(g, ds, ins[3]))
    return tuple(grads)


def attention_jvp(op: Attention, g: Graph, node: Node, tangents: Grads) -> NodeId:
    ins = list(node.inputs)
    tans = [t if t is not None else zeros(g, i) for t, i in zip(tangents, ins, strict=True)]
    return g.apply(AttentionJvp(op), [*ins, *tans])


def _front(g: Graph, x: NodeId, bdim: int | None, v: object) -> NodeId:
    """``x`` with its mapped axis first (``x`` broadcast to ``v`` copies when unmapped)."""
    if bdim is None:
        return g.expand(g.unsqueeze(x, 0), [v, *g.shape(x).dims])
    r = g.shape(x).rank
    return x if bdim == 0 else g.transpose(x, [bdim, *(a for a in range(r) if a != bdim)])


def _fold(g: Graph, x: NodeId) -> NodeId:
    """``[V, B, *rest]`` -> ``[V*B, *rest]``."""
    dims = list(g.shape(x).dims)
    return g.reshape(x, [dims[0] * dims[1], *dims[2:]])


def attention_batch(
    op: Attention, g: Graph, node: Node, ins: tuple, bdims: tuple
) -> tuple[NodeId, int]:
    """vmap: the mapped axis joins the batch dim (``[V,B,S,E]`` -> ``[V*B,S,E]``); a mask
    is brought to rank 4 and folded the same way unless it broadcasts over the batch."""
    k0 = next(k for k, b in enumerate(bdims) if b is not None)
    v = g.shape(ins[k0]).dims[bdims[k0]]
    qkv = [_front(g, x, b, v) for x, b in zip(ins[:3], bdims[:3], strict=True)]
    batch = g.shape(qkv[0]).dims[1]
    folded = [_fold(g, x) for x in qkv]
    if len(ins) == 4:
        m, bm = ins[3], bdims[3]
        if bm is None and (g.shape(m).rank < 4 or g.shape(m).dims[0] == 1):
            folded.append(m)
        else:
            m = _front(g, m, bm, v)
            while g.shape(m).rank < 5:
                m = g.unsqueeze(m, 1)
            dims = list(g.shape(m).dims)
            dims[1] = batch
            folded.append(_fold(g, g.expand(m, dims)))
    out = g.apply(op, folded)
    return g.reshape(out, [v, batch, *g.shape(out).dims[1:]]), 0


# ---- rotary embedding ------------------------------------------------------------------


def rope_vjp(op: Rope, g: Graph, node: Node, ct: NodeId) -> Grads:
    x, cos, sin = node.inputs
    dx = g.apply(op, [ct, cos, g.neg(sin)])
    return (
        dx,
        g.apply(RopeBackward(op, "cos"), [x, ct]),
        g.apply(RopeBackward(op, "sin"), [x, ct]),
    )


def rope_jvp(op: Rope, g: Graph, node: Node, tangents: Grads) -> NodeId | None:
    """``rope(tx, cos, sin) + rope(x, tcos, tsin) - rope(x, 0, 0)`` (the last term removes
    the pass-through dims the second one copies from x)."""
    x, cos, sin = node.inputs
    tx, tc, ts = tangents
    terms = [None if tx is None else g.apply(op, [tx, cos, sin])]
    if tc is not None or ts is not None:
        z = zeros(g, cos)
        terms.append(g.apply(op, [x, z if tc is None else tc, z if ts is None else ts]))
        if op.n_rot < op.head_dim:
            terms.append(g.neg(g.apply(op, [x, z, z])))
    return add_any(g, terms)


# ---- convolution and pooling -----------------------------------------------------------


def _bias_dims(g: Graph, b: NodeId, rank: int) -> NodeId:
    return g.reshape(b, [1, g.shape(b).dims[0]] + [1] * (rank - 2))


def conv_vjp(op: Conv, g: Graph, node: Node, ct: NodeId) -> Grads:
    fwd = dataclasses.replace(op, has_bias=False)
    x, w = node.inputs[:2]
    dx = g.apply(ConvBackwardData(fwd), [x, w, ct])
    dw = g.apply(ConvBackwardWeight(fwd), [x, w, ct])
    if not op.has_bias:
        return dx, dw
    rank = node.shape.rank
    return dx, dw, g.sum(ct, [0, *range(2, rank)])


def conv_jvp(op: Conv, g: Graph, node: Node, tangents: Grads) -> NodeId | None:
    fwd = dataclasses.replace(op, has_bias=False)
    x, w = node.inputs[:2]
    tx, tw = tangents[:2]
    terms = [
        None if tx is None else g.apply(fwd, [tx, w]),
        None if tw is None else g.apply(fwd, [x, tw]),
    ]
    if op.has_bias and tangents[2] is not None:
        terms.append(_bias_dims(g, tangents[2], node.shape.rank))
    out = add_any(g, terms)
    if out is not None and g.shape(out).dims != node.shape.dims:
        out = g.expand(out, list(node.shape.dims))
    return out


def pool_vjp(op: Pool, g: Graph, node: Node, ct: NodeId) -> Grads:
    return (g.apply(pool_backward_op(op), [node.inputs[0], ct]),)


def pool_jvp(op: Pool, g: Graph, node: Node, tangents: Grads) -> NodeId | None:
    (tx,) = tangents
    if tx is None:
        return None
    if op.fn is PoolKind.AVG:
        return g.apply(op, [tx])
    return g.apply(MaxPoolSelect(op), [node.inputs[0], tx])
