"""Differential fuzzing of the bit-level and shape ops (harness.py: reference interpreter
and compiled graph, every precision policy and native target) against oracles written
with Python's own ints and ``struct`` / ``math`` modules, element by element:

* ``bitwise`` (and, or, xor, shl, shr with broadcasting; every integer dtype, bool for
  the logical ones) and ``bitwise_not``: Python ints wrapped to the dtype's width;
* ``bitcast``: ``struct.pack`` / ``unpack`` of each element (bf16 as the top half of the
  f32 word);
* ``trig`` (tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh): ``math`` functions;
* ``shape_of``: the dims of the arrays fed, over symbolic dims, on one compiled graph run
  at several sizes.
"""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.dtype import DType
from rlx.ops.base import OpKind
from rlx.ops.bitcast import Bitcast
from rlx.ops.bitwise import Bitwise, BitwiseKind, BitwiseNot
from rlx.ops.trig import Trig, TrigKind

from .harness import EXACT, SEEDS, Tol, check, compiled, examples

# small shapes, and some past a SIMD vector (16 / 32 / 64 lanes) and its tail
SHAPES = st.sampled_from(
    [(1,), (5,), (2, 3), (3, 1), (4, 1, 2), (2, 3, 4), (37,), (3, 67), (130, 1)]
)
INT_DTYPES = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
              "u8": np.uint8, "u32": np.uint32}  # fmt: skip


def _wrap(v: int, dt: np.dtype) -> int:
    """``v`` wrapped to the two's-complement range of ``dt``."""
    bits = dt.itemsize * 8
    v &= (1 << bits) - 1
    if dt.kind == "i" and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def _bit_oracle(fn: BitwiseKind, a: int, b: int, dt: np.dtype) -> int:
    bits = dt.itemsize * 8
    if fn is BitwiseKind.AND:
        return _wrap(a & b, dt)
    if fn is BitwiseKind.OR:
        return _wrap(a | b, dt)
    if fn is BitwiseKind.XOR:
        return _wrap(a ^ b, dt)
    if fn is BitwiseKind.SHL:
        return 0 if b >= bits else _wrap(a << b, dt)
    return a >> min(b, bits)  # Python's >> is arithmetic; a >= 0 for unsigned dtypes


def _broadcast_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shape = draw(SHAPES)
    other = tuple(d if draw(st.booleans()) else 1 for d in shape)
    if draw(st.booleans()):
        other = other[draw(st.integers(0, len(other))) :]
    return (shape, other) if draw(st.booleans()) else (other, shape)


@st.composite
def bitwise_cases(draw: st.DrawFn):
    fn = draw(st.sampled_from(list(BitwiseKind)))
    shift = fn in (BitwiseKind.SHL, BitwiseKind.SHR)
    names = list(INT_DTYPES) + ([] if shift else ["bool"])
    return fn, draw(st.sampled_from(names)), _broadcast_pair(draw)


@examples(12)
@given(case=bitwise_cases(), seed=SEEDS)
def test_bitwise_matches_python_ints(case, seed) -> None:
    fn, dname, (sa, sb) = case
    rng = np.random.default_rng(seed)
    if dname == "bool":
        dt = np.dtype(bool)
        a, b = rng.random(sa) < 0.5, rng.random(sb) < 0.5
    else:
        dt = np.dtype(INT_DTYPES[dname])
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, sa, dtype=dt, endpoint=True)
        if fn in (BitwiseKind.SHL, BitwiseKind.SHR):  # counts 0..width+2 (>= width too)
            b = rng.integers(0, dt.itemsize * 8 + 3, sb).astype(dt)
        else:
            b = rng.integers(info.min, info.max, sb, dtype=dt, endpoint=True)
    g = rlx.Graph("bitwise")
    ia, ib = g.input("a", sa, dname), g.input("b", sb, dname)
    g.set_outputs([g.apply(Bitwise(fn), [ia, ib]), g.apply(BitwiseNot(), [ia])])
    shape = np.broadcast_shapes(sa, sb)
    aa, bb = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    if dname == "bool":
        op = {BitwiseKind.AND: bool.__and__, BitwiseKind.OR: bool.__or__,
              BitwiseKind.XOR: bool.__xor__}[fn]  # fmt: skip
        want = [np.array([op(bool(x), bool(y)) for x, y in zip(aa.flat, bb.flat)]).reshape(shape)]
        want.append(np.array([not bool(x) for x in a.flat]).reshape(sa))
    else:
        want = [np.array([_bit_oracle(fn, int(x), int(y), dt) for x, y in
                          zip(aa.flat, bb.flat)], np.int64).reshape(shape)]  # fmt: skip
        want.append(np.array([_wrap(~int(x), dt) for x in a.flat], np.int64).reshape(sa))
    check(g, {"a": a, "b": b}, {}, want, [OpKind.ELEMENTWISE], EXACT)


# (from, to, struct format of from, of to); bf16 handled apart
BITCASTS = [
    ("f32", "i32", "f", "i"), ("i32", "f32", "i", "f"), ("f32", "u32", "f", "I"),
    ("u32", "i32", "I", "i"), ("f64", "i64", "d", "q"), ("i64", "f64", "q", "d"),
    ("i8", "u8", "b", "B"), ("u8", "i8", "B", "b"), ("f16", "i16", "e", "h"),
    ("i16", "f16", "h", "e"), ("bool", "u8", "?", "B"), ("bf16", "i16", None, "h"),
    ("i16", "bf16", "h", None),
]  # fmt: skip


