"""sentence-transformers directory layout. In: a model directory. Out: :class:`StLayout`:
where the transformer lives, how token vectors are pooled, whether the result is
L2-normalized and which prompts the model declares, read from ``modules.json``, the pooling
module's ``config.json`` and ``config_sentence_transformers.json``.

Supported modules: ``Transformer`` (its ``path``, "" for the directory itself),
``Pooling`` (exactly one mode of :class:`Pooling`, given as sentence-transformers 6's
``pooling_mode`` or the older ``pooling_mode_<mode>`` flags) and ``Normalize``; any other
module (``Dense``, ``LayerNorm``, ...) or pooling mode is a ModelError naming it and what is
supported. ``prompts`` (name -> text prepended to each input) and ``default_prompt_name``
come from ``config_sentence_transformers.json``. A directory without ``modules.json`` is a
plain Hugging Face model: mean pooling, not normalized, no prompts (what
sentence-transformers itself does with one).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path

from rlx.errors import InputError, ModelError
from rlx.models.hf.config import read_json

__all__ = ["Pooling", "StLayout", "read_layout", "read_prompts", "resolve_prompt"]


class Pooling(enum.Enum):
    """How token vectors become one sentence vector (padding excluded)."""

    MEAN = "mean"
    CLS = "cls"
    MAX = "max"
    MEAN_SQRT_LEN = "mean_sqrt_len"
    WEIGHTED_MEAN = "weightedmean"
    LAST_TOKEN = "lasttoken"


#: sentence-transformers' ``pooling_mode`` names, and the older boolean config keys.
_MODES = {
    "mean": Pooling.MEAN,
    "cls": Pooling.CLS,
    "max": Pooling.MAX,
    "mean_sqrt_len_tokens": Pooling.MEAN_SQRT_LEN,
    "weightedmean": Pooling.WEIGHTED_MEAN,
    "lasttoken": Pooling.LAST_TOKEN,
}
_FLAGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_ST = "sentence_transformers."  # module types are class paths under it (any sub-package)


@dataclass(frozen=True, slots=True)
class StLayout:
    """``transformer_dir``: the Hugging Face model; ``pooling``; ``normalize``;
    ``prompts``: (name, text) pairs; ``default_prompt_name``: the prompt applied when the
    caller names none (None: no prompt); ``include_prompt``: whether prompt tokens are
    pooled (sentence-transformers' Pooling option)."""

    transformer_dir: Path
    pooling: Pooling
    normalize: bool
    prompts: tuple[tuple[str, str], ...] = ()
    default_prompt_name: str | None = None
    include_prompt: bool = True


def _pooling(path: Path) -> tuple[Pooling, bool]:
    """The one pooling mode and ``include_prompt`` of a Pooling module's config."""
    cfg = read_json(path, "pooling")
    mode = cfg.get("pooling_mode")
    if mode is not None:
        given = [mode] if isinstance(mode, str) else mode
        if not isinstance(given, list) or not all(isinstance(m, str) for m in given):
            raise ModelError(
                f"{path}: pooling_mode must be a name or a list of names, got {mode!r}"
            )
        shown = given
    else:
        shown = [k for k in _FLAGS if cfg.get(k)]
        given = [_FLAGS[k] for k in shown]
    if len(given) != 1 or given[0] not in _MODES:
        raise ModelError(
            f"{path}: pooling modes {shown or 'none'} are not supported; rlx supports "
            f"exactly one of {list(_MODES)} (older configs: {list(_FLAGS)})"
        )
    include = cfg.get("include_prompt", True)
    if not isinstance(include, bool):
        raise ModelError(f"{path}: include_prompt must be true or false, got {include!r}")
    return _MODES[given[0]], include


def read_prompts(model_dir: Path) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """``prompts`` ((name, text) pairs) and ``default_prompt_name`` of
    ``model_dir/config_sentence_transformers.json`` (none when the file is absent)."""
    path = model_dir / "config_sentence_transformers.json"
    if not path.is_file():
        return (), None
    cfg = read_json(path, "sentence-transformers config")
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ModelError(f"{path}: prompts must map names to strings, got {prompts!r}")
    default = cfg.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ModelError(
            f"{path}: default_prompt_name {default!r} is not one of the prompts {list(prompts)}"
        )
    return tuple(prompts.items()), default


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
    normalize, include = False, True
    for m in mods:
        kind = str(m.get("type", ""))
        short = kind.rsplit(".", 1)[-1] if kind.startswith(_ST) else kind
        sub = model_dir / str(m.get("path", ""))
        if short == "Transformer" and transformer is None:
            transformer = sub
        elif short == "Pooling" and pooling is None and transformer is not None:
            pooling, include = _pooling(sub / "config.json")
        elif short == "Normalize" and pooling is not None:
            normalize = True
        else:
            raise ModelError(
                f"{mpath}: module {m.get('name', '?')!r} of type {kind!r} is not supported "
                f"here; rlx supports Transformer, then Pooling, then optionally Normalize"
            )
    if transformer is None or pooling is None:
        raise ModelError(f"{mpath}: needs a Transformer module followed by a Pooling module")
    prompts, default = read_prompts(model_dir)
    return StLayout(transformer, pooling, normalize, prompts, default, include)


def resolve_prompt(
    prompts: dict[str, str],
    default_name: str | None,
    prompt_name: str | None = None,
    prompt: str | None = None,
) -> str:
    """The text to prepend, as sentence-transformers resolves it: ``prompt`` when given
    (``prompt_name`` then ignored), else the prompt named ``prompt_name`` (InputError
    listing ``prompts`` when none has that name), else the default prompt, else ""."""
    if prompt is not None:
        if not isinstance(prompt, str):
            raise InputError(f"prompt must be a str, got {type(prompt).__name__}")
        return prompt
    if prompt_name is not None:
        if prompt_name not in prompts:
            raise InputError(
                f"prompt_name {prompt_name!r} is not one of the model's prompts "
                f"{list(prompts)} (config_sentence_transformers.json)"
            )
        return prompts[prompt_name]
    return prompts.get(default_name, "") if default_name is not None else ""
