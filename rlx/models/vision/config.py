"""Hugging Face ``config.json`` of an image model -> :class:`VisionModelConfig`. In: a
model directory. Out: the sizes of the vision tower (and, for CLIP / SigLIP, of the text
tower) and the facts the graph builder needs, or a ModelError naming the field and its
value when rlx does not support them.

Supported (:data:`SUPPORTED_ARCHITECTURES`): ``CLIPModel`` and ``SiglipModel`` (image and
text towers in one embedding space) and ``ViTForImageClassification``. A field missing
from the file takes transformers' default for that config class (:data:`DEFAULTS`), as
``from_pretrained`` does: hub configs often keep only the values that differ.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlx.errors import ModelError
from rlx.models.hf.config import read_json

__all__ = [
    "Family",
    "Act",
    "TowerConfig",
    "VisionConfig",
    "TextConfig",
    "VisionModelConfig",
    "SUPPORTED_ARCHITECTURES",
    "ACTIVATIONS",
    "DEFAULTS",
    "read_vision_config",
]


class Family(enum.Enum):
    """Which weight layout, embeddings and pooling a checkpoint follows."""

    CLIP = "clip"
    SIGLIP = "siglip"
    VIT = "vit"


class Act(enum.Enum):
    """The MLP activation of a tower (``hidden_act``)."""

    GELU = "gelu"  # exact (erf)
    GELU_TANH = "gelu_tanh"  # tanh approximation
    QUICK_GELU = "quick_gelu"  # x * sigmoid(1.702 x)


#: ``architectures`` entries rlx loads, and the family of each.
SUPPORTED_ARCHITECTURES: dict[str, Family] = {
    "CLIPModel": Family.CLIP,
    "SiglipModel": Family.SIGLIP,
    "ViTForImageClassification": Family.VIT,
}
_MODEL_TYPES = {"clip": Family.CLIP, "siglip": Family.SIGLIP, "vit": Family.VIT}

#: ``hidden_act`` values rlx builds, and the activation each names.
ACTIVATIONS: dict[str, Act] = {
    "gelu": Act.GELU,
    "gelu_pytorch_tanh": Act.GELU_TANH,
    "gelu_new": Act.GELU_TANH,
    "quick_gelu": Act.QUICK_GELU,
}

#: transformers' defaults per config class: (family, "vision" | "text" | "top") -> fields.
DEFAULTS: dict[tuple[Family, str], dict[str, Any]] = {
    (Family.CLIP, "text"): {
        "vocab_size": 49408,
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 8,
        "max_position_embeddings": 77,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
        "pad_token_id": 1,
        "eos_token_id": 49407,
    },
    (Family.CLIP, "vision"): {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_channels": 3,
        "image_size": 224,
        "patch_size": 32,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
    },
    (Family.CLIP, "top"): {"projection_dim": 512},
    (Family.SIGLIP, "text"): {
        "vocab_size": 32000,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "max_position_embeddings": 64,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
        "pad_token_id": 1,
        "eos_token_id": 49407,
        "projection_size": None,
    },
    (Family.SIGLIP, "vision"): {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_channels": 3,
        "image_size": 224,
        "patch_size": 16,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
        "vision_use_head": True,
    },
    (Family.SIGLIP, "top"): {},
    (Family.VIT, "vision"): {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_channels": 3,
        "image_size": 224,
        "patch_size": 16,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "qkv_bias": True,
    },
    (Family.VIT, "top"): {},
}


@dataclass(frozen=True)
class TowerConfig:
    """A pre-norm transformer encoder: ``layers`` x (LN, attention, residual, LN, MLP with
    ``act``, residual)."""

    hidden: int
    heads: int
    layers: int
    intermediate: int
    eps: float
    act: Act

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower: square ``image_size`` images cut into ``patch_size`` patches."""

    tower: TowerConfig
    image_size: int
    patch_size: int
    channels: int

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid * self.grid


@dataclass(frozen=True)
class TextConfig:
    """The text tower; ``projection`` is the size of its pooled output after the head
    (SigLIP's ``head``; CLIP's ``text_projection`` has ``projection_dim``)."""

    tower: TowerConfig
    vocab_size: int
    max_positions: int
    pad_token_id: int
    eos_token_id: int
    projection: int


@dataclass(frozen=True)
class VisionModelConfig:
    """A parsed image-model ``config.json``. ``text`` is None for ViT classification;
    ``projection_dim`` is CLIP's shared embedding size (0 otherwise); ``labels`` are
    ``id2label``'s names in id order (ViT classification)."""

    architecture: str
    family: Family
    vision: VisionConfig
    text: TextConfig | None
    projection_dim: int
    labels: tuple[str, ...]

    @property
    def embed_dim(self) -> int:
        """Size of an image (and text) embedding, or the number of labels for ViT."""
        if self.family is Family.CLIP:
            return self.projection_dim
        if self.family is Family.SIGLIP:
            return self.vision.tower.hidden
        return len(self.labels)


