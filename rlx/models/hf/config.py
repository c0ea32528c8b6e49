"""Hugging Face ``config.json`` -> :class:`EncoderConfig`. In: a model directory. Out: the
encoder's sizes and the facts the graph builder needs, or a ModelError naming the
architecture, the field and its value when rlx does not support them.

Supported: BERT (``BertModel``; MiniLM is a BERT), RoBERTa and XLM-R (``RobertaModel``,
``XLMRobertaModel``: positions offset by ``pad_token_id + 1``) and DistilBERT
(``DistilBertModel``: no token types). A config without ``architectures`` is read by its
``model_type``. For :class:`Task` ``RERANK`` (cross-encoders), the same families'
``...ForSequenceClassification`` checkpoints (:data:`CLASSIFIER_ARCHITECTURES`), with
``num_labels`` scores (``id2label``'s size when the field is absent, as transformers).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlx.errors import ModelError

__all__ = [
    "Family",
    "Task",
    "EncoderConfig",
    "read_config",
    "read_json",
    "SUPPORTED_ARCHITECTURES",
    "CLASSIFIER_ARCHITECTURES",
]


class Family(enum.Enum):
    """Which weight layout and embedding rule a checkpoint follows."""

    BERT = "bert"
    ROBERTA = "roberta"
    DISTILBERT = "distilbert"


#: ``architectures`` entries rlx loads, and the family of each.
SUPPORTED_ARCHITECTURES: dict[str, Family] = {
    "BertModel": Family.BERT,
    "RobertaModel": Family.ROBERTA,
    "XLMRobertaModel": Family.ROBERTA,
    "DistilBertModel": Family.DISTILBERT,
}
#: ``architectures`` entries of cross-encoder (reranker) checkpoints, and the family of each.
CLASSIFIER_ARCHITECTURES: dict[str, Family] = {
    "BertForSequenceClassification": Family.BERT,
    "RobertaForSequenceClassification": Family.ROBERTA,
    "XLMRobertaForSequenceClassification": Family.ROBERTA,
    "DistilBertForSequenceClassification": Family.DISTILBERT,
}


class Task(enum.Enum):
    """What a checkpoint is loaded for: the bare encoder (embeddings) or the encoder with
    its sequence-classification head (a cross-encoder scoring text pairs)."""

    EMBED = "embed"
    RERANK = "rerank"

    @property
    def architectures(self) -> dict[str, Family]:
        """The ``architectures`` entries this task loads."""
        return SUPPORTED_ARCHITECTURES if self is Task.EMBED else CLASSIFIER_ARCHITECTURES


_MODEL_TYPES = {
    "bert": Family.BERT,
    "roberta": Family.ROBERTA,
    "xlm-roberta": Family.ROBERTA,
    "distilbert": Family.DISTILBERT,
}


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    """The encoder's sizes. ``position_offset`` is added to 0-based positions (RoBERTa:
    ``pad_token_id + 1``, counted over non-pad tokens); ``type_vocab_size`` is 0 when the
    model has no token-type embedding (DistilBERT); ``num_labels`` is the size of the
    classification head's output (0: no head, an encoder)."""

    family: Family
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int
    position_offset: int
    num_labels: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_positions(self) -> int:
        """The longest sequence the position table holds (after the RoBERTa offset)."""
        return self.max_position_embeddings - self.position_offset


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path``; ModelError naming the file when it is missing or bad."""
    if not path.is_file():
        raise ModelError(f"{what}: {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{what}: {path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{what}: {path} holds a {type(data).__name__}, expected a JSON object")
    return data


def _family(cfg: dict[str, Any], path: Path, task: Task) -> tuple[Family, str]:
    known = task.architectures
    supported = ", ".join(known)
    archs = cfg.get("architectures")
    if archs is not None:
        if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
            raise ModelError(f"{path}: architectures must be a list of names, got {archs!r}")
        bad = [a for a in archs if a not in known]
        if bad:
            raise ModelError(
                f"{path}: architectures: {json.dumps(archs)} is not supported"
                f"{' as a reranker' if task is Task.RERANK else ''}; supported: {supported}"
            )
        return known[archs[0]], archs[0]
    if task is Task.RERANK:
        raise ModelError(f"{path}: no architectures field; a reranker needs one of: {supported}")
    mt = cfg.get("model_type")
    if mt not in _MODEL_TYPES:
        raise ModelError(
            f"{path}: model_type {mt!r} (no architectures field) is not supported; "
            f"supported: {', '.join(_MODEL_TYPES)} (architectures {supported})"
        )
    names = {"bert": "BertModel", "roberta": "RobertaModel", "xlm-roberta": "XLMRobertaModel"}
    return _MODEL_TYPES[mt], names.get(mt, "DistilBertModel")


class _Fields:
    """Typed reads of config fields, each error naming the file and the field."""

    def __init__(self, cfg: dict[str, Any], path: Path, arch: str):
        self.cfg, self.path, self.arch = cfg, path, arch

    def int(self, name: str, default: int | None = None, minimum: int = 1) -> int:
        v = self.cfg.get(name, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ModelError(
                f"{self.path}: {self.arch} field {name} must be an integer >= {minimum}, "
                f"got {v!r}" + (" (missing)" if name not in self.cfg else "")
            )
        return v

    def float(self, name: str, default: float) -> float:
        v = self.cfg.get(name, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ModelError(f"{self.path}: {self.arch} field {name} must be > 0, got {v!r}")
        return float(v)

    def require(self, name: str, allowed: tuple[Any, ...], default: Any) -> None:
        v = self.cfg.get(name, default)
        if v not in allowed:
            raise ModelError(
                f"{self.path}: {self.arch} config {name}={v!r} is not supported; "
                f"supported: {', '.join(repr(a) for a in allowed)}"
            )


def _num_labels(cfg: dict[str, Any], f: _Fields) -> int:
    """transformers' rule: ``num_labels`` when given, else the size of ``id2label``, else 2."""
    if "num_labels" in cfg:
        return f.int("num_labels")
    labels = cfg.get("id2label")
    if isinstance(labels, dict) and labels:
        return len(labels)
    return 2


