"""Weight packing for weight-only quantization. In: an f32 weight ``[N, K]`` (rows = output
channels, blocks along K) and a :class:`~rlx.formats.schemes.QuantScheme`. Out: the arrays
``DequantMatMul`` reads for it (:func:`pack`): ``(packed,)`` for the GGUF schemes,
``(w_q, scale, zp)`` otherwise.

Methods (round-to-nearest per block, no search):

* Int8Block: symmetric, ``scale = absmax / 127``, zp 0. Int8BlockAsym: ``scale =
  (max - min) / 255``, zp puts ``min`` at -128. Int4Block: asymmetric, ``scale =
  (max - min) / 15``, zp in [0, 15] puts ``min`` at 0. Fp8E4m3 / Fp8E5m2: one scale per
  tensor, ``absmax / 448`` (``/ 57344``), round to nearest even into the FP8 format.
* GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: llama.cpp's reference quantizers (the same f32 steps
  as ``gguf.quants.quantize``, so the bytes are identical).
* GGUF Q4_K / Q5_K: per 32 weights ``min`` (clamped to <= 0) rounded up to a 6-bit
  multiple of a per-256 f16 factor ``dmin``, then ``scale = (max - min') / (2^b - 1)``
  rounded up likewise (so nothing clips: the step is at most one ``dmin`` and one ``d``
  wider than the block's own range needs); Q6_K: per
  16 weights ``absmax / 31`` rounded up to an i8 multiple of one f16 factor; Q8_K:
  ``absmax / 127`` per 256 (f32). Q2_K and Q3_K have no packer here (a QuantizationError;
  files made by llama.cpp carry them already packed).
"""

from __future__ import annotations

import numpy as np

from rlx.dtype import f8e4m3_np, f8e5m2_np
from rlx.errors import QuantizationError
from rlx.formats import schemes as S

__all__ = ["pack", "can_pack"]


def can_pack(scheme: S.QuantScheme, k: int) -> str | None:
    """None when an ``[N, k]`` weight can be packed in ``scheme``, else the reason."""
    if isinstance(scheme, (S.GgufQ2K, S.GgufQ3K)):
        return f"{scheme} has no packer in rlx (only decoding)"
    if type(scheme) not in _PACKERS:
        return f"{scheme} is not a weight-only scheme rlx can pack"
    bs = scheme.block_size
    if bs is not None and (bs <= 0 or k % bs):
        return f"K={k} is not a multiple of the {scheme} block size {bs}"
    if isinstance(scheme, S.Int4Block) and (bs or 0) % 2:
        return f"{scheme}: the block size must be even (two weights per byte)"
    return None


