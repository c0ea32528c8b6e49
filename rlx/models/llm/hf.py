"""Hugging Face decoder checkpoints. In: a directory with ``config.json`` and
``model.safetensors`` (or the shards ``model.safetensors.index.json`` lists). Out:
:class:`HfCheckpoint`: the :class:`LlmConfig` read from ``config.json`` and the tensors
under the GGUF names :func:`rlx.models.llm.graph.build_decoder` reads, so one decoder
graph serves both formats.

What differs from a GGUF file, as data: the name map (``_NAMES``: transformers' module
names -> llama.cpp's), q / k rows in transformers' order (rotate-half rope, so every
family's spec gets ``rope_interleaved=False``: no row permutation), Gemma's norm weights
stored as ``w`` where the model scales by ``1 + w`` (the ``1 +`` is added here, as
llama.cpp's converter does), and per-layer sliding windows from ``layer_types`` (or
Mistral's window on every layer, Qwen's ``max_window_layers``). Tensors are
memory-mapped: every weight is a read-only view of the file, and bf16 / f16 weights
stay packed in the graph too (the decoder's params are those views; their products
widen a panel of rows at a time, :mod:`rlx.models.llm.lowp`), so loading a bf16
checkpoint grows the process by about its file size.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import ModelError
from rlx.models.llm.config import ARCHS, LlmConfig, MoeSpec

__all__ = [
    "HF_ARCHITECTURES",
    "HfCheckpoint",
    "HfTensor",
    "llama3_inv_freq",
    "open_checkpoint",
    "read_hf_config",
]

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
_ROPE_TYPES = ("default", "linear", "llama3")

# per-layer module names (after ``model.layers.{i}.``) -> GGUF names (after ``blk.{i}.``)
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LAYER_PLAIN = {"post_attention_layernorm.weight": "ffn_norm.weight"}
# Phi-3's fused projections (rows [q; k; v] and [gate; up]), split by _split_fused
_FUSED = {
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_gate_up.weight",
}
_LAYER_GEMMA = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
# mixture-of-experts FFNs: the router, expert j's projections (``{j}``) and Qwen2-MoE's
# shared expert with its sigmoid gate
_MOE = {
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.experts.{j}.w1.weight": "ffn_gate.{j}.weight",
    "block_sparse_moe.experts.{j}.w3.weight": "ffn_up.{j}.weight",
    "block_sparse_moe.experts.{j}.w2.weight": "ffn_down.{j}.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.{j}.gate_proj.weight": "ffn_gate.{j}.weight",
    "mlp.experts.{j}.up_proj.weight": "ffn_up.{j}.weight",
    "mlp.experts.{j}.down_proj.weight": "ffn_down.{j}.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_FLOATS = {"F32": "<f4", "F16": "<f2", "BF16": None}


@dataclass(frozen=True, eq=False)
class HfTensor:
    """One checkpoint tensor as the decoder builder reads it (the GGUF tensor interface):
    ``data`` is a read-only view of the file (or, for Gemma's norms, the f32 ``1 + w``),
    ``type_name`` its dtype ("F32", "F16", "BF16"); never block-quantized (``scheme``
    None)."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    data: np.ndarray = field(repr=False)
    scheme: None = None
    file: Path | None = None  # the safetensors file and the data's byte offset in it
    offset: int = 0

    def dequantize(self) -> np.ndarray:
        """The values as a new f32 array."""
        return np.asarray(self.data, dtype=np.float32).reshape(self.shape).copy()

    def packed(self) -> tuple[np.ndarray, ...]:
        """Not block-quantized: ModelError (use ``data`` or :meth:`dequantize`)."""
        raise ModelError(f"tensor {self.name!r} is {self.type_name}: it has no packed form")


@dataclass
class HfCheckpoint:
    """A Hugging Face decoder directory: ``config``, ``tensors`` by GGUF name,
    ``hf_config`` (config.json) and ``metadata`` (the chat template, when the tokenizer
    config has one, under GGUF's key ``tokenizer.chat_template``)."""

    path: Path
    config: LlmConfig
    tensors: dict[str, HfTensor]
    hf_config: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)


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


_Rope = tuple[float, float, tuple[float, ...] | None]  # base, linear factor, llama3 params


