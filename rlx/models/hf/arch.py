"""Encoder graphs. In: an :class:`EncoderConfig`. Out: a MIR graph with
symbolic ``batch`` and ``seq`` whose params carry the checkpoint's tensor names.

Inputs (i64 ``[batch, seq]``): ``input_ids``, ``attention_mask`` (1 = token, 0 = padding)
and, for BERT and RoBERTa, ``token_type_ids``. Output: the last hidden state
``[batch, seq, hidden]`` (f32), as ``transformers``' ``last_hidden_state``.

The computation is transformers' eager one: word + position (+ token type) embeddings,
layer_norm; per layer ``attention`` (the rlx op, with the additive mask
``(attention_mask - 1) * 1e30`` broadcast over heads and queries), output projection,
residual + layer_norm, exact (erf) GELU FFN, residual + layer_norm (post-norm). Positions
are ``0..seq-1`` for BERT / DistilBERT; for RoBERTa / XLM-R they count the non-pad tokens
from ``pad_token_id + 1`` and pad tokens get ``pad_token_id`` (transformers'
``create_position_ids_from_input_ids``). Linear weights are params of shape ``[in, out]``
(the checkpoint's ``[out, in]`` transposed, see ``weights.py``).

The rope families have their own graphs, picked by :data:`FAMILY_GRAPHS`: ModernBERT
(``modernbert.py``), NomicBERT (``nomic.py``) and the Qwen2 / Qwen3 decoders
(``decoder.py``); their inputs and output are the same.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx.dtype import DType
from rlx.ir.mir import Graph, NodeId
from rlx.models.hf import decoder, modernbert, nomic
from rlx.models.hf.common import MASK_FILL
from rlx.models.hf.config import EncoderConfig, Family
from rlx.models.hf.weights import layer_names

__all__ = ["build_encoder", "encoder_graph", "MASK_FILL", "FAMILY_GRAPHS"]

#: The families with a graph of their own, and its builder.
FAMILY_GRAPHS: dict[Family, Callable[[EncoderConfig, str], tuple[Graph, NodeId, NodeId]]] = {
    Family.MODERNBERT: modernbert.build,
    Family.NOMIC: nomic.build,
    Family.QWEN2: decoder.build,
    Family.QWEN3: decoder.build,
}


def _positions(g: Graph, cfg: EncoderConfig, ids: NodeId) -> NodeId:
    """i64 [batch, seq] position ids (see the module docstring)."""
    if cfg.family is Family.ROBERTA:
        real = g.cast(g.ne(ids, np.int64(cfg.pad_token_id)), DType.I64)
        return g.add(g.mul(g.cumsum(real, 1), real), np.int64(cfg.pad_token_id))
    ones = g.add(g.mul(ids, np.int64(0)), np.int64(1))
    return g.sub(g.cumsum(ones, 1), np.int64(1))


def build_encoder(cfg: EncoderConfig, name: str = "encoder") -> tuple[Graph, NodeId, NodeId]:
    """The encoder graph without outputs, its last hidden state node and the f32
    ``[batch, seq]`` attention mask node (for a pooling head to add)."""
    if cfg.family in FAMILY_GRAPHS:
        return FAMILY_GRAPHS[cfg.family](cfg, name)
    g = Graph(name)
    batch, seq = g.sym("batch"), g.sym("seq", max=cfg.max_positions)
    h, eps = cfg.hidden_size, cfg.layer_norm_eps
    ids = g.input("input_ids", (batch, seq), DType.I64)
    mask_i = g.input("attention_mask", (batch, seq), DType.I64)
    types = g.input("token_type_ids", (batch, seq), DType.I64) if cfg.type_vocab_size else None

    def param(n: str, shape: tuple[int, ...]) -> NodeId:
        return g.param(n, shape)

    def lin(x: NodeId, p: str, n_in: int, n_out: int) -> NodeId:
        return g.linear(x, param(f"{p}.weight", (n_in, n_out)), param(f"{p}.bias", (n_out,)))

    def ln(x: NodeId, p: str) -> NodeId:
        return g.layer_norm(x, param(f"{p}.weight", (h,)), param(f"{p}.bias", (h,)), eps)

    x = g.gather(param("embeddings.word_embeddings.weight", (cfg.vocab_size, h)), ids, 0)
    pos_table = param("embeddings.position_embeddings.weight", (cfg.max_position_embeddings, h))
    x = g.add(x, g.gather(pos_table, _positions(g, cfg, ids), 0))
    if types is not None:
        tt = param("embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, h))
        x = g.add(x, g.gather(tt, types, 0))
    x = ln(x, "embeddings.LayerNorm")

    mask = g.cast(mask_i, DType.F32)
    additive = g.mul(g.sub(g.reshape(mask, (batch, 1, 1, seq)), 1.0), MASK_FILL)
    for i in range(cfg.num_layers):
        n = layer_names(cfg, i)
        q, k, v = (lin(x, n[r], h, h) for r in "qkv")
        a = g.attention(q, k, v, cfg.num_heads, cfg.head_dim, mask_input=additive)
        x = ln(g.add(lin(a, n["o"], h, h), x), n["ln1"])
        f = g.gelu(lin(x, n["up"], h, cfg.intermediate_size))
        x = ln(g.add(lin(f, n["down"], cfg.intermediate_size, h), x), n["ln2"])
    return g, x, mask


def encoder_graph(cfg: EncoderConfig, name: str = "encoder") -> Graph:
    """:func:`build_encoder` with the last hidden state as the one output."""
    g, x, _ = build_encoder(cfg, name)
    g.set_outputs([x])
    return g
