"""ModernBERT (transformers' ``ModernBertModel``). In: an :class:`EncoderConfig` whose
``spec`` is a :class:`ModernBertSpec`. Out: its checkpoint tensors (:func:`tensors`) and
the encoder graph (:func:`build`): inputs ``input_ids``, ``attention_mask`` (i64
``[batch, seq]``), the last hidden state ``[batch, seq, hidden]``.

The computation is transformers' eager one on a padded batch (transformers itself unpads
for flash attention; on the tokens the two agree): the token embedding, LayerNorm; per
layer a pre-norm block (layer 0 has no attention norm) with one fused ``Wqkv`` projection,
rope on q and k (the global layers' base or the local layers'), attention over the
non-padding keys, within ``|i - j| <= local_attention / 2`` on the sliding-window layers
(every layer but each ``global_attn_every_n_layers``-th, or as ``layer_types`` says),
``Wo``, residual; LayerNorm, the GLU ``act(input) * gate`` of ``Wi``'s two halves,
``Wo``, residual; then the final LayerNorm. Norms have no bias unless ``norm_bias``.
Positions are ``0..seq-1``: padding is on the right, so a text's rows do not depend on
the batch it is in.
"""

from __future__ import annotations

from rlx.dtype import DType
from rlx.ir.mir import Graph, NodeId
from rlx.models.hf.common import (
    MASK_FILL,
    Tensors,
    activation,
    additive_mask,
    inputs,
    linear,
    positions,
    rope_rows,
    split,
)
from rlx.models.hf.config import EncoderConfig, ModernBertSpec

__all__ = ["build", "tensors"]


def _spec(cfg: EncoderConfig) -> ModernBertSpec:
    assert isinstance(cfg.spec, ModernBertSpec)
    return cfg.spec


def tensors(cfg: EncoderConfig) -> Tensors:
    """Checkpoint name -> (shape as stored, whether it is a linear weight to transpose)."""
    sp, h, f = _spec(cfg), cfg.hidden_size, cfg.intermediate_size
    out: Tensors = {"embeddings.tok_embeddings.weight": ((cfg.vocab_size, h), False)}

    def lin(name: str, n_in: int, n_out: int, bias: bool) -> None:
        out[f"{name}.weight"] = ((n_out, n_in), True)
        if bias:
            out[f"{name}.bias"] = ((n_out,), False)

    def norm(name: str) -> None:
        out[f"{name}.weight"] = ((h,), False)
        if sp.norm_bias:
            out[f"{name}.bias"] = ((h,), False)

    norm("embeddings.norm")
    for i in range(cfg.num_layers):
        p = f"layers.{i}"
        if i:
            norm(f"{p}.attn_norm")
        lin(f"{p}.attn.Wqkv", h, 3 * h, sp.attention_bias)
        lin(f"{p}.attn.Wo", h, h, sp.attention_bias)
        norm(f"{p}.mlp_norm")
        lin(f"{p}.mlp.Wi", h, 2 * f, sp.mlp_bias)
        lin(f"{p}.mlp.Wo", f, h, sp.mlp_bias)
    norm("final_norm")
    return out


def build(cfg: EncoderConfig, name: str = "modernbert") -> tuple[Graph, NodeId, NodeId]:
    """The encoder graph without outputs, its last hidden state node and the f32
    ``[batch, seq]`` attention mask node (module docstring)."""
    sp = _spec(cfg)
    g = Graph(name)
    ids, mask_i, _ = inputs(g, cfg)
    h, f, heads, hd = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.head_dim
    act = activation(g, sp.activation)

    def norm(x: NodeId, p: str) -> NodeId:
        beta = g.param(f"{p}.bias", (h,)) if sp.norm_bias else None
        return g.layer_norm(x, g.param(f"{p}.weight", (h,)), beta, cfg.layer_norm_eps)

    x = g.gather(g.param("embeddings.tok_embeddings.weight", (cfg.vocab_size, h)), ids, 0)
    x = norm(x, "embeddings.norm")

    mask = g.cast(mask_i, DType.F32)
    full = additive_mask(g, mask)
    pos = positions(g, ids)
    local = full
    if any(sp.sliding_layers):
        _, s = g.node(ids).shape.dims
        pf = g.cast(pos, DType.F32)
        dist = g.abs(g.sub(g.reshape(pf, (1, 1, s, 1)), g.reshape(pf, (1, 1, 1, s))))
        far = g.cast(g.gt(dist, float(sp.local_window)), DType.F32)
        local = g.add(full, g.mul(far, -MASK_FILL))  # [batch, 1, seq, seq]
    ropes = {
        kind: rope_rows(g, pos, base, hd, cfg.max_positions)
        for kind, base in ((False, sp.global_rope_base), (True, sp.local_rope_base))
        if kind in sp.sliding_layers
    }
    for i in range(cfg.num_layers):
        p, sliding = f"layers.{i}", sp.sliding_layers[i]
        a = norm(x, f"{p}.attn_norm") if i else x
        q, k, v = split(g, linear(g, a, f"{p}.attn.Wqkv", h, 3 * h, sp.attention_bias), (h, h, h))
        cos, sin = ropes[sliding]
        q, k = g.rope(q, cos, sin, hd), g.rope(k, cos, sin, hd)
        att = g.attention(q, k, v, heads, hd, mask_input=local if sliding else full)
        x = g.add(x, linear(g, att, f"{p}.attn.Wo", h, h, sp.attention_bias))
        inp, gate = split(g, linear(g, norm(x, f"{p}.mlp_norm"), f"{p}.mlp.Wi", h, 2 * f,
                                    sp.mlp_bias), (f, f))  # fmt: skip
        x = g.add(x, linear(g, g.mul(act(inp), gate), f"{p}.mlp.Wo", f, h, sp.mlp_bias))
    return g, norm(x, "final_norm"), mask
