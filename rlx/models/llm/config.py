"""Decoder configs from GGUF metadata. In: a GGUF file's metadata and tensor names. Out:
:class:`LlmConfig` (sizes, norms, rope, attention pattern) built from the architecture's
:class:`ArchSpec`: what differs between architectures is data in :data:`ARCHS`, not code.

Conventions follow llama.cpp, which wrote the file: the ``{arch}.*`` keys give the sizes;
what llama.cpp hard-codes per architecture (Gemma 3's sliding-window pattern of 6 and its
local rope base 10000; the rope layout) is in the spec. GGUF norm weights are used as
stored (llama.cpp's converter already added Gemma's ``1 +``). Llama-family files store
q / k permuted for llama.cpp's adjacent-pair rope, so their rope is ``interleaved``; Gemma
and Qwen use NeoX's rotate-half.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlx.errors import ModelError

__all__ = ["ArchSpec", "ARCHS", "LlmConfig", "read_config"]


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
    "llama": ArchSpec("llama", "silu", False, False, True),
    "qwen2": ArchSpec("qwen2", "silu", False, False, False),
    "qwen3": ArchSpec("qwen3", "silu", False, False, False),
}


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

    def is_sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends within the sliding window."""
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


def _get(meta: Mapping[str, Any], key: str, kind: type, default: Any = None) -> Any:
    v = meta.get(key, default)
    if v is None:
        raise ModelError(f"GGUF metadata key {key!r} is missing (needed for the model's sizes)")
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ModelError(f"GGUF metadata {key!r} must be an integer, got {v!r}")
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise ModelError(f"GGUF metadata {key!r} must be a number, got {v!r}")
    return kind(v)


def read_config(
    arch_name: str | None, meta: Mapping[str, Any], tensors: Mapping[str, Any]
) -> LlmConfig:
    """The :class:`LlmConfig` of a GGUF file with ``general.architecture`` ``arch_name``;
    ModelError naming an unknown architecture or a missing / bad metadata key."""
    spec = ARCHS.get(arch_name or "")
    if spec is None:
        raise ModelError(
            f"GGUF architecture {arch_name!r} is not supported by rlx.models.llm; "
            f"supported: {', '.join(sorted(ARCHS))}"
        )
    a = spec.name
    d = _get(meta, f"{a}.embedding_length", int)
    heads = _get(meta, f"{a}.attention.head_count", int)
    head_dim = _get(meta, f"{a}.attention.key_length", int, d // max(heads, 1))
    layers = _get(meta, f"{a}.block_count", int)
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise ModelError("GGUF tensor 'token_embd.weight' is missing (the token embedding)")
    scaling = meta.get(f"{a}.rope.scaling.type")
    factor = float(meta.get(f"{a}.rope.scaling.factor", 1.0) or 1.0)
    if scaling not in (None, "none", "linear"):
        raise ModelError(f"GGUF rope scaling {scaling!r} is not supported (only linear)")
    if a == "gemma3":  # llama.cpp: 27B scales queries by (d / heads)^-1/2, others head_dim
        attn_scale = 1.0 / math.sqrt(d / heads if layers == 62 else head_dim)
    else:
        attn_scale = 1.0 / math.sqrt(head_dim)
    softcap = meta.get(f"{a}.final_logit_softcapping")
    return LlmConfig(
        arch=spec,
        num_layers=layers,
        hidden=d,
        ffn=_get(meta, f"{a}.feed_forward_length", int),
        num_heads=heads,
        num_kv_heads=_get(meta, f"{a}.attention.head_count_kv", int, heads),
        head_dim=head_dim,
        vocab=int(emb.shape[0]),
        eps=_get(meta, f"{a}.attention.layer_norm_rms_epsilon", float),
        rope_base=_get(meta, f"{a}.rope.freq_base", float, 10000.0),
        rope_dims=_get(meta, f"{a}.rope.dimension_count", int, head_dim),
        rope_scale=factor if scaling == "linear" else 1.0,
        sliding_window=_get(meta, f"{a}.attention.sliding_window", int, 0),
        context_length=_get(meta, f"{a}.context_length", int, 2048),
        attn_scale=attn_scale,
        logit_softcap=float(softcap) if softcap else None,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        attn_bias="blk.0.attn_q.bias" in tensors,
        tied_embeddings="output.weight" not in tensors,
    )
