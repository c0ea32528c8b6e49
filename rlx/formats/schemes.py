"""Weight quantization schemes. In: a packed weight plus (for the integer schemes) its
block scales and zero points. Out: the f32 weight it stands for (``dequantize_weight``).

A :class:`QuantScheme` variant is a frozen dataclass saying how ``DequantMatMul``'s weight
inputs are laid out; every scheme stores the weight **row-major by output channel** (row
``n`` holds the ``K`` input weights of output ``n``, as llama.cpp and GPTQ do) and blocks
run along K. The GGUF layouts (the legacy 32-element blocks Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
and the 256-element K-quants Q2_K..Q8_K) are decoded by :mod:`rlx.formats.gguf`; each GGUF
variant is made from one row of the table ``GGUF_TYPES`` (its ggml type ``ggml_type`` /
``gguf_name``, ``qk``, ``block_bytes``) and ``GGUF_SCHEMES`` maps the type names to the
variants.
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
    "GGUF_TYPES",
    "GgufType",
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


@dataclass(frozen=True, slots=True)
class GgufType:
    """One llama.cpp block layout, a row of :data:`GGUF_TYPES`: its ggml type (name and
    ``GGMLQuantizationType`` value), elements and bytes per block, bits per weight x 10 and
    the block's fields (the variant's docstring)."""

    name: str
    ggml_type: int
    qk: int
    block_bytes: int
    bits_per_elem_x10: int
    layout: str

    @property
    def scheme_name(self) -> str:
        """The QuantScheme variant's name: ``Q4_0`` -> ``GgufQ4_0``, ``Q4_K`` -> ``GgufQ4K``."""
        return "Gguf" + self.name.replace("_K", "K")


#: Every GGUF block layout rlx reads (legacy qk = 32, then the K-quants, qk = 256).
GGUF_TYPES: tuple[GgufType, ...] = (
    GgufType("Q4_0", 2, 32, 18, 45, "half d; u8 qs[16]; ``y = d * (q - 8)``"),
    GgufType("Q4_1", 3, 32, 20, 50, "half d, m; u8 qs[16]; ``y = d * q + m``"),
    GgufType("Q5_0", 6, 32, 22, 55, "half d; u32 qh; u8 qs[16]; ``y = d * (q - 16)``"),
    GgufType("Q5_1", 7, 32, 24, 60, "half d, m; u32 qh; u8 qs[16]; ``y = d * q + m``"),
    GgufType("Q8_0", 8, 32, 34, 85, "half d; i8 qs[32]; ``y = d * q``"),
    GgufType("Q2_K", 10, 256, 84, 26, "u8 scales[16]; u8 qs[64]; half d, dmin"),
    GgufType("Q3_K", 11, 256, 110, 34, "u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d"),
    GgufType("Q4_K", 12, 256, 144, 45, "half d, dmin; u8 scales[12]; u8 qs[128]"),
    GgufType("Q5_K", 13, 256, 176, 55, "half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]"),
    GgufType("Q6_K", 14, 256, 210, 66, "u8 ql[128]; u8 qh[64]; i8 scales[16]; half d"),
    GgufType("Q8_K", 15, 256, 292, 91, "f32 d; i8 qs[256]; i16 bsums[16]"),
)


class _Gguf(QuantScheme):
    """A llama.cpp block layout: packed U8 ``[N, K / qk * block_bytes]`` (scales inside).
    The variants (``GgufQ4K``...) are made from the rows of :data:`GGUF_TYPES`."""

    __slots__ = ()
    is_gguf: ClassVar[bool] = True
    gguf: ClassVar[GgufType]  # the variant's row
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


def _variant(t: GgufType) -> type[_Gguf]:
    """The frozen dataclass (no fields) of the GGUF layout ``t``, named ``t.scheme_name``."""
    ns = {
        "__doc__": f"llama.cpp block_{t.name.lower()} ({t.block_bytes} bytes per {t.qk}): "
        f"{t.layout}",
        "__module__": __name__,
        "__qualname__": t.scheme_name,
        "gguf": t,
        "bits_per_elem_x10": t.bits_per_elem_x10,
        "block_bytes": t.block_bytes,
        "qk": t.qk,
        "ggml_type": t.ggml_type,
        "gguf_name": t.name,
    }
    return dataclass(frozen=True, slots=True)(type(t.scheme_name, (_Gguf,), ns))


#: ggml type name (``"Q4_K"``) -> the GGUF scheme variant
GGUF_SCHEMES: dict[str, type[QuantScheme]] = {t.name: _variant(t) for t in GGUF_TYPES}

GgufQ4_0 = GGUF_SCHEMES["Q4_0"]
GgufQ4_1 = GGUF_SCHEMES["Q4_1"]
GgufQ5_0 = GGUF_SCHEMES["Q5_0"]
GgufQ5_1 = GGUF_SCHEMES["Q5_1"]
GgufQ8_0 = GGUF_SCHEMES["Q8_0"]
GgufQ2K = GGUF_SCHEMES["Q2_K"]
GgufQ3K = GGUF_SCHEMES["Q3_K"]
GgufQ4K = GGUF_SCHEMES["Q4_K"]
GgufQ5K = GGUF_SCHEMES["Q5_K"]
GgufQ6K = GGUF_SCHEMES["Q6_K"]
GgufQ8K = GGUF_SCHEMES["Q8_K"]


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
