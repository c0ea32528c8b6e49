"""Model graphs: synthetic transformer encoders/decoders for benchmarks and tests, and
real Hugging Face encoders (``rlx.models.hf.load``) with sentence embeddings
(:class:`SentenceEncoder`, loaded on first use: it needs the ``hf`` extra)."""

from __future__ import annotations

import importlib
from typing import Any

from rlx.models.synthetic import decoder, encoder, random_inputs, random_params, rope_tables

__all__ = ["encoder", "decoder", "random_params", "random_inputs", "rope_tables", "SentenceEncoder"]


def __getattr__(name: str) -> Any:
    if name == "SentenceEncoder":
        value = importlib.import_module("rlx.models.sentence").SentenceEncoder
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlx.models' has no attribute {name!r}")
