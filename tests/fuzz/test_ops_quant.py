"""Differential fuzzing of the quantized and packed-weight ops (harness.py: reference
interpreter and compiled graph, every precision policy and native target) against oracles
written here in int64 / f32 / f64 NumPy from the ops' documented formulas:

* ``qmatmul`` (integer x, or float x quantized by the op), ``dynamic_qmatmul`` (s8 / u8
  rows), ``dynamic_qbatch_matmul``, ``qconv2d``: the exact int64 accumulator (explicit
  loops over the kernel taps for the conv), then the documented f32 rescale and an f64
  epilogue (bias, activation, residual);
* ``dequant_matmul`` (Int8Block, Int8BlockAsym, Int4Block, FP8 E4M3 / E5M2 and every GGUF
  block type) and ``dequant_gather`` (GGUF): weights decoded by a loop over the documented
  layout, or by the ``gguf`` package's ``gguf.quants.dequantize`` (Q8_K, which it lacks:
  ``d * q`` here), then an f64 product;
* ``quantize`` (i8, u8, i16, i32; per tensor / channel; NaN, +-inf, huge values),
  ``dequantize``, ``fake_quantize``, ``fake_quantize_lsq``: ``round half to even`` of the
  f32 quotient (Python's ``round``), saturation in Python ints.

These ops fix their f32 output, so the tolerance is the f32 one under every policy; a
policy that runs COMPUTE ops narrow still feeds them their float operands (x of the
dynamic ones, bias, residual) rounded to its precision (the precision pass's rule for an
op whose output dtype is fixed), and the oracle reads them so rounded.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.dtype import DType
from rlx.ops.base import OpKind
from rlx.ops.elementwise import UnaryKind
from rlx.ops.qconv import QConv2d
from rlx.ops.qmatmul import ActQuant, DynamicQBatchMatMul, DynamicQMatMul, QMatMul

from .harness import SEEDS, Tol, check, examples

F32 = np.float32
COMPUTE = [OpKind.COMPUTE]
STRICT = Tol(2e-6, 2e-6, 2e-6)  # f32 output under every policy
RANGES = {"i8": (-128, 127), "u8": (0, 255), "i16": (-32768, 32767), "i32": (-(2**31), 2**31 - 1)}
ACTS = {
    None: lambda y: y,
    UnaryKind.RELU: lambda y: np.maximum(y, 0.0),
    UnaryKind.GELU: lambda y: 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2))),
    UnaryKind.GELU_TANH: lambda y: (
        0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))
    ),  # fmt: skip
    UnaryKind.SILU: lambda y: y / (1 + np.exp(-y)),
}


def _epilogue(y32: np.ndarray, act, bias, residual) -> np.ndarray:
    y = y32.astype(np.float64)
    if bias is not None:
        y = y + bias
    y = ACTS[act](y)
    return y if residual is None else y + residual


def _rounded(rnd, *arrays):
    """The optional float operands as the op reads them under a policy (None stays)."""
    return [None if a is None else rnd(a) for a in arrays]


def _rint(a: np.ndarray) -> np.ndarray:
    """Round half to even, element by element with Python's ``round`` (NaN stays NaN)."""
    return np.array([v if math.isnan(v) or math.isinf(v) else float(round(v)) for v in
                     np.asarray(a, np.float64).flat]).reshape(np.shape(a))  # fmt: skip


def _quantize(x, scale, zp, lo, hi) -> np.ndarray:
    """``clip(rint(f32(x) / f32(scale)) + zp, lo, hi)``; NaN -> zp, +-inf saturate (int64)."""
    with np.errstate(all="ignore"):
        r = _rint(np.asarray(x, F32) / np.asarray(scale, F32))
    r = np.nan_to_num(r, nan=0.0, posinf=2.0**62, neginf=-(2.0**62))
    out = [min(max(int(v) + int(z), lo), hi) for v, z in zip(r.flat, np.broadcast_to(zp, r.shape).flat)]  # fmt: skip
    return np.array(out, np.int64).reshape(r.shape)


def _row_quant(x: np.ndarray, mode: ActQuant):
    """The documented per-row dynamic quantization, one f32 operation at a time."""
    x = x.astype(F32)
    lo, hi = x.min(axis=1), x.max(axis=1)
    if mode is ActQuant.S8:
        scale = (np.maximum(np.abs(lo), np.abs(hi)) / F32(127)).astype(F32)
        qmin, qmax, zp = -128, 127, np.zeros(len(x), np.int64)
    else:
        lo, hi = np.minimum(lo, F32(0)), np.maximum(hi, F32(0))
        scale = ((hi - lo) / F32(255)).astype(F32)
        qmin, qmax = 0, 255
    scale = np.where(scale == 0, F32(1), scale).astype(F32)
    if mode is ActQuant.U8:
        zp = np.clip(_rint(-lo / scale), 0, 255).astype(np.int64)
    q = _quantize(x, scale[:, None], zp[:, None], qmin, qmax)
    return q, scale, zp


