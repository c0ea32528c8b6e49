"""What both directions of :mod:`rlx.frontends.convert` share: the output types, the
result, destination checks, the progress bar, the q / k row order and the GGUF token
types."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import InputError

#: GGUF ``general.architecture`` values converted both ways.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "gemma2")


class GgufType(enum.Enum):
    """The weight type of a GGUF written from a Hugging Face directory (the value is the
    ``--type`` name)."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    Q8_0 = "q8_0"
    Q4_K_M = "q4_k_m"


class HfType(enum.Enum):
    """The dtype of the safetensors weights written from a GGUF file."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"


# llama.cpp's ``general.file_type`` (LlamaFileType) of each GgufType
_FILE_TYPE = {
    GgufType.F32: 0,
    GgufType.F16: 1,
    GgufType.Q8_0: 7,
    GgufType.Q4_K_M: 15,
    GgufType.BF16: 32,
}
# the ggml type of 2-D weights (before fallbacks); q4_k_m is a mix (q4_k_m_types)
_MATRIX_TYPE = {
    GgufType.F32: "F32",
    GgufType.F16: "F16",
    GgufType.BF16: "BF16",
    GgufType.Q8_0: "Q8_0",
}
_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
_BLOCK = {"Q4_K": 256, "Q6_K": 256, "Q5_0": 32, "Q8_0": 32}

# GGUF value types llama.cpp insists on (the writer would pick UINT32 for token types)
_VALUE_TYPES = {
    "tokenizer.ggml.token_type": "ARRAY[INT32]",
    "tokenizer.ggml.scores": "ARRAY[FLOAT32]",
}
# GGUF token types (llama.cpp's llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion wrote: ``path`` (the GGUF file or the HF directory),
    ``architecture``, and ``tensors`` (name in the written file -> its type: a ggml type
    name such as "Q4_K", or a safetensors dtype such as "F32")."""

    path: Path
    architecture: str
    tensors: dict[str, str]


def _parse_type(value: GgufType | HfType | str, kind: type[enum.Enum]) -> Any:
    if isinstance(value, kind):
        return value
    names = [str(t.value) for t in kind]
    if isinstance(value, str) and value.lower() in names:
        return kind(value.lower())
    what = "a GGUF file" if kind is GgufType else "a Hugging Face directory"
    raise InputError(f"--type {value!r} is not a type rlx writes {what} as; one of {names}")


def _check_destination(dest: Path, force: bool, file: bool) -> None:
    """InputError for an existing ``dest`` without ``force``, a directory where a
    ``file`` is written, or a missing parent directory."""
    if dest.exists() or dest.is_symlink():
        if not force:
            raise InputError(f"{dest} exists; pass force=True (--force) to replace it")
        if file and dest.is_dir():
            raise InputError(f"{dest} is a directory; a GGUF file cannot replace it")
    if not dest.parent.is_dir():
        raise InputError(f"{dest.parent} is not a directory (the destination's parent)")


def _bar(total: int, desc: str, progress: bool | None) -> Any:
    """A tqdm bar over ``total`` bytes (None: shown when stderr is a terminal; False: none;
    no bar either when tqdm is not installed)."""
    if progress is False:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(
        total=total, desc=desc, unit="B", unit_scale=True, leave=False,
        disable=None if progress is None else False,
    )  # fmt: skip


# ---- q / k row order ----------------------------------------------------------------


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Transformers' rotate-half q / k rows -> llama.cpp's adjacent-pair order (its
    converter's ``LlamaModel.permute``)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of :func:`_permute`."""
    return (
        w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )
