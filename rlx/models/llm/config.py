"""Decoder configs from GGUF metadata. In: a GGUF file's metadata and tensor names. Out:
:class:`LlmConfig` (sizes, norms, rope, attention pattern) built from the architecture's
:class:`ArchSpec`: what differs between architectures is data in :data:`ARCHS`, not code.

Conventions follow llama.cpp, which wrote the file: the ``{arch}.*`` keys give the sizes;
what llama.cpp hard-codes per architecture (Gemma 3's sliding-window pattern of 6 and its
local rope base 10000, Gemma 2's pattern of 2; the rope layout) is in the spec. Gemma 2
soft-caps its attention scores and its logits (``gemma2.attn_logit_softcapping``, default
50, and ``gemma2.final_logit_softcapping``, default 30, as llama.cpp reads them). GGUF norm weights are used as
stored (llama.cpp's converter already added Gemma's ``1 +``). Llama-family files store
q / k permuted for llama.cpp's adjacent-pair rope, so their rope is ``interleaved``; Gemma
and Qwen use NeoX's rotate-half.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx.errors import ModelError

__all__ = ["ArchSpec", "ARCHS", "LlmConfig", "MoeSpec", "read_config"]


@dataclass(frozen=True)
class ArchSpec:
    """What one architecture does differently (see the module docstring)."""

    name: str
    activation: str  # the gated FFN's activation: "gelu_tanh" or "silu"
    embed_scale: bool  # multiply the embedding by sqrt(d) (Gemma)
    post_norms: bool  # norms after attention and FFN, before the residual add (Gemma 2/3)
    rope_interleaved: bool  # adjacent-pair rope (llama.cpp's LLAMA layout)
    swa_pattern: int = 0  # every n-th layer global, the others sliding-window (0: none)
    rope_base_local: float | None = None  # rope base of the sliding-window layers


#: The architectures rlx builds (``general.architecture`` -> spec).
ARCHS: dict[str, ArchSpec] = {
    "gemma3": ArchSpec(
        "gemma3", "gelu_tanh", True, True, False, swa_pattern=6, rope_base_local=10000.0
    ),
    # Gemma 2: every other layer sliding-window (layer 0 first), one rope base
    "gemma2": ArchSpec("gemma2", "gelu_tanh", True, True, False, swa_pattern=2),
    "llama": ArchSpec("llama", "silu", False, False, True),
    "qwen2": ArchSpec("qwen2", "silu", False, False, False),
    "qwen3": ArchSpec("qwen3", "silu", False, False, False),
}


@dataclass(frozen=True)
class MoeSpec:
    """A sparse mixture-of-experts FFN (Mixtral, Qwen2-MoE, Qwen3-MoE): ``experts``
    gated FFNs of size ``ffn``, each token routed to the ``top_k`` best by
    ``softmax(x @ router.T)`` (weights renormalized to sum 1 when ``renormalize``),
    plus a shared expert of size ``shared_ffn`` scaled by ``sigmoid(x @ gate.T)`` (0:
    none). ``layers``: which layers have it (None: all; the others a dense FFN)."""

    experts: int
    top_k: int
    ffn: int
    renormalize: bool
    shared_ffn: int = 0
    layers: tuple[bool, ...] | None = None

    def is_moe(self, layer: int) -> bool:
        """Whether ``layer``'s FFN is this mixture."""
        return self.layers is None or self.layers[layer]


