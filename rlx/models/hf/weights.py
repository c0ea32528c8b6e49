"""Checkpoint tensors -> rlx params. In: a model directory (``model.safetensors``, or the
shards listed by ``model.safetensors.index.json``) and its :class:`EncoderConfig`. Out:
``{name: array}`` with the checkpoint's tensor names.

Every file header is read and checked before any tensor is: a truncated or corrupt file,
a tensor missing, unexpected or of the wrong shape is a ModelError naming the file or the
tensor, and nothing is returned half-loaded. Headers are validated by the ``safetensors``
library (``safe_open``); the data is then memory-mapped with NumPy at the offsets of the
header, so a tensor whose dtype is already f32 is a read-only view of the file, not a copy.
bf16 / f16 tensors are converted to f32 (rlx's PrecisionPolicy narrows them again when
asked). Linear weights, stored ``[out, in]`` by PyTorch, come out transposed (a view) as
rlx's ``linear`` reads them (``[in, out]``). A checkpoint saved from a task model
(``bert.``-prefixed names; ``model.`` for ModernBERT and the Qwen decoders, whose
``...ForCausalLM`` LM head is ignored) is read without the prefix. The rope families
name their tensors in their own modules (``modernbert.py``, ``nomic.py``,
``decoder.py``). A config with ``num_labels`` (a
reranker) also needs its classification head (:func:`head_names`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from rlx.errors import ModelError
from rlx.models.hf import decoder, modernbert, nomic
from rlx.models.hf.config import EncoderConfig, Family

__all__ = [
    "expected_tensors",
    "head_names",
    "layer_names",
    "load_weights",
    "IGNORED_TENSORS",
    "extra_import",
]

#: Checkpoint tensors rlx reads but does not use (the pooler head; registered buffers).
IGNORED_TENSORS = (
    "pooler.dense.weight",
    "pooler.dense.bias",
    "embeddings.position_ids",
    "embeddings.token_type_ids",
    "lm_head.weight",
)
#: The prefix a task model's checkpoint puts before the encoder's names, per family.
_PREFIXES = {
    Family.BERT: "bert.",
    Family.ROBERTA: "roberta.",
    Family.DISTILBERT: "distilbert.",
    Family.MODERNBERT: "model.",
    Family.NOMIC: "bert.",
    Family.QWEN2: "model.",
    Family.QWEN3: "model.",
}
_FAMILY_TENSORS = {
    Family.MODERNBERT: modernbert.tensors,
    Family.NOMIC: nomic.tensors,
    Family.QWEN2: decoder.tensors,
    Family.QWEN3: decoder.tensors,
}

_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
}


def extra_import(name: str) -> object:
    """Import an optional dependency of the ``hf`` extra; ModelError saying how to get it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise ModelError(
            f"loading Hugging Face models needs the {name!r} package, which is not "
            f"installed; install it with: pip install 'rlx[hf]'"
        ) from None


def _dtype(code: str) -> np.dtype:
    if code == "BF16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if code not in _DTYPES:
        raise ModelError(f"safetensors dtype {code} is not supported")
    return _DTYPES[code]


def layer_names(cfg: EncoderConfig, i: int) -> dict[str, str]:
    """Role -> checkpoint name prefix (``<prefix>.weight`` / ``.bias``) of layer ``i``'s
    tensors: ``q``, ``k``, ``v``, ``o`` (attention projections), ``ln1`` (after attention),
    ``up``, ``down`` (FFN) and ``ln2``."""
    if cfg.family is Family.DISTILBERT:
        p = f"transformer.layer.{i}"
        return {
            "q": f"{p}.attention.q_lin",
            "k": f"{p}.attention.k_lin",
            "v": f"{p}.attention.v_lin",
            "o": f"{p}.attention.out_lin",
            "ln1": f"{p}.sa_layer_norm",
            "up": f"{p}.ffn.lin1",
            "down": f"{p}.ffn.lin2",
            "ln2": f"{p}.output_layer_norm",
        }
    p = f"encoder.layer.{i}"
    return {
        "q": f"{p}.attention.self.query",
        "k": f"{p}.attention.self.key",
        "v": f"{p}.attention.self.value",
        "o": f"{p}.attention.output.dense",
        "ln1": f"{p}.attention.output.LayerNorm",
        "up": f"{p}.intermediate.dense",
        "down": f"{p}.output.dense",
        "ln2": f"{p}.output.LayerNorm",
    }


def head_names(cfg: EncoderConfig) -> tuple[str, str]:
    """The two linear layers (name prefixes) of the sequence-classification head, applied
    to the first token's vector: ``(hidden -> hidden, hidden -> num_labels)``. BERT: the
    pooler (tanh) and ``classifier``; RoBERTa / XLM-R: ``classifier.dense`` (tanh) and
    ``classifier.out_proj``; DistilBERT: ``pre_classifier`` (ReLU) and ``classifier``."""
    if cfg.family is Family.BERT:
        return "pooler.dense", "classifier"
    if cfg.family is Family.ROBERTA:
        return "classifier.dense", "classifier.out_proj"
    return "pre_classifier", "classifier"


