"""GGUF tensor types and :class:`GgufTensor`. In: a ggml type id, the dims as the file
stores them (``ne``, fastest first) and the tensor's bytes. Out: a tensor in rlx terms:
numpy-order shape (``ne`` reversed: a weight used as ``y = x @ W.T`` has shape
``(out, in)``), the :class:`~rlx.formats.schemes.QuantScheme` variant of its block layout
(None for the plain types), its raw data (zero copy) and the decoded f32 values.

Types rlx maps: the float types F32, F16, BF16, F64 and the integer types I8..I64 (plain
arrays, no scheme) and the block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q8_K (the GGUF
schemes of :mod:`rlx.formats.schemes`, decoded by :mod:`rlx.formats.gguf`). Any other type
(Q8_1, IQ*, TQ*, MXFP4, ...) is a :class:`~rlx.errors.GgufError` naming it and the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from rlx.errors import GgufError
from rlx.formats.gguf import dequantize_blocks
from rlx.formats.schemes import GGUF_TYPES, QuantScheme

__all__ = ["GgufTensor", "PLAIN_TYPES", "BLOCK_TYPES", "TYPE_NAMES", "type_layout"]

#: ggml type id -> name, for every type the format defines (unmapped ones included, so
#: an error can name them). Mirrors ``gguf.constants.GGMLQuantizationType``.
TYPE_NAMES: dict[int, str] = {}

#: plain (unblocked) type name -> numpy dtype of one element
PLAIN_TYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype("<f8"),
    "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
}

#: block type name -> (elements per block, bytes per block), from the rlx schemes
BLOCK_TYPES: dict[str, tuple[int, int]] = {t.name: (t.qk, t.block_bytes) for t in GGUF_TYPES}


def _load_type_names() -> None:
    from gguf.constants import GGMLQuantizationType

    TYPE_NAMES.update({t.value: t.name for t in GGMLQuantizationType})


_load_type_names()


def type_layout(type_id: int, tensor: str) -> tuple[str, int, int]:
    """ggml type id -> (name, elements per block, bytes per block); GgufError naming the
    type and ``tensor`` for a type rlx does not map."""
    name = TYPE_NAMES.get(type_id)
    if name is None:
        raise GgufError(f"tensor {tensor!r}: unknown ggml type id {type_id}")
    if name in PLAIN_TYPES:
        return name, 1, PLAIN_TYPES[name].itemsize
    if name in BLOCK_TYPES:
        return (name, *BLOCK_TYPES[name])
    mapped = sorted([*PLAIN_TYPES, *BLOCK_TYPES])
    raise GgufError(
        f"tensor {tensor!r}: ggml type {name} (id {type_id}) is not supported by rlx; "
        f"supported types: {', '.join(mapped)}"
    )


@dataclass(frozen=True, eq=False)
class GgufTensor:
    """One tensor of a GGUF file.

    ``shape`` is in numpy order (the file's ``ne`` reversed). ``data`` is a read-only
    zero-copy view of the file: a typed array of ``shape`` for the plain types, else the
    u8 blocks as ``(*shape[:-1], row_bytes)``. ``scheme`` is the rlx GGUF scheme (None
    for the plain types). ``offset`` is the absolute byte offset in the file.
    """

    name: str
    type_name: str
    shape: tuple[int, ...]
    scheme: QuantScheme | None
    data: np.ndarray = field(repr=False)
    offset: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies in the file."""
        return int(self.data.nbytes)

    @property
    def n_elements(self) -> int:
        """Number of elements (product of ``shape``)."""
        return int(np.prod(self.shape, dtype=np.int64))

    def dequantize(self) -> np.ndarray:
        """The values as a new f32 array of ``shape`` (decoded exactly as ggml does)."""
        if self.scheme is None:
            return np.asarray(self.data, dtype=np.float32).reshape(self.shape).copy()
        with np.errstate(over="ignore", invalid="ignore"):
            return dequantize_blocks(self.scheme, self.data).reshape(self.shape)

    def packed(self) -> tuple[np.ndarray, ...]:
        """The inputs ``DequantMatMul(scheme)`` takes after ``x``: ``(packed,)`` with
        packed the u8 ``[N, K / qk * block_bytes]`` rows of this ``(N, K)`` weight, a
        zero-copy view of the file (the GGUF bytes are rlx's layout). Leading dims of a
        tensor of rank > 2 fold into N. GgufError for a plain type (no packed form: use
        ``data`` or ``dequantize()``)."""
        if self.scheme is None:
            raise GgufError(
                f"tensor {self.name!r} is {self.type_name}, not a block-quantized type: it "
                f"has no packed form (use .data or .dequantize())"
            )
        if len(self.shape) < 2:
            raise GgufError(
                f"tensor {self.name!r}: a packed weight needs rank >= 2 [N, K], the tensor "
                f"has shape {list(self.shape)}"
            )
        return (self.data.reshape(-1, self.data.shape[-1]),)