@dataclass(frozen=True)
class LlmConfig:
    """Sizes and per-layer facts of one decoder (in: metadata; see :func:`read_config`)."""

    arch: ArchSpec
    num_layers: int
    hidden: int
    ffn: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    eps: float
    rope_base: float
    rope_dims: int
    rope_scale: float  # linear position scaling of the global layers (1.0: none)
    sliding_window: int
    context_length: int
    attn_scale: float
    logit_softcap: float | None
    qk_norm: bool
    attn_bias: bool
    tied_embeddings: bool
    sliding_layers: tuple[bool, ...] | None = None  # per layer (None: the spec's pattern)
    # f32 inverse frequencies of the global layers' rope when not base^(-2i/dims)
    # (Llama 3's rope scaling); None: from the base
    rope_inv_freq: tuple[float, ...] | None = None
    moe: MoeSpec | None = None  # the FFN is a mixture of experts (on the layers it says)
    rope_gain: float = 1.0  # cos / sin of the global layers times this (YaRN, longrope)
    # scaled attention scores become c * tanh(s / c) before the mask (Gemma 2); None: off
    attn_softcap: float | None = None

    def is_sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends within the sliding window."""
        if self.sliding_layers is not None:
            return bool(self.sliding_window and self.sliding_layers[layer])
        p = self.arch.swa_pattern
        return bool(p and self.sliding_window and (layer + 1) % p != 0)

    def window(self, layer: int) -> int:
        """The sliding window of ``layer`` (0: causal over the whole context)."""
        return self.sliding_window if self.is_sliding(layer) else 0

    def rope(self, layer: int) -> tuple[float, float]:
        """``(base, position scale)`` of ``layer``'s rotary embedding."""
        if self.is_sliding(layer) and self.arch.rope_base_local is not None:
            return self.arch.rope_base_local, 1.0
        return self.rope_base, self.rope_scale

    def rope_scaling_gain(self, layer: int) -> float:
        """The factor on ``layer``'s rope cos / sin (1: none; YaRN's attention factor)."""
        if self.is_sliding(layer) and self.arch.rope_base_local is not None:
            return 1.0
        return self.rope_gain

    def rope_inv(self, layer: int) -> tuple[float, ...] | None:
        """The inverse frequencies of ``layer``'s rope when given explicitly (None: from
        the base of :meth:`rope`)."""
        if self.is_sliding(layer) and self.arch.rope_base_local is not None:
            return None
        return self.rope_inv_freq


def _get(meta: Mapping[str, Any], key: str, kind: type, default: Any = None) -> Any:
    v = meta.get(key, default)
    if v is None:
        raise ModelError(f"GGUF metadata key {key!r} is missing (needed for the model's sizes)")
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ModelError(f"GGUF metadata {key!r} must be an integer, got {v!r}")
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise ModelError(f"GGUF metadata {key!r} must be a number, got {v!r}")
    return kind(v)


def _positive(meta: Mapping[str, Any], key: str, kind: type, use: str, default: Any = None) -> Any:
    """``_get`` of a value that must be > 0 (and finite): ``use`` says what divides by it
    or takes its log (the ModelError names the key, the value and that use)."""
    v = _get(meta, key, kind, default)
    if not (v > 0 and math.isfinite(v)):
        what = "an integer" if kind is int else "a finite number"
        raise ModelError(f"GGUF metadata {key!r} must be {what} > 0 ({use}), got {v!r}")
    return v


def read_config(
    arch_name: str | None, meta: Mapping[str, Any], tensors: Mapping[str, Any]
) -> LlmConfig:
    """The :class:`LlmConfig` of a GGUF file with ``general.architecture`` ``arch_name``;
    ModelError naming an unknown architecture or a missing / bad metadata key: every size,
    head count, rope base, epsilon and scale that rlx divides by or takes a power or log of
    must be > 0 and finite (a rope base of 0 would give NaN logits)."""
    spec = ARCHS.get(arch_name or "")
    if spec is None:
        raise ModelError(
            f"GGUF architecture {arch_name!r} is not supported by rlx.models.llm; "
            f"supported: {', '.join(sorted(ARCHS))}"
        )
    a = spec.name
    d = _positive(meta, f"{a}.embedding_length", int, "the hidden size")
    heads = _positive(meta, f"{a}.attention.head_count", int, "the number of query heads")
    kv_heads = _positive(
        meta, f"{a}.attention.head_count_kv", int, "the number of key / value heads", heads
    )
    if heads % kv_heads:
        raise ModelError(
            f"GGUF metadata {a}.attention.head_count_kv = {kv_heads} must divide "
            f"{a}.attention.head_count = {heads} (each key / value head serves a whole "
            f"group of query heads)"
        )
    head_dim = _positive(
        meta, f"{a}.attention.key_length", int, "the head size; attention scales by "
        "1/sqrt of it", d // heads,
    )  # fmt: skip
    layers = _positive(meta, f"{a}.block_count", int, "the number of layers")
    ffn = _positive(meta, f"{a}.feed_forward_length", int, "the FFN size")
    eps = _positive(
        meta, f"{a}.attention.layer_norm_rms_epsilon", float, "RMS norm divides by "
        "sqrt(mean(x^2) + eps)",
    )  # fmt: skip
    rope_base = _positive(
        meta, f"{a}.rope.freq_base", float, "rope frequencies are base^(-2i/dims)", 10000.0
    )
    rope_dims = _positive(
        meta, f"{a}.rope.dimension_count", int, "the rotated part of each head", head_dim
    )
    if rope_dims % 2 or rope_dims > head_dim:
        raise ModelError(
            f"GGUF metadata {a}.rope.dimension_count = {rope_dims} must be even and at most "
            f"the head size {head_dim} (rope rotates pairs of a head's dimensions)"
        )
    window = _get(meta, f"{a}.attention.sliding_window", int, 0)
    if window < 0:
        raise ModelError(
            f"GGUF metadata {a}.attention.sliding_window must be >= 0 (0: none), got {window}"
        )
    context = _positive(meta, f"{a}.context_length", int, "the longest context", 2048)
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise ModelError("GGUF tensor 'token_embd.weight' is missing (the token embedding)")
    if not emb.shape or int(emb.shape[0]) < 1:
        raise ModelError(f"GGUF tensor 'token_embd.weight' has shape {list(emb.shape)}: no tokens")
    scaling = meta.get(f"{a}.rope.scaling.type")
    if scaling not in (None, "none", "linear"):
        raise ModelError(f"GGUF rope scaling {scaling!r} is not supported (only linear)")
    factor = 1.0
    if scaling == "linear":
        factor = _positive(
            meta, f"{a}.rope.scaling.factor", float, "positions are divided by it", 1.0
        )
    inv_freq = _rope_freqs(tensors.get("rope_freqs.weight"), rope_base, rope_dims)
    # llama.cpp: Gemma 2 / 3 27B (46 / 62 layers) scale queries by (d / heads)^-1/2
    big = {"gemma2": 46, "gemma3": 62}.get(a)
    attn_scale = 1.0 / math.sqrt(d / heads if layers == big else head_dim)
    # llama.cpp's Gemma 2 always soft-caps, 50 (attention) and 30 (logits) when absent
    final_default, attn_default = (30.0, 50.0) if a == "gemma2" else (None, None)
    softcap = None
    if meta.get(f"{a}.final_logit_softcapping", final_default):  # absent or 0: none
        softcap = _positive(
            meta, f"{a}.final_logit_softcapping", float, "logits become c * tanh(logits / c)",
            final_default,
        )  # fmt: skip
    attn_softcap = None
    if a == "gemma2":  # the one architecture whose attention llama.cpp soft-caps
        attn_softcap = _positive(
            meta, f"{a}.attn_logit_softcapping", float, "attention scores become "
            "c * tanh(s / c)", attn_default,
        )  # fmt: skip
    return LlmConfig(
        arch=spec,
        num_layers=layers,
        hidden=d,
        ffn=ffn,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=int(emb.shape[0]),
        eps=eps,
        rope_base=rope_base,
        rope_dims=rope_dims,
        rope_scale=factor,
        sliding_window=window,
        context_length=context,
        attn_scale=attn_scale,
        logit_softcap=softcap,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        attn_bias="blk.0.attn_q.bias" in tensors,
        tied_embeddings="output.weight" not in tensors,
        rope_inv_freq=inv_freq,
        attn_softcap=attn_softcap,
    )


def _rope_freqs(t: Any, base: float, dims: int) -> tuple[float, ...] | None:
    """The inverse frequencies ``base^(-2i/dims) / f[i]`` of llama.cpp's ``rope_freqs``
    tensor ``f`` (Llama 3 rope scaling's per-frequency divisors; None when absent);
    ModelError when it does not hold ``dims / 2`` finite values > 0."""
    if t is None:
        return None
    f = np.asarray(t.dequantize(), np.float64).reshape(-1)
    if f.size != dims // 2 or not np.all(np.isfinite(f) & (f > 0)):
        raise ModelError(
            f"GGUF tensor 'rope_freqs.weight' must hold {dims // 2} finite values > 0 "
            f"(one divisor per rope frequency), got {f.size} values"
        )
    inv = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims) / f
    return tuple(float(v) for v in inv)