def _source_values(rng: np.random.Generator, name: str, shape) -> np.ndarray:
    if name == "bool":
        return rng.random(shape) < 0.5
    if name in ("f32", "f64", "f16", "bf16"):
        v = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)
        v[rng.random(shape) < 0.1] = 0.0
        return v.astype(DType(name).np)
    dt = np.dtype(DType(name).np)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)


def _struct_bitcast(x: np.ndarray, src: str, dst: str, fs: str | None, fd: str | None):
    out = []
    for v in x.flat:
        if fs is None:  # bf16 -> bits: the top half of the f32 word
            word = struct.unpack("<I", struct.pack("<f", float(v)))[0] >> 16
            raw = struct.pack("<H", word)
        else:
            raw = struct.pack("<" + fs, v.item())
        if fd is None:  # bits -> bf16: the f32 whose top half they are
            out.append(struct.unpack("<f", struct.pack("<I", struct.unpack("<H", raw)[0] << 16))[0])
        else:
            out.append(struct.unpack("<" + fd, raw)[0])
    if dst in ("f32", "f64", "f16", "bf16"):
        return np.array(out, np.float64).reshape(x.shape)
    return np.array(out, np.int64).reshape(x.shape)


@examples(10)
@given(case=st.sampled_from(BITCASTS), shape=SHAPES, seed=SEEDS)
def test_bitcast_matches_struct(case, shape, seed) -> None:
    src, dst, fs, fd = case
    rng = np.random.default_rng(seed)
    x = _source_values(rng, src, shape)
    if dst in ("f32", "f16", "f64", "bf16"):  # reinterpret only non-NaN bit patterns
        y = np.ascontiguousarray(x).view(
            {"f32": np.float32, "f16": np.float16, "f64": np.float64,
             "bf16": ml_dtypes.bfloat16}[dst])  # fmt: skip
        with np.errstate(invalid="ignore"):
            x = np.where(np.isnan(y.astype(np.float64)), np.zeros((), x.dtype), x)
    g = rlx.Graph("bitcast")
    xi = g.input("x", shape, src)
    g.set_outputs([g.apply(Bitcast(DType(dst)), [xi])])
    want = [_struct_bitcast(x, src, dst, fs, fd)]
    check(g, {"x": x}, {}, want, [OpKind.DATA_MOVEMENT], EXACT)


# each function with inputs inside its domain and away from its poles
TRIG = {
    TrigKind.TAN: (math.tan, -1.3, 1.3),
    TrigKind.ASIN: (math.asin, -0.95, 0.95),
    TrigKind.ACOS: (math.acos, -0.95, 0.95),
    TrigKind.ATAN: (math.atan, -6.0, 6.0),
    TrigKind.SINH: (math.sinh, -5.0, 5.0),
    TrigKind.COSH: (math.cosh, -5.0, 5.0),
    TrigKind.ASINH: (math.asinh, -20.0, 20.0),
    TrigKind.ACOSH: (math.acosh, 1.05, 20.0),
    TrigKind.ATANH: (math.atanh, -0.95, 0.95),
}


@examples(12)
@given(fn=st.sampled_from(list(TrigKind)), shape=SHAPES, seed=SEEDS)
def test_trig_matches_math(fn, shape, seed) -> None:
    f, lo, hi = TRIG[fn]
    rng = np.random.default_rng(seed)
    x = rng.uniform(lo, hi, shape).astype(np.float32)
    g = rlx.Graph("trig")
    g.set_outputs([g.apply(Trig(fn), [g.input("x", shape)])])

    def oracle(rnd):
        # clipped: an end of the domain may round outside it at 16 bits
        xr = np.clip(rnd(x), lo, hi)
        return [np.array([f(v) for v in xr.flat], np.float64).reshape(shape)]

    check(g, {"x": x}, {}, oracle, [OpKind.ELEMENTWISE], Tol(2e-6, 2e-3, 1.6e-2))


@examples(6)
@given(
    dims=st.lists(st.integers(1, 6), min_size=3, max_size=3),
    runs=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 4)), min_size=1, max_size=3),
)
def test_shape_of_reads_symbolic_dims_at_run_time(dims, runs) -> None:
    g = rlx.Graph("shape_of")
    b, s = g.sym("b", max=8), g.sym("s", max=8)
    x = g.input("x", (b, dims[0], s), "f32")
    y = g.input("y", (dims[1], dims[2]), "i32")
    both = g.concat([x, x], 0)  # [2*b, d0, s]
    g.set_outputs([g.shape_of(x), g.shape_of(both), g.shape_of(y)])
    feeds = [
        {"x": np.zeros((bb, dims[0], ss), np.float32), "y": np.zeros(dims[1:], np.int32)}
        for bb, ss in runs
    ]
    wants = [
        [np.array(list(f["x"].shape), np.int64),
         np.array([2 * f["x"].shape[0], *f["x"].shape[1:]], np.int64),
         np.array(dims[1:], np.int64)]
        for f in feeds
    ]  # fmt: skip
    for f, w in zip(feeds, wants, strict=True):
        for i, (a, b2) in enumerate(zip(g.evaluate(f), w, strict=True)):
            assert a.dtype == np.int64 and a.tolist() == b2.tolist(), f"reference output {i}"
    for v in compiled(g, {}, [OpKind.DATA_MOVEMENT]):
        for f, w in zip(feeds, wants, strict=True):  # one compiled graph, every size
            for i, (a, b2) in enumerate(zip(v.cg.run(f), w, strict=True)):
                assert a.dtype == np.int64 and a.tolist() == b2.tolist(), f"{v.label} output {i}"
