"""Hugging Face ``config.json`` -> :class:`EncoderConfig`. In: a model directory. Out: the
encoder's sizes and the facts the graph builder needs, or a ModelError naming the
architecture, the field and its value when rlx does not support them.

Supported: BERT (``BertModel``; MiniLM is a BERT), RoBERTa and XLM-R (``RobertaModel``,
``XLMRobertaModel``: positions offset by ``pad_token_id + 1``) and DistilBERT
(``DistilBertModel``: no token types); and the rope families, each with its own graph
(``modernbert.py``, ``nomic.py``, ``decoder.py``) and its facts in a spec
(:class:`ModernBertSpec`, :class:`NomicSpec`, :class:`DecoderSpec`): ModernBERT
(``ModernBertModel``), NomicBERT (``NomicBertModel``, nomic-embed-text's remote code,
read from its GPT-2-style keys ``n_embd``, ``n_head``, ...) and the Qwen2 / Qwen3
decoders used as embedders (``Qwen2Model``, ``Qwen3Model`` and their ``...ForCausalLM``
checkpoints: gte-Qwen2, Qwen3-Embedding). Rope models hold at most
:data:`MAX_ROPE_POSITIONS` tokens here. A config without ``architectures`` is read by its
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
    "Activation",
    "ModernBertSpec",
    "NomicSpec",
    "DecoderSpec",
    "MAX_ROPE_POSITIONS",
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
    MODERNBERT = "modernbert"
    NOMIC = "nomic_bert"
    QWEN2 = "qwen2"
    QWEN3 = "qwen3"

    @property
    def is_decoder(self) -> bool:
        """A causal decoder used as an embedder (last-token pooling, right padding)."""
        return self in (Family.QWEN2, Family.QWEN3)


class Activation(enum.Enum):
    """The FFN's activation (of the gate, for a gated FFN)."""

    GELU = "gelu"  # exact (erf)
    GELU_TANH = "gelu_tanh"
    SILU = "silu"
    SIGMOID = "sigmoid"


#: The longest sequence a rope model takes here (its rope tables are this long).
MAX_ROPE_POSITIONS = 8192


#: ``architectures`` entries rlx loads, and the family of each.
SUPPORTED_ARCHITECTURES: dict[str, Family] = {
    "BertModel": Family.BERT,
    "RobertaModel": Family.ROBERTA,
    "XLMRobertaModel": Family.ROBERTA,
    "DistilBertModel": Family.DISTILBERT,
    "ModernBertModel": Family.MODERNBERT,
    "NomicBertModel": Family.NOMIC,
    "Qwen2Model": Family.QWEN2,
    "Qwen2ForCausalLM": Family.QWEN2,
    "Qwen3Model": Family.QWEN3,
    "Qwen3ForCausalLM": Family.QWEN3,
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
    "modernbert": Family.MODERNBERT,
    "nomic_bert": Family.NOMIC,
    "qwen2": Family.QWEN2,
    "qwen3": Family.QWEN3,
}
#: The architecture a config without ``architectures`` is read as, by ``model_type``.
_MODEL_TYPE_ARCH = {
    "bert": "BertModel",
    "roberta": "RobertaModel",
    "xlm-roberta": "XLMRobertaModel",
    "distilbert": "DistilBertModel",
    "modernbert": "ModernBertModel",
    "nomic_bert": "NomicBertModel",
    "qwen2": "Qwen2Model",
    "qwen3": "Qwen3Model",
}


@dataclass(frozen=True, slots=True)
class ModernBertSpec:
    """ModernBERT's facts: rope bases of the global and the sliding-window layers, the
    half window (a local layer's query ``i`` sees keys ``|i - j| <= local_window``), which
    layers are local, the GLU's activation and which linears / norms have biases."""

    global_rope_base: float
    local_rope_base: float
    local_window: int
    sliding_layers: tuple[bool, ...]
    activation: Activation
    attention_bias: bool
    mlp_bias: bool
    norm_bias: bool


@dataclass(frozen=True, slots=True)
class NomicSpec:
    """NomicBERT's facts: rope base and rotated dims per head (``rotary_emb_fraction``),
    the pair layout, the FFN (``gated``: ``fc11(x) * act(fc12(x))``, else
    ``act(fc1(x))``) and which linears have biases."""

    rope_base: float
    rope_dims: int
    rope_interleaved: bool
    activation: Activation
    gated: bool
    qkv_bias: bool
    fc1_bias: bool
    fc2_bias: bool


