"""Block fusion: a BERT-style layer's fused parts -> ``fused_attention_block`` and
``fused_transformer_layer`` (``rlx/ops/blocks.py``). Opt-in: they run only with
``CompileOptions(fuse_blocks=True)`` (see the measurement in docs/architecture.md:
on all-MiniLM-L6-v2 the fused layer is no faster than the layer's own kernels, which
the native schedule already runs as one C loop).

They run after the pattern fusions (``fuse_matmul_bias_act`` and ``fuse_residual_norm``
made the linears and residual norms they look for), before elementwise regions.
Recognised (``lin`` a ``fused_matmul_bias_act`` without activation, or a ``matmul``)::

    a = lin(attention(lin(x, wq), lin(x, wk), lin(x, wv) [, mask]), wo)
        -> fused_attention_block(x, wq, wk, wv, wo, [bq, bk, bv, bo], [mask])
    h = fused_residual_layer_norm(a, x, ln1)        a a fused_attention_block of x
    y = fused_residual_layer_norm(lin(act(lin(h, w_up)), w_down), h, ln2)
        -> fused_transformer_layer(x, ..., activation=act)   (post-norm, the seed's)
    h = a + x                                       a a fused_attention_block of layer_norm(x, ln1)
    y = lin(act(lin(layer_norm(h, ln2), w_up)), w_down) + h
        -> fused_transformer_layer(x, ..., pre_norm=True)

with every projection biased or none of them (the op has one ``has_bias``), q / k / v
reading the same x, the attention's heads all its own (no grouped-query) and its scale
the default ``1/sqrt(head_dim)``. A near miss says which condition failed, e.g. an
intermediate with a consumer outside the layer (``intermediate %29 has 2 users``). (A
pre-norm stack's last layer, whose residual add the final norm took into a
``fused_residual_layer_norm``, stays as its parts.)
"""

from __future__ import annotations

import math

from rlx.ir.mir import Node, NodeId
from rlx.ops.blocks import FusedAttentionBlock, FusedTransformerLayer
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.ops.fused import FusedMatMulBiasAct, FusedResidualLN
from rlx.ops.linalg import MatMul
from rlx.ops.nn import Attention
from rlx.ops.norm import LayerNorm
from rlx.passes.fusion import FusionView, Match, PatternFusion
from rlx.passes.report import FusionPattern

__all__ = ["AttentionBlockFusion", "TransformerLayerFusion"]


def _linear(view: FusionView, nid: NodeId) -> tuple[NodeId, NodeId, NodeId | None] | None:
    """``(x, w, bias or None)`` of a linear without activation (a 2-D weight), else None."""
    n = view.node(nid)
    op = n.op
    if isinstance(op, MatMul) or (isinstance(op, FusedMatMulBiasAct) and op.act is None):
        if view.node(n.inputs[1]).shape.rank != 2:
            return None
        bias = n.inputs[2] if len(n.inputs) == 3 else None
        return n.inputs[0], n.inputs[1], bias
    return None