def expected_tensors(cfg: EncoderConfig) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Checkpoint name -> (shape as stored, whether it is a linear weight to transpose)."""
    if cfg.family in _FAMILY_TENSORS:
        return _FAMILY_TENSORS[cfg.family](cfg)
    h, f = cfg.hidden_size, cfg.intermediate_size
    out: dict[str, tuple[tuple[int, ...], bool]] = {}

    def lin(name: str, n_in: int, n_out: int) -> None:
        out[f"{name}.weight"] = ((n_out, n_in), True)
        out[f"{name}.bias"] = ((n_out,), False)

    def ln(name: str) -> None:
        out[f"{name}.weight"] = ((h,), False)
        out[f"{name}.bias"] = ((h,), False)

    out["embeddings.word_embeddings.weight"] = ((cfg.vocab_size, h), False)
    out["embeddings.position_embeddings.weight"] = ((cfg.max_position_embeddings, h), False)
    if cfg.type_vocab_size:
        out["embeddings.token_type_embeddings.weight"] = ((cfg.type_vocab_size, h), False)
    ln("embeddings.LayerNorm")
    for i in range(cfg.num_layers):
        n = layer_names(cfg, i)
        for role in ("q", "k", "v", "o"):
            lin(n[role], h, h)
        ln(n["ln1"])
        lin(n["up"], h, f)
        lin(n["down"], f, h)
        ln(n["ln2"])
    if cfg.num_labels:
        dense, proj = head_names(cfg)
        lin(dense, h, h)
        lin(proj, h, cfg.num_labels)
    return out


def _shard_files(model_dir: Path) -> list[Path]:
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(wm.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelError(f"{index}: not a safetensors index with a weight_map ({e})") from None
        files = [model_dir / n for n in names]
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise ModelError(f"{index} lists shards that do not exist: {missing}")
        return files
    other = sorted(p.name for p in model_dir.glob("*.bin")) + sorted(
        p.name for p in model_dir.glob("*.pt*")
    )
    hint = f" (found {other}: convert them to safetensors)" if other else ""
    raise ModelError(
        f"{model_dir}: no model.safetensors or model.safetensors.index.json{hint}; "
        "rlx reads weights from safetensors files only"
    )


def _header(path: Path) -> tuple[dict[str, dict], int]:
    """Tensor entries and the data start of one file, checked by ``safe_open`` first."""
    st = extra_import("safetensors")
    try:
        with st.safe_open(str(path), framework="numpy") as fh:  # type: ignore[attr-defined]
            names = set(fh.keys())
    except Exception as e:  # safetensors raises its own SafetensorError
        raise ModelError(f"{path}: not a valid safetensors file ({e})") from None
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        head = json.loads(fh.read(n))
    head.pop("__metadata__", None)
    if set(head) != names:
        raise ModelError(f"{path}: header entries disagree with safetensors' reading")
    return head, 8 + n


def _iter_entries(files: list[Path]) -> Iterator[tuple[str, Path, dict, int]]:
    for path in files:
        head, start = _header(path)
        for name, entry in head.items():
            yield name, path, entry, start


def load_weights(model_dir: Path, cfg: EncoderConfig) -> dict[str, np.ndarray]:
    """Checked params of ``cfg``'s architecture from ``model_dir`` (see the module doc)."""
    want = expected_tensors(cfg)
    found: dict[str, tuple[Path, dict, int]] = {}
    for name, path, entry, start in _iter_entries(_shard_files(model_dir)):
        key = name
        for old, new in ((".gamma", ".weight"), (".beta", ".bias")):  # pre-2019 LayerNorm names
            if "LayerNorm" in key and key.endswith(old):
                key = key[: -len(old)] + new
        p = _PREFIXES[cfg.family]
        if key.startswith(p):
            key = key[len(p) :]
        if key in found:
            raise ModelError(
                f"{model_dir}: tensor {name!r} appears twice ({found[key][0]}, {path})"
            )
        found[key] = (path, entry, start)
    missing = [k for k in want if k not in found]
    if missing:
        raise ModelError(
            f"{model_dir}: {cfg.architecture} checkpoint is missing tensor {missing[0]!r} "
            f"({len(missing)} missing in all: {missing[:5]}{' ...' if len(missing) > 5 else ''})"
        )
    extra = [
        k
        for k in found
        if k not in want and k not in IGNORED_TENSORS and not k.endswith("rotary_emb.inv_freq")
    ]
    if extra:
        raise ModelError(
            f"{model_dir}: unexpected tensor {extra[0]!r} for {cfg.architecture} "
            f"({len(extra)} unexpected in all: {extra[:5]}); rlx does not know what it is for"
        )
    for k, (shape, _) in want.items():
        got = tuple(found[k][1].get("shape", ()))
        if got != shape:
            raise ModelError(
                f"{found[k][0]}: tensor {k!r} has shape {list(got)}, expected {list(shape)} "
                f"from config.json ({cfg.architecture})"
            )
        if found[k][1].get("dtype") not in ("F32", "F16", "BF16", "F64"):
            raise ModelError(
                f"{found[k][0]}: tensor {k!r} has dtype {found[k][1].get('dtype')}, "
                "expected a float (F32, F16, BF16)"
            )
    out: dict[str, np.ndarray] = {}
    maps: dict[Path, np.memmap] = {}
    for k, (shape, transpose) in want.items():
        path, entry, start = found[k]
        if path not in maps:
            maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        lo, hi = entry["data_offsets"]
        dt = _dtype(entry["dtype"])
        raw = maps[path][start + lo : start + hi]
        arr = np.ndarray(shape, dtype=dt, buffer=raw) if shape else raw.view(dt).reshape(())
        if arr.dtype != np.float32:
            arr = arr.astype(np.float32)
        out[k] = arr.T if transpose else arr
    return out
