"""Model arguments of ``rlx serve`` -> services. An argument is ``MODEL`` or ``ID=MODEL``;
MODEL is a Hugging Face sentence-embedding directory (an :class:`EmbeddingService`), a
``.gguf`` file or a Hugging Face decoder directory (``config.json`` naming an architecture
of :data:`rlx.models.llm.hf.HF_ARCHITECTURES`: a ``GenerationService`` of
:mod:`rlx.serve.generation`) or a name that
:mod:`rlx.models.known` resolves. The id defaults to the known model's name, the
directory's name or the GGUF file's stem. Paths and names are checked here, at once;
compiling happens when the app starts (in a thread per model, ``/health`` says
``loading`` meanwhile) unless ``background=False``."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlx.errors import ServeError
from rlx.serve.config import ServeConfig
from rlx.serve.embeddings import SHAPE_PLANS, EmbeddingService, worker_layout
from rlx.serve.service import Service

__all__ = ["load_services", "split_id"]


def split_id(arg: str) -> tuple[str | None, str]:
    """``"ID=MODEL"`` -> (ID, MODEL); a bare MODEL (or an existing path with ``=``) -> (None, MODEL)."""
    head, sep, tail = arg.partition("=")
    if sep and head and "/" not in head and not Path(arg).exists():
        return head, tail
    return None, arg


def _generation(path: Path, id: str, config: ServeConfig) -> Service:
    try:
        module = importlib.import_module("rlx.serve.generation")
    except ModuleNotFoundError as e:
        if e.name != "rlx.serve.generation":
            raise
        raise ServeError(
            f"{path}: serving GGUF models needs rlx.serve.generation, which this rlx lacks"
        ) from None
    service: Service = module.GenerationService(path, id, config)
    return service


def _embedding(path: Path, id: str, config: ServeConfig, background: bool) -> Service:
    from rlx.models import SentenceEncoder
    from rlx.models.hf.config import read_config
    from rlx.models.hf.layout import read_layout

    read_config(read_layout(path).transformer_dir)  # a ModelError now, not after startup

    def load() -> Any:
        precision = config.precision.value
        threads = config.num_threads
        if precision != "int8":  # int8 runs one batcher (its graph comes from calibration)
            threads = worker_layout(config)[1]
        return SentenceEncoder(path, precision, threads, max_shape_plans=SHAPE_PLANS)

    return EmbeddingService(load if background else load(), id, config)


def _is_decoder(folder: Path) -> bool:
    """Whether ``folder`` is a Hugging Face decoder rlx.models.llm builds (config.json's
    ``architectures``), not a sentence-embedding model."""
    import json

    from rlx.models.llm.hf import HF_ARCHITECTURES

    try:
        archs = json.loads((folder / "config.json").read_text(encoding="utf-8"))["architectures"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(archs, list) and any(a in HF_ARCHITECTURES for a in archs)


def load_services(
    models: Sequence[str], config: ServeConfig, *, background: bool = True
) -> list[Service]:
    """One service per model argument (see the module docstring); ServeError for an id
    given twice, ModelError for a model that cannot be found."""
    from rlx.models.known import find, resolve

    if not models:
        raise ServeError("no model given: pass at least one MODEL (a directory, .gguf or name)")
    out: list[Service] = []
    for arg in models:
        given_id, spec = split_id(arg)
        path = Path(spec)
        if path.suffix.lower() == ".gguf" and not path.is_dir():
            if not path.is_file():
                raise ServeError(f"model {spec!r}: no such GGUF file")
            service = _generation(path, given_id or path.stem, config)
        elif path.is_dir() and _is_decoder(path):
            service = _generation(path, given_id or path.resolve().name, config)
        else:
            directory = resolve(spec)
            known = find(spec) if not path.is_dir() else None
            default = known.name if known is not None else directory.resolve().name
            service = _embedding(directory, given_id or default, config, background)
        if any(s.id == service.id for s in out):
            raise ServeError(
                f"two models have the id {service.id!r}; name one with ID=MODEL (e.g. other={spec})"
            )
        out.append(service)
    return out
