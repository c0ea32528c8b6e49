"""Decoder-only language models from GGUF files and Hugging Face directories. In: a
``.gguf`` path or a directory (config.json + safetensors + tokenizer.json). Out:
:class:`LlmModel` with ``generate(prompt, ...)`` (text, ids and tokens/s), token-level
``prefill`` / ``step`` / ``logits``, and the compiled rlx graph.

``config.py``: the architecture table and the config read from metadata; ``graph.py``:
the decoder as one graph over the packed GGUF weights with a KV cache in the runtime;
``model.py``: compile once, run prefill and decode steps; ``batch.py``: batched decode
(``LlmModel.batched``: N KV-cache slots, one compiled step per token for all of them);
``speculative.py``: speculative decoding (``generate(..., draft=model | "ngram")``);
``hf.py`` / ``hf_tokenizer.py``: Hugging Face directories as the same config and
GGUF-named tensors (docs/gguf.md); ``sampling.py``: greedy /
temperature / top-k / top-p; ``generate.py``: the generation loop (stop tokens and strings,
streaming). Needs the ``llm`` extra (the ``gguf`` package).
"""

from __future__ import annotations

from pathlib import Path

from rlx.models.llm.config import ARCHS, ArchSpec, LlmConfig, read_config
from rlx.models.llm.model import LlmModel, SequenceState, StepTimes, open_model
from rlx.models.llm.sampling import SamplingParams

__all__ = [
    "load",
    "LlmModel",
    "LlmConfig",
    "ArchSpec",
    "ARCHS",
    "SamplingParams",
    "SequenceState",
    "StepTimes",
    "read_config",
]


def load(
    path: str | Path,
    max_context: int | None = None,
    num_threads: int | None = None,
    kv_dtype: str = "f32",
    precision: str | None = None,
    kv_group: int = 0,
) -> LlmModel:
    """The decoder in GGUF file ``path`` (or Hugging Face directory ``path``: Llama /
    Mistral, Qwen2, Qwen3, Gemma 3; see docs/gguf.md), compiled for the CPU with a KV cache of
    ``max_context`` positions (None: 2048, or the model's context length when smaller)
    stored as ``kv_dtype`` ("f32", or "bf16" / "f16": half the memory, see docs/gguf.md
    for the accuracy; "int8": a quarter plus per-row, per-head scales,
    benchmarks/results/BENCHMARKS_kv_int8.md; ``kv_group`` > 0: one int8 scale per that
    many values of a head instead, e.g. 32) and ``num_threads`` threads (None: physical cores).
    ``precision`` (a Hugging Face directory only): quantize the weights while loading,
    ``"int8"`` / ``"int4"`` (Int8Block / Int4Block) or a GGUF type such as ``"q8_0"``,
    ``"q4_k"`` (:data:`rlx.models.llm.quantize.PRECISIONS`); the model's
    ``quantization`` reports what was done and ``quantization_error(ids)`` the logit
    error against the unquantized weights.
    ModelError for an unsupported architecture or a missing tensor; InputError for an
    unknown ``kv_dtype`` or ``precision``."""
    return open_model(
        path,
        max_context=max_context,
        num_threads=num_threads,
        kv_dtype=kv_dtype,
        precision=precision,
        kv_group=kv_group,
    )