def pack(scheme: S.QuantScheme, w: np.ndarray, name: str = "weight") -> tuple[np.ndarray, ...]:
    """Pack f32 ``w [N, K]`` (rows = output channels) in ``scheme``. QuantizationError
    naming ``name`` for a non-finite weight or a shape the scheme cannot hold."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise QuantizationError(f"tensor {name!r}: need a 2-D weight [N, K], given {w.shape}")
    why = can_pack(scheme, w.shape[1])
    if why is not None:
        raise QuantizationError(f"tensor {name!r} {list(w.shape)}: {why}")
    if not np.isfinite(w).all():
        raise QuantizationError(f"tensor {name!r}: weight holds NaN/Inf, cannot quantize")
    return _PACKERS[type(scheme)](scheme, w)


def _blocks(w: np.ndarray, bs: int) -> np.ndarray:
    return w.reshape(w.shape[0], -1, bs)


def _safe_inv(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _int8(scheme: S.QuantScheme, w: np.ndarray) -> tuple[np.ndarray, ...]:
    b = _blocks(w, scheme.block_size)  # type: ignore[arg-type]
    if isinstance(scheme, S.Int8BlockAsym):
        lo, hi = np.minimum(b.min(-1), 0), np.maximum(b.max(-1), 0)
        scale = ((hi - lo) / 255).astype(np.float32)
        scale = np.where(scale > 0, scale, np.float32(1))
        zp = np.clip(np.rint(-128 - lo / scale), -128, 127).astype(np.int32)
    else:
        scale = (np.abs(b).max(-1) / 127).astype(np.float32)
        scale = np.where(scale > 0, scale, np.float32(1))
        zp = np.zeros(scale.shape, np.int32)
    q = np.clip(np.rint(b / scale[..., None]) + zp[..., None], -128, 127).astype(np.int8)
    return q.reshape(w.shape), scale, zp


def _int4(scheme: S.QuantScheme, w: np.ndarray) -> tuple[np.ndarray, ...]:
    b = _blocks(w, scheme.block_size)  # type: ignore[arg-type]
    lo, hi = np.minimum(b.min(-1), 0), np.maximum(b.max(-1), 0)
    scale = ((hi - lo) / 15).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1))
    zp = np.clip(np.rint(-lo / scale), 0, 15).astype(np.int32)
    q = np.clip(np.rint(b / scale[..., None]) + zp[..., None], 0, 15).astype(np.uint8)
    q = q.reshape(w.shape)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8), scale, zp


def _fp8(scheme: S.QuantScheme, w: np.ndarray) -> tuple[np.ndarray, ...]:
    e4 = isinstance(scheme, S.Fp8E4m3)
    dt, fmax = (f8e4m3_np(), 448.0) if e4 else (f8e5m2_np(), 57344.0)
    amax = float(np.abs(w).max()) if w.size else 0.0
    scale = np.float32(amax / fmax if amax > 0 else 1.0)
    q = (w / scale).astype(dt)
    return q, np.array([scale], np.float32), np.array([0], np.int32)


def _f16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).astype("<f2").view(np.uint8).reshape(a.shape[0], 2)


def _roundf(x: np.ndarray) -> np.ndarray:
    """C ``roundf``: half away from zero (llama.cpp's ``nearest_int`` for Q8_0)."""
    return (np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))).astype(np.float32)


