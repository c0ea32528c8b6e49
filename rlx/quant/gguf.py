"""llama.cpp K-quant decoding. In: packed bytes (one row = K/256 super-blocks).
Out: f32 values, exactly as ``dequantize_row_q{4,5,6,8}_K`` in ggml-quants.c computes them.

Block layouts (QK_K = 256, little-endian, no padding; ``half`` is IEEE f16)::

    block_q4_K  144 B: half d; half dmin; u8 scales[12]; u8 qs[128]
    block_q5_K  176 B: half d; half dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
    block_q6_K  210 B: u8 ql[128]; u8 qh[64]; i8 scales[16]; half d
    block_q8_K  292 B: f32 d; i8 qs[256]; i16 bsums[16]

Q4_K / Q5_K hold 8 sub-blocks of 32 with 6-bit scales and mins packed into ``scales``
(``get_scale_min_k4``): ``y = d * sc * q - dmin * m``. Q6_K has 16 sub-blocks of 16
with i8 scales: ``y = d * sc * (q - 32)``. Q8_K: ``y = d * q``.
"""

from __future__ import annotations

import numpy as np

from rlx.errors import QuantizationError
from rlx.quant.schemes import GgufQ4K, GgufQ5K, GgufQ6K, GgufQ8K, QuantScheme

__all__ = ["dequantize_rows", "dequantize_blocks", "scale_min_k4", "BLOCK_BYTES"]

QK_K = 256
BLOCK_BYTES: dict[type, int] = {GgufQ4K: 144, GgufQ5K: 176, GgufQ6K: 210, GgufQ8K: 292}


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


_DECODERS = {GgufQ4K: _q4_k, GgufQ5K: _q5_k, GgufQ6K: _q6_k, GgufQ8K: _q8_k}


def dequantize_blocks(scheme: QuantScheme, data: np.ndarray) -> np.ndarray:
    """Decode a flat run of super-blocks (u8 bytes) to f32 [n_blocks * 256]."""
    try:
        bb = BLOCK_BYTES[type(scheme)]
    except KeyError:
        raise QuantizationError(f"{scheme} is not a GGUF K-quant scheme") from None
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if raw.size % bb:
        raise QuantizationError(
            f"{scheme}: {raw.size} bytes is not a whole number of {bb}-byte super-blocks"
        )
    return _DECODERS[type(scheme)](raw.reshape(-1, bb)).reshape(-1)


def dequantize_rows(scheme: QuantScheme, packed: np.ndarray) -> np.ndarray:
    """Decode packed rows U8 [N, K/256 * block_bytes] to f32 [N, K]."""
    n = packed.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        return dequantize_blocks(scheme, packed).reshape(n, -1)
