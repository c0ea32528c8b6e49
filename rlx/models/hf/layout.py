"""sentence-transformers directory layout. In: a model directory. Out: :class:`StLayout`:
where the transformer lives, how token vectors are pooled and whether the result is
L2-normalized, read from ``modules.json`` and the pooling module's ``config.json``.

Supported modules: ``Transformer`` (its ``path``, "" for the directory itself),
``Pooling`` (exactly one of the cls / mean / max / mean-sqrt-len modes) and
``Normalize``; any other module (``Dense``, ``LayerNorm``, ...) is a ModelError naming it.
A directory without ``modules.json`` is a plain Hugging Face model: mean pooling, not
normalized (what sentence-transformers itself does with one).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path

from rlx.errors import ModelError
from rlx.models.hf.config import read_json

__all__ = ["Pooling", "StLayout", "read_layout"]


class Pooling(enum.Enum):
    """How token vectors become one sentence vector (padding excluded)."""

    MEAN = "mean"
    CLS = "cls"
    MAX = "max"
    MEAN_SQRT_LEN = "mean_sqrt_len"


_MODES = {
    "pooling_mode_mean_tokens": Pooling.MEAN,
    "pooling_mode_cls_token": Pooling.CLS,
    "pooling_mode_max_tokens": Pooling.MAX,
    "pooling_mode_mean_sqrt_len_tokens": Pooling.MEAN_SQRT_LEN,
}
_UNSUPPORTED_MODES = ("pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
_ST = "sentence_transformers.models."


@dataclass(frozen=True, slots=True)
class StLayout:
    """``transformer_dir``: the Hugging Face model; ``pooling``; ``normalize``."""

    transformer_dir: Path
    pooling: Pooling
    normalize: bool


def _pooling(path: Path) -> Pooling:
    cfg = read_json(path, "pooling")
    bad = [k for k in _UNSUPPORTED_MODES if cfg.get(k)]
    on = [mode for key, mode in _MODES.items() if cfg.get(key)]
    if bad or len(on) != 1:
        given = [k for k in (*_MODES, *_UNSUPPORTED_MODES) if cfg.get(k)]
        raise ModelError(
            f"{path}: pooling modes {given or 'none'} are not supported; rlx supports "
            f"exactly one of {list(_MODES)}"
        )
    return on[0]


def read_layout(model_dir: Path) -> StLayout:
    """The layout of ``model_dir`` (see the module docstring)."""
    mpath = model_dir / "modules.json"
    if not mpath.is_file():
        return StLayout(model_dir, Pooling.MEAN, False)
    try:
        mods = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{mpath}: not valid JSON ({e})") from None
    if not isinstance(mods, list) or not all(isinstance(m, dict) for m in mods):
        raise ModelError(f"{mpath}: expected a list of module objects")
    transformer = pooling = None
    normalize = False
    for m in mods:
        kind = str(m.get("type", ""))
        short = kind.removeprefix(_ST)
        sub = model_dir / str(m.get("path", ""))
        if short == "Transformer" and transformer is None:
            transformer = sub
        elif short == "Pooling" and pooling is None and transformer is not None:
            pooling = _pooling(sub / "config.json")
        elif short == "Normalize" and pooling is not None:
            normalize = True
        else:
            raise ModelError(
                f"{mpath}: module {m.get('name', '?')!r} of type {kind!r} is not supported "
                f"here; rlx supports Transformer, then Pooling, then optionally Normalize"
            )
    if transformer is None or pooling is None:
        raise ModelError(f"{mpath}: needs a Transformer module followed by a Pooling module")
    return StLayout(transformer, pooling, normalize)