def _int(block: dict[str, Any], key: str, where: str, minimum: int = 1) -> int:
    v = block[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ModelError(f"{where}: {key} must be an int >= {minimum}, got {v!r}")
    return v


def _tower(block: dict[str, Any], where: str) -> TowerConfig:
    act_name = block["hidden_act"]
    if act_name not in ACTIVATIONS:
        raise ModelError(
            f"{where}: hidden_act {act_name!r} is not supported; supported: "
            f"{', '.join(ACTIVATIONS)}"
        )
    hidden, heads = _int(block, "hidden_size", where), _int(block, "num_attention_heads", where)
    if hidden % heads:
        raise ModelError(
            f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
        )
    eps = block["layer_norm_eps"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ModelError(f"{where}: layer_norm_eps must be a positive number, got {eps!r}")
    return TowerConfig(
        hidden=hidden,
        heads=heads,
        layers=_int(block, "num_hidden_layers", where),
        intermediate=_int(block, "intermediate_size", where),
        eps=float(eps),
        act=ACTIVATIONS[act_name],
    )


def _block(raw: dict[str, Any], family: Family, part: str, where: str) -> dict[str, Any]:
    """``raw`` (the file's sub-config, or the whole file for ViT) over the defaults."""
    sub = raw if part == "top" or family is Family.VIT else raw.get(f"{part}_config") or {}
    if not isinstance(sub, dict):
        raise ModelError(f"{where}: {part}_config must be an object, got {type(sub).__name__}")
    return {**DEFAULTS[(family, "vision" if family is Family.VIT else part)], **sub}


def _vision(block: dict[str, Any], family: Family, where: str) -> VisionConfig:
    size, patch = _int(block, "image_size", where), _int(block, "patch_size", where)
    if size % patch:
        raise ModelError(
            f"{where}: image_size {size} is not a multiple of patch_size {patch}; rlx needs "
            "whole patches"
        )
    channels = _int(block, "num_channels", where)
    if channels != 3:
        raise ModelError(f"{where}: num_channels {channels} is not supported; supported: 3 (RGB)")
    if family is Family.SIGLIP and block.get("vision_use_head") is not True:
        raise ModelError(
            f"{where}: vision_use_head={block.get('vision_use_head')!r} is not supported: "
            "SiglipModel's image embedding is its attention-pooling head (vision_use_head=true)"
        )
    if family is Family.VIT and block.get("qkv_bias") is not True:
        raise ModelError(f"{where}: qkv_bias={block.get('qkv_bias')!r}; rlx supports true only")
    return VisionConfig(_tower(block, where), size, patch, channels)


def _text(block: dict[str, Any], family: Family, proj: int, where: str) -> TextConfig:
    tower = _tower(block, where)
    if family is Family.SIGLIP:
        ps = block.get("projection_size")
        proj = tower.hidden if ps is None else _int(block, "projection_size", where)
    return TextConfig(
        tower=tower,
        vocab_size=_int(block, "vocab_size", where),
        max_positions=_int(block, "max_position_embeddings", where),
        pad_token_id=_int(block, "pad_token_id", where, 0),
        eos_token_id=_int(block, "eos_token_id", where, 0),
        projection=proj,
    )


def _labels(raw: dict[str, Any], where: str) -> tuple[str, ...]:
    id2label = raw.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            items = sorted((int(k), str(v)) for k, v in id2label.items())
        except ValueError:
            raise ModelError(
                f"{where}: id2label keys must be integers, got {list(id2label)}"
            ) from None
        if [k for k, _ in items] != list(range(len(items))):
            raise ModelError(f"{where}: id2label keys must be 0..n-1, got {[k for k, _ in items]}")
        return tuple(v for _, v in items)
    n = raw.get("num_labels", 2)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ModelError(f"{where}: num_labels must be an int >= 1, got {n!r}")
    return tuple(f"LABEL_{i}" for i in range(n))


def read_vision_config(model_dir: Path) -> VisionModelConfig:
    """The parsed ``config.json`` of ``model_dir`` (see the module docstring)."""
    path = model_dir / "config.json"
    raw = read_json(path, "config")
    archs = raw.get("architectures")
    if isinstance(archs, list) and archs:
        arch = str(archs[0])
    elif raw.get("model_type") in _MODEL_TYPES and raw.get("model_type") != "vit":
        arch = {"clip": "CLIPModel", "siglip": "SiglipModel"}[raw["model_type"]]
    else:
        arch = str(raw.get("model_type"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"{path}: architecture {arch!r} is not supported by rlx.models.vision; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    family = SUPPORTED_ARCHITECTURES[arch]
    where = f"{path} ({arch})"
    try:
        vision = _vision(_block(raw, family, "vision", where), family, f"{where} vision_config")
        top = _block(raw, family, "top", where)
        proj = _int(top, "projection_dim", where) if family is Family.CLIP else 0
        text = None
        if family is not Family.VIT:
            tblock = _block(raw, family, "text", where)
            text = _text(tblock, family, proj, f"{where} text_config")
    except KeyError as e:
        raise ModelError(f"{where}: field {e.args[0]!r} is missing") from None
    labels = _labels(raw, where) if family is Family.VIT else ()
    return VisionModelConfig(arch, family, vision, text, proj, labels)
