"""Differential fuzzing of every kind of the elementwise and reduction ops (harness.py:
reference interpreter and compiled graph, every precision policy and native target) — the
random-graph fuzzer (test_differential.py) draws only some of them — against oracles
computed element by element with Python's ``math``, ``fractions`` and ints:

* ``unary``: every UnaryKind on floats (round half to even on ties, domains respected),
  and the integer ones (relu, neg, abs, square, sign) with two's-complement wrapping;
* ``binary``: every BinaryKind on floats, ints (division truncating toward zero, x / 0 = 0,
  fmod's sign, integer pow with negative exponents, wrapping) and bools (and, or);
* ``compare`` (every kind, NaN and ties) and ``where`` (broadcasting three ways);
* ``cast`` between f64, f32, f16, bf16, the integer types, bool and c64: exact rounding
  to nearest even by ``fractions.Fraction``, truncation toward zero to integers;
* ``reduce``: sum, mean, max, min, prod over any set of axes, keepdims, ints, empty axes.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.dtype import DType
from rlx.ops.base import OpKind
from rlx.ops.elementwise import (
    Binary,
    BinaryKind,
    Cast,
    Compare,
    CompareKind,
    Unary,
    UnaryKind,
    Where,
)
from rlx.ops.reduce import Reduce, ReduceKind

from .harness import EXACT, SEEDS, Tol, check, exact_values, examples
from .test_ops_bits import SHAPES, _broadcast_pair, _wrap

F32 = np.float32
EW = [OpKind.ELEMENTWISE]
TOL = Tol(2e-6, 1.5e-3, 1e-2)  # one rounding at the op's precision, a few f32 ulps
INTS = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "u8": np.uint8,
        "u32": np.uint32}  # fmt: skip


def _sig(v: float) -> float:
    return 1 / (1 + math.exp(-v)) if v >= 0 else math.exp(v) / (1 + math.exp(v))


UNARY = {  # fn, (lo, hi) of the inputs drawn
    UnaryKind.RELU: (lambda v: max(v, 0.0), (-4, 4)),
    UnaryKind.GELU: (lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))), (-5, 5)),
    UnaryKind.GELU_TANH: (
        lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
        (-5, 5),
    ),  # fmt: skip
    UnaryKind.SILU: (lambda v: v * _sig(v), (-8, 8)),
    UnaryKind.SIGMOID: (_sig, (-8, 8)),
    UnaryKind.TANH: (math.tanh, (-4, 4)),
    UnaryKind.EXP: (math.exp, (-8, 8)),
    UnaryKind.LOG: (math.log, (0.01, 50)),
    UnaryKind.SQRT: (math.sqrt, (0, 50)),
    UnaryKind.RSQRT: (lambda v: 1 / math.sqrt(v), (0.01, 50)),
    UnaryKind.NEG: (lambda v: -v, (-8, 8)),
    UnaryKind.ABS: (abs, (-8, 8)),
    UnaryKind.SIN: (math.sin, (-7, 7)),
    UnaryKind.COS: (math.cos, (-7, 7)),
    UnaryKind.ROUND: (lambda v: float(round(v)), (-6, 6)),
    UnaryKind.FLOOR: (math.floor, (-6, 6)),
    UnaryKind.CEIL: (math.ceil, (-6, 6)),
    UnaryKind.RECIP: (lambda v: 1 / v, (0.05, 8)),
    UnaryKind.SQUARE: (lambda v: v * v, (-8, 8)),
    UnaryKind.SOFTPLUS: (lambda v: max(v, 0) + math.log1p(math.exp(-abs(v))), (-10, 10)),
    UnaryKind.ERF: (math.erf, (-3, 3)),
    UnaryKind.SIGN: (lambda v: float(int(v > 0) - int(v < 0)), (-3, 3)),
}
INT_UNARY = {
    UnaryKind.RELU: lambda v: max(v, 0),
    UnaryKind.NEG: lambda v: -v,
    UnaryKind.ABS: abs,
    UnaryKind.SQUARE: lambda v: v * v,
    UnaryKind.SIGN: lambda v: int(v > 0) - int(v < 0),
}


@examples(16)
@given(fn=st.sampled_from([*UNARY, UnaryKind.NOT]), shape=SHAPES, dt=st.sampled_from(["f32", *INTS]), seed=SEEDS)  # fmt: skip
def test_unary_kinds_match_math(fn, shape, dt, seed) -> None:
    rng = np.random.default_rng(seed)
    if fn is UnaryKind.NOT:
        dt = "bool"
        x = rng.random(shape) < 0.5
        want = [~x]
    elif dt != "f32" and fn in INT_UNARY:
        info = np.iinfo(INTS[dt])
        x = rng.integers(info.min, info.max, shape, dtype=INTS[dt], endpoint=True)
        want = [np.array([_wrap(INT_UNARY[fn](int(v)), x.dtype) for v in x.flat], np.int64).reshape(shape)]  # fmt: skip
    else:
        dt = "f32"
        f, (lo, hi) = UNARY[fn]
        x = rng.uniform(lo, hi, shape).astype(F32)
        ties = rng.random(shape) < 0.3  # quarters: ties of round, integers of floor / ceil
        x = np.where(ties, np.clip(np.round(x * 4) / 4, lo, hi), x).astype(F32)

        def want(rnd):
            return [np.array([f(v) for v in np.clip(rnd(x), lo, hi).flat], np.float64).reshape(shape)]  # fmt: skip

    g = rlx.Graph("unary")
    g.set_outputs([g.apply(Unary(fn), [g.input("x", shape, dt)])])
    check(g, {"x": x}, {}, want, EW, TOL if dt == "f32" else EXACT)


def _trunc_div(a: int, b: int) -> int:
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _int_pow(a: int, b: int) -> int:
    if b >= 0:
        return a**b
    return 1 if a == 1 else ((-1 if b % 2 else 1) if a == -1 else 0)


INT_BINARY = {
    BinaryKind.ADD: lambda a, b: a + b,
    BinaryKind.SUB: lambda a, b: a - b,
    BinaryKind.MUL: lambda a, b: a * b,
    BinaryKind.DIV: _trunc_div,
    BinaryKind.MAX: max,
    BinaryKind.MIN: min,
    BinaryKind.POW: _int_pow,
    BinaryKind.MOD: lambda a, b: (abs(a) % abs(b)) * (-1 if a < 0 else 1),  # fmod, exactly
}
FLOAT_BINARY = {
    BinaryKind.ADD: lambda a, b: a + b,
    BinaryKind.SUB: lambda a, b: a - b,
    BinaryKind.MUL: lambda a, b: a * b,
    BinaryKind.DIV: lambda a, b: a / b,
    BinaryKind.MAX: max,
    BinaryKind.MIN: min,
    BinaryKind.POW: lambda a, b: a**b,
    BinaryKind.MOD: math.fmod,
}


@st.composite
def binary_cases(draw: st.DrawFn):
    fn = draw(st.sampled_from(list(BinaryKind)))
    if fn in (BinaryKind.AND, BinaryKind.OR):
        dt = "bool"
    else:
        dt = draw(st.sampled_from(["f32", "f32", "i8", "i32", "i64", "u8"]))
    return fn, dt, _broadcast_pair(draw)


@examples(16)
@given(case=binary_cases(), seed=SEEDS)
def test_binary_kinds_match_python(case, seed) -> None:
    fn, dt, (sa, sb) = case
    rng = np.random.default_rng(seed)
    shape = np.broadcast_shapes(sa, sb)
    if dt == "bool":
        a, b = rng.random(sa) < 0.5, rng.random(sb) < 0.5
        op = (lambda p, q: p and q) if fn is BinaryKind.AND else (lambda p, q: p or q)
        aa, bb = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
        want = [np.array([op(bool(p), bool(q)) for p, q in zip(aa.flat, bb.flat)]).reshape(shape)]
        tol = EXACT
    elif dt != "f32":
        t = np.dtype(INTS[dt])
        info = np.iinfo(t)
        if fn is BinaryKind.POW:
            a = rng.integers(max(info.min, -4), 5, sa).astype(t)
            b = rng.integers(-2 if info.min < 0 else 0, 6, sb).astype(t)
        else:
            a = rng.integers(info.min, info.max, sa, dtype=t, endpoint=True)
            b = rng.integers(info.min, info.max, sb, dtype=t, endpoint=True)
            small = rng.random(sb) < 0.5  # divisors of a few units, zero for div
            b = np.where(small, rng.integers(max(info.min, -3), 4, sb), b).astype(t)
            if fn is BinaryKind.MOD:
                b = np.where(b == 0, 1, b).astype(t)  # fmod by 0 is left undefined
        aa, bb = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
        vals = [_wrap(INT_BINARY[fn](int(p), int(q)), t) for p, q in zip(aa.flat, bb.flat)]
        want = [np.array(vals, np.int64).reshape(shape)]
        tol = EXACT
    else:
        a = rng.uniform(-6, 6, sa).astype(F32)
        b = rng.uniform(-6, 6, sb).astype(F32)
        if fn is BinaryKind.POW:  # integral exponents of any base, or positive bases
            if rng.random() < 0.4:  # |a| >= 0.5: a**-6 stays within f16's range
                b = np.round(b).astype(F32)
                a = (np.sign(a) * np.maximum(np.abs(a), 0.5)).astype(F32)
            else:
                a, b = (np.abs(a) + F32(0.1)).astype(F32), (b / 2).astype(F32)
        if fn in (BinaryKind.DIV, BinaryKind.MOD):
            b = np.where(np.abs(b) < 0.25, F32(0.5), b).astype(F32)
        a = np.where(rng.random(sa) < 0.2, np.round(a), a).astype(F32)  # ties of max / min
        f = FLOAT_BINARY[fn]

        def want(rnd):
            aa, bb = np.broadcast_to(rnd(a), shape), np.broadcast_to(rnd(b), shape)
            with np.errstate(divide="ignore", over="ignore"):  # 0 ** -n: inf, as IEEE
                vals = [f(p, q) for p, q in zip(aa.flat, bb.flat)]
            return [np.array(vals, np.float64).reshape(shape)]

        tol = TOL
    g = rlx.Graph("binary")
    g.set_outputs([g.apply(Binary(fn), [g.input("a", sa, dt), g.input("b", sb, dt)])])
    check(g, {"a": a, "b": b}, {}, want, EW, tol)


CMP = {
    CompareKind.EQ: lambda a, b: a == b,
    CompareKind.NE: lambda a, b: a != b,
    CompareKind.LT: lambda a, b: a < b,
    CompareKind.LE: lambda a, b: a <= b,
    CompareKind.GT: lambda a, b: a > b,
    CompareKind.GE: lambda a, b: a >= b,
}


@examples(14)
@given(fn=st.sampled_from(list(CompareKind)), dt=st.sampled_from(["f32", "i32", "u8"]),
       pair=st.data(), seed=SEEDS)  # fmt: skip
def test_compare_and_where_match_python(fn, dt, pair, seed) -> None:
    sa, sb = _broadcast_pair(pair.draw)
    sc = pair.draw(st.sampled_from([(), (1,), sa[-1:] or (1,)]))
    rng = np.random.default_rng(seed)
    if dt == "f32":  # a small grid: ties; and NaN
        a, b = exact_values(rng, sa, lim=4), exact_values(rng, sb, lim=4)
        a[rng.random(sa) < 0.1] = np.nan
    else:
        a = rng.integers(0, 5, sa).astype(INTS[dt])
        b = rng.integers(0, 5, sb).astype(INTS[dt])
    cond = rng.random(sc) < 0.5
    g = rlx.Graph("compare")
    ia, ib = g.input("a", sa, dt), g.input("b", sb, dt)
    g.set_outputs([g.apply(Compare(fn), [ia, ib]), g.apply(Where(), [g.input("c", sc, "bool"), ia, ib])])  # fmt: skip
    shape = np.broadcast_shapes(sa, sb)
    aa, bb = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    cmp = np.array([CMP[fn](float(p), float(q)) for p, q in zip(aa.flat, bb.flat)]).reshape(shape)
    wshape = np.broadcast_shapes(sc, sa, sb)
    cc, wa, wb = (np.broadcast_to(v, wshape) for v in (cond, a, b))
    sel = np.array([p if c else q for c, p, q in zip(cc.flat, wa.flat, wb.flat)]).reshape(wshape)
    check(g, {"a": a, "b": b, "c": cond}, {}, [cmp, sel], EW, EXACT)


# precision, min exponent (of frexp), largest finite value
FLOATS = {"f64": (53, -1021, float(np.finfo(np.float64).max)),
          "f32": (24, -125, (2 - 2.0**-23) * 2.0**127), "f16": (11, -13, 65504.0),
          "bf16": (8, -125, (2 - 2.0**-7) * 2.0**127)}  # fmt: skip


def _round_exact(v, to: str) -> float:
    """``v`` (float or int) rounded once to nearest even in ``to``; inf beyond range."""
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) or v == 0:
        return float(v)
    p, emin, big = FLOATS[to]
    x = Fraction(v)
    e = math.floor(math.log2(abs(x))) + 1
    while abs(x) >= Fraction(2) ** e:
        e += 1
    while abs(x) < Fraction(2) ** (e - 1):
        e -= 1
    step = Fraction(2) ** (max(e, emin) - p)  # subnormals keep a fixed step
    r = round(x / step) * step  # Fraction's round: half to even
    return math.copysign(math.inf, v) if abs(r) > Fraction(big) else float(r)


CAST_FROM = ["f64", "f32", "f16", "bf16", "i8", "i32", "i64", "u8", "bool", "c64"]
CAST_TO = ["f64", "f32", "f16", "bf16", "i8", "i16", "i32", "i64", "u8", "u32", "bool", "c64"]


def _cast_source(rng, src: str, to: str, shape) -> np.ndarray:
    if src == "bool":
        return rng.random(shape) < 0.5
    if src in INTS:
        info = np.iinfo(INTS[src])
        lo, hi = info.min, info.max
        if to in INTS:  # within the target's range (out of range is left undefined)
            lo, hi = max(lo, np.iinfo(INTS[to]).min), min(hi, np.iinfo(INTS[to]).max)
        if to == "f32":  # a narrow policy runs a cast to f32 at 16 bits: within f16's range
            lo, hi = max(lo, -60000), min(hi, 60000)
        return rng.integers(lo, hi, shape, dtype=INTS[src], endpoint=True)
    lim = {"i8": 127, "u8": 255, "i16": 32767}.get(to, 2e9 if to in ("i32", "u32") else 1e15)
    lim = min(lim, 6e4) if src == "f16" else lim
    lim = min(lim, 6e4) if to == "f32" else lim  # a narrow policy runs cast-to-f32 at 16 bits
    lo = 0.0 if to in ("u8", "u32") else -lim
    v = rng.uniform(lo, lim, shape) * 10.0 ** rng.integers(-6, 1, shape)
    v[rng.random(shape) < 0.2] = 0.0
    if to not in INTS and to != "bool":  # values beyond f16 / subnormal ones / specials
        extra = [-1e-7, 3e-6, np.inf, np.nan] + ([] if to == "f32" or src == "f16" else [7e4])
        v = np.where(rng.random(shape) < 0.2, rng.choice(extra, shape), v)
    if src == "c64":
        return (v + 1j * rng.standard_normal(shape)).astype(np.complex64)
    return v.astype(DType(src).np)


def _cast_oracle(x: np.ndarray, src: str, to: str) -> np.ndarray:
    out = []
    for v in x.flat:
        if src == to == "c64":
            out.append(complex(v))
            continue
        v = complex(v).real if src == "c64" else (bool(v) if src == "bool" else (int(v) if src in INTS else float(v)))  # fmt: skip
        if to == "bool":
            out.append(v != 0)
        elif to in INTS:
            out.append(int(v))  # truncation toward zero
        elif to == "c64":
            out.append(complex(_round_exact(float(v), "f32")))
        else:
            out.append(_round_exact(int(v) if isinstance(v, bool) else v, to))
    kind = bool if to == "bool" else (np.int64 if to in INTS else (complex if to == "c64" else np.float64))  # fmt: skip
    return np.array(out, kind).reshape(x.shape)


@examples(16)
@given(src=st.sampled_from(CAST_FROM), to=st.sampled_from(CAST_TO), shape=SHAPES, seed=SEEDS)
def test_cast_matches_exact_rounding(src, to, shape, seed) -> None:
    rng = np.random.default_rng(seed)
    x = _cast_source(rng, src, to, shape)
    g = rlx.Graph("cast")
    g.set_outputs([g.apply(Cast(DType(to)), [g.input("x", shape, src)])])
    want = [_cast_oracle(x, src, to)]
    # a cast to f32 runs at the policy's precision (cast(x, f32) becomes cast(x, low)): one
    # rounding there; every other target is exact under every policy
    tol = Tol(0.0, 1e-3, 8e-3) if to == "f32" else EXACT
    check(g, {"x": x}, {}, want, [OpKind.DATA_MOVEMENT], tol)


@examples(16)
@given(
    fn=st.sampled_from(list(ReduceKind)), shape=st.sampled_from([(5,), (3, 4), (2, 3, 2), (2, 0, 3), (3, 70), (40, 5)]),
    dt=st.sampled_from(["f32", "f32", "i32", "i64"]), keep=st.booleans(), data=st.data(), seed=SEEDS,
)  # fmt: skip
def test_reduce_kinds_match_loops(fn, shape, dt, keep, data, seed) -> None:
    if fn is ReduceKind.MEAN:
        dt = "f32"
    if 0 in shape and fn is ReduceKind.MEAN:
        shape = (2, 3)
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    rng = np.random.default_rng(seed)
    if dt == "f32":
        x = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape) if fn is ReduceKind.PROD else rng.standard_normal(shape) * 3  # fmt: skip
        x = np.where(rng.random(shape) < 0.3, np.round(x), x).astype(F32)  # ties of max / min
    else:
        x = rng.integers(-1000, 1000, shape).astype(INTS[dt])
        if fn is ReduceKind.PROD:
            x = rng.integers(-3, 4, shape).astype(INTS[dt])
    g = rlx.Graph("reduce")
    g.set_outputs([g.apply(Reduce(fn, axes, keep), [g.input("x", shape, dt)])])
    rest = [i for i in range(len(shape)) if i not in axes]
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keep else tuple(shape[i] for i in rest)  # fmt: skip

    def run(rnd, absolute=False):
        v = rnd(x) if dt == "f32" else x.astype(object)
        v = np.abs(v) if absolute else v
        out = []
        for pos in np.ndindex(*(shape[i] for i in rest)):
            items = []
            for j in np.ndindex(*(shape[i] for i in axes)):
                idx = [0] * len(shape)
                for i, q in [*zip(rest, pos, strict=True), *zip(axes, j, strict=True)]:
                    idx[i] = q
                items.append(v[tuple(idx)])
            if fn is ReduceKind.SUM:
                r = sum(items, 0.0 if dt == "f32" else 0)
            elif fn is ReduceKind.PROD:
                r = math.prod(items)
            elif fn is ReduceKind.MEAN:
                r = sum(items) / len(items)
            elif dt == "f32":
                r = (max if fn is ReduceKind.MAX else min)(items, default=-math.inf if fn is ReduceKind.MAX else math.inf)  # fmt: skip
            else:
                info = np.iinfo(INTS[dt])
                r = (max if fn is ReduceKind.MAX else min)(items, default=info.min if fn is ReduceKind.MAX else info.max)  # fmt: skip
            out.append(r if dt == "f32" else _wrap(int(r), np.dtype(INTS[dt])))
        return [np.array(out, np.float64 if dt == "f32" else np.int64).reshape(out_shape)]

    if dt != "f32":
        check(g, {"x": x}, {}, run, [OpKind.REDUCTION], EXACT)
    else:  # the error of a sum is relative to the sum of |terms|
        check(g, {"x": x}, {}, run, [OpKind.REDUCTION], TOL, lambda rnd: [1 + run(rnd, True)[0]])
