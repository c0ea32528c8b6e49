"""Differential fuzzing of the packed-weight and (fake) quantization ops (harness.py:
reference interpreter and compiled graph, every precision policy and native target)
against oracles written here (see test_ops_quant.py for the integer matmuls):

* ``dequant_matmul``: Int8Block, Int8BlockAsym, Int4Block (nibbles: even k low, odd k
  high), FP8 E4M3 / E5M2 (``ml_dtypes`` widening) decoded element by element from the
  documented layouts, and every GGUF block type decoded by ``gguf.quants.dequantize``
  (Q8_K, which it lacks: ``d * q`` here); then an f64 product;
* ``dequant_gather``: the same GGUF decoding, rows picked by NumPy indexing;
* ``quantize`` (i8, u8, i16, i32; per tensor / channel; NaN, +-inf, huge values) and
  ``dequantize``: Python ints and ``round`` (half to even) on the f32 quotient;
* ``fake_quantize`` / ``fake_quantize_lsq`` (scale input, clamped to f32 eps): the same,
  on the operands rounded to the policy's precision.

Packed GGUF tables: the legacy types are ``gguf.quants.quantize`` of random rows; the
K-quants are random bytes with their f16 (Q8_K: f32) super-block scales set to sane values.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType, quants
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.dtype import DType
from rlx.formats import schemes as S
from rlx.ops.base import OpKind
from rlx.ops.fake_quant import FakeQuantizeLSQ
from rlx.ops.kvcache import DequantGather
from rlx.ops.quant import Dequantize, DequantMatMul, FakeQuantize, Quantize

from .harness import SEEDS, Tol, check, examples, leaves

F32 = np.float32
RANGES = {"i8": (-128, 127), "u8": (0, 255), "i16": (-32768, 32767), "i32": (-(2**31), 2**31 - 1)}
MM_TOL = Tol(2e-5, 2e-5, 2e-5)  # f32 output under every policy, per unit of |x| @ |w|ᵀ
GGUF = [S.GgufQ4_0, S.GgufQ4_1, S.GgufQ5_0, S.GgufQ5_1, S.GgufQ8_0, S.GgufQ2K, S.GgufQ3K,
        S.GgufQ4K, S.GgufQ5K, S.GgufQ6K, S.GgufQ8K]  # fmt: skip
# byte offsets of the f16 super-block scales (d, dmin) of the K-quants in random blocks
K_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _rint(v: float) -> float:
    return v if math.isnan(v) or math.isinf(v) else float(round(v))


def _q(x: float, s: float, zp: int, lo: int, hi: int) -> int:
    """``clip(rint(f32(x) / f32(s)) + zp)``; NaN -> zp, +-inf saturate."""
    with np.errstate(all="ignore"):
        r = _rint(float(F32(x) / F32(s)))
    if math.isnan(r):
        return min(max(zp, lo), hi)
    if math.isinf(r):
        return hi if r > 0 else lo
    return min(max(int(r) + zp, lo), hi)


def _per_element(shape, axis, values) -> np.ndarray:
    """``values`` (one per tensor, or one per index of ``axis``) broadcast to ``shape``."""
    v = np.asarray(values)
    if axis is None:
        return np.broadcast_to(v.reshape(()), shape)
    cs = [1] * len(shape)
    cs[axis % len(shape)] = len(v)
    return np.broadcast_to(v.reshape(cs), shape)


# ---- packed weights --------------------------------------------------------------------------


def _packed_gguf(rng: np.random.Generator, scheme, n: int, k: int) -> np.ndarray:
    name = scheme.gguf_name
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        rows = rng.standard_normal((n, k)).astype(F32) * F32(rng.uniform(0.1, 2))
        return quants.quantize(rows, GGMLQuantizationType[name])
    bb = scheme.block_bytes
    blocks = rng.integers(0, 256, (n, k // 256, bb), dtype=np.uint8)
    if name == "Q8_K":
        d = rng.uniform(1e-3, 2e-2, (n, k // 256)).astype("<f4")
        blocks[..., 0:4] = d[..., None].view(np.uint8).reshape(n, k // 256, 4)
    else:
        for off in K_SCALES[name]:
            d = rng.uniform(1e-3, 5e-2, (n, k // 256)).astype("<f2")
            blocks[..., off : off + 2] = d[..., None].view(np.uint8).reshape(n, k // 256, 2)
    return blocks.reshape(n, -1)


def _decode_gguf(scheme, packed: np.ndarray) -> np.ndarray:
    name = scheme.gguf_name
    if name == "Q8_K":  # gguf.quants lacks it: f32 d, i8 qs[256], i16 bsums[16]
        b = packed.reshape(packed.shape[0], -1, 292)
        d = b[..., 0:4].copy().view("<f4")
        q = b[..., 4:260].copy().view(np.int8).astype(np.float64)
        return (d.astype(np.float64) * q).reshape(packed.shape[0], -1)
    return quants.dequantize(packed, GGMLQuantizationType[name]).astype(np.float64)


def _packed_plain(rng: np.random.Generator, scheme, n: int, k: int):
    """(w_q, scale, zp, decoded f64 [N, K]) of a non-GGUF scheme, decoded element-wise."""
    if isinstance(scheme, (S.Fp8E4m3, S.Fp8E5m2)):
        t = ml_dtypes.float8_e4m3fn if isinstance(scheme, S.Fp8E4m3) else ml_dtypes.float8_e5m2
        wq = (rng.standard_normal((n, k)) * 4).astype(t)
        scale, zp = np.array([rng.uniform(0.01, 1)], F32), np.zeros(1, np.int32)
        dec = np.array([float(v) for v in wq.flat]).reshape(n, k) * float(scale[0])
        return wq, scale, zp, dec
    bs = scheme.block_size
    scale = rng.uniform(1e-3, 5e-2, (n, k // bs)).astype(F32)
    if isinstance(scheme, S.Int4Block):
        nib = rng.integers(0, 16, (n, k))
        wq = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
        zp = np.where(rng.random((n, k // bs)) < 0.5, 8, rng.integers(0, 16, (n, k // bs))).astype(np.int32)  # fmt: skip
        vals = [[(int(wq[r, c // 2]) >> (4 * (c % 2))) & 0xF for c in range(k)] for r in range(n)]
    else:
        wq = rng.integers(-128, 128, (n, k)).astype(np.int8)
        asym = isinstance(scheme, S.Int8BlockAsym)
        zp = (rng.integers(-20, 21, (n, k // bs)) if asym else np.zeros((n, k // bs))).astype(np.int32)  # fmt: skip
        vals = wq.astype(int).tolist()
    dec = np.array(
        [[(vals[r][c] - int(zp[r, c // bs])) * float(scale[r, c // bs]) for c in range(k)]
         for r in range(n)]
    )  # fmt: skip
    return wq, scale, zp, dec


@st.composite
def dequant_cases(draw: st.DrawFn):
    kind = draw(st.sampled_from(["int8", "int8asym", "int4", "e4m3", "e5m2", "gguf"]))
    if kind == "gguf":
        scheme = draw(st.sampled_from(GGUF))()
        k = scheme.qk * draw(st.integers(1, 2))
    else:
        bs = draw(st.sampled_from([2, 4, 8, 32]))
        k = bs * draw(st.sampled_from([1, 2, 3, 9]))
        scheme = {"int8": S.Int8Block(bs), "int8asym": S.Int8BlockAsym(bs), "int4": S.Int4Block(bs),
                  "e4m3": S.Fp8E4m3(), "e5m2": S.Fp8E5m2()}[kind]  # fmt: skip
    return (
        scheme,
        k,
        draw(st.sampled_from([1, 3, 6, 33])),
        draw(st.sampled_from([(), (1,), (3,), (2, 2), (17,)])),
    )


@examples(16)
@given(case=dequant_cases(), weights=st.sampled_from(["constants", "params", "frozen"]), seed=SEEDS)
def test_dequant_matmul_matches_decoded_f64(case, weights, seed) -> None:
    scheme, k, n, lead = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*lead, k)).astype(F32)
    g = rlx.Graph("dequant_matmul")
    if scheme.is_gguf:
        packed = _packed_gguf(rng, scheme, n, k)
        wdec = _decode_gguf(scheme, packed)
        arrays = {"packed": packed}
    else:
        wq, scale, zp, wdec = _packed_plain(rng, scheme, n, k)
        arrays = {"wq": wq, "scale": scale, "zp": zp}
    if weights == "constants":
        ids, params = [g.constant(a) for a in arrays.values()], {}
    else:
        named, _, params = leaves(g, arrays, list(arrays))
        ids = list(named.values())
    g.set_outputs([g.apply(DequantMatMul(scheme), [g.input("x", x.shape), *ids])])
    scale_ = 1.0 + np.abs(x.astype(np.float64)) @ np.abs(wdec).T
    # f32 output under every policy; a narrow COMPUTE policy feeds a GGUF scheme's x at its
    # precision, while the other schemes' f32 scales keep the whole node f32
    plain = lambda a: a.astype(np.float64)  # noqa: E731
    oracle = lambda rnd: [(rnd if scheme.is_gguf else plain)(x) @ wdec.T]  # noqa: E731
    frozen = weights == "frozen"
    check(g, {"x": x}, params, oracle, [OpKind.COMPUTE], MM_TOL, [scale_], freeze_params=frozen)


@examples(10)
@given(scheme=st.sampled_from(GGUF), data=st.data(), seed=SEEDS)
def test_dequant_gather_matches_gguf_decoding(scheme, data, seed) -> None:
    scheme = scheme()
    rng = np.random.default_rng(seed)
    n, k = data.draw(st.integers(1, 5)), scheme.qk * data.draw(st.integers(1, 2))
    ids_shape = data.draw(st.sampled_from([(), (1,), (4,), (2, 3)]))
    packed = _packed_gguf(rng, scheme, n, k)
    ids = rng.integers(0, n, ids_shape).astype(data.draw(st.sampled_from([np.int32, np.int64])))
    g = rlx.Graph("dequant_gather")
    ii = g.input("ids", ids_shape, "i32" if ids.dtype == np.int32 else "i64")
    g.set_outputs([g.apply(DequantGather(scheme), [g.constant(packed), ii])])
    want = _decode_gguf(scheme, packed)[ids]
    check(g, {"ids": ids}, {}, [want], [OpKind.DATA_MOVEMENT], Tol(1e-7, 1e-7, 1e-7))


# ---- quantize / dequantize / fake quantizers ----------------------------------------------------

SHAPES = st.sampled_from([(5,), (3, 4), (2, 3, 2)])


def _qparams(rng, shape, axis, lo, hi):
    c = 1 if axis is None else shape[axis % len(shape)]
    scales = tuple(float(F32(s)) for s in 10.0 ** rng.uniform(-2, 0.5, c))
    zps = tuple(int(z) for z in rng.integers(lo, hi + 1, c))
    return scales, zps


def _special(rng, shape, mag: float) -> np.ndarray:
    x = rng.standard_normal(shape) * mag
    pick = rng.random(shape)
    x = np.where(pick < 0.05, np.nan, x)
    x = np.where((pick >= 0.05) & (pick < 0.1), np.inf * rng.choice([-1, 1], shape), x)
    x = np.where((pick >= 0.1) & (pick < 0.15), 1e10 * rng.choice([-1, 1], shape), x)
    return x.astype(F32)


@examples(12)
@given(shape=SHAPES, dt=st.sampled_from(list(RANGES)), per_channel=st.booleans(), data=st.data(),
       seed=SEEDS)  # fmt: skip
def test_quantize_and_dequantize_match_python_ints(shape, dt, per_channel, data, seed) -> None:
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1)) if per_channel else None
    lo, hi = RANGES[dt]
    scales, zps = _qparams(rng, shape, axis, *(max(lo, -1000), min(hi, 1000)))
    x = _special(rng, shape, float(rng.choice([3.0, 300.0, 3e5])))
    qv = rng.integers(lo, hi, shape, endpoint=True).astype(DType(dt).np)
    g = rlx.Graph("quantize")
    g.set_outputs([
        g.apply(Quantize(axis, scales, zps, DType(dt)), [g.input("x", shape)]),
        g.apply(Dequantize(axis, scales, zps), [g.input("q", shape, dt)]),
    ])  # fmt: skip
    s_el, z_el = _per_element(shape, axis, scales), _per_element(shape, axis, zps)
    q = np.array([_q(v, s, int(z), lo, hi) for v, s, z in zip(x.flat, s_el.flat, z_el.flat)])
    deq = np.array([(int(v) - int(z)) * float(F32(s)) for v, s, z in zip(qv.flat, s_el.flat, z_el.flat)])  # fmt: skip
    want = [q.reshape(shape), deq.reshape(shape)]
    # dequantize: one f32 rounding of the exact product
    check(g, {"x": x, "q": qv}, {}, want, [OpKind.ELEMENTWISE], Tol(1.2e-7, 1.2e-7, 1.2e-7))


QRANGES = [(-128, 127), (0, 255), (-8, 7), (0, 15), (-32768, 32767)]


@examples(14)
@given(shape=SHAPES, qr=st.sampled_from(QRANGES), per_channel=st.booleans(), lsq=st.booleans(),
       scalar_scale=st.booleans(), data=st.data(), seed=SEEDS)  # fmt: skip
def test_fake_quantizers_match_python_rounding(
    shape, qr, per_channel, lsq, scalar_scale, data, seed
):
    rng = np.random.default_rng(seed)
    qmin, qmax = qr
    axis = data.draw(st.integers(-len(shape), len(shape) - 1)) if per_channel else None
    scales, zps = _qparams(rng, shape, axis, qmin, qmax)
    # every representable output within f16's range (a 16-bit policy runs the op there)
    scales = tuple(min(sc, float(F32(6e4 / (qmax - qmin)))) for sc in scales)
    x = (rng.standard_normal(shape) * max(scales) * rng.uniform(1, (qmax - qmin) / 2)).astype(F32)
    g = rlx.Graph("fake_quantize")
    feeds = {"x": x}
    if lsq:
        sv = np.array(scales, F32)
        if rng.random() < 0.2:  # below f32 eps: clamped to it
            sv[0] = F32(rng.choice([0.0, -0.5, 1e-9]))
        if axis is None and scalar_scale:
            sv = sv.reshape(())
        feeds["s"] = sv
        op = FakeQuantizeLSQ(axis, zps, qmin, qmax)
        g.set_outputs([g.apply(op, [g.input("x", shape), g.input("s", sv.shape)])])
    else:
        g.set_outputs([g.apply(FakeQuantize(axis, scales, zps, qmin, qmax), [g.input("x", shape)])])

    def oracle(rnd):
        xs = rnd(x)
        s = rnd(feeds["s"]).reshape(-1) if lsq else np.array(scales)
        s = np.maximum(s, float(np.finfo(F32).eps)) if lsq else s
        s_el, z_el = _per_element(shape, axis, s), _per_element(shape, axis, zps)
        out = [(_q(v, sc, int(z), qmin, qmax) - int(z)) * float(F32(sc))
               for v, sc, z in zip(xs.flat, s_el.flat, z_el.flat)]  # fmt: skip
        return [np.array(out).reshape(shape)]

    check(g, feeds, {}, oracle, [OpKind.ELEMENTWISE], Tol(1.2e-7, 1e-3, 8e-3))
