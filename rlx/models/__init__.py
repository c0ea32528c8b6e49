"""Model graphs: synthetic transformer encoders/decoders for benchmarks and tests, and
real Hugging Face encoders (``rlx.models.hf.load``) with sentence embeddings
(:class:`SentenceEncoder`) and cross-encoder rerankers (:class:`Reranker`), both loaded
on first use: they need the ``hf`` extra."""

from __future__ import annotations

import importlib
from typing import Any

from rlx.models.synthetic import decoder, encoder, random_inputs, random_params, rope_tables

__all__ = [
    "encoder",
    "decoder",
    "random_params",
    "random_inputs",
    "rope_tables",
    "SentenceEncoder",
    "Reranker",
    "ImageTextEncoder",
    "ImageClassifier",
]

_LAZY = {"SentenceEncoder": "rlx.models.sentence", "Reranker": "rlx.models.rerank"}
_LAZY |= dict.fromkeys(("ImageTextEncoder", "ImageClassifier"), "rlx.models.vision")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlx.models' has no attribute {name!r}")