class AttentionBlockFusion(PatternFusion):
    """QKV projections + attention + output projection -> ``fused_attention_block``."""

    name = "fuse_attention_block"
    pattern = FusionPattern.ATTENTION_BLOCK

    def match_at(self, view: FusionView, node: Node, claimed: set[NodeId]) -> Match | None:
        out = _linear(view, node.id)
        if out is None or not isinstance(view.node(out[0]).op, Attention):
            return None
        att = view.node(out[0])
        aop: Attention = att.op  # type: ignore[assignment]
        desc = f"{view.desc(att.id)} -> {view.desc(node.id)}"
        projs = [_linear(view, i) for i in att.inputs[:3]]
        nodes = [*att.inputs[:3], att.id, node.id]
        why = None
        if any(p is None for p in projs):
            bad = [view.ref(i) for i, p in zip(att.inputs[:3], projs, strict=True) if p is None]
            why = f"q / k / v {', '.join(bad)} not a linear projection without activation"
        elif len({p[0] for p in projs if p}) != 1:
            why = "q, k and v project different inputs (cross-attention)"
        elif aop.kv_heads != aop.num_heads:
            why = f"grouped-query attention ({aop.kv_heads} kv heads for {aop.num_heads})"
        elif aop.scale is not None and not math.isclose(aop.scale, aop.effective_scale):
            why = f"attention scale {aop.scale:g} is not 1/sqrt(head_dim)"
        elif len({p[2] is None for p in (*projs, out) if p}) != 1:
            why = "some projections have a bias and others not"
        if why is None:
            why = self._escapes(view, frozenset(nodes), node.id)
        if why is not None:
            self.miss(nodes, desc, why)
            return None
        x = projs[0][0]  # type: ignore[index]
        has_bias = out[2] is not None
        op = FusedAttentionBlock(aop.num_heads, aop.head_dim, has_bias, aop.mask)
        ws = [p[1] for p in projs] + [out[1]]  # type: ignore[index]
        bs = [p[2] for p in projs] + [out[2]] if has_bias else []  # type: ignore[index]
        inputs = (x, *ws, *bs, *att.inputs[3:])  # type: ignore[misc]
        why = view.infer(op, inputs)  # type: ignore[arg-type]
        if why is not None:
            self.miss(nodes, desc, why)
            return None
        return Match(node.id, op, inputs, frozenset(nodes), desc)  # type: ignore[arg-type]

    def _escapes(self, view: FusionView, inside: frozenset[NodeId], anchor: NodeId) -> str | None:
        for n in sorted(inside - {anchor}):
            why = view.why_escapes(n, inside)
            if why:
                return why
        return None


