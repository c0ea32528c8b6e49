"""Checkpoint tensors of an image model -> rlx params. In: a model directory (safetensors,
one file or shards) and its :class:`VisionModelConfig`. Out: ``{name: f32 array}`` for the
graphs of ``graph.py``, plus the scalars the graphs do not use (CLIP's ``logit_scale``,
SigLIP's ``logit_scale`` and ``logit_bias``).

Every tensor the architecture needs is checked for presence, shape and a float dtype
before any is read; a missing, unexpected or misshapen tensor is a ModelError naming it.
Params keep the checkpoint's names, with these changes of layout: linear weights are
transposed to ``[in, out]`` (rlx's ``linear``); a patch-embedding convolution weight
``[O, C, p, p]`` becomes the ``[C*p*p, O]`` matrix of the patch projection; SigLIP's
``nn.MultiheadAttention`` ``in_proj_weight`` / ``in_proj_bias`` are split into
``q_proj`` / ``k_proj`` / ``v_proj`` params.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlx.errors import ModelError
from rlx.models.hf.weights import _dtype, _iter_entries, _shard_files
from rlx.models.vision.config import Family, TowerConfig, VisionModelConfig

__all__ = ["layer_names", "expected_tensors", "load_vision_weights", "PATCH", "IGNORED"]

#: Checkpoint tensors read but unused (registered buffers some versions save).
IGNORED = (
    "text_model.embeddings.position_ids",
    "vision_model.embeddings.position_ids",
)


def layer_names(family: Family, prefix: str, i: int) -> dict[str, str]:
    """Role -> checkpoint name prefix of encoder layer ``i`` of the tower at ``prefix``:
    ``ln1``, ``q``, ``k``, ``v``, ``o``, ``ln2``, ``up``, ``down``."""
    if family is Family.VIT:
        p = f"vit.encoder.layer.{i}"
        return {
            "ln1": f"{p}.layernorm_before",
            "q": f"{p}.attention.attention.query",
            "k": f"{p}.attention.attention.key",
            "v": f"{p}.attention.attention.value",
            "o": f"{p}.attention.output.dense",
            "ln2": f"{p}.layernorm_after",
            "up": f"{p}.intermediate.dense",
            "down": f"{p}.output.dense",
        }
    p = f"{prefix}.encoder.layers.{i}"
    return {
        "ln1": f"{p}.layer_norm1",
        "q": f"{p}.self_attn.q_proj",
        "k": f"{p}.self_attn.k_proj",
        "v": f"{p}.self_attn.v_proj",
        "o": f"{p}.self_attn.out_proj",
        "ln2": f"{p}.layer_norm2",
        "up": f"{p}.mlp.fc1",
        "down": f"{p}.mlp.fc2",
    }


#: The patch-embedding weight of each family (a conv weight in the checkpoint).
PATCH = {
    Family.CLIP: "vision_model.embeddings.patch_embedding",
    Family.SIGLIP: "vision_model.embeddings.patch_embedding",
    Family.VIT: "vit.embeddings.patch_embeddings.projection",
}

# What a stored tensor becomes: L = linear weight (transpose), P = patch conv weight,
# Q = in_proj weight or bias (split in three), V = as stored.
_Spec = dict[str, tuple[tuple[int, ...], str]]


def _tower(out: _Spec, family: Family, prefix: str, t: TowerConfig) -> None:
    h, f = t.hidden, t.intermediate
    for i in range(t.layers):
        n = layer_names(family, prefix, i)
        for role, (a, b) in {"q": (h, h), "k": (h, h), "v": (h, h), "o": (h, h),
                             "up": (h, f), "down": (f, h)}.items():  # fmt: skip
            out[f"{n[role]}.weight"] = ((b, a), "L")
            out[f"{n[role]}.bias"] = ((b,), "V")
        for role in ("ln1", "ln2"):
            out[f"{n[role]}.weight"] = ((h,), "V")
            out[f"{n[role]}.bias"] = ((h,), "V")


def _ln(out: _Spec, name: str, h: int) -> None:
    out[f"{name}.weight"] = ((h,), "V")
    out[f"{name}.bias"] = ((h,), "V")


def expected_tensors(cfg: VisionModelConfig) -> _Spec:
    """Checkpoint name -> (shape as stored, what it becomes: see the comment above)."""
    out: _Spec = {}
    fam, vis = cfg.family, cfg.vision
    h, p, n = vis.tower.hidden, vis.patch_size, vis.num_patches
    out[f"{PATCH[fam]}.weight"] = ((h, vis.channels, p, p), "P")
    if fam is Family.CLIP:
        out["vision_model.embeddings.class_embedding"] = ((h,), "V")
        out["vision_model.embeddings.position_embedding.weight"] = ((n + 1, h), "V")
        _ln(out, "vision_model.pre_layrnorm", h)
        _tower(out, fam, "vision_model", vis.tower)
        _ln(out, "vision_model.post_layernorm", h)
        out["visual_projection.weight"] = ((cfg.projection_dim, h), "L")
        out["logit_scale"] = ((), "V")
    elif fam is Family.SIGLIP:
        out[f"{PATCH[fam]}.bias"] = ((h,), "V")
        out["vision_model.embeddings.position_embedding.weight"] = ((n, h), "V")
        _tower(out, fam, "vision_model", vis.tower)
        _ln(out, "vision_model.post_layernorm", h)
        hd = "vision_model.head"
        out[f"{hd}.probe"] = ((1, 1, h), "V")
        out[f"{hd}.attention.in_proj_weight"] = ((3 * h, h), "Q")
        out[f"{hd}.attention.in_proj_bias"] = ((3 * h,), "Q")
        out[f"{hd}.attention.out_proj.weight"] = ((h, h), "L")
        out[f"{hd}.attention.out_proj.bias"] = ((h,), "V")
        _ln(out, f"{hd}.layernorm", h)
        f = vis.tower.intermediate
        out[f"{hd}.mlp.fc1.weight"] = ((f, h), "L")
        out[f"{hd}.mlp.fc1.bias"] = ((f,), "V")
        out[f"{hd}.mlp.fc2.weight"] = ((h, f), "L")
        out[f"{hd}.mlp.fc2.bias"] = ((h,), "V")
        out["logit_scale"] = ((1,), "V")
        out["logit_bias"] = ((1,), "V")
    else:
        out[f"{PATCH[fam]}.bias"] = ((h,), "V")
        out["vit.embeddings.cls_token"] = ((1, 1, h), "V")
        out["vit.embeddings.position_embeddings"] = ((1, n + 1, h), "V")
        _tower(out, fam, "vit", vis.tower)
        _ln(out, "vit.layernorm", h)
        out["classifier.weight"] = ((len(cfg.labels), h), "L")
        out["classifier.bias"] = ((len(cfg.labels),), "V")
    if cfg.text is not None:
        t = cfg.text
        th = t.tower.hidden
        out["text_model.embeddings.token_embedding.weight"] = ((t.vocab_size, th), "V")
        out["text_model.embeddings.position_embedding.weight"] = ((t.max_positions, th), "V")
        _tower(out, fam, "text_model", t.tower)
        _ln(out, "text_model.final_layer_norm", th)
        if fam is Family.CLIP:
            out["text_projection.weight"] = ((t.projection, th), "L")
        else:
            out["text_model.head.weight"] = ((t.projection, th), "L")
            out["text_model.head.bias"] = ((t.projection,), "V")
    return out


def load_vision_weights(model_dir: Path, cfg: VisionModelConfig) -> dict[str, np.ndarray]:
    """Checked, re-laid-out params of ``cfg``'s architecture from ``model_dir`` (module
    docstring); f16 / bf16 tensors are widened to f32."""
    want = expected_tensors(cfg)
    found: dict[str, tuple[Path, dict, int]] = {}
    for name, path, entry, start in _iter_entries(_shard_files(model_dir)):
        if name in found:
            raise ModelError(
                f"{model_dir}: tensor {name!r} appears twice ({found[name][0]}, {path})"
            )
        found[name] = (path, entry, start)
    missing = [k for k in want if k not in found]
    if missing:
        raise ModelError(
            f"{model_dir}: {cfg.architecture} checkpoint is missing tensor {missing[0]!r} "
            f"({len(missing)} missing in all: {missing[:5]}{' ...' if len(missing) > 5 else ''})"
        )
    extra = [k for k in found if k not in want and k not in IGNORED]
    if extra:
        raise ModelError(
            f"{model_dir}: unexpected tensor {extra[0]!r} for {cfg.architecture} "
            f"({len(extra)} unexpected in all: {extra[:5]}); rlx does not know what it is for"
        )
    out: dict[str, np.ndarray] = {}
    maps: dict[Path, np.memmap] = {}
    for k, (shape, kind) in want.items():
        path, entry, start = found[k]
        got = tuple(entry.get("shape", ()))
        if got != shape:
            raise ModelError(
                f"{path}: tensor {k!r} has shape {list(got)}, expected {list(shape)} from "
                f"config.json ({cfg.architecture})"
            )
        if entry.get("dtype") not in ("F32", "F16", "BF16", "F64"):
            raise ModelError(
                f"{path}: tensor {k!r} has dtype {entry.get('dtype')}, expected a float "
                "(F32, F16, BF16)"
            )
        if path not in maps:
            maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        lo, hi = entry["data_offsets"]
        raw = maps[path][start + lo : start + hi]
        arr = np.ndarray(shape, dtype=_dtype(entry["dtype"]), buffer=raw)
        arr = arr.astype(np.float32, copy=False)  # f32: a read-only view of the file
        if kind == "L":
            out[k] = np.ascontiguousarray(arr.T)
        elif kind == "P":
            out[k] = np.ascontiguousarray(arr.reshape(shape[0], -1).T)
        elif kind == "Q":
            base = k.rsplit(".", 1)[0]
            suffix = "weight" if k.endswith("weight") else "bias"
            for part, chunk in zip("qkv", np.split(arr, 3, axis=0), strict=True):
                out[f"{base}.{part}_proj.{suffix}"] = np.ascontiguousarray(
                    chunk.T if suffix == "weight" else chunk
                )
        else:
            out[k] = arr
    return out
