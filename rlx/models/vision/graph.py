"""The graphs of an image model. In: a :class:`VisionModelConfig`. Out: MIR graphs with a
symbolic ``batch`` whose params carry the names of ``weights.py``.

Image graph: input ``pixel_values`` f32 ``[batch, 3, S, S]`` (preprocessed); output the
image embedding ``[batch, dim]`` (not normalized), as transformers' ``get_image_features``
(CLIP, SigLIP), or the logits ``[batch, num_labels]`` of ``ViTForImageClassification``.
Patches are cut in the graph (reshape + transpose) and projected by one matmul with the
convolution weight as a ``[C*p*p, hidden]`` matrix: the same sum as the stride-p conv.
CLIP: [class embedding; patches] + positions, ``pre_layrnorm``, the tower, the class
token through ``post_layernorm`` and ``visual_projection``. SigLIP: patches + positions,
the tower, ``post_layernorm``, then the attention-pooling head (MAP: one learned probe
query attending over all tokens, + the head's LN / MLP residual). ViT: [cls token;
patches] + positions, the tower, ``layernorm``, the cls token through ``classifier``.

Text graph (CLIP, SigLIP): inputs ``input_ids`` i64 ``[batch, seq]`` and ``pool_index``
i64 ``[batch]`` (the flat index ``row * seq + position`` of each text's pooled token);
output the text embedding ``[batch, dim]``. Token + position embeddings, the tower
(causal attention for CLIP, none for SigLIP), ``final_layer_norm``, the pooled token
(CLIP: its EOS; SigLIP: the last) through ``text_projection`` (CLIP) or ``head``.

Every tower layer is pre-norm: ``x + o(attn(ln1(x)))``, then ``x + down(act(up(ln2(x))))``
with ``act`` the config's (exact GELU, tanh GELU or CLIP's quick GELU).
"""

from __future__ import annotations

import numpy as np

from rlx.dtype import DType
from rlx.ir.mir import Graph, NodeId
from rlx.models.vision.config import Act, Family, TowerConfig, VisionModelConfig
from rlx.models.vision.weights import PATCH, layer_names
from rlx.ops.nn import MaskKind

__all__ = ["image_graph", "text_graph"]


class _B:
    """Builder helpers over one graph."""

    def __init__(self, g: Graph):
        self.g = g

    def param(self, name: str, shape: tuple[int, ...]) -> NodeId:
        return self.g.param(name, shape)

    def lin(self, x: NodeId, p: str, n_in: int, n_out: int, bias: bool = True) -> NodeId:
        w = self.param(f"{p}.weight", (n_in, n_out))
        return self.g.linear(x, w, self.param(f"{p}.bias", (n_out,)) if bias else None)

    def ln(self, x: NodeId, p: str, h: int, eps: float) -> NodeId:
        return self.g.layer_norm(
            x, self.param(f"{p}.weight", (h,)), self.param(f"{p}.bias", (h,)), eps
        )

    def act(self, x: NodeId, act: Act) -> NodeId:
        g = self.g
        if act is Act.GELU:
            return g.gelu(x)
        if act is Act.GELU_TANH:
            return g.gelu_tanh(x)
        return g.mul(x, g.sigmoid(g.mul(x, 1.702)))

    def mlp(self, x: NodeId, up: str, down: str, t: TowerConfig) -> NodeId:
        f = self.act(self.lin(x, up, t.hidden, t.intermediate), t.act)
        return self.lin(f, down, t.intermediate, t.hidden)

    def tower(
        self, x: NodeId, family: Family, prefix: str, t: TowerConfig, mask: MaskKind
    ) -> NodeId:
        g, h = self.g, t.hidden
        for i in range(t.layers):
            n = layer_names(family, prefix, i)
            a = self.ln(x, n["ln1"], h, t.eps)
            q, k, v = (self.lin(a, n[r], h, h) for r in "qkv")
            x = g.add(x, self.lin(g.attention(q, k, v, t.heads, t.head_dim, mask), n["o"], h, h))
            x = g.add(x, self.mlp(self.ln(x, n["ln2"], h, t.eps), n["up"], n["down"], t))
        return x


def _patches(b: _B, cfg: VisionModelConfig, batch: object, pixels: NodeId) -> NodeId:
    """f32 ``[batch, patches, hidden]``: each patch (c, i, j order) times the conv weight."""
    g, vis = b.g, cfg.vision
    c, p, n, h = vis.channels, vis.patch_size, vis.grid, vis.tower.hidden
    x = g.reshape(pixels, (batch, c, n, p, n, p))
    x = g.reshape(g.transpose(x, (0, 2, 4, 1, 3, 5)), (batch, n * n, c * p * p))
    name = PATCH[cfg.family]
    w = b.param(f"{name}.weight", (c * p * p, h))
    bias = None if cfg.family is Family.CLIP else b.param(f"{name}.bias", (h,))
    return g.linear(x, w, bias)


