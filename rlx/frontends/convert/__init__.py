"""Conversion between Hugging Face decoder directories and GGUF files, both ways.

* :func:`hf_to_gguf`: In: a directory :func:`rlx.models.llm.load` reads (Llama / Mistral,
  Qwen2, Qwen3, Gemma 2 / 3: config.json, safetensors, tokenizer.json,
  tokenizer_config.json).
  Out: a GGUF file as llama.cpp's ``convert_hf_to_gguf.py`` writes it: llama.cpp's
  metadata keys and tensor names, Llama's q / k rows permuted for its adjacent-pair rope,
  Gemma's norms stored as ``1 + w`` (Gemma 2's soft-capping as
  ``gemma2.attn_logit_softcapping`` / ``final_logit_softcapping``), the tokenizer
  (tokens, token types, merges or scores, special ids, flags) and the chat template. Weights are written as a
  :class:`GgufType` (f32, f16, bf16, q8_0, q4_k_m), quantized with rlx's packers
  (:func:`rlx.gguf.save`).
* :func:`gguf_to_hf`: In: a GGUF file of one of those architectures. Out: a directory
  transformers loads (``AutoModelForCausalLM`` / ``AutoTokenizer``): config.json,
  generation_config.json, model.safetensors (weights dequantized with gguf-py, written
  as f32, f16 or bf16), tokenizer.json (built with the ``tokenizers`` library from the
  GGUF vocabulary) and tokenizer_config.json with the chat template.

Both write into a temporary name beside the destination and rename it at the end, so a
failure or an interrupt leaves no partial output; an existing destination is an error
unless ``force``. Large tensors tick a tqdm bar on stderr (when tqdm is installed and
stderr is a terminal).

The ``q4_k_m`` mix follows llama.cpp's ``llama_tensor_get_type`` for Q4_K_M: the output
projection (the token embedding when they are tied) is Q6_K; ``attn_v`` and
``ffn_down`` are Q6_K in the first and last eighth of the layers and every third layer
between, Q4_K elsewhere; every other matrix is Q4_K; 1-D tensors (norms, biases) stay
F32. A matrix whose rows are not a multiple of 256 falls back as llama.cpp's does (Q4_K
-> Q5_0, Q6_K -> Q8_0), and to F16 when not a multiple of 32 (q8_0 likewise).
"""

from __future__ import annotations

import os
from pathlib import Path

from rlx.errors import InputError
from rlx.frontends.convert.common import SUPPORTED_ARCHITECTURES, ConvertResult, GgufType, HfType
from rlx.frontends.convert.to_gguf import hf_to_gguf, q4_k_m_types
from rlx.frontends.convert.to_hf import gguf_to_hf

__all__ = [
    "GgufType",
    "HfType",
    "ConvertResult",
    "convert",
    "hf_to_gguf",
    "gguf_to_hf",
    "q4_k_m_types",
    "SUPPORTED_ARCHITECTURES",
]


def convert(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    type: str | GgufType | HfType | None = None,
    force: bool = False,
    progress: bool | None = None,
) -> ConvertResult:
    """``src`` a Hugging Face directory -> the GGUF file ``dest`` (:func:`hf_to_gguf`,
    ``type`` default f16); ``src`` a GGUF file -> the Hugging Face directory ``dest``
    (:func:`gguf_to_hf`, ``type`` default f32). InputError for a missing ``src``."""
    s = Path(src)
    if s.is_dir():
        to_gguf = GgufType.F16 if type is None else type
        if isinstance(to_gguf, HfType):
            to_gguf = to_gguf.value
        return hf_to_gguf(s, dest, to_gguf, force, progress)
    if s.is_file():
        to_hf = HfType.F32 if type is None else type
        if isinstance(to_hf, GgufType):
            to_hf = to_hf.value
        return gguf_to_hf(s, dest, to_hf, force, progress)
    raise InputError(
        f"{s} does not exist (expected a Hugging Face model directory or a .gguf file)"
    )