@dataclass(frozen=True, slots=True)
class DecoderSpec:
    """A Qwen2 / Qwen3 decoder's facts: rope base and rotated dims, q / k / v biases, per-head
    q / k RMS norms (Qwen3), the output projection's bias (Qwen3 with ``attention_bias``)
    and the causal sliding window of the layers that have one."""

    rope_base: float
    rope_dims: int
    qkv_bias: bool
    qk_norm: bool
    o_bias: bool = False
    sliding_window: int = 0
    sliding_layers: tuple[bool, ...] = ()

    def window(self, layer: int) -> int:
        """The sliding window of ``layer`` (0: causal over everything before)."""
        return self.sliding_window if self.sliding_layers and self.sliding_layers[layer] else 0


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    """The encoder's sizes. ``position_offset`` is added to 0-based positions (RoBERTa:
    ``pad_token_id + 1``, counted over non-pad tokens); ``type_vocab_size`` is 0 when the
    model has no token-type embedding (DistilBERT); ``num_labels`` is the size of the
    classification head's output (0: no head, an encoder); ``num_kv_heads`` and
    ``head_size`` (0: ``num_heads``, ``hidden_size // num_heads``) and ``spec`` (the rope
    families' facts; None for the BERT family) serve the families with their own graph."""

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
    num_kv_heads: int = 0
    head_size: int = 0
    spec: ModernBertSpec | NomicSpec | DecoderSpec | None = None

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key / value heads (grouped-query attention when fewer than ``num_heads``)."""
        return self.num_kv_heads or self.num_heads

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
    return _MODEL_TYPES[mt], _MODEL_TYPE_ARCH[mt]


class _Fields:
    """Typed reads of config fields, each error naming the file and the field."""

    def __init__(self, cfg: dict[str, Any], path: Path, arch: str):
        self.cfg, self.path, self.arch = cfg, path, arch

    def int(self, name: str, default: int | None = None, minimum: int = 1) -> int:
        v = self.cfg.get(name)
        v = default if v is None else v  # absent or null: the default
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ModelError(
                f"{self.path}: {self.arch} field {name} must be an integer >= {minimum}, "
                f"got {v!r}" + (" (missing)" if name not in self.cfg else "")
            )
        return v

    def float(self, name: str, default: float) -> float:
        v = self.cfg.get(name)
        v = default if v is None else v
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

    def flag(self, name: str, default: bool) -> bool:
        """A true / false field (absent or null: ``default``)."""
        v = self.cfg.get(name)
        v = default if v is None else v
        if not isinstance(v, bool):
            raise ModelError(
                f"{self.path}: {self.arch} field {name} must be true or false, got {v!r}"
            )
        return v

    def choice(self, name: str, table: dict[str, Any], default: str) -> Any:
        """``table[value]`` of a name-valued field; ModelError listing the names."""
        v = self.cfg.get(name)
        v = default if v is None else v
        if v not in table:
            raise ModelError(
                f"{self.path}: {self.arch} config {name}={v!r} is not supported; "
                f"supported: {', '.join(repr(a) for a in table)}"
            )
        return table[v]


def _rope_base(f: _Fields, where: str, params: Any, legacy: str, default: float) -> float:
    """The rope base of one rope parameter object (``rope_parameters`` of transformers
    5, else ``rope_scaling``; base from ``rope_theta``, else the field ``legacy``).
    Only the plain rope (``rope_type`` "default") is supported."""
    p = params if isinstance(params, dict) else {}
    kind = p.get("rope_type", p.get("type", "default"))
    if kind != "default":
        raise ModelError(
            f"{f.path}: {f.arch} {where} rope_type={kind!r} is not supported; "
            f"supported: 'default' (no rope scaling)"
        )
    v = p.get("rope_theta")
    if v is None:
        return f.float(legacy, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ModelError(f"{f.path}: {f.arch} {where}.rope_theta must be > 0, got {v!r}")
    return float(v)


_GELUS = {
    "gelu": Activation.GELU,
    "gelu_new": Activation.GELU_TANH,
    "gelu_fast": Activation.GELU_TANH,
    "gelu_pytorch_tanh": Activation.GELU_TANH,
}


def _layer_types(f: _Fields, layers: int, sliding: tuple[bool, ...]) -> tuple[bool, ...]:
    """Which layers are sliding-window: ``layer_types`` when the config lists them, else
    ``sliding`` (the family's older rule)."""
    types = f.cfg.get("layer_types")
    if types is None:
        return sliding
    allowed = ("full_attention", "sliding_attention")
    if not isinstance(types, list) or len(types) != layers or set(types) - set(allowed):
        raise ModelError(
            f"{f.path}: {f.arch} layer_types must list {layers} entries of {allowed}, "
            f"got {types!r:.120}"
        )
    return tuple(t == "sliding_attention" for t in types)


def _modernbert(f: _Fields, fam: Family) -> EncoderConfig:
    cfg = f.cfg
    hidden, heads = f.int("hidden_size"), f.int("num_attention_heads")
    layers = f.int("num_hidden_layers")
    every = f.int("global_attn_every_n_layers", 3)
    sliding = _layer_types(f, layers, tuple(bool(i % every) for i in range(layers)))
    rp = cfg.get("rope_parameters") or {}
    per_type = isinstance(rp, dict) and any(isinstance(v, dict) for v in rp.values())
    full = rp.get("full_attention") if per_type else (rp or cfg.get("rope_scaling"))
    local = rp.get("sliding_attention") if per_type else (rp or cfg.get("rope_scaling"))
    spec = ModernBertSpec(
        global_rope_base=_rope_base(f, "rope_parameters.full_attention", full,
                                     "global_rope_theta", 160000.0),
        local_rope_base=_rope_base(f, "rope_parameters.sliding_attention", local,
                                    "local_rope_theta", 10000.0),
        local_window=f.int("local_attention", 128, minimum=2) // 2,
        sliding_layers=sliding,
        activation=f.choice("hidden_activation", {**_GELUS, "silu": Activation.SILU}, "gelu"),
        attention_bias=f.flag("attention_bias", False),
        mlp_bias=f.flag("mlp_bias", False),
        norm_bias=f.flag("norm_bias", False),
    )  # fmt: skip
    return EncoderConfig(
        family=fam,
        architecture=f.arch,
        vocab_size=f.int("vocab_size"),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=f.int("intermediate_size"),
        max_position_embeddings=min(f.int("max_position_embeddings", 8192), MAX_ROPE_POSITIONS),
        type_vocab_size=0,
        layer_norm_eps=f.float("norm_eps", 1e-5),
        pad_token_id=f.int("pad_token_id", 50283, minimum=0),
        position_offset=0,
        spec=spec,
    )


def _nomic(f: _Fields, fam: Family) -> EncoderConfig:
    """NomicBERT from the keys of its GPT2Config-derived config (contrastors'
    ``modeling_hf_nomic_bert.py``): the vocabulary padded to ``pad_vocab_size_multiple``,
    a gated FFN's width rounded up to a multiple of 256, as its modules do."""
    for name, ok in (
        ("prenorm", (False,)),
        ("causal", (False,)),
        ("use_rms_norm", (False, None)),
        ("parallel_block", (False, None)),
        ("rotary_emb_scale_base", (None,)),
    ):
        f.require(name, ok, ok[0])
    hidden, heads = f.int("n_embd"), f.int("n_head")
    act_name = f.cfg.get("activation_function") or "gelu_new"
    gated = act_name in ("swiglu", "geglu", "glu")
    act = f.choice(
        "activation_function",
        {"swiglu": Activation.SILU, "geglu": Activation.GELU, "glu": Activation.SIGMOID,
         **{k: Activation.GELU for k in _GELUS}},  # the block passes F.gelu: exact erf
        "gelu_new",
    )  # fmt: skip
    inner = f.cfg.get("n_inner")
    if gated:
        width = f.int("n_inner") if inner is not None else int(8 * hidden / 3)
        width = (width + 255) // 256 * 256
    else:
        width = f.int("n_inner") if inner is not None else 4 * hidden
    if hidden % heads:
        raise ModelError(f"{f.path}: {f.arch} n_embd={hidden} is not divisible by n_head={heads}")
    fraction = f.cfg.get("rotary_emb_fraction") or 0.0
    head_dim = hidden // heads
    number = isinstance(fraction, (int, float)) and not isinstance(fraction, bool)
    rot = int(head_dim * fraction) if number else 0
    if not number or not 0 < fraction <= 1.0 or rot < 2 or rot % 2:
        raise ModelError(
            f"{f.path}: {f.arch} rotary_emb_fraction={f.cfg.get('rotary_emb_fraction')!r} gives "
            f"{rot} rotated dims of {head_dim}; supported: rotary positions on an even number "
            f"of dims (learned position embeddings are not)"
        )
    positions = f.int("n_positions", f.cfg.get("max_position_embeddings") or 2048)
    if f.cfg.get("rotary_scaling_factor"):  # dynamic NTK: the plain rope up to this length
        positions = min(positions, f.int("max_trained_positions", 2048))
    vocab = f.int("vocab_size")
    multiple = f.int("pad_vocab_size_multiple", 1)
    vocab = (vocab + multiple - 1) // multiple * multiple
    spec = NomicSpec(
        rope_base=f.float("rotary_emb_base", 10000.0),
        rope_dims=rot,
        rope_interleaved=f.flag("rotary_emb_interleaved", False),
        activation=act,
        gated=gated,
        qkv_bias=f.flag("qkv_proj_bias", True),
        fc1_bias=f.flag("mlp_fc1_bias", True),
        fc2_bias=f.flag("mlp_fc2_bias", True),
    )
    return EncoderConfig(
        family=fam,
        architecture=f.arch,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=f.int("n_layer"),
        num_heads=heads,
        intermediate_size=width,
        max_position_embeddings=min(positions, MAX_ROPE_POSITIONS),
        type_vocab_size=f.int("type_vocab_size", 2, minimum=0),
        layer_norm_eps=f.float("layer_norm_epsilon", 1e-5),
        pad_token_id=f.int("pad_token_id", 0, minimum=0),
        position_offset=0,
        spec=spec,
    )


def _decoder(f: _Fields, fam: Family) -> EncoderConfig:
    """A Qwen2 / Qwen3 decoder: transformers' ``Qwen2Config`` / ``Qwen3Config`` keys."""
    f.require("hidden_act", ("silu",), "silu")
    hidden, heads = f.int("hidden_size"), f.int("num_attention_heads")
    kv = f.int("num_key_value_heads", heads)
    if heads % kv:
        raise ModelError(
            f"{f.path}: {f.arch} num_key_value_heads={kv} must divide num_attention_heads={heads}"
        )
    head_dim = f.int("head_dim", hidden // heads)
    layers = f.int("num_hidden_layers")
    first = f.int("max_window_layers", layers, minimum=0)
    old = tuple(f.flag("use_sliding_window", False) and i >= first for i in range(layers))
    sliding = _layer_types(f, layers, old)
    window = f.int("sliding_window", 4096) if any(sliding) else 0
    rp = f.cfg.get("rope_parameters") or f.cfg.get("rope_scaling")
    spec = DecoderSpec(
        rope_base=_rope_base(f, "rope_parameters", rp, "rope_theta", 10000.0),
        rope_dims=head_dim,
        qkv_bias=True if fam is Family.QWEN2 else f.flag("attention_bias", False),
        qk_norm=fam is Family.QWEN3,
        o_bias=fam is Family.QWEN3 and f.flag("attention_bias", False),
        sliding_window=window,
        sliding_layers=sliding if window else (),
    )
    return EncoderConfig(
        family=fam,
        architecture=f.arch,
        vocab_size=f.int("vocab_size"),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=f.int("intermediate_size"),
        max_position_embeddings=min(f.int("max_position_embeddings", 32768), MAX_ROPE_POSITIONS),
        type_vocab_size=0,
        layer_norm_eps=f.float("rms_norm_eps", 1e-6),
        pad_token_id=f.int("pad_token_id", 0, minimum=0),
        position_offset=0,
        num_kv_heads=kv,
        head_size=head_dim,
        spec=spec,
    )


_READERS = {
    Family.MODERNBERT: _modernbert,
    Family.NOMIC: _nomic,
    Family.QWEN2: _decoder,
    Family.QWEN3: _decoder,
}


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
    if fam in _READERS:
        return _READERS[fam](f, fam)
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
