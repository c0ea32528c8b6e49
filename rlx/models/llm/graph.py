"""The decoder as one rlx graph. In: an :class:`LlmConfig` and the GGUF tensors. Out:
:class:`DecoderGraph`: a MIR graph with a symbolic sequence length ``seq`` and the params
it reads (the GGUF bytes themselves: no f32 copy of a quantized weight; bf16 / f16
weights stay 16-bit, multiplied by the custom op of :mod:`rlx.models.llm.lowp`).

Inputs: ``input_ids`` i64 ``[1, seq]``, ``positions`` i64 ``[seq]`` (consecutive, the
positions of these tokens in the context) and ``last`` i64 ``[rows]`` (which of the ``seq``
rows give logits: one for a prompt or a decode step, every row for the verification of
drafted tokens in speculative decoding). Output: f32 ``[1, rows, vocab]``, the next-token
logits after each row of ``last``. One compiled graph serves prefill (``seq`` = the prompt, padded to a length
class) and decode (``seq`` = 1): each layer's ``cache_attention`` writes its rows into
the layer's KV cache params ``kv.{i}.k`` / ``kv.{i}.v`` (``[1, max_context, Hkv*D]``,
kept by the runtime) and attends over the cache's valid prefix.

The batched graph (``slots`` = N, :mod:`rlx.models.llm.batch`): the caches are
``[N, max_context, Hkv*D]`` (one context per slot), a further input ``slots`` i64 ``[seq]``
names each token's slot (``positions`` are then per token, not necessarily consecutive),
and each layer's ``slot_cache_attention`` writes every token's rows into its slot and
attends over that slot. A decode step of N sequences is ``seq`` = N tokens (one per slot),
so every projection is one ``dequant_matmul`` of N rows.

Per layer (llama.cpp's graphs; Gemma 3's parts where its spec says so): rms_norm ->
q, k, v (``dequant_matmul`` on the packed weight; biases when present) -> per-head q / k
rms_norm (when present) and rope (per-layer base) as one ``rope_norm`` (the rope tables
are constants of every position; the op reads the rows at ``positions``) -> cache attention (causal or sliding
window, grouped-query) -> output projection (-> post norm) -> residual; rms_norm -> gated
FFN ``act(gate) * up`` -> down (-> post norm) -> residual (a post norm and its residual
add are one ``norm_add``). Then the final rms_norm, the
row ``last``, and the LM head (the token embedding when tied; logit soft-capping when the
metadata gives one). The token embedding is ``dequant_gather`` (only the ids' rows are
decoded), times ``sqrt(d)`` for Gemma.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import ModelError
from rlx.ir.mir import Graph, NodeId
from rlx.models.llm.config import LlmConfig
from rlx.models.llm.lowp import HALF_LINEAR

#: ``_Builder.matrix``'s kind of a bf16 / f16 weight kept as stored
HALF = "half"
_HALF = {"BF16": DType.BF16, "F16": DType.F16}

__all__ = ["DecoderGraph", "build_decoder", "rope_tables"]


@dataclass
class DecoderGraph:
    """The graph and the params it needs (name -> array). The caches are writable zeros,
    which the runtime copies into its own storage (the cache a step writes)."""

    graph: Graph
    params: dict[str, np.ndarray] = field(default_factory=dict)


def rope_tables(
    base: float,
    scale: float,
    rot: int,
    length: int,
    inv_freq: Sequence[float] | None = None,
    gain: float = 1.0,
) -> tuple[np.ndarray, ...]:
    """f32 ``cos, sin [length, rot/2]`` of positions ``0..length-1`` (angles as
    transformers computes them: f32 inverse frequencies times f32 positions), times
    ``gain``; the inverse frequencies are ``inv_freq`` when given, else
    ``base^(-2i/rot)``."""
    inv: np.ndarray
    if inv_freq is not None:
        inv = np.asarray(inv_freq, dtype=np.float32)
    else:
        inv = 1.0 / (base ** (np.arange(0, rot, 2, dtype=np.int64).astype(np.float32) / rot))
    inv = inv.astype(np.float32)
    pos = (np.arange(length, dtype=np.float32) / np.float32(scale)).astype(np.float32)
    ang = (pos[:, None] * inv[None, :]).astype(np.float32)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    if gain != 1.0:
        cos, sin = (
            (cos * np.float32(gain)).astype(np.float32),
            (sin * np.float32(gain)).astype(np.float32),
        )
    return cos, sin


class _Builder:
    def __init__(self, cfg: LlmConfig, tensors: Mapping[str, Any], max_context: int):
        self.cfg, self.tensors, self.ctx = cfg, tensors, max_context
        self.g = Graph(f"llm_{cfg.arch.name}")
        self.params: dict[str, np.ndarray] = {}
        self.nodes: dict[str, tuple[Any, NodeId]] = {}
        self.extra: dict[str, list[NodeId]] = defaultdict(list)  # scale / zp params

    def tensor(self, name: str) -> Any:
        t = self.tensors.get(name)
        if t is None:
            raise ModelError(f"GGUF tensor {name!r} is missing ({self.cfg.arch.name} needs it)")
        return t

    def vector(self, name: str, n: int) -> NodeId:
        """A 1-D f32 param (a norm weight or a bias) of length ``n``."""
        if name in self.nodes:
            return self.nodes[name][1]
        t = self.tensor(name)
        if tuple(t.shape) != (n,):
            raise ModelError(f"GGUF tensor {name!r} has shape {list(t.shape)}, expected [{n}]")
        arr = t.data if t.type_name == "F32" else t.dequantize()
        self.params[name] = arr.reshape(n)
        self.nodes[name] = (None, self.g.param(name, (n,), DType.F32))
        return self.nodes[name][1]

    def matrix(self, name: str, n: int, k: int) -> tuple[Any, NodeId]:
        """``(kind, param)`` of the ``[n, k]`` weight ``name``: kind None for an f32
        weight, ``HALF`` for a bf16 / f16 one (kept as stored, the param is its view),
        else the QuantScheme of its packed bytes (GGUF: the one u8 param; Int8Block /
        Int4Block...: ``w_q``, with ``.scale`` / ``.zp`` params beside it)."""
        if name in self.nodes:
            return self.nodes[name]
        t = self.tensor(name)
        if tuple(t.shape) != (n, k):
            raise ModelError(f"GGUF tensor {name!r} has shape {list(t.shape)}, expected [{n}, {k}]")
        g = self.g
        if t.scheme is None and t.type_name in _HALF:
            self.params[name] = t.data.reshape(n, k)
            self.nodes[name] = (HALF, g.param(name, (n, k), _HALF[t.type_name]))
        elif t.scheme is None:
            arr = t.data if t.type_name == "F32" else t.dequantize()
            self.params[name] = arr.reshape(n, k)
            self.nodes[name] = (None, g.param(name, (n, k), DType.F32))
        else:
            packed = t.packed()
            self.params[name] = packed[0]
            w = g.param(name, packed[0].shape, DType.from_numpy(packed[0].dtype))
            self.nodes[name] = (t.scheme, w)
            for suffix, arr in zip((".scale", ".zp"), packed[1:], strict=False):
                self.params[name + suffix] = arr
                self.extra[name].append(
                    g.param(name + suffix, arr.shape, DType.from_numpy(arr.dtype))
                )
        return self.nodes[name]

    def linear(self, x: NodeId, name: str, n: int, k: int, bias: bool = False) -> NodeId:
        w_name = f"{name}.weight"
        scheme, w = self.matrix(w_name, n, k)
        g = self.g
        if scheme is None:
            y = g.matmul(x, g.transpose(w, (1, 0)))
        elif scheme is HALF:
            y = g.custom(HALF_LINEAR, [x, w])
        else:
            y = g.dequant_matmul(x, scheme, w, *self.extra[w_name])
        return g.add(y, self.vector(f"{name}.bias", n)) if bias else y

    def embed(self, ids: NodeId, n: int, k: int) -> NodeId:
        """The f32 rows ``ids`` of the token embedding ``[n, k]``."""
        scheme, emb = self.matrix("token_embd.weight", n, k)
        g = self.g
        if scheme is None:
            return g.gather(emb, ids, 0)
        if scheme is HALF:
            return g.cast(g.gather(emb, ids, 0), DType.F32)
        if not scheme.is_gguf:
            raise ModelError(
                f"the token embedding is packed as {scheme}: rlx gathers rows only from "
                f"GGUF-packed, f32, bf16 or f16 tables"
            )
        return g.dequant_gather(emb, ids, scheme)

    def ffn(self, x: NodeId, p: str, suffix: str, size: int, act: Any) -> NodeId:
        """The gated FFN ``down(act(gate(x)) * up(x))`` of ``{p}.ffn_{gate,up,down}{suffix}``."""
        d = self.cfg.hidden
        gate = self.linear(x, f"{p}.ffn_gate{suffix}", size, d)
        up = self.linear(x, f"{p}.ffn_up{suffix}", size, d)
        return self.linear(self.g.mul(act(gate), up), f"{p}.ffn_down{suffix}", d, size)

    def moe(self, x: NodeId, p: str, act: Any) -> NodeId:
        """The mixture of experts of layer ``p`` over the tokens ``x [T, d]`` (config.py's
        ``MoeSpec``; the routing of transformers' Mixtral / Qwen-MoE blocks). GGUF-packed
        expert stacks (``ffn_*_exps``, made by quantization at load) run as
        ``dequant_grouped_matmul`` over the (token, slot) rows: only the chosen experts
        are read. Experts kept one tensor each (float, or another scheme) run every
        expert on every token, weighted by the routing (0 for the experts not chosen):
        exact, no copy of a weight, ``experts / top_k`` times the FFN work."""
        g, moe, d = self.g, self.cfg.moe, self.cfg.hidden
        assert moe is not None
        logits = self.linear(x, f"{p}.ffn_gate_inp", moe.experts, d)
        weights, ids = g.topk(g.softmax(logits, -1), moe.top_k, -1)
        if moe.renormalize:
            weights = g.div(weights, g.sum(weights, [-1], keepdims=True))
        stack = self.tensors.get(f"{p}.ffn_gate_exps.weight")
        if stack is not None:
            y = self._grouped(x, p, weights, ids, act)
        else:
            chosen = g.eq(g.unsqueeze(ids, -1), g.constant(np.arange(moe.experts, dtype=np.int64)))
            dense = g.sum(g.mul(g.cast(chosen, DType.F32), g.unsqueeze(weights, -1)), [1])
            y = None
            for j in range(moe.experts):
                e = g.mul(
                    self.ffn(x, p, f".{j}", moe.ffn, act), g.slice(dense, [0, j], [None, j + 1])
                )
                y = e if y is None else g.add(y, e)
        if moe.shared_ffn:
            s = self.ffn(x, p, "_shexp", moe.shared_ffn, act)
            gate = g.sigmoid(self.linear(x, f"{p}.ffn_gate_inp_shexp", 1, d))
            y = g.add(y, g.mul(s, gate))
        assert y is not None
        return y

    def _grouped(self, x: NodeId, p: str, weights: NodeId, ids: NodeId, act: Any) -> NodeId:
        """The experts of GGUF-packed stacks (``rlx.ops.compose.moe``'s block body)."""
        g, moe, d = self.g, self.cfg.moe, self.cfg.hidden
        assert moe is not None
        stacks = {}
        for part in ("gate", "up", "down"):
            name = f"{p}.ffn_{part}_exps.weight"
            t = self.tensor(name)
            (packed,) = t.packed()
            self.params[name] = packed
            stacks[part] = (t.scheme, g.param(name, packed.shape, DType.U8))
        t_dim = g.shape(x).dims[0]
        k = moe.top_k
        rows = g.reshape(g.expand(g.unsqueeze(x, 1), [t_dim, k, d]), [-1, d])
        slot = g.reshape(ids, [-1])
        a = g.dequant_grouped_matmul(rows, *stacks["gate"], slot)
        u = g.dequant_grouped_matmul(rows, *stacks["up"], slot)
        y = g.dequant_grouped_matmul(g.mul(act(a), u), *stacks["down"], slot)
        y = g.mul(g.reshape(y, [t_dim, k, d]), g.unsqueeze(weights, -1))
        return g.sum(y, [1])

    def norm(self, x: NodeId, name: str, n: int) -> NodeId:
        return self.g.rms_norm(x, self.vector(name, n), eps=self.cfg.eps)

    def residual(self, x: NodeId, y: NodeId, norm: str | None) -> NodeId:
        """``x + y``, ``y`` RMS-normed by ``norm`` first when given (Gemma's post norms):
        one ``norm_add`` (rlx/ops/decoder.py)."""
        if norm is None:
            return self.g.add(x, y)
        return self.g.norm_add(y, self.vector(norm, self.cfg.hidden), x, self.cfg.eps)


def build_decoder(
    cfg: LlmConfig,
    tensors: Mapping[str, Any],
    max_context: int,
    kv_dtype: DType = DType.F32,
    slots: int | None = None,
    kv_group: int = 0,
) -> DecoderGraph:
    """The decoder graph of ``cfg`` over the GGUF ``tensors`` (module docstring), its KV
    cache of ``kv_dtype`` (f32, bf16, f16, or i8 with the f32 params ``kv.{i}.k_scale`` /
    ``kv.{i}.v_scale [1, max_context, G]``: one scale per row and kv head, G = Hkv, or with
    ``kv_group`` > 0 per that many values of a head, G = Hkv*D / kv_group); a missing or misshapen tensor is a
    ModelError naming it. With ``slots``, the batched graph (module docstring): a cache
    of that many sequences, a ``slots`` input and ``last`` of any length."""
    b = _Builder(cfg, tensors, max_context)
    g = b.g
    d, h, hkv, hd = cfg.hidden, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    seq = g.sym("seq", max=max_context)
    ids = g.input("input_ids", (1, seq), DType.I64)
    positions = g.input("positions", (seq,), DType.I64)
    last = g.input("last", (g.sym("rows", max=max_context),), DType.I64)
    if slots is None:
        cache = (1, max_context, hkv * hd)
    else:
        which = g.input("slots", (seq,), DType.I64)
        cache = (slots, max_context, hkv * hd)
    zeros = np.zeros(cache, kv_dtype.np)  # every layer's caches start as these zeros
    int8 = kv_dtype is DType.I8
    if int8 and slots is not None:
        raise ModelError("an int8 KV cache is for single-stream decode; batched slots are f32, "
                         "bf16 or f16")  # fmt: skip
    groups = hkv * hd // kv_group if kv_group else hkv
    scale_zeros = np.zeros((*cache[:2], groups), np.float32) if int8 else None

    x = b.embed(ids, cfg.vocab, d)
    if cfg.arch.embed_scale:
        x = g.mul(x, float(np.float32(math.sqrt(d))))

    tables: dict[tuple[Any, ...], tuple[NodeId, NodeId]] = {}

    def rope_at(layer: int) -> tuple[NodeId, NodeId]:
        """The whole ``[max_context, rot/2]`` tables of ``layer``'s rope (``rope_norm``
        reads the rows at ``positions``)."""
        key = (*cfg.rope(layer), cfg.rope_inv(layer), cfg.rope_scaling_gain(layer))
        if key not in tables:
            cos, sin = rope_tables(key[0], key[1], cfg.rope_dims, max_context, key[2], key[3])
            tables[key] = (g.constant(cos), g.constant(sin))
        return tables[key]

    def heads(x: NodeId, norm: str | None, cos: NodeId, sin: NodeId) -> NodeId:
        """``x``'s heads RMS-normed by ``norm`` (None: no norm) and rotated: one
        ``rope_norm`` (rlx/ops/decoder.py)."""
        w = None if norm is None else b.vector(norm, hd)
        return g.rope_norm(x, cos, sin, positions, w, hd, cfg.rope_dims,
                           cfg.arch.rope_interleaved, cfg.eps)  # fmt: skip

    act = g.gelu_tanh if cfg.arch.activation == "gelu_tanh" else g.silu
    for i in range(cfg.num_layers):
        p = f"blk.{i}"
        a = b.norm(x, f"{p}.attn_norm.weight", d)
        q = b.linear(a, f"{p}.attn_q", h * hd, d, cfg.attn_bias)
        k = b.linear(a, f"{p}.attn_k", hkv * hd, d, cfg.attn_bias)
        v = b.linear(a, f"{p}.attn_v", hkv * hd, d, cfg.attn_bias)
        cos, sin = rope_at(i)
        q = heads(q, f"{p}.attn_q_norm.weight" if cfg.qk_norm else None, cos, sin)
        k = heads(k, f"{p}.attn_k_norm.weight" if cfg.qk_norm else None, cos, sin)
        kc = g.param(f"kv.{i}.k", cache, kv_dtype)
        vc = g.param(f"kv.{i}.v", cache, kv_dtype)
        b.params[f"kv.{i}.k"] = b.params[f"kv.{i}.v"] = zeros
        spec = (h, hd, hkv, cfg.window(i), cfg.attn_scale)
        scales: dict[str, NodeId] = {}
        if scale_zeros is not None:  # int8: one f32 scale per cache row and kv head
            for kv in ("k", "v"):
                b.params[f"kv.{i}.{kv}_scale"] = scale_zeros
                scales[f"{kv}_scale"] = g.param(f"kv.{i}.{kv}_scale", scale_zeros.shape, DType.F32)
        cap = cfg.attn_softcap or 0.0  # Gemma 2's attention-logit soft-capping (0: off)
        att = (
            g.cache_attention(q, k, v, kc, vc, positions, *spec, **scales, softcap=cap)
            if slots is None
            else g.slot_cache_attention(q, k, v, kc, vc, positions, which, *spec, softcap=cap)
        )
        o = b.linear(att, f"{p}.attn_output", d, h * hd)
        x = b.residual(x, o, f"{p}.post_attention_norm.weight" if cfg.arch.post_norms else None)
        f = b.norm(x, f"{p}.ffn_norm.weight", d)
        if cfg.moe is not None and cfg.moe.is_moe(i):
            f = g.reshape(b.moe(g.reshape(f, (-1, d)), p, act), (1, seq, d))
        else:
            f = b.ffn(f, p, "", cfg.ffn, act)
        x = b.residual(x, f, f"{p}.post_ffw_norm.weight" if cfg.arch.post_norms else None)

    x = b.norm(g.gather(x, last, 1), "output_norm.weight", d)  # row-wise: the rows first
    head = "token_embd" if cfg.tied_embeddings else "output"
    logits = b.linear(x, head, cfg.vocab, d)
    if cfg.logit_softcap:
        c = float(cfg.logit_softcap)
        logits = g.mul(g.tanh(g.mul(logits, 1.0 / c)), c)
    g.set_outputs([logits])
    return DecoderGraph(g, b.params)