def _rope(params: Any, where: str) -> _Rope:
    """``(base, linear factor, llama3 parameters or None)`` of one rope parameter dict;
    ModelError for another type."""
    if not isinstance(params, Mapping):
        raise ModelError(f"{where}: expected a rope parameter object, got {params!r:.60}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _ROPE_TYPES:
        raise ModelError(
            f"{where}: rope type {kind!r} is not supported by rlx.models.llm; supported: "
            f"{', '.join(_ROPE_TYPES)}"
        )
    base = params.get("rope_theta", 10000.0)
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    need = {"default": (), "linear": keys[:1], "llama3": keys}[kind]
    values: list[float] = []
    for key in ("rope_theta", *need):
        v = params.get(key, base if key == "rope_theta" else None)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ModelError(f"{where}: {key} must be a number > 0, got {v!r}")
        values.append(float(v))
    base, values = values[0], values[1:]
    if kind == "llama3" and not values[1] < values[2]:
        raise ModelError(f"{where}: low_freq_factor must be < high_freq_factor, got {values}")
    factor = float(values[0]) if kind == "linear" else 1.0
    return float(base), factor, tuple(float(v) for v in values) if kind == "llama3" else None


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
        out = {k: _rope(v, f"{where}: rope_parameters.{k}") for k, v in rp.items()}
        out.setdefault("sliding_attention", out.get("full_attention", (10000.0, 1.0, None)))
        out.setdefault("full_attention", out["sliding_attention"])
        return out
    if isinstance(rp, Mapping) and rp:
        full = _rope(rp, f"{where}: rope_parameters")
    else:
        params = dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
        full = _rope(params, f"{where}: rope_scaling")
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
    if hf.get("attn_logit_softcapping"):
        raise ModelError(
            f"{where}: attn_logit_softcapping = {hf['attn_logit_softcapping']!r} is not "
            f"supported by rlx.models.llm (rlx's cache attention has no soft-capping of the "
            f"attention logits; supported: null)"
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
        context_length=f.num("max_position_embeddings", int, 2048),
        attn_scale=1.0 / math.sqrt(scalar),
        logit_softcap=softcap,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        attn_bias="blk.0.attn_q.bias" in tensors,
        tied_embeddings=tied or "output.weight" not in tensors,
        sliding_layers=sliding if window else None,
        rope_inv_freq=None if full[2] is None else llama3_inv_freq(full[0], rope_dims, full[2]),
        moe=_moe(hf, hf_arch, layers, f),
    )


# ---- safetensors -------------------------------------------------------------------


def _shards(folder: Path) -> dict[Path, set[str] | None]:
    """Each file -> the tensor names the index puts in it (None: a single file)."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return {single: None}
    if not index.is_file():
        raise ModelError(
            f"{folder}: no model.safetensors or model.safetensors.index.json (rlx reads "
            f"Hugging Face decoders from safetensors files)"
        )
    wm = _read_json(index).get("weight_map")
    if not isinstance(wm, dict) or not wm:
        raise ModelError(f"{index}: no weight_map")
    files: dict[Path, set[str] | None] = {}
    for name, file in wm.items():
        s = files.setdefault(folder / str(file), set())
        assert s is not None
        s.add(name)
    missing = sorted(p.name for p in files if not p.is_file())
    if missing:
        raise ModelError(f"{index} lists shards that do not exist: {', '.join(missing)}")
    return files


def _header(path: Path) -> tuple[dict[str, Any], int]:
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            head = json.loads(fh.read(n))
        size = path.stat().st_size
    except (OSError, struct.error, ValueError) as e:
        raise ModelError(f"{path}: not a valid safetensors file ({e})") from None
    if not isinstance(head, dict):
        raise ModelError(f"{path}: not a valid safetensors header")
    head.pop("__metadata__", None)
    for name, entry in head.items():
        lo, hi = entry.get("data_offsets", (0, -1))
        if not 0 <= lo <= hi <= size - 8 - n:
            raise ModelError(f"{path}: tensor {name!r} lies outside the file (truncated?)")
    return head, 8 + n


def _gguf_name(name: str, gemma: bool) -> str | None:
    if name in _TOP:
        return _TOP[name]
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        rest = parts[3]
        table = {**_LAYER, **_FUSED, **(_LAYER_GEMMA if gemma else _LAYER_PLAIN)}
        if rest in table:
            return f"blk.{parts[2]}.{table[rest]}"
        bits = rest.split(".")
        j = next((b for b in bits if b.isdigit()), None)
        pattern = rest if j is None else ".".join("{j}" if b == j else b for b in bits)
        if pattern in _MOE:
            return f"blk.{parts[2]}." + _MOE[pattern].replace("{j}", j or "")
    return None


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


def _tensor(mm: np.ndarray, start: int, e: Mapping[str, Any], name: str, path: Path) -> HfTensor:
    code = e.get("dtype")
    if code not in _FLOATS:
        raise ModelError(
            f"{path}: tensor {name!r} has dtype {code}; supported: {', '.join(_FLOATS)}"
        )
    if code == "BF16":
        import ml_dtypes

        dt = np.dtype(ml_dtypes.bfloat16)
    else:
        dt = np.dtype(_FLOATS[code])
    shape = tuple(int(s) for s in e.get("shape", ()))
    lo, hi = e["data_offsets"]
    if hi - lo != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
        raise ModelError(f"{path}: tensor {name!r} size disagrees with its shape {list(shape)}")
    arr = np.ndarray(shape, dtype=dt, buffer=mm[start + lo : start + hi])
    return HfTensor(name, str(code), shape, arr, file=path, offset=start + lo)


def _rows(t: HfTensor, start: int, stop: int, name: str) -> HfTensor:
    """Rows ``start:stop`` of the 2-D ``t`` as a tensor of its own (a view, same file)."""
    k = t.shape[1]
    off = t.offset + start * k * t.data.dtype.itemsize
    return HfTensor(
        name, t.type_name, (stop - start, k), t.data[start:stop], file=t.file, offset=off
    )


def _split_fused(path: Path, cfg: LlmConfig, tensors: dict[str, HfTensor]) -> None:
    """Phi-3's ``qkv_proj`` -> q, k, v and ``gate_up_proj`` -> gate, up (row views), in
    place; ModelError naming a fused tensor whose rows disagree with config.json."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    parts = {
        "attn_qkv.weight": (("attn_q.weight", q), ("attn_k.weight", kv), ("attn_v.weight", kv)),
        "ffn_gate_up.weight": (("ffn_gate.weight", cfg.ffn), ("ffn_up.weight", cfg.ffn)),
    }
    for key in [k for k in tensors if k.split(".", 2)[-1] in parts]:
        t = tensors.pop(key)
        prefix, fused = key.rsplit(".", 2)[0], key.split(".", 2)[-1]
        want = sum(n for _, n in parts[fused])
        if len(t.shape) != 2 or t.shape[0] != want:
            raise ModelError(
                f"{path}: tensor {t.name!r} has shape {list(t.shape)}, config.json implies "
                f"[{want}, {cfg.hidden}] (the fused rows {[n for n, _ in parts[fused]]})"
            )
        start = 0
        for sub, n in parts[fused]:
            tensors[f"{prefix}.{sub}"] = _rows(t, start, start + n, t.name)
            start += n


