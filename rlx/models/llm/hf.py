"""Hugging Face decoder checkpoints. In: a directory with ``config.json`` and
``model.safetensors`` (or the shards ``model.safetensors.index.json`` lists). Out:
:class:`HfCheckpoint`: the :class:`LlmConfig` read from ``config.json`` and the tensors
under the GGUF names :func:`rlx.models.llm.graph.build_decoder` reads, so one decoder
graph serves both formats (the config itself: :mod:`rlx.models.llm.hf_config`).

What differs from a GGUF file, as data: the name maps (``_LAYER``, ``_MOE``, ``_TOP``:
transformers' module names -> llama.cpp's; Phi-3's fused projections split into row
views), q / k rows in transformers' order (rotate-half rope, so every
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

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import ModelError
from rlx.models.llm.config import LlmConfig
from rlx.models.llm.hf_config import (
    HF_ARCHITECTURES,
    _arch,
    _read_json,
    llama3_inv_freq,
    read_hf_config,
)

__all__ = [
    "HF_ARCHITECTURES",
    "HfCheckpoint",
    "HfTensor",
    "llama3_inv_freq",
    "open_checkpoint",
    "read_hf_config",
]

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