def read_config(model_dir: Path, task: Task = Task.EMBED) -> EncoderConfig:
    """Parse and check ``model_dir/config.json`` for ``task``; ModelError for anything
    unsupported."""
    path = model_dir / "config.json"
    cfg = read_json(path, "config")
    fam, arch = _family(cfg, path, task)
    f = _Fields(cfg, path, arch)
    for flag in ("is_decoder", "add_cross_attention"):
        f.require(flag, (False,), False)
    if fam is Family.DISTILBERT:
        f.require("activation", ("gelu",), "gelu")
        hidden, heads = f.int("dim"), f.int("n_heads")
        layers, inter = f.int("n_layers"), f.int("hidden_dim")
        types, eps, pad = 0, 1e-12, f.int("pad_token_id", 0, minimum=0)
    else:
        f.require("hidden_act", ("gelu",), "gelu")
        f.require("position_embedding_type", ("absolute",), "absolute")
        hidden, heads = f.int("hidden_size"), f.int("num_attention_heads")
        layers, inter = f.int("num_hidden_layers"), f.int("intermediate_size")
        types = f.int("type_vocab_size", 2)
        eps = f.float("layer_norm_eps", 1e-12)
        pad = f.int("pad_token_id", 1 if fam is Family.ROBERTA else 0, minimum=0)
    if hidden % heads:
        raise ModelError(
            f"{path}: hidden size {hidden} is not divisible by the number of heads {heads}"
        )
    offset = pad + 1 if fam is Family.ROBERTA else 0
    max_pos = f.int("max_position_embeddings", 512, minimum=offset + 1)
    return EncoderConfig(
        family=fam,
        architecture=arch,
        vocab_size=f.int("vocab_size"),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=inter,
        max_position_embeddings=max_pos,
        type_vocab_size=types,
        layer_norm_eps=eps,
        pad_token_id=pad,
        position_offset=offset,
        num_labels=_num_labels(cfg, f) if task is Task.RERANK else 0,
    )