def _legacy(scheme: S.QuantScheme, w: np.ndarray) -> tuple[np.ndarray, ...]:
    n = w.shape[0]
    b = w.reshape(-1, 32)
    if isinstance(scheme, S.GgufQ8_0):
        d = (np.abs(b).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
        q = _roundf(b * _safe_inv(d)).astype(np.int8).view(np.uint8)
        return (np.concatenate([_f16(d), q], 1).reshape(n, -1),)
    if isinstance(scheme, (S.GgufQ4_0, S.GgufQ5_0)):
        top = 8 if isinstance(scheme, S.GgufQ4_0) else 16
        mx = np.take_along_axis(b, np.abs(b).argmax(-1)[:, None], -1)
        d = (mx / np.float32(-top)).astype(np.float32)
        q = np.trunc(b * _safe_inv(d) + np.float32(top + 0.5)).clip(0, 2 * top - 1)
        head = [_f16(d)]
    else:  # Q4_1 / Q5_1
        levels = 15 if isinstance(scheme, S.GgufQ4_1) else 31
        mn, mx = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
        d = ((mx - mn) / np.float32(levels)).astype(np.float32)
        q = np.trunc((b - mn) * _safe_inv(d) + np.float32(0.5)).clip(0, levels)
        head = [_f16(d), _f16(mn)]
    q = q.astype(np.uint8)
    qs = (q[:, :16] & 0x0F) | (q[:, 16:] << 4)
    if isinstance(scheme, (S.GgufQ5_0, S.GgufQ5_1)):
        head.append(np.packbits(q >> 4, axis=-1, bitorder="little"))
    return (np.concatenate([*head, qs], 1).reshape(n, -1),)


def _ceil_div(a: np.ndarray, d: np.ndarray, top: int) -> np.ndarray:
    """clip(ceil(a / d), 0, top) with 0 where d == 0, as u8."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(d > 0, np.ceil(a / d - np.float32(1e-6)), 0)
    return np.clip(r, 0, top).astype(np.uint8)


def _q45_k(scheme: S.QuantScheme, w: np.ndarray) -> tuple[np.ndarray, ...]:
    n = w.shape[0]
    five = isinstance(scheme, S.GgufQ5K)
    levels = 31 if five else 15
    x = w.reshape(-1, 8, 32)
    mn = np.minimum(x.min(-1), 0)
    dmin = ((-mn).max(-1) / 63).astype(np.float16).astype(np.float32)  # [nb]
    m = _ceil_div(-mn, dmin[:, None], 63)
    mm = (dmin[:, None] * m.astype(np.float32))[..., None]  # >= -min: x + mm >= 0
    scale = (np.maximum(x.max(-1), 0) + mm[..., 0]) / np.float32(levels)  # covers x + mm
    d = (scale.max(-1) / 63).astype(np.float16).astype(np.float32)
    sc = _ceil_div(scale, d[:, None], 63)
    dd = (d[:, None] * sc.astype(np.float32))[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(dd > 0, np.rint((x + mm) / dd), 0)
    q = np.clip(q, 0, levels).astype(np.uint8)  # [nb, 8, 32]
    scales = np.empty((len(x), 12), np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    low = q & 0x0F
    qs = (low[:, 0::2, :] | (low[:, 1::2, :] << 4)).reshape(len(x), 128)
    parts = [_f16(d), _f16(dmin), scales]
    if five:
        bits = (q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]  # bit j: sub-block j
        parts.append(np.bitwise_or.reduce(bits, axis=1).astype(np.uint8))
    return (np.concatenate([*parts, qs], 1).reshape(n, -1),)


def _q6_k(scheme: S.QuantScheme, w: np.ndarray) -> tuple[np.ndarray, ...]:
    n = w.shape[0]
    x = w.reshape(-1, 16, 16)
    s = np.abs(x).max(-1) / np.float32(31)
    d = (s.max(-1) / 127).astype(np.float16).astype(np.float32)
    sc = _ceil_div(s, d[:, None], 127)
    dd = (d[:, None] * sc.astype(np.float32))[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(dd > 0, np.rint(x / dd), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [nb, h, g, l]
    ql = np.empty((len(q), 2, 2, 32), np.uint8)  # [nb, h, g & 1, l]
    ql[:, :, 0] = (q[:, :, 0] & 0x0F) | ((q[:, :, 2] & 0x0F) << 4)
    ql[:, :, 1] = (q[:, :, 1] & 0x0F) | ((q[:, :, 3] & 0x0F) << 4)
    hi = (q >> 4) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    qh = np.bitwise_or.reduce(hi, axis=2).astype(np.uint8)  # [nb, h, 32]
    out = [ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), _f16(d)]
    return (np.concatenate(out, 1).reshape(n, -1),)


def _q8_k(scheme: S.QuantScheme, w: np.ndarray) -> tuple[np.ndarray, ...]:
    n = w.shape[0]
    x = w.reshape(-1, 256)
    d = (np.abs(x).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    q = np.clip(np.rint(x * _safe_inv(d)), -127, 127).astype(np.int8)
    bsums = q.reshape(-1, 16, 16).astype(np.int16).sum(-1).astype("<i2")
    parts = [d.astype("<f4").view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)]
    return (np.concatenate(parts, 1).reshape(n, -1),)


_PACKERS = {
    S.Int8Block: _int8,
    S.Int8BlockAsym: _int8,
    S.Int4Block: _int4,
    S.Fp8E4m3: _fp8,
    S.Fp8E5m2: _fp8,
    S.GgufQ8_0: _legacy,
    S.GgufQ4_0: _legacy,
    S.GgufQ4_1: _legacy,
    S.GgufQ5_0: _legacy,
    S.GgufQ5_1: _legacy,
    S.GgufQ4K: _q45_k,
    S.GgufQ5K: _q45_k,
    S.GgufQ6K: _q6_k,
    S.GgufQ8K: _q8_k,
}