def _check_complete(
    path: Path, cfg: LlmConfig, tensors: Mapping[str, HfTensor], gemma: bool
) -> None:
    """ModelError naming (by its checkpoint name) the first tensor the decoder needs that
    no file holds, and how many are missing."""
    per_layer = {**_LAYER, **(_LAYER_GEMMA if gemma else _LAYER_PLAIN)}
    optional = {"bias", "q_norm", "k_norm"}
    moe = cfg.moe
    wanted = {v: k for k, v in _TOP.items() if k != "lm_head.weight" or not cfg.tied_embeddings}
    for i in range(cfg.num_layers):
        sparse = moe is not None and moe.is_moe(i)
        for hf_name, gguf_name in per_layer.items():
            if any(o in hf_name for o in optional) or (sparse and hf_name.startswith("mlp.")):
                continue
            wanted[f"blk.{i}.{gguf_name}"] = f"model.layers.{i}.{hf_name}"
        if sparse:
            assert moe is not None
            names = {"ffn_gate_inp.weight": "router"}
            names |= {
                f"ffn_{p}.{j}.weight": f"expert {j}'s {p}"
                for j in range(moe.experts)
                for p in ("gate", "up", "down")
            }
            if moe.shared_ffn:
                names |= {
                    f"ffn_{p}_shexp.weight": f"the shared expert's {p}"
                    for p in ("gate", "up", "down")
                }
                names["ffn_gate_inp_shexp.weight"] = "the shared expert's gate"
            for key, what in names.items():
                wanted[f"blk.{i}.{key}"] = f"layer {i}'s {what}"
    missing = [hf_name for gguf_name, hf_name in wanted.items() if gguf_name not in tensors]
    if missing:
        raise ModelError(
            f"{path}: the checkpoint has no tensor {missing[0]!r} ({len(missing)} missing "
            f"in all; config.json says {cfg.num_layers} layers)"
        )
    d, q, kv, hd = (
        cfg.hidden,
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.head_dim,
    )
    shapes = {
        "token_embd.weight": (cfg.vocab, d),
        "output.weight": (cfg.vocab, d),
        "attn_q.weight": (q, d),
        "attn_k.weight": (kv, d),
        "attn_v.weight": (kv, d),
        "attn_q.bias": (q,),
        "attn_k.bias": (kv,),
        "attn_v.bias": (kv,),
        "attn_output.weight": (d, q),
        "attn_q_norm.weight": (hd,),
        "attn_k_norm.weight": (hd,),
        "ffn_gate.weight": (cfg.ffn, d),
        "ffn_up.weight": (cfg.ffn, d),
        "ffn_down.weight": (d, cfg.ffn),
    }
    if moe is not None:
        e, s = moe.ffn, moe.shared_ffn
        shapes |= {
            "ffn_gate_inp.weight": (moe.experts, d),
            "ffn_gate.j.weight": (e, d),
            "ffn_up.j.weight": (e, d),
            "ffn_down.j.weight": (d, e),
            "ffn_gate_shexp.weight": (s, d),
            "ffn_up_shexp.weight": (s, d),
            "ffn_down_shexp.weight": (d, s),
            "ffn_gate_inp_shexp.weight": (1, d),
        }
    for key, t in tensors.items():
        parts = key.split(".")
        if parts[0] == "blk" and int(parts[1]) >= cfg.num_layers:
            raise ModelError(
                f"{path}: tensor {t.name!r} is beyond the {cfg.num_layers} layers config.json gives"
            )
        if parts[0] == "blk" and len(parts) == 5:  # an expert's: blk.i.ffn_x.j.weight
            j = int(parts[3])
            if moe is None or not moe.is_moe(int(parts[1])) or j >= moe.experts:
                raise ModelError(
                    f"{path}: tensor {t.name!r} is an expert config.json does not have "
                    f"({0 if moe is None else moe.experts} experts)"
                )
            parts[3] = "j"
        want = shapes.get(key if parts[0] != "blk" else ".".join(parts[2:]), (d,))
        if t.shape != want:
            raise ModelError(
                f"{path}: tensor {t.name!r} has shape {list(t.shape)}, config.json implies "
                f"{list(want)}"
            )


