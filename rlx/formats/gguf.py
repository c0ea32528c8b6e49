"""llama.cpp block decoding. In: packed bytes (one row = K/qk blocks). Out: f32 values,
exactly as ``dequantize_row_*`` in ggml-quants.c (and ``gguf.quants``) compute them.

Legacy layouts (qk = 32; element ``j`` of a block takes the low nibble of ``qs[j]`` and
element ``j + 16`` the high nibble; ``qh`` bit ``j`` is the fifth bit of element ``j``)::

    block_q4_0  18 B: half d; u8 qs[16]                 y = d * (q - 8)
    block_q4_1  20 B: half d; half m; u8 qs[16]         y = d * q + m
    block_q5_0  22 B: half d; u32 qh; u8 qs[16]         y = d * (q - 16)
    block_q5_1  24 B: half d; half m; u32 qh; u8 qs[16] y = d * q + m
    block_q8_0  34 B: half d; i8 qs[32]                 y = d * q

K-quant layouts (QK_K = 256, little-endian, no padding; ``half`` is IEEE f16)::

    block_q2_K   84 B: u8 scales[16]; u8 qs[64]; half d; half dmin
    block_q3_K  110 B: u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d

    block_q4_K  144 B: half d; half dmin; u8 scales[12]; u8 qs[128]
    block_q5_K  176 B: half d; half dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
    block_q6_K  210 B: u8 ql[128]; u8 qh[64]; i8 scales[16]; half d
    block_q8_K  292 B: f32 d; i8 qs[256]; i16 bsums[16]

Q2_K: 16 sub-blocks of 16, 2-bit q, 4-bit scale / min per sub-block (low / high nibble of
``scales``): ``y = d * sc * q - dmin * m``. Q3_K: 16 sub-blocks of 16, 2 low bits in
``qs`` and the third in ``hmask`` (set = no offset, clear = minus 4), 6-bit scales
biased by 32 packed into 12 bytes: ``y = d * (sc - 32) * q``. Q4_K / Q5_K hold 8 sub-blocks of 32 with 6-bit scales and mins packed into ``scales``
(``get_scale_min_k4``): ``y = d * sc * q - dmin * m``. Q6_K has 16 sub-blocks of 16
with i8 scales: ``y = d * sc * (q - 32)``. Q8_K: ``y = d * q``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx.errors import QuantizationError
from rlx.formats.schemes import GGUF_SCHEMES, QuantScheme

__all__ = [
    "dequantize_rows",
    "dequantize_blocks",
    "scale_min_k4",
    "q3_k_scales",
    "check_packed",
    "BLOCK_BYTES",
]

QK_K = 256
#: scheme class -> bytes per block
BLOCK_BYTES: dict[type, int] = {c: c.block_bytes for c in GGUF_SCHEMES.values()}  # type: ignore[attr-defined]


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per row -> f32 of the little-endian half they hold, shape [nb, 1]."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12-byte ``scales`` of Q4_K/Q5_K into 8 six-bit scales and 8 mins,
    each [nb, 8] (llama.cpp ``get_scale_min_k4`` for j = 0..7)."""
    q = scales.astype(np.uint8)
    sc = np.empty((q.shape[0], 8), np.uint8)
    mn = np.empty((q.shape[0], 8), np.uint8)
    sc[:, :4] = q[:, 0:4] & 63
    mn[:, :4] = q[:, 4:8] & 63
    sc[:, 4:] = (q[:, 8:12] & 0x0F) | ((q[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[nb, 16] bytes -> [nb, 32] values: low nibbles (elements 0..15), then high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _qh_bits(qh: np.ndarray) -> np.ndarray:
    """[nb, 4] bytes (a little-endian u32) -> [nb, 32] bits (bit j -> element j)."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 2:18]).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def _q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return d * _nibbles(b[:, 4:20]).astype(np.float32) + m


def _q5_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    q = (_nibbles(b[:, 6:22]) | (_qh_bits(b[:, 2:6]) << 4)).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


def _q5_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 8:24]) | (_qh_bits(b[:, 4:8]) << 4)
    return d * q.astype(np.float32) + m


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    return b[:, 2:34].view(np.int8).astype(np.float32) * d


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """Q2_K / Q3_K ``qs`` [nb, 64] -> 2-bit values [nb, 256]: element ``128 h + 32 s + l``
    is bits ``2s..2s+1`` of ``qs[32 h + l]``."""
    sh = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    return ((qs.reshape(-1, 2, 1, 32) >> sh) & 3).reshape(-1, QK_K)


def _q2_k(b: np.ndarray) -> np.ndarray:
    sc = b[:, 0:16]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (sc & 0x0F).astype(np.float32))[:, :, None]
    ml = (dmin * (sc >> 4).astype(np.float32))[:, :, None]
    q = _crumbs(b[:, 16:80]).reshape(-1, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(-1, QK_K)


def q3_k_scales(sc: np.ndarray) -> np.ndarray:
    """The 12 scale bytes of Q3_K -> 16 signed scales (6 bits minus 32), i8 [nb, 16]."""
    lo = np.concatenate([sc[:, 0:8] & 0x0F, sc[:, 0:8] >> 4], axis=1)
    hi = (sc[:, None, 8:12] >> (2 * np.arange(4, dtype=np.uint8))[None, :, None]) & 3
    return (lo | (hi.reshape(-1, 16) << 4)).astype(np.int8) - np.int8(32)


def _q3_k(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 108:110])
    dl = (d * q3_k_scales(b[:, 96:108]).astype(np.float32))[:, :, None]
    bit = (b[:, None, 0:32] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # [nb, 8, 32]
    q = _crumbs(b[:, 32:96]).astype(np.int8) - ((bit.reshape(-1, QK_K) ^ 1) << 2).astype(np.int8)
    return (dl * q.reshape(-1, 16, 16).astype(np.float32)).reshape(-1, QK_K)


def _q4_k(b: np.ndarray) -> np.ndarray:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = scale_min_k4(b[:, 4:16])
    qs = b[:, 16:144].reshape(-1, 4, 32)  # 4 chunks of 32 bytes, each feeding 64 outputs
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    d1 = (d * sc)[:, :, None]
    m1 = (dmin * mn)[:, :, None]
    return (d1 * q - m1).reshape(-1, QK_K)


def _q5_k(b: np.ndarray) -> np.ndarray:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = scale_min_k4(b[:, 4:16])
    qh = b[:, 16:48]  # [nb, 32]: bit 2j / 2j+1 is the high bit of sub-block 2j / 2j+1
    ql = b[:, 48:176].reshape(-1, 4, 32)
    low = np.stack([ql & 0x0F, ql >> 4], axis=2).reshape(-1, 8, 32)
    bits = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = (low + (bits << 4)).astype(np.float32)
    d1 = (d * sc)[:, :, None]
    m1 = (dmin * mn)[:, :, None]
    return (d1 * q - m1).reshape(-1, QK_K)


def _q6_k(b: np.ndarray) -> np.ndarray:
    ql = b[:, 0:128].reshape(-1, 2, 64)  # two halves of 128 outputs
    qh = b[:, 128:192].reshape(-1, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32).reshape(-1, 2, 8)
    d = _f16(b[:, 208:210])
    lo = np.stack(
        [ql[:, :, :32] & 0x0F, ql[:, :, 32:] & 0x0F, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4],
        axis=2,
    )  # [nb, 2, 4, 32]
    hi = (qh[:, :, None, :] >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    q = ((lo | (hi << 4)).astype(np.int16) - 32).astype(np.float32)  # [nb, 2, 4, 32]
    # output l + 32*g of half h uses scale index l//16 + 2*g
    s = sc.reshape(-1, 2, 4, 2)[:, :, :, :, None]  # [nb, 2, g, l//16, 1]
    y = d[:, :, None, None, None] * s * q.reshape(-1, 2, 4, 2, 16)
    return y.reshape(-1, QK_K)


def _q8_k(b: np.ndarray) -> np.ndarray:
    d = np.ascontiguousarray(b[:, 0:4]).view("<f4").astype(np.float32)
    qs = b[:, 4:260].view(np.int8).astype(np.float32)
    return d * qs


#: ggml type name -> the decoder of a [nb, block_bytes] array of its blocks
_DECODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "Q8_K": _q8_k,
}


def dequantize_blocks(scheme: QuantScheme, data: np.ndarray) -> np.ndarray:
    """Decode a flat run of blocks (u8 bytes) to f32 [n_blocks * qk]."""
    try:
        bb = BLOCK_BYTES[type(scheme)]
    except KeyError:
        raise QuantizationError(f"{scheme} is not a GGUF block scheme") from None
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if raw.size % bb:
        raise QuantizationError(
            f"{scheme}: {raw.size} bytes is not a whole number of {bb}-byte blocks"
        )
    decode = _DECODERS[type(scheme).gguf_name]  # type: ignore[attr-defined]
    return decode(raw.reshape(-1, bb)).reshape(-1)


def dequantize_rows(scheme: QuantScheme, packed: np.ndarray) -> np.ndarray:
    """Decode packed rows U8 [N, K/qk * block_bytes] to f32 [N, K]."""
    n = packed.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        return dequantize_blocks(scheme, packed).reshape(n, -1)


def check_packed(scheme: QuantScheme, packed: np.ndarray, n: int, k: int, name: str) -> None:
    """QuantizationError naming tensor ``name`` unless ``packed`` is the u8 ``[n, K/qk *
    block_bytes]`` array of an ``[n, k]`` weight in the GGUF ``scheme``."""
    bb = BLOCK_BYTES.get(type(scheme))
    if bb is None:
        raise QuantizationError(f"tensor {name!r}: {scheme} is not a GGUF block scheme")
    qk = scheme.block_size
    if k % qk:
        raise QuantizationError(
            f"tensor {name!r}: {scheme} packs K in blocks of {qk}, but K is {k}"
        )
    want = (n, k // qk * bb)
    if packed.dtype != np.uint8 or tuple(packed.shape) != want:
        raise QuantizationError(
            f"tensor {name!r}: {scheme} of a [{n}, {k}] weight needs u8 {list(want)} "
            f"({bb} bytes per {qk} weights), given {packed.dtype} {list(packed.shape)} "
            f"({packed.nbytes} bytes)"
        )