# ---- integer matmuls ------------------------------------------------------------------------

LEAD = st.sampled_from([(), (3,), (2, 2)])


@st.composite
def qmatmul_cases(draw: st.DrawFn):
    return (
        draw(LEAD), draw(st.sampled_from([1, 7, 40, 300])), draw(st.sampled_from([1, 5, 12, 70])),
        draw(st.sampled_from(["i8", "u8", "float_i8", "float_u8"])), draw(st.booleans()),
        draw(st.sampled_from(list(ACTS))), draw(st.booleans()), draw(st.booleans()),
    )  # fmt: skip


@examples(12)
@given(case=qmatmul_cases(), seed=SEEDS)
def test_qmatmul_matches_int64(case, seed) -> None:
    lead, k, n, xkind, per_channel, act, has_bias, has_res = case
    rng = np.random.default_rng(seed)
    qd = xkind.split("_")[-1]
    lo, hi = RANGES[qd]
    zp = int(rng.integers(lo, hi + 1))
    x_scale = float(rng.uniform(0.01, 0.1))
    floats = xkind.startswith("float")
    if floats:
        x = ((rng.integers(lo, hi + 1, (*lead, k)) - zp) * x_scale + rng.normal(0, x_scale, (*lead, k))).astype(F32)  # fmt: skip
    else:
        x = rng.integers(lo, hi + 1, (*lead, k)).astype(DType(qd).np)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    ws = rng.uniform(1e-3, 1e-2, n if per_channel else 1).astype(F32)
    bias = rng.standard_normal(n).astype(F32) if has_bias else None
    res = rng.standard_normal((*lead, n)).astype(F32) if has_res else None
    op = QMatMul(x_scale, zp, tuple(ws), has_bias, act, has_res,
                 DType(qd) if xkind.startswith("float") else None)  # fmt: skip
    g = rlx.Graph("qmatmul")
    ins = [g.input("x", x.shape, "f32" if x.dtype == F32 else qd), g.constant(w)]
    feeds = {"x": x}
    for name, a in (("bias", bias), ("res", res)):
        if a is not None:
            ins.append(g.input(name, a.shape))
            feeds[name] = a
    g.set_outputs([g.apply(op, ins)])

    def oracle(rnd):
        xq = _quantize(rnd(x), x_scale, zp, lo, hi) if floats else x.astype(np.int64)
        acc = np.matmul(xq - zp, w.astype(np.int64))
        y32 = acc.astype(F32) * (F32(x_scale) * np.broadcast_to(ws, (n,))).astype(F32)
        return [_epilogue(y32, act, *_rounded(rnd, bias, res))]

    check(g, feeds, {}, oracle, COMPUTE, STRICT)


@examples(12)
@given(
    lead=LEAD, k=st.sampled_from([1, 7, 40, 300]), n=st.sampled_from([1, 5, 12, 70]), mode=st.sampled_from(list(ActQuant)),
    per_channel=st.booleans(), act=st.sampled_from(list(ACTS)), has_bias=st.booleans(),
    has_res=st.booleans(), seed=SEEDS,
)  # fmt: skip
def test_dynamic_qmatmul_matches_int64(lead, k, n, mode, per_channel, act, has_bias, has_res, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((*lead, k)) * rng.uniform(0.1, 3)).astype(F32)
    if rng.random() < 0.2:  # a row of zeros takes scale 1
        x.reshape(-1, k)[0] = 0
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    ws = rng.uniform(1e-3, 1e-2, n if per_channel else 1).astype(F32)
    bias = rng.standard_normal(n).astype(F32) if has_bias else None
    res = rng.standard_normal((*lead, n)).astype(F32) if has_res else None
    g = rlx.Graph("dynamic_qmatmul")
    ins, feeds = [g.input("x", x.shape), g.constant(w)], {"x": x}
    for name, a in (("bias", bias), ("res", res)):
        if a is not None:
            ins.append(g.input(name, a.shape))
            feeds[name] = a
    g.set_outputs([g.apply(DynamicQMatMul(tuple(ws), has_bias, act, has_res, mode), ins)])

    def oracle(rnd):
        q, scale, zp = _row_quant(rnd(x).reshape(-1, k), mode)
        acc = (q - zp[:, None]) @ w.astype(np.int64)
        y32 = acc.astype(F32) * (scale[:, None] * np.broadcast_to(ws, (n,))[None, :]).astype(F32)
        return [_epilogue(y32.reshape(*lead, n), act, *_rounded(rnd, bias, res))]

    check(g, feeds, {}, oracle, COMPUTE, STRICT)


