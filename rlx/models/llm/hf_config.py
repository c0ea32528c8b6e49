"""Hugging Face decoder configs. In: a transformers ``config.json`` (as a dict) and the
checkpoint's tensors by GGUF name. Out: the :class:`~rlx.models.llm.config.LlmConfig` the
decoder graph is built from (:func:`read_hf_config`), the families as data: which
transformers class is built on which rlx architecture (:data:`HF_ARCHITECTURES`), rope
parameters and scaling (default, linear, llama3), per-layer sliding windows, and the
mixture of experts of Mixtral / Qwen2-MoE / Qwen3-MoE (:class:`MoeSpec`). Every
unsupported architecture or value is a ModelError naming the key, the file and what is
supported.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import ModelError
from rlx.models.llm.config import ARCHS, LlmConfig, MoeSpec

__all__ = ["HF_ARCHITECTURES", "llama3_inv_freq", "read_hf_config"]

#: transformers ``architectures[0]`` -> the rlx architecture it is built as.
HF_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma2ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "Qwen2MoeForCausalLM": "qwen2",
    "Qwen3MoeForCausalLM": "qwen3",
}
#: families built on another's spec under their own name (the graph is the same; what
#: differs is in the config: Gemma 2's alternating windows, Phi-3's fused projections)
_RENAMED = {
    "Gemma2ForCausalLM": "gemma2",
    "Phi3ForCausalLM": "phi3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Qwen3MoeForCausalLM": "qwen3moe",
}
_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _hf_arch(hf: Mapping[str, Any], where: Path) -> str:
    """The supported transformers class named by ``architectures`` (ModelError if none)."""
    names = hf.get("architectures") or []
    for n in names if isinstance(names, list) else []:
        if n in HF_ARCHITECTURES:
            return str(n)
    raise ModelError(
        f"{where}: architecture {names or hf.get('model_type')!r} is not supported by "
        f"rlx.models.llm; supported: {', '.join(HF_ARCHITECTURES)}"
    )


def _arch(hf: Mapping[str, Any], where: Path) -> str:
    """The rlx architecture (the :data:`ARCHS` spec) of ``hf``."""
    return HF_ARCHITECTURES[_hf_arch(hf, where)]


class _Fields:
    """Typed reads of config.json values: ModelError naming the key and the file."""

    def __init__(self, hf: Mapping[str, Any], where: Path):
        self.hf, self.where = hf, where

    def num(self, key: str, kind: type, default: Any = None, positive: bool = True) -> Any:
        v = self.hf.get(key)
        v = default if v is None else v
        if v is None:
            raise ModelError(f"{self.where}: {key!r} is missing (needed for the model's sizes)")
        ok = not isinstance(v, bool) and isinstance(v, int if kind is int else (int, float))
        if not ok or (positive and not (v > 0 and math.isfinite(v))):
            what = "an integer" if kind is int else "a finite number"
            raise ModelError(
                f"{self.where}: {key!r} must be {what}{' > 0' if positive else ''}, got {v!r}"
            )
        return kind(v)


# base, linear factor, and the other scalings as (type, parameters) or None
_Rope = tuple[float, float, tuple[str, tuple[Any, ...]] | None]


def _number(params: Mapping[str, Any], key: str, where: str, default: Any = None) -> float:
    v = params.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ModelError(f"{where}: {key} must be a number > 0, got {v!r}")
    return float(v)


def _rope(params: Any, where: str, top: Mapping[str, Any] | None = None) -> _Rope:
    """``(base, linear factor, (type, parameters) or None)`` of one rope parameter dict
    (``top``: config.json, for ``original_max_position_embeddings`` given there);
    ModelError for a type rlx does not build."""
    if not isinstance(params, Mapping):
        raise ModelError(f"{where}: expected a rope parameter object, got {params!r:.60}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "su":  # Phi-3's first name for longrope
        kind = "longrope"
    if kind not in _ROPE_TYPES:
        raise ModelError(
            f"{where}: rope type {kind!r} is not supported by rlx.models.llm; supported: "
            f"{', '.join(_ROPE_TYPES)}"
        )
    top = top or {}
    base = _number(params, "rope_theta", where, 10000.0)
    orig_default = top.get("original_max_position_embeddings")
    if kind == "default":
        return base, 1.0, None
    if kind == "linear":
        return base, _number(params, "factor", where), None
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        values = tuple(_number(params, k, where) for k in keys)
        if not values[1] < values[2]:
            raise ModelError(
                f"{where}: low_freq_factor must be < high_freq_factor, got {values[1:3]}"
            )
        return base, 1.0, ("llama3", values)
    orig = _number(params, "original_max_position_embeddings", where, orig_default)
    if kind == "dynamic":
        return base, 1.0, ("dynamic", (_number(params, "factor", where), orig))
    if kind == "yarn":
        factor = params.get("factor")
        factor = _number(params, "factor", where) if factor is not None else None
        extra = tuple(params.get(k) for k in ("attention_factor", "mscale", "mscale_all_dim"))
        beta = (params.get("beta_fast") or 32, params.get("beta_slow") or 1)
        return base, 1.0, ("yarn", (factor, *extra, *beta, orig, params.get("truncate", True)))
    short, long = params.get("short_factor"), params.get("long_factor")
    for key, v in (("short_factor", short), ("long_factor", long)):
        if not isinstance(v, list) or not all(isinstance(x, (int, float)) for x in v):
            raise ModelError(f"{where}: {key} must be a list of numbers, got {v!r:.60}")
    extra = (params.get("factor"), params.get("attention_factor"))
    return base, 1.0, ("longrope", (tuple(short), tuple(long), *extra, orig))  # type: ignore[arg-type]


def _scaled(
    rope: _Rope, rot: int, max_pos: int, where: Path
) -> tuple[tuple[float, ...] | None, float, int]:
    """``(inverse frequencies or None, cos / sin gain, context cap)`` of a rope's
    scaling, in f32 as transformers computes them. ``dynamic`` and ``longrope`` change
    the frequencies once a sequence outgrows ``original_max_position_embeddings``
    (transformers recomputes them per call); rlx uses fixed tables, so those contexts
    are capped there, where they equal the default (dynamic) or the short factors
    (longrope)."""
    base, _, scaled = rope
    if scaled is None:
        return None, 1.0, max_pos
    kind, p = scaled
    exps = np.arange(0, rot, 2, dtype=np.int64).astype(np.float32) / np.float32(rot)
    pos = (np.float32(base) ** exps).astype(np.float32)
    if kind == "llama3":
        return llama3_inv_freq(base, rot, p), 1.0, max_pos
    if kind == "dynamic":
        return None, 1.0, min(max_pos, int(p[1]))
    if kind == "longrope":
        short, long, factor, gain, orig = p
        if len(short) != rot // 2:
            raise ModelError(
                f"{where}: longrope short_factor has {len(short)} entries, the rope has "
                f"{rot // 2} frequencies"
            )
        factor = factor or max_pos / orig
        if gain is None:
            gain = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
        inv = (np.float32(1.0) / (np.asarray(short, np.float32) * pos)).astype(np.float32)
        return tuple(float(v) for v in inv), float(gain), min(max_pos, int(orig))
    factor, gain, mscale, mscale_all, fast, slow, orig, truncate = p
    factor = factor or max_pos / orig

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if gain is None:
        gain = (
            get_mscale(factor, mscale) / get_mscale(factor, mscale_all)
            if mscale and mscale_all
            else get_mscale(factor)
        )

    def corr(n: float) -> float:
        return (rot * math.log(orig / (n * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr(fast), corr(slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(rot // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extra = (np.float32(1) - ramp.astype(np.float32)).astype(np.float32)
    inv_ext = (np.float32(1.0) / pos).astype(np.float32)
    inv_int = (np.float32(1.0) / (np.float32(factor) * pos)).astype(np.float32)
    inv = (inv_int * (np.float32(1) - extra) + inv_ext * extra).astype(np.float32)
    return tuple(float(v) for v in inv), float(gain), max_pos


def llama3_inv_freq(base: float, rot: int, params: tuple[float, ...]) -> tuple[float, ...]:
    """Llama 3's rope inverse frequencies (``factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings``), in f32 as transformers computes them: long
    wavelengths divided by ``factor``, short ones kept, the middle band interpolated."""
    factor, low, high, old = params
    inv = (1.0 / (base ** (np.arange(0, rot, 2, dtype=np.int64).astype(np.float32) / rot))).astype(
        np.float32
    )
    wavelen = np.float32(2 * math.pi) / inv
    scaled = np.where(wavelen > old / low, inv / np.float32(factor), inv).astype(np.float32)
    smooth = ((np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)).astype(
        np.float32
    )
    smoothed = (np.float32(1) - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    out = np.where(medium, smoothed, scaled).astype(np.float32)
    return tuple(float(v) for v in out)


def _ropes(hf: Mapping[str, Any], where: Path) -> dict[str, _Rope]:
    """Rope ``(base, factor)`` per layer type (``full_attention`` / ``sliding_attention``)
    from transformers 5's ``rope_parameters`` or the older ``rope_theta`` /
    ``rope_scaling`` / ``rope_local_base_freq``."""
    rp = hf.get("rope_parameters")
    if isinstance(rp, Mapping) and rp and all(isinstance(v, Mapping) for v in rp.values()):
        out = {k: _rope(v, f"{where}: rope_parameters.{k}", hf) for k, v in rp.items()}
        out.setdefault("sliding_attention", out.get("full_attention", (10000.0, 1.0, None)))
        out.setdefault("full_attention", out["sliding_attention"])
        return out
    if isinstance(rp, Mapping) and rp:
        full = _rope(rp, f"{where}: rope_parameters", hf)
    else:
        params = dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
        full = _rope(params, f"{where}: rope_scaling", hf)
    local = hf.get("rope_local_base_freq")
    sliding = _rope({"rope_theta": local}, f"{where}: rope_local_base_freq") if local else full
    return {"full_attention": full, "sliding_attention": sliding}


def _sliding(hf: Mapping[str, Any], arch: str, layers: int, where: Path) -> tuple[bool, ...]:
    """Which layers attend within the sliding window (``arch``: the transformers class)."""
    types = hf.get("layer_types")
    if types is not None:
        allowed = ("full_attention", "sliding_attention")
        if not isinstance(types, list) or len(types) != layers or set(types) - set(allowed):
            raise ModelError(
                f"{where}: layer_types must list {layers} entries of {allowed}, got {types!r:.80}"
            )
        return tuple(t == "sliding_attention" for t in types)
    if arch == "Gemma2ForCausalLM":  # transformers 4: the even layers
        return tuple(i % 2 == 0 for i in range(layers))
    if arch == "Gemma3ForCausalLM":
        p = int(hf.get("sliding_window_pattern") or 6)
        return tuple((i + 1) % p != 0 for i in range(layers))
    if arch.startswith("Qwen"):
        if not hf.get("use_sliding_window"):
            return (False,) * layers
        first = int(hf.get("max_window_layers") or 0)
        return tuple(i >= first for i in range(layers))
    return (True,) * layers  # Mistral: the window (when set) on every layer


def read_hf_config(hf: Mapping[str, Any], tensors: Mapping[str, Any], where: Path) -> LlmConfig:
    """The :class:`LlmConfig` of a transformers ``config.json`` (``hf``) over the mapped
    ``tensors``; ModelError naming an unsupported architecture or a missing / bad value."""
    hf_arch = _hf_arch(hf, where)
    arch = HF_ARCHITECTURES[hf_arch]
    f = _Fields(hf, where)
    d = f.num("hidden_size", int)
    heads = f.num("num_attention_heads", int)
    kv_heads = f.num("num_key_value_heads", int, heads)
    if heads % kv_heads:
        raise ModelError(
            f"{where}: num_key_value_heads = {kv_heads} must divide num_attention_heads = {heads}"
        )
    head_dim = f.num("head_dim", int, d // heads)
    layers = f.num("num_hidden_layers", int)
    if hf.get("mlp_bias"):
        raise ModelError(
            f"{where}: mlp_bias = {hf['mlp_bias']!r} is not supported by rlx.models.llm"
        )
    if "blk.0.attn_output.bias" in tensors:
        raise ModelError(f"{where}: an o_proj bias is not supported by rlx.models.llm")
    act = hf.get("hidden_activation", hf.get("hidden_act"))
    want_act = {"llama": ("silu",), "qwen2": ("silu",), "qwen3": ("silu",)}.get(
        arch, ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
    )
    if act not in want_act:
        raise ModelError(
            f"{where}: activation {act!r} is not supported for {arch}; supported: {want_act}"
        )
    ropes = _ropes(hf, where)
    rp = hf.get("rope_parameters")
    partial = hf.get("partial_rotary_factor") or (
        rp.get("partial_rotary_factor") if isinstance(rp, Mapping) else None
    )
    rope_dims = int(head_dim * float(partial or 1.0))
    if rope_dims % 2 or not 0 < rope_dims <= head_dim:
        raise ModelError(f"{where}: rope dims {rope_dims} must be even and in (0, {head_dim}]")
    sliding = _sliding(hf, hf_arch, layers, where)
    window = int(hf.get("sliding_window") or 0)
    local, full = ropes["sliding_attention"], ropes["full_attention"]
    max_pos = f.num("max_position_embeddings", int, 2048)
    inv_freq, gain, context = _scaled(full, rope_dims, max_pos, where)
    if local != full and (local[1] != 1.0 or local[2] is not None):
        raise ModelError(
            f"{where}: rope scaling of the sliding-window layers only is not supported"
        )
    spec = dataclasses.replace(
        ARCHS[arch],
        name=_RENAMED.get(hf_arch, arch),
        rope_interleaved=False,
        swa_pattern=0,
        rope_base_local=local[0] if local != ropes["full_attention"] else None,
    )
    scalar = f.num("query_pre_attn_scalar", float, head_dim) if arch == "gemma3" else head_dim
    softcap = hf.get("final_logit_softcapping") or None
    if softcap is not None:
        softcap = f.num("final_logit_softcapping", float)
    # Gemma 2 (and any config that sets it): scores become c * tanh(s / c); null or 0: off
    attn_softcap = None
    if hf.get("attn_logit_softcapping") is not None and hf["attn_logit_softcapping"] != 0:
        attn_softcap = f.num("attn_logit_softcapping", float)
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise ModelError(f"{where}: tensor 'model.embed_tokens.weight' is missing")
    tied = bool(hf.get("tie_word_embeddings", arch == "gemma3"))
    return LlmConfig(
        arch=spec,
        num_layers=layers,
        hidden=d,
        ffn=f.num("intermediate_size", int),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=int(emb.shape[0]),
        eps=f.num("rms_norm_eps", float, 1e-6),
        rope_base=ropes["full_attention"][0],
        rope_dims=rope_dims,
        rope_scale=ropes["full_attention"][1],
        sliding_window=window,
        context_length=context,
        attn_scale=1.0 / math.sqrt(scalar),
        logit_softcap=softcap,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        attn_bias="blk.0.attn_q.bias" in tensors,
        tied_embeddings=tied or "output.weight" not in tensors,
        sliding_layers=sliding if window else None,
        rope_inv_freq=inv_freq,
        rope_gain=gain,
        moe=_moe(hf, hf_arch, layers, f),
        attn_softcap=attn_softcap,
    )


def _moe(hf: Mapping[str, Any], arch: str, layers: int, f: _Fields) -> MoeSpec | None:
    """The mixture of a Mixtral / Qwen2-MoE / Qwen3-MoE config (None for the others)."""
    if arch == "MixtralForCausalLM":
        experts = f.num("num_local_experts", int, hf.get("num_experts"))
        return MoeSpec(
            experts, f.num("num_experts_per_tok", int), f.num("intermediate_size", int), True
        )
    if arch not in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
        return None
    step = f.num("decoder_sparse_step", int, 1)
    dense = hf.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) for i in dense):
        raise ModelError(
            f"{f.where}: mlp_only_layers must be a list of layer numbers, got {dense!r:.60}"
        )
    which = tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))
    shared = 0
    if arch == "Qwen2MoeForCausalLM":
        shared = f.num("shared_expert_intermediate_size", int, 0, positive=False)
    return MoeSpec(
        f.num("num_experts", int, hf.get("num_local_experts")),
        f.num("num_experts_per_tok", int),
        f.num("moe_intermediate_size", int),
        bool(hf.get("norm_topk_prob", False)),
        shared,
        None if all(which) else which,
    )
