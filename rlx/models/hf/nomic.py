"""NomicBERT (nomic-embed-text's ``NomicBertModel``, remote code in
``modeling_hf_nomic_bert.py``, not part of transformers). In: an :class:`EncoderConfig`
whose ``spec`` is a :class:`NomicSpec`. Out: its checkpoint tensors (:func:`tensors`) and
the encoder graph (:func:`build`): inputs ``input_ids``, ``attention_mask`` and
``token_type_ids`` (i64 ``[batch, seq]``), the last hidden state ``[batch, seq, hidden]``.

The computation follows the published modeling code (``prenorm: false``): word (+ token
type) embeddings, LayerNorm ``emb_ln``; per layer a fused ``Wqkv`` projection (q, k, v
each ``hidden`` wide), rope on the first ``head_dim * rotary_emb_fraction`` dims of each
q / k head (rotate-half, or adjacent pairs when ``rotary_emb_interleaved``), attention
over the non-padding keys scaled by ``1/sqrt(head_dim)``, ``out_proj``, residual +
LayerNorm ``norm1``; the FFN (gated: ``fc11(x) * act(fc12(x))`` then ``fc2``, SwiGLU for
``activation_function: swiglu``; else ``fc2(gelu(fc1(x)))``), residual + LayerNorm
``norm2``. No final norm (post-norm). Positions are ``0..seq-1`` with padding on the
right.
"""

from __future__ import annotations

from rlx.dtype import DType
from rlx.ir.mir import Graph, NodeId
from rlx.models.hf.common import (
    Tensors,
    activation,
    additive_mask,
    inputs,
    linear,
    positions,
    rope_rows,
    split,
)
from rlx.models.hf.config import EncoderConfig, NomicSpec

__all__ = ["build", "tensors"]


def _spec(cfg: EncoderConfig) -> NomicSpec:
    assert isinstance(cfg.spec, NomicSpec)
    return cfg.spec


def tensors(cfg: EncoderConfig) -> Tensors:
    """Checkpoint name -> (shape as stored, whether it is a linear weight to transpose)."""
    sp, h, f = _spec(cfg), cfg.hidden_size, cfg.intermediate_size
    out: Tensors = {"embeddings.word_embeddings.weight": ((cfg.vocab_size, h), False)}
    if cfg.type_vocab_size:
        out["embeddings.token_type_embeddings.weight"] = ((cfg.type_vocab_size, h), False)

    def lin(name: str, n_in: int, n_out: int, bias: bool) -> None:
        out[f"{name}.weight"] = ((n_out, n_in), True)
        if bias:
            out[f"{name}.bias"] = ((n_out,), False)

    def ln(name: str) -> None:
        out[f"{name}.weight"] = ((h,), False)
        out[f"{name}.bias"] = ((h,), False)

    ln("emb_ln")
    for i in range(cfg.num_layers):
        p = f"encoder.layers.{i}"
        lin(f"{p}.attn.Wqkv", h, 3 * h, sp.qkv_bias)
        lin(f"{p}.attn.out_proj", h, h, sp.qkv_bias)
        ln(f"{p}.norm1")
        if sp.gated:
            lin(f"{p}.mlp.fc11", h, f, sp.fc1_bias)
            lin(f"{p}.mlp.fc12", h, f, sp.fc1_bias)
        else:
            lin(f"{p}.mlp.fc1", h, f, sp.fc1_bias)
        lin(f"{p}.mlp.fc2", f, h, sp.fc2_bias)
        ln(f"{p}.norm2")
    return out


def build(cfg: EncoderConfig, name: str = "nomic_bert") -> tuple[Graph, NodeId, NodeId]:
    """The encoder graph without outputs, its last hidden state node and the f32
    ``[batch, seq]`` attention mask node (module docstring)."""
    sp = _spec(cfg)
    g = Graph(name)
    ids, mask_i, types = inputs(g, cfg)
    h, f, heads, hd = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.head_dim
    act = activation(g, sp.activation)

    def ln(x: NodeId, p: str) -> NodeId:
        w, b = g.param(f"{p}.weight", (h,)), g.param(f"{p}.bias", (h,))
        return g.layer_norm(x, w, b, cfg.layer_norm_eps)

    x = g.gather(g.param("embeddings.word_embeddings.weight", (cfg.vocab_size, h)), ids, 0)
    if types is not None:
        tt = g.param("embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, h))
        x = g.add(x, g.gather(tt, types, 0))
    x = ln(x, "emb_ln")

    mask = g.cast(mask_i, DType.F32)
    additive = additive_mask(g, mask)
    cos, sin = rope_rows(g, positions(g, ids), sp.rope_base, sp.rope_dims, cfg.max_positions)
    for i in range(cfg.num_layers):
        p = f"encoder.layers.{i}"
        q, k, v = split(g, linear(g, x, f"{p}.attn.Wqkv", h, 3 * h, sp.qkv_bias), (h, h, h))
        q = g.rope(q, cos, sin, hd, sp.rope_dims, sp.rope_interleaved)
        k = g.rope(k, cos, sin, hd, sp.rope_dims, sp.rope_interleaved)
        att = g.attention(q, k, v, heads, hd, mask_input=additive)
        x = ln(g.add(linear(g, att, f"{p}.attn.out_proj", h, h, sp.qkv_bias), x), f"{p}.norm1")
        if sp.gated:
            y = linear(g, x, f"{p}.mlp.fc11", h, f, sp.fc1_bias)
            y = g.mul(y, act(linear(g, x, f"{p}.mlp.fc12", h, f, sp.fc1_bias)))
        else:
            y = act(linear(g, x, f"{p}.mlp.fc1", h, f, sp.fc1_bias))
        x = ln(g.add(linear(g, y, f"{p}.mlp.fc2", f, h, sp.fc2_bias), x), f"{p}.norm2")
    return g, x, mask