def _first(g: Graph, x: NodeId) -> NodeId:
    """``x[:, 0, :]``."""
    return g.squeeze(g.narrow(x, 1, 0, 1), 1)


def image_graph(cfg: VisionModelConfig) -> Graph:
    """The image graph of ``cfg`` (module docstring)."""
    g = Graph(f"{cfg.architecture}_image")
    b = _B(g)
    vis, fam = cfg.vision, cfg.family
    t, h, s = vis.tower, vis.tower.hidden, vis.image_size
    batch = g.sym("batch")
    pixels = g.input("pixel_values", (batch, vis.channels, s, s), DType.F32)
    x = _patches(b, cfg, batch, pixels)
    if fam is Family.SIGLIP:
        pos = b.param("vision_model.embeddings.position_embedding.weight", (vis.num_patches, h))
        x = g.add(x, pos)
        x = b.tower(x, fam, "vision_model", t, MaskKind.none())
        x = b.ln(x, "vision_model.post_layernorm", h, t.eps)
        hd = "vision_model.head"
        probe = g.expand(b.param(f"{hd}.probe", (1, 1, h)), (batch, 1, h))
        q = b.lin(probe, f"{hd}.attention.q_proj", h, h)
        k = b.lin(x, f"{hd}.attention.k_proj", h, h)
        v = b.lin(x, f"{hd}.attention.v_proj", h, h)
        a = b.lin(g.attention(q, k, v, t.heads, t.head_dim), f"{hd}.attention.out_proj", h, h)
        a = g.add(
            a, b.mlp(b.ln(a, f"{hd}.layernorm", h, t.eps), f"{hd}.mlp.fc1", f"{hd}.mlp.fc2", t)
        )
        out = _first(g, a)
    else:
        if fam is Family.CLIP:
            cls = g.reshape(b.param("vision_model.embeddings.class_embedding", (h,)), (1, 1, h))
            pos = b.param(
                "vision_model.embeddings.position_embedding.weight", (vis.num_patches + 1, h)
            )
        else:
            cls = b.param("vit.embeddings.cls_token", (1, 1, h))
            pos = b.param("vit.embeddings.position_embeddings", (1, vis.num_patches + 1, h))
        x = g.add(g.concat([g.expand(cls, (batch, 1, h)), x], 1), pos)
        if fam is Family.CLIP:
            x = b.ln(x, "vision_model.pre_layrnorm", h, t.eps)
            x = b.tower(x, fam, "vision_model", t, MaskKind.none())
            pooled = b.ln(_first(g, x), "vision_model.post_layernorm", h, t.eps)
            out = b.lin(pooled, "visual_projection", h, cfg.projection_dim, bias=False)
        else:
            x = b.ln(b.tower(x, fam, "vit", t, MaskKind.none()), "vit.layernorm", h, t.eps)
            out = b.lin(_first(g, x), "classifier", h, len(cfg.labels))
    g.set_outputs([out])
    return g


def text_graph(cfg: VisionModelConfig) -> Graph:
    """The text graph of ``cfg`` (module docstring); CLIP and SigLIP only."""
    tc = cfg.text
    assert tc is not None, "text_graph needs a model with a text tower"
    g = Graph(f"{cfg.architecture}_text")
    b = _B(g)
    t, h = tc.tower, tc.tower.hidden
    batch, seq = g.sym("batch"), g.sym("seq", max=tc.max_positions)
    ids = g.input("input_ids", (batch, seq), DType.I64)
    pool = g.input("pool_index", (batch,), DType.I64)
    tok = b.param("text_model.embeddings.token_embedding.weight", (tc.vocab_size, h))
    pos_table = b.param("text_model.embeddings.position_embedding.weight", (tc.max_positions, h))
    ones = g.add(g.mul(ids, np.int64(0)), np.int64(1))
    positions = g.sub(g.cumsum(ones, 1), np.int64(1))
    x = g.add(g.gather(tok, ids, 0), g.gather(pos_table, positions, 0))
    mask = MaskKind.causal() if cfg.family is Family.CLIP else MaskKind.none()
    x = b.tower(x, cfg.family, "text_model", t, mask)
    x = b.ln(x, "text_model.final_layer_norm", h, t.eps)
    pooled = g.gather(g.reshape(x, (-1, h)), pool, 0)
    if cfg.family is Family.CLIP:
        out = b.lin(pooled, "text_projection", h, tc.projection, bias=False)
    else:
        out = b.lin(pooled, "text_model.head", h, tc.projection)
    g.set_outputs([out])
    return g