@examples(10)
@given(
    batch=st.sampled_from([(1,), (2,), (2, 2)]), m=st.integers(1, 6), k=st.sampled_from([1, 5, 20, 100]),
    n=st.sampled_from([1, 6, 33]), mode=st.sampled_from(list(ActQuant)), tb=st.booleans(),
    alpha=st.sampled_from([1.0, 0.125, 0.37]), seed=SEEDS,
)  # fmt: skip
def test_dynamic_qbatch_matmul_matches_int64(batch, m, k, n, mode, tb, alpha, seed) -> None:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((*batch, m, k)).astype(F32)
    b = rng.standard_normal((*batch, n, k) if tb else (*batch, k, n)).astype(F32)
    g = rlx.Graph("dqbmm")
    op = DynamicQBatchMatMul(mode, tb, alpha)
    g.set_outputs([g.apply(op, [g.input("a", a.shape), g.input("b", b.shape)])])

    def oracle(rnd):
        ar, br = rnd(a), rnd(b)
        bt = br if tb else np.swapaxes(br, -1, -2)
        want = np.empty((*batch, m, n))
        for i in np.ndindex(*batch):
            qa, sa, za = _row_quant(ar[i], mode)
            qb, sb, _ = _row_quant(bt[i], ActQuant.S8)
            acc = (qa - za[:, None]) @ qb.T
            sbn = (sb * F32(alpha)).astype(F32)
            want[i] = acc.astype(F32) * (sa[:, None] * sbn[None, :]).astype(F32)
        return [want]

    check(g, {"a": a, "b": b}, {}, oracle, COMPUTE, STRICT)


@st.composite
def qconv_cases(draw: st.DrawFn):
    groups = draw(st.sampled_from([1, 2]))
    c, o = groups * draw(st.sampled_from([1, 3, 9])), groups * draw(st.sampled_from([1, 3, 17]))
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(2))
    sp = tuple(d * (kk - 1) + 1 + draw(st.integers(0, 4)) for kk, d in zip(k, dil, strict=True))
    return draw(st.integers(1, 2)), c, o, groups, k, stride, dil, pads, sp


def _qconv_acc(x, w, zp, stride, pads, dil, groups) -> np.ndarray:
    """Explicit loops: sum over (c, a, b) of (x - zp)[n, c, i*s + a*d, j*s + b*d] * w."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (pt, pb), (pl, pr) = pads
    xs = np.pad(x.astype(np.int64) - zp, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ho = (h + pt + pb - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + pl + pr - dil[1] * (kw - 1) - 1) // stride[1] + 1
    acc = np.zeros((n, o, ho, wo), np.int64)
    og = o // groups
    for oc in range(o):
        gi = oc // og
        for ci in range(cg):
            for a in range(kh):
                for b in range(kw):
                    r0, c0 = a * dil[0], b * dil[1]
                    patch = xs[:, gi * cg + ci, r0 : r0 + stride[0] * ho : stride[0],
                               c0 : c0 + stride[1] * wo : stride[1]]  # fmt: skip
                    acc[:, oc] += patch * int(w[oc, ci, a, b])
    return acc


@examples(10)
@given(case=qconv_cases(), unsigned=st.booleans(), per_channel=st.booleans(),
       has_bias=st.booleans(), seed=SEEDS)  # fmt: skip
def test_qconv2d_matches_int64_loops(case, unsigned, per_channel, has_bias, seed) -> None:
    n, c, o, groups, k, stride, dil, pads, sp = case
    rng = np.random.default_rng(seed)
    lo, hi = RANGES["u8" if unsigned else "i8"]
    x = rng.integers(lo, hi + 1, (n, c, *sp)).astype(np.uint8 if unsigned else np.int8)
    w = rng.integers(-128, 128, (o, c // groups, *k)).astype(np.int8)
    zp, x_scale = int(rng.integers(lo, hi + 1)), float(rng.uniform(0.01, 0.1))
    ws = rng.uniform(1e-3, 1e-2, o if per_channel else 1).astype(F32)
    bias = rng.standard_normal(o).astype(F32)
    g = rlx.Graph("qconv")
    op = QConv2d(stride, pads, dil, x_scale, zp, tuple(ws), groups, has_bias)
    ins = [g.input("x", x.shape, "u8" if unsigned else "i8"), g.constant(w)]
    ins += [g.input("bias", (o,))] if has_bias else []
    g.set_outputs([g.apply(op, ins)])
    acc = _qconv_acc(x, w, zp, stride, pads, dil, groups)
    y = (
        acc.astype(F32)
        * (F32(x_scale) * np.broadcast_to(ws, (o,))).astype(F32)[None, :, None, None]
    )
    feeds = {"x": x, **({"bias": bias} if has_bias else {})}

    def oracle(rnd):
        return [y.astype(np.float64) + (rnd(bias)[None, :, None, None] if has_bias else 0)]

    check(g, feeds, {}, oracle, COMPUTE, STRICT)