class TransformerLayerFusion(PatternFusion):
    """Attention block + residual norm + FFN + residual norm -> ``fused_transformer_layer``."""

    name = "fuse_transformer_layer"
    pattern = FusionPattern.TRANSFORMER_LAYER

    def match_at(self, view: FusionView, node: Node, claimed: set[NodeId]) -> Match | None:
        ln2 = node.op
        if isinstance(ln2, Binary) and ln2.fn is BinaryKind.ADD:
            return self._pre_norm(view, node)
        if not isinstance(ln2, FusedResidualLN) or not ln2.has_beta:
            return None
        for down_id, h in (node.inputs[:2], node.inputs[1::-1]):
            ln1 = view.node(h).op
            down = _linear(view, down_id)
            if not isinstance(ln1, FusedResidualLN) or down is None:
                continue
            up_id = down[0]
            up = view.node(up_id)
            if not (isinstance(up.op, FusedMatMulBiasAct) and up.op.act is not None):
                continue
            return self._layer(view, node, h, down_id, up_id)
        return None

    def _layer(
        self, view: FusionView, node: Node, h: NodeId, down_id: NodeId, up_id: NodeId
    ) -> Match | None:
        ln1n, up, down = view.node(h), view.node(up_id), view.node(down_id)
        ln1: FusedResidualLN = ln1n.op  # type: ignore[assignment]
        ln2: FusedResidualLN = node.op  # type: ignore[assignment]
        desc = f"{view.desc(h)} .. {view.desc(node.id)}"
        nodes = [h, up_id, down_id, node.id]
        why = None
        blk = x = None
        for a, b in (ln1n.inputs[:2], ln1n.inputs[1::-1]):
            if isinstance(view.node(a).op, FusedAttentionBlock) and view.node(a).inputs[0] == b:
                blk, x = a, b
        if blk is None:
            why = "the first residual norm does not add an attention block to its input"
        elif not ln1.has_beta:
            why = "the first layer norm has no beta"
        elif up.inputs[0] != h:
            why = f"the FFN reads {view.ref(up.inputs[0])}, not the first norm {view.ref(h)}"
        if why is None:
            nodes.append(blk)  # type: ignore[arg-type]
            for n in sorted(set(nodes) - {node.id}):
                why = why or view.why_escapes(n, frozenset(nodes))
        bop: FusedAttentionBlock = view.node(blk).op if blk is not None else None  # type: ignore[assignment]
        if why is None and (
            bop.has_bias != (len(up.inputs) == 3) or bop.has_bias != (len(down.inputs) == 3)
        ):
            why = "the attention block and the FFN differ in having biases"
        if why is not None:
            self.miss(sorted(nodes), desc, why)
            return None
        b_ins = view.node(blk).inputs  # type: ignore[arg-type]
        ws, rest = list(b_ins[1:5]), list(b_ins[5:])
        ffn_w = [up.inputs[1], down.inputs[1]]
        lns = [*ln1n.inputs[2:4], *node.inputs[2:4]]
        biases = [*rest[:4], up.inputs[2], down.inputs[2]] if bop.has_bias else []
        mask = rest[4:] if bop.has_bias else rest
        op = FusedTransformerLayer(
            bop.num_heads,
            bop.head_dim,
            ln1.eps,
            ln2.eps,
            up.op.act,  # type: ignore[attr-defined]
            bop.has_bias,
            bop.mask,
        )
        inputs = (x, *ws, *ffn_w, *lns, *biases, *mask)
        why = view.infer(op, inputs)  # type: ignore[arg-type]
        if why is not None:
            self.miss(sorted(nodes), desc, why)
            return None
        return Match(node.id, op, inputs, frozenset(nodes), desc)  # type: ignore[arg-type]

    def _pre_norm(self, view: FusionView, node: Node) -> Match | None:
        """``y = ffn(layer_norm(h)) + h``, ``h = block(layer_norm(x)) + x``."""
        for down_id, h in (node.inputs[:2], node.inputs[1::-1]):
            down, hop = _linear(view, down_id), view.node(h).op
            if down is None or not (isinstance(hop, Binary) and hop.fn is BinaryKind.ADD):
                continue
            up = view.node(down[0])
            if not (isinstance(up.op, FusedMatMulBiasAct) and up.op.act is not None):
                continue
            ln2 = view.node(up.inputs[0])
            if not (isinstance(ln2.op, LayerNorm) and ln2.inputs[0] == h):
                continue
            for blk, x in (view.node(h).inputs[:2], view.node(h).inputs[1::-1]):
                bnode = view.node(blk)
                if not isinstance(bnode.op, FusedAttentionBlock):
                    continue
                ln1 = view.node(bnode.inputs[0])
                if isinstance(ln1.op, LayerNorm) and ln1.inputs[0] == x:
                    return self._pre_layer(
                        view, node, (ln1, bnode, view.node(h), ln2, up), down_id, x
                    )
        return None

    def _pre_layer(
        self, view: FusionView, node: Node, parts: tuple[Node, ...], down_id: NodeId, x: NodeId
    ) -> Match | None:
        ln1, blk, h, ln2, up = parts
        down = view.node(down_id)
        bop: FusedAttentionBlock = blk.op  # type: ignore[assignment]
        nodes = [*(n.id for n in parts), down_id, node.id]
        desc = f"{view.desc(ln1.id)} .. {view.desc(node.id)}"
        why = None
        if not (ln1.op.has_beta and ln2.op.has_beta):  # type: ignore[attr-defined]
            why = "a layer norm without beta"
        elif bop.has_bias != (len(up.inputs) == 3) or bop.has_bias != (len(down.inputs) == 3):
            why = "the attention block and the FFN differ in having biases"
        for n in sorted(set(nodes) - {node.id}):
            why = why or view.why_escapes(n, frozenset(nodes))
        if why is not None:
            self.miss(sorted(nodes), desc, why)
            return None
        rest = list(blk.inputs[5:])
        biases = [*rest[:4], up.inputs[2], down.inputs[2]] if bop.has_bias else []
        mask = rest[4:] if bop.has_bias else rest
        act = up.op.act  # type: ignore[attr-defined]
        eps1, eps2 = ln1.op.eps, ln2.op.eps  # type: ignore[attr-defined]
        op = FusedTransformerLayer(
            bop.num_heads, bop.head_dim, eps1, eps2, act, bop.has_bias, bop.mask, True
        )
        lns = [*ln1.inputs[1:3], *ln2.inputs[1:3]]
        inputs = (x, *blk.inputs[1:5], up.inputs[1], down.inputs[1], *lns, *biases, *mask)
        why = view.infer(op, inputs)
        if why is not None:
            self.miss(sorted(nodes), desc, why)
            return None
        return Match(node.id, op, inputs, frozenset(nodes), desc)