def open_checkpoint(folder: str | Path) -> HfCheckpoint:
    """Read the Hugging Face decoder directory ``folder`` (module docstring). ModelError
    for a missing config.json or shard, a shard whose tensors disagree with the index, an
    unknown tensor, or an unsupported architecture / config value."""
    path = Path(folder)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelError(f"{path}: no config.json (a Hugging Face model directory needs one)")
    hf = _read_json(cfg_file)
    gemma = _arch(hf, cfg_file) == "gemma3"
    tensors: dict[str, HfTensor] = {}
    for file, listed in _shards(path).items():
        head, start = _header(file)
        if listed is not None and set(head) != listed:
            extra, gone = sorted(set(head) - listed), sorted(listed - set(head))
            raise ModelError(
                f"{file}: its tensors disagree with model.safetensors.index.json "
                f"(in the file, not the index: {extra[:5]}; in the index, not the file: "
                f"{gone[:5]})"
            )
        mm = np.memmap(file, dtype=np.uint8, mode="r")
        for name, e in head.items():
            key = _gguf_name(name, gemma)
            if key is None:
                if name.endswith(_IGNORED_SUFFIXES):
                    continue
                raise ModelError(f"{file}: tensor {name!r} is not one rlx.models.llm knows")
            t = _tensor(mm, start, e, name, file)
            if gemma and key.endswith("norm.weight"):  # Gemma scales by 1 + w
                data = (t.data.astype(np.float32) + np.float32(1.0)).astype(np.float32)
                t = HfTensor(name, "F32", t.shape, data)
            tensors[key] = t
    config = read_hf_config(hf, tensors, cfg_file)
    _split_fused(path, config, tensors)
    _check_complete(path, config, tensors, gemma)
    if config.tied_embeddings:
        tensors.pop("output.weight", None)
    meta: dict[str, Any] = {}
    tc = path / "tokenizer_config.json"
    template = _read_json(tc).get("chat_template") if tc.is_file() else None
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    if isinstance(template, str):
        meta["tokenizer.chat_template"] = template
    return HfCheckpoint(path, config, tensors, hf, meta)
