"""Qwen2 / Qwen3 decoders as embedders (gte-Qwen2, Qwen3-Embedding). In: an
:class:`EncoderConfig` whose ``spec`` is a :class:`DecoderSpec`. Out: its checkpoint
tensors (:func:`tensors`; a ``...ForCausalLM`` checkpoint's ``model.`` prefix is dropped
and its ``lm_head`` ignored by the loader) and the graph (:func:`build`): inputs
``input_ids``, ``attention_mask`` (i64 ``[batch, seq]``), the last hidden state
``[batch, seq, hidden]`` (the final RMS norm applied), as transformers'
``Qwen2Model`` / ``Qwen3Model`` give it.

Per layer (transformers' eager computation): RMS norm, q / k / v projections (biases for
Qwen2; for Qwen3 with ``attention_bias``, on ``o_proj`` too), per-head q / k RMS norms
(Qwen3), rope (rotate-half) at positions ``0..seq-1``,
causal grouped-query attention (within the sliding window on the layers that have one),
``o_proj``, residual; RMS norm, ``down(silu(gate(x)) * up(x))``, residual. Batches are
padded on the right whatever the tokenizer says (the loader sets it): a causal token
never sees the padding after it, so no padding mask is needed and each text gets the
positions it has alone; the last-token pooling picks each text's last real token.
"""

from __future__ import annotations

from rlx.dtype import DType
from rlx.ir.mir import Graph, NodeId
from rlx.models.hf.common import Tensors, inputs, linear, positions, rope_rows
from rlx.models.hf.config import DecoderSpec, EncoderConfig
from rlx.ops.nn import MaskKind

__all__ = ["build", "tensors"]


def _spec(cfg: EncoderConfig) -> DecoderSpec:
    assert isinstance(cfg.spec, DecoderSpec)
    return cfg.spec


def tensors(cfg: EncoderConfig) -> Tensors:
    """Checkpoint name -> (shape as stored, whether it is a linear weight to transpose)."""
    sp, d, f, hd = _spec(cfg), cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_heads * hd, cfg.kv_heads * hd
    out: Tensors = {"embed_tokens.weight": ((cfg.vocab_size, d), False)}

    def lin(name: str, n_in: int, n_out: int, bias: bool = False) -> None:
        out[f"{name}.weight"] = ((n_out, n_in), True)
        if bias:
            out[f"{name}.bias"] = ((n_out,), False)

    for i in range(cfg.num_layers):
        p = f"layers.{i}"
        out[f"{p}.input_layernorm.weight"] = ((d,), False)
        lin(f"{p}.self_attn.q_proj", d, q, sp.qkv_bias)
        lin(f"{p}.self_attn.k_proj", d, kv, sp.qkv_bias)
        lin(f"{p}.self_attn.v_proj", d, kv, sp.qkv_bias)
        if sp.qk_norm:
            out[f"{p}.self_attn.q_norm.weight"] = ((hd,), False)
            out[f"{p}.self_attn.k_norm.weight"] = ((hd,), False)
        lin(f"{p}.self_attn.o_proj", q, d, sp.o_bias)
        out[f"{p}.post_attention_layernorm.weight"] = ((d,), False)
        lin(f"{p}.mlp.gate_proj", d, f)
        lin(f"{p}.mlp.up_proj", d, f)
        lin(f"{p}.mlp.down_proj", f, d)
    out["norm.weight"] = ((d,), False)
    return out


def build(cfg: EncoderConfig, name: str = "decoder") -> tuple[Graph, NodeId, NodeId]:
    """The graph without outputs, its last hidden state node and the f32 ``[batch, seq]``
    attention mask node (module docstring)."""
    sp = _spec(cfg)
    g = Graph(name)
    ids, mask_i, _ = inputs(g, cfg)
    d, f, hd, h, hkv = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.head_dim,
        cfg.num_heads,
        cfg.kv_heads,
    )
    batch, seq = g.node(ids).shape.dims
    eps = cfg.layer_norm_eps

    def rms(x: NodeId, name: str, n: int) -> NodeId:
        return g.rms_norm(x, g.param(name, (n,)), eps=eps)

    def head_norm(x: NodeId, name: str, n_heads: int) -> NodeId:
        y = rms(g.reshape(x, (batch, seq, n_heads, hd)), name, hd)
        return g.reshape(y, (batch, seq, n_heads * hd))

    x = g.gather(g.param("embed_tokens.weight", (cfg.vocab_size, d)), ids, 0)
    cos, sin = rope_rows(g, positions(g, ids), sp.rope_base, sp.rope_dims, cfg.max_positions)
    scale = float(hd) ** -0.5
    for i in range(cfg.num_layers):
        p = f"layers.{i}"
        a = rms(x, f"{p}.input_layernorm.weight", d)
        q = linear(g, a, f"{p}.self_attn.q_proj", d, h * hd, sp.qkv_bias)
        k = linear(g, a, f"{p}.self_attn.k_proj", d, hkv * hd, sp.qkv_bias)
        v = linear(g, a, f"{p}.self_attn.v_proj", d, hkv * hd, sp.qkv_bias)
        if sp.qk_norm:
            q = head_norm(q, f"{p}.self_attn.q_norm.weight", h)
            k = head_norm(k, f"{p}.self_attn.k_norm.weight", hkv)
        q = g.rope(q, cos, sin, hd, sp.rope_dims)
        k = g.rope(k, cos, sin, hd, sp.rope_dims)
        window = sp.window(i)
        kind = MaskKind.sliding_window(window) if window else MaskKind.causal()
        att = g.attention(q, k, v, h, hd, mask=kind, num_kv_heads=hkv, scale=scale)
        x = g.add(x, linear(g, att, f"{p}.self_attn.o_proj", h * hd, d, sp.o_bias))
        m = rms(x, f"{p}.post_attention_layernorm.weight", d)
        gate = linear(g, m, f"{p}.mlp.gate_proj", d, f, False)
        up = linear(g, m, f"{p}.mlp.up_proj", d, f, False)
        x = g.add(x, linear(g, g.mul(g.silu(gate), up), f"{p}.mlp.down_proj", f, d, False))
    return g, rms(x, "norm.weight", d), g.cast(mask_i, DType.F32)
