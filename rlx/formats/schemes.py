"""Weight quantization schemes. In: a packed weight plus (for the integer schemes) its
block scales and zero points. Out: the f32 weight it stands for (``dequantize_weight``).

A :class:`QuantScheme` variant is a frozen dataclass saying how ``DequantMatMul``'s weight
inputs are laid out; every scheme stores the weight **row-major by output channel** (row
``n`` holds the ``K`` input weights of output ``n``, as llama.cpp and GPTQ do) and blocks
run along K. The GGUF layouts (the legacy 32-element blocks Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
and the 256-element K-quants Q2_K..Q8_K) are decoded by :mod:`rlx.formats.gguf`; each GGUF
variant names its ggml type (``ggml_type``, ``gguf_name``) and ``GGUF_SCHEMES`` maps the
type names to the variants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rlx.dtype import DType

__all__ = [
    "QuantScheme",
    "Int8Block",
    "Int8BlockAsym",
    "Int4Block",
    "Fp8E4m3",
    "Fp8E5m2",
    "GgufQ4K",
    "GgufQ5K",
    "GgufQ6K",
    "GgufQ8K",
    "GgufQ4_0",
    "GgufQ4_1",
    "GgufQ5_0",
    "GgufQ5_1",
    "GgufQ8_0",
    "GgufQ2K",
    "GgufQ3K",
    "GGUF_SCHEMES",
    "WEIGHT_DTYPES",
    "dequantize_weight",
]


class QuantScheme:
    """How a packed weight is laid out. Subclasses are frozen dataclasses (the variants).

    Every scheme stores the weight **row-major by output channel**: row ``n`` holds the
    ``K`` input weights of output ``n`` (as llama.cpp and GPTQ do), blocks run along K.
    """

    __slots__ = ()
    is_gguf: ClassVar[bool] = False
    bits_per_elem_x10: ClassVar[int] = 80

    @property
    def block_size(self) -> int | None:
        """Elements per block along K (None for per-tensor schemes)."""
        return None

    def num_inputs(self) -> int:
        """DequantMatMul arity: 2 for GGUF (x, packed bytes), else 4 (x, w_q, scale, zp)."""
        return 2 if self.is_gguf else 4

    def __str__(self) -> str:
        bs = self.block_size
        name = type(self).__name__
        return f"{name}({bs})" if bs is not None and not self.is_gguf else name


@dataclass(frozen=True, slots=True)
class Int8Block(QuantScheme):
    """Symmetric INT8 (GPTQ-style): w_q I8 [N, K], scale F32 [N, K/bs], zp I32 [N, K/bs]
    (zeros); ``w = (w_q - zp) * scale`` per block."""

    block_size: int = 32  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Int8BlockAsym(QuantScheme):
    """INT8 with a per-block zero point: as :class:`Int8Block` with non-zero ``zp``."""

    block_size: int = 32  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Int4Block(QuantScheme):
    """INT4, two per byte: w_q U8 [N, K/2] (low nibble = even k, high nibble = odd k,
    unsigned 0..15), scale F32 [N, K/bs], zp I32 [N, K/bs] (8 for symmetric)."""

    bits_per_elem_x10: ClassVar[int] = 40
    block_size: int = 32  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Fp8E4m3(QuantScheme):
    """Per-tensor FP8 E4M3: w_q F8E4M3 [N, K], scale F32 [1], zp I32 [1] (zero)."""


@dataclass(frozen=True, slots=True)
class Fp8E5m2(QuantScheme):
    """Per-tensor FP8 E5M2: w_q F8E5M2 [N, K], scale F32 [1], zp I32 [1] (zero)."""


class _Gguf(QuantScheme):
    """A llama.cpp block layout: packed U8 ``[N, K / qk * block_bytes]`` (scales inside)."""

    __slots__ = ()
    is_gguf: ClassVar[bool] = True
    block_bytes: ClassVar[int] = 0
    qk: ClassVar[int] = 256  # elements per block (32 for the legacy types)
    ggml_type: ClassVar[int] = -1  # the GGMLQuantizationType value
    gguf_name: ClassVar[str] = ""  # the GGMLQuantizationType name

    @property
    def block_size(self) -> int:
        return self.qk

    def row_bytes(self, k: int) -> int:
        """Packed bytes of one row of ``k`` elements (``k`` a multiple of ``qk``)."""
        return k // self.qk * self.block_bytes


@dataclass(frozen=True, slots=True)
class GgufQ4_0(_Gguf):  # noqa: N801 (the ggml type name)
    """llama.cpp block_q4_0 (18 bytes per 32): half d; u8 qs[16]; ``y = d * (q - 8)``."""

    bits_per_elem_x10: ClassVar[int] = 45
    block_bytes: ClassVar[int] = 18
    qk: ClassVar[int] = 32
    ggml_type: ClassVar[int] = 2
    gguf_name: ClassVar[str] = "Q4_0"


@dataclass(frozen=True, slots=True)
class GgufQ4_1(_Gguf):  # noqa: N801
    """llama.cpp block_q4_1 (20 bytes per 32): half d, m; u8 qs[16]; ``y = d * q + m``."""

    bits_per_elem_x10: ClassVar[int] = 50
    block_bytes: ClassVar[int] = 20
    qk: ClassVar[int] = 32
    ggml_type: ClassVar[int] = 3
    gguf_name: ClassVar[str] = "Q4_1"


@dataclass(frozen=True, slots=True)
class GgufQ5_0(_Gguf):  # noqa: N801
    """llama.cpp block_q5_0 (22 bytes per 32): half d; u32 qh; u8 qs[16];
    ``y = d * (q - 16)``."""

    bits_per_elem_x10: ClassVar[int] = 55
    block_bytes: ClassVar[int] = 22
    qk: ClassVar[int] = 32
    ggml_type: ClassVar[int] = 6
    gguf_name: ClassVar[str] = "Q5_0"


@dataclass(frozen=True, slots=True)
class GgufQ5_1(_Gguf):  # noqa: N801
    """llama.cpp block_q5_1 (24 bytes per 32): half d, m; u32 qh; u8 qs[16];
    ``y = d * q + m``."""

    bits_per_elem_x10: ClassVar[int] = 60
    block_bytes: ClassVar[int] = 24
    qk: ClassVar[int] = 32
    ggml_type: ClassVar[int] = 7
    gguf_name: ClassVar[str] = "Q5_1"


@dataclass(frozen=True, slots=True)
class GgufQ8_0(_Gguf):  # noqa: N801
    """llama.cpp block_q8_0 (34 bytes per 32): half d; i8 qs[32]; ``y = d * q``."""

    bits_per_elem_x10: ClassVar[int] = 85
    block_bytes: ClassVar[int] = 34
    qk: ClassVar[int] = 32
    ggml_type: ClassVar[int] = 8
    gguf_name: ClassVar[str] = "Q8_0"


@dataclass(frozen=True, slots=True)
class GgufQ2K(_Gguf):
    """llama.cpp block_q2_K (84 bytes per 256): packed U8 [N, K/256*84]."""

    bits_per_elem_x10: ClassVar[int] = 26
    block_bytes: ClassVar[int] = 84
    ggml_type: ClassVar[int] = 10
    gguf_name: ClassVar[str] = "Q2_K"


@dataclass(frozen=True, slots=True)
class GgufQ3K(_Gguf):
    """llama.cpp block_q3_K (110 bytes per 256): packed U8 [N, K/256*110]."""

    bits_per_elem_x10: ClassVar[int] = 34
    block_bytes: ClassVar[int] = 110
    ggml_type: ClassVar[int] = 11
    gguf_name: ClassVar[str] = "Q3_K"


@dataclass(frozen=True, slots=True)
class GgufQ4K(_Gguf):
    """llama.cpp block_q4_K (144 bytes per 256): packed U8 [N, K/256*144]."""

    bits_per_elem_x10: ClassVar[int] = 45
    block_bytes: ClassVar[int] = 144
    ggml_type: ClassVar[int] = 12
    gguf_name: ClassVar[str] = "Q4_K"


@dataclass(frozen=True, slots=True)
class GgufQ5K(_Gguf):
    """llama.cpp block_q5_K (176 bytes per 256): packed U8 [N, K/256*176]."""

    bits_per_elem_x10: ClassVar[int] = 55
    block_bytes: ClassVar[int] = 176
    ggml_type: ClassVar[int] = 13
    gguf_name: ClassVar[str] = "Q5_K"


@dataclass(frozen=True, slots=True)
class GgufQ6K(_Gguf):
    """llama.cpp block_q6_K (210 bytes per 256): packed U8 [N, K/256*210]."""

    bits_per_elem_x10: ClassVar[int] = 66
    block_bytes: ClassVar[int] = 210
    ggml_type: ClassVar[int] = 14
    gguf_name: ClassVar[str] = "Q6_K"


@dataclass(frozen=True, slots=True)
class GgufQ8K(_Gguf):
    """llama.cpp block_q8_K (292 bytes per 256): packed U8 [N, K/256*292]."""

    bits_per_elem_x10: ClassVar[int] = 91
    block_bytes: ClassVar[int] = 292
    ggml_type: ClassVar[int] = 15
    gguf_name: ClassVar[str] = "Q8_K"


#: ggml type name (``"Q4_K"``) -> the GGUF scheme variant
GGUF_SCHEMES: dict[str, type[QuantScheme]] = {
    c.gguf_name: c
    for c in (
        GgufQ4_0, GgufQ4_1, GgufQ5_0, GgufQ5_1, GgufQ8_0,
        GgufQ2K, GgufQ3K, GgufQ4K, GgufQ5K, GgufQ6K, GgufQ8K,
    )
}  # fmt: skip


WEIGHT_DTYPES: dict[type, tuple[DType, ...]] = {
    Int8Block: (DType.I8,),
    Int8BlockAsym: (DType.I8,),
    Int4Block: (DType.U8,),
    Fp8E4m3: (DType.F8E4M3,),
    Fp8E5m2: (DType.F8E5M2,),
}


def dequantize_weight(
    scheme: QuantScheme,
    w_q: np.ndarray,
    scale: np.ndarray | None = None,
    zp: np.ndarray | None = None,
) -> np.ndarray:
    """Decode a packed weight to f32 ``[N, K]`` (rows = output channels)."""
    if scheme.is_gguf:
        from rlx.formats.gguf import dequantize_rows

        return dequantize_rows(scheme, w_q)
    assert scale is not None and zp is not None
    if isinstance(scheme, (Fp8E4m3, Fp8E5m2)):
        return (w_q.astype(np.float32) - np.float32(zp.reshape(-1)[0])) * scale.astype(
            np.float32
        ).reshape(-1)[0]
    if isinstance(scheme, Int4Block):
        lo = (w_q & 0x0F).astype(np.int32)
        hi = (w_q >> 4).astype(np.int32)
        q = np.stack([lo, hi], axis=-1).reshape(w_q.shape[0], -1)
    else:
        q = w_q.astype(np.int32)
    bs = scheme.block_size
    n, k = q.shape
    qb = q.reshape(n, k // bs, bs) - zp.astype(np.int32)[:, :, None]
    return (qb.astype(np.float32) * scale.astype(np.float32)[:, :, None]).reshape(n, k)
