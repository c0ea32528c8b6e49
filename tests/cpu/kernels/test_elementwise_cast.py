"""f64 and integer -> bf16 / f16 casts round once, from the source value (issue 19, fault
16).

ml_dtypes before 0.7 converts f64 to bf16 through f32, rounding twice: 13.90625 + 2**-30 becomes
13.875, where 13.9375 is nearest. The oracle here is an independent round to nearest
even written with NumPy integer operations on the f64 bits; the reference interpreter,
the compiled Cast kernel and a cast inside a native elementwise region must all equal it
on 64 edge values (ties in f32 that are not ties in f64, exact ties, overflow, subnormals,
NaN, infinities, signed zeros) and on random bit patterns.

Integer -> bf16 casts had the same fault (ml_dtypes and the region C code went through
f32: i32 16842753 gave 16777216 where 16908288 is nearest). Every integer source (i8 to
i64, u8, u32) -> bf16 / f16 is checked on the three paths against an oracle that rounds
the Python integer itself: ties at every binade, the dtype's limits, f16's overflow.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.kernels import KernelKind
from rlx.backends.reference import evaluate
from rlx.dtype import DType
from rlx.options import CompileOptions
from rlx.runtime.session import Session

RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)
# (exponent bits, fraction bits) of the 16-bit formats
FORMATS = {DType.BF16: (8, 7), DType.F16: (5, 10)}


def rne_bits(x: np.ndarray, exp_bits: int, frac_bits: int) -> np.ndarray:
    """The 16-bit pattern of each f64 in ``x`` rounded once to nearest, ties to even, in
    the binary format with ``exp_bits`` / ``frac_bits`` (NaN -> the quiet NaN, overflow
    -> inf), computed on the integer significand and exponent of the f64."""
    u = np.ascontiguousarray(x, np.float64).view(np.uint64)
    sign = ((u >> np.uint64(63)).astype(np.uint16)) << np.uint16(15)
    e64 = ((u >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    f64 = u & np.uint64((1 << 52) - 1)
    bias = (1 << (exp_bits - 1)) - 1
    inf = np.uint16(((1 << exp_bits) - 1) << frac_bits)
    # |x| = sig * 2**(e - 52), sig < 2**53
    sig = np.where(e64 > 0, f64 | np.uint64(1 << 52), f64)
    e = np.where(e64 > 0, e64 - 1023, -1022)
    # the target's spacing at |x| is 2**(max(e, 1 - bias) - frac_bits)
    shift = np.minimum(np.maximum(e, 1 - bias) - frac_bits - (e - 52), 60).astype(np.uint64)
    q = sig >> shift
    rem = sig - (q << shift)
    half = np.uint64(1) << (shift - np.uint64(1))
    up = (rem > half) | ((rem == half) & ((q & np.uint64(1)) == 1))
    q = q + up.astype(np.uint64)
    # the exponent field of the result's binade (0 for subnormals); a carry out of the
    # significand moves to the next binade by itself
    field = np.maximum(e + bias, 1) - 1
    mag = (field.astype(np.uint64) << np.uint64(frac_bits)) + q
    mag = np.minimum(mag, np.uint64(inf)).astype(np.uint16)
    mag = np.where(
        e64 == 0x7FF, np.where(f64 == 0, inf, inf | np.uint16(1 << (frac_bits - 1))), mag
    )
    return (mag | sign).astype(np.uint16)


def edge_values(dt: DType) -> np.ndarray:
    """64 f64 values at the edges of ``dt``'s rounding."""
    exp_bits, frac_bits = FORMATS[dt]
    bias = (1 << (exp_bits - 1)) - 1
    vals: list[float] = []
    # (significand, exponent) of a lower neighbour; its midpoint with the next value
    lows = [
        (1.0, 0),  # 1 and its successor
        (1.0 + 2.0**-frac_bits, 0),  # an odd significand: ties go up
        (13.875 / 8, 3),  # the 13.875 / 13.9375
        (1.5, -20),
        (1.0, bias),  # the largest binade
        (1.0, 1 - bias),  # the smallest normal
        (2.0**-3, 1 - bias),  # subnormal
        (3 * 2.0**-frac_bits, 1 - bias),  # an odd subnormal
    ]
    for s, e in lows:
        lo = s * 2.0**e
        ulp = 2.0 ** (max(e, 1 - bias) - frac_bits)
        mid = lo + ulp / 2
        tiny = max(mid * 2.0**-35, 2.0**-1074)  # far below f32's resolution at ``mid``
        for v in (mid - tiny, mid, mid + tiny):
            vals += [v, -v]
    top = (2.0 - 2.0**-frac_bits) * 2.0**bias  # the largest finite value
    over = top + 2.0 ** (bias - frac_bits) / 2  # from here on: inf
    vals += [top, over - over * 2.0**-40, over, over + over * 2.0**-40, 2.0**128, 1e300]
    vals += [0.0, -0.0, np.inf, -np.inf, np.nan, -(2.0**-1074)]
    smallest = 2.0 ** (1 - bias - frac_bits)
    vals += [smallest / 2, smallest / 2 + smallest * 2.0**-30, -smallest / 2, 0.1]
    assert len(vals) == 64
    return np.array(vals, np.float64)


def bits_of(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


def assert_same(got: np.ndarray, x: np.ndarray, dt: DType) -> None:
    """``got`` equals the oracle bit for bit (any NaN for a NaN)."""
    want = rne_bits(x, *FORMATS[dt])
    g = bits_of(got)
    nan = np.isnan(x)
    assert np.isnan(got[nan].astype(np.float32)).all()
    bad = np.flatnonzero((g != want) & ~nan)
    assert bad.size == 0, [
        (float(x[i]), float(got[i].astype(np.float64)), hex(int(want[i]))) for i in bad[:8]
    ]


def test_oracle_on_known_values() -> None:
    """The oracle against values worked out by hand (and against NumPy's own f64 -> f16,
    which rounds once)."""
    x = np.array([13.90625 + 2.0**-30, 13.90625, 13.96875, 1.0 + 2.0**-9, -0.0, 3.4e38, 1e-45])
    want = np.array([13.9375, 13.875, 14.0, 1.0, -0.0, np.inf, 0.0])
    got = rne_bits(x, 8, 7).astype(np.uint32) << np.uint32(16)
    np.testing.assert_array_equal(got.view(np.float32), want.astype(np.float32))
    r = np.random.default_rng(0).integers(0, 2**64, 20000, dtype=np.uint64).view(np.float64)
    r = np.concatenate([r, edge_values(DType.F16)])
    with np.errstate(all="ignore"):
        numpy_f16 = r.astype(np.float16).view(np.uint16)
    ok = ~np.isnan(r)
    np.testing.assert_array_equal(rne_bits(r, 5, 10)[ok], numpy_f16[ok])


def test_reference_keeps_its_own_rounding_while_old_ml_dtypes_are_supported() -> None:
    """Why ``Cast.reference`` rounds f64 / integers -> bf16 itself: ml_dtypes before 0.7
    (checked: 0.4.1, 0.5.4, 0.6.0) converts through f32 and rounds twice (13.90625 +
    2**-30 -> 13.875; i32 16842753 -> 16777216); 0.7.0 rounds once. The special case can
    go once the project's lower bound on ml_dtypes reaches 0.7: this test then fails, to
    say so. (What rlx computes is checked against the oracle above, not against
    ml_dtypes, whichever version is installed.)"""
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    (req,) = [d for d in meta["project"]["dependencies"] if d.startswith("ml_dtypes")]
    lower = re.search(r">=\s*([\d.]+)", req)
    assert lower is not None, req
    assert tuple(int(p) for p in lower.group(1).split(".")[:2]) < (0, 7), (
        f"{req}: every supported ml_dtypes rounds once; drop f64_to_bf16 / int_to_bf16"
    )


def cast_graph(dt: DType, n: int) -> rlx.Graph:
    g = rlx.Graph("cast")
    g.set_outputs([g.cast(g.input("x", (n,), DType.F64), dt)])
    return g


def region_graph(dt: DType, n: int) -> rlx.Graph:
    g = rlx.Graph("cast_region")
    x = g.input("x", (n,), DType.F64)
    g.set_outputs([g.elementwise_region([x], lambda sg, a: sg.cast(sg.mul(a, 1.0), dt))])
    return g


def random_values(n: int, seed: int) -> np.ndarray:
    """Random bit patterns, and values near bf16 / f16 ties at every exponent."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**64, n, dtype=np.uint64).view(np.float64)
    near = rng.uniform(1, 2, n) * 2.0 ** rng.integers(-140, 128, n)
    for fb in (7, 10):
        tie = (np.floor(near * 2.0 ** (fb - np.floor(np.log2(near)))) + 0.5) * 2.0 ** (
            np.floor(np.log2(near)) - fb
        )
        near = np.where(rng.random(n) < 0.5, tie * (1 + rng.normal(0, 2.0**-32, n)), near)
    return np.concatenate([bits, near, -near])


@pytest.mark.parametrize("dt", [DType.BF16, DType.F16], ids=str)
def test_reference_rounds_once(dt: DType) -> None:
    for x in (edge_values(dt), random_values(20000, 1)):
        assert_same(evaluate(cast_graph(dt, x.size), {"x": x})[0], x, dt)


@pytest.mark.parametrize("dt", [DType.BF16, DType.F16], ids=str)
def test_compiled_cast_rounds_once(dt: DType) -> None:
    x = np.concatenate([edge_values(dt), random_values(5000, 2)])
    cg = Session("cpu").compile(cast_graph(dt, x.size), RAW)
    assert_same(cg.run({"x": x})[0], x, dt)


@pytest.mark.skipif(not native.available(), reason="gcc is not installed")
@pytest.mark.parametrize("dt", [DType.BF16, DType.F16], ids=str)
def test_cast_in_a_native_region_rounds_once(dt: DType) -> None:
    x = np.concatenate([edge_values(dt), random_values(5000, 3)])
    cg = Session("cpu").compile(region_graph(dt, x.size), RAW)
    (entry,) = [e for e in cg._executor_any().entries if e.op == "elementwise_region"]
    assert entry.kind is KernelKind.NATIVE, entry.notes
    assert_same(cg.run({"x": x})[0], x, dt)


# ---- integer sources -------------------------------------------------------------------

INT_SOURCES = [DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U32]


def int_rne_bits(values: list[int], exp_bits: int, frac_bits: int) -> np.ndarray:
    """The 16-bit pattern of each Python int rounded once to nearest, ties to even, in the
    binary format with ``exp_bits`` / ``frac_bits`` (beyond the largest finite value:
    inf), worked out on the integer itself."""
    bias = (1 << (exp_bits - 1)) - 1
    out = []
    for v in values:
        sign = 0x8000 if v < 0 else 0
        m = abs(v)
        if m == 0:
            out.append(sign)
            continue
        e = m.bit_length() - 1  # 2**e <= m < 2**(e + 1)
        shift = e - frac_bits  # the spacing at m is 2**shift
        if shift <= 0:
            q = m << -shift
        else:
            q, rem = m >> shift, m & ((1 << shift) - 1)
            half = 1 << (shift - 1)
            q += rem > half or (rem == half and q & 1)
            if q >> (frac_bits + 1):  # carried into the next binade
                q, e = q >> 1, e + 1
        if e + bias >= (1 << exp_bits) - 1:
            out.append(sign | ((1 << exp_bits) - 1) << frac_bits)
        else:
            out.append(sign | (e + bias) << frac_bits | (q - (1 << frac_bits)))
    return np.array(out, np.uint16)


def int_edge_values(src: DType, dt: DType) -> np.ndarray:
    """Integers of ``src`` at the edges of ``dt``'s rounding: below, on and above the ties
    at every binade the source reaches (odd and even neighbours), its limits, the issue's
    16842753, and f16's overflow threshold."""
    info = np.iinfo(src.np)
    frac_bits = FORMATS[dt][1]
    vals = {0, 1, -1, int(info.min), int(info.max), int(info.max) - 1, 16842753, -16842753}
    vals |= {65504, 65519, 65520, 65535, 65536, 2**24 + 1, 2**53 + 1, 2**63 - 2**39 - 1}
    for e in range(frac_bits + 1, info.bits):
        spacing = 1 << (e - frac_bits)
        for lo in (1 << e, (1 << e) + spacing, (1 << (e + 1)) - spacing):
            tie = lo + spacing // 2
            vals |= {tie - 1, tie, tie + 1, lo}
    vals |= {-v for v in vals}
    ok = [v for v in sorted(vals) if info.min <= v <= info.max]
    return np.array(ok, src.np)


def int_random_values(src: DType, n: int, seed: int) -> np.ndarray:
    """Random integers of ``src``: uniform bit patterns and log-uniform magnitudes."""
    info = np.iinfo(src.np)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 2**64, n, dtype=np.uint64).view(np.int64).astype(src.np)
    mag = (2.0 ** rng.uniform(0, info.bits - 1, n)).astype(np.uint64).astype(src.np)
    if info.min < 0:
        mag = np.where(rng.random(n) < 0.5, mag, -mag)
    return np.concatenate([raw, mag])


def assert_same_int(got: np.ndarray, x: np.ndarray, dt: DType) -> None:
    """``got`` equals the integer oracle bit for bit."""
    want = int_rne_bits([int(v) for v in x], *FORMATS[dt])
    bad = np.flatnonzero(bits_of(got) != want)
    assert bad.size == 0, [
        (int(x[i]), float(got[i].astype(np.float64)), hex(int(want[i]))) for i in bad[:8]
    ]


def test_int_oracle_on_known_values() -> None:
    """The integer oracle against values worked out by hand, and against NumPy's int ->
    f16 (exact below 2**24, so NumPy's conversion rounds once there)."""
    got = int_rne_bits([16842753, 16842752, -16908289, 2**64 - 1, 65520, 257], 8, 7)
    want = np.array([16908288, 16777216, -16908288, 2.0**64, 65536, 256], np.float32)
    np.testing.assert_array_equal((got.astype(np.uint32) << np.uint32(16)).view(np.float32), want)
    r = np.arange(-70000, 70000)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(
            int_rne_bits([int(v) for v in r], 5, 10), r.astype(np.float16).view(np.uint16)
        )


def int_cast_graph(src: DType, dt: DType, n: int, region: bool) -> rlx.Graph:
    g = rlx.Graph("int_cast")
    x = g.input("x", (n,), src)
    if region:
        g.set_outputs([g.elementwise_region([x], lambda sg, a: sg.cast(a, dt))])
    else:
        g.set_outputs([g.cast(x, dt)])
    return g


@pytest.mark.parametrize("dt", [DType.BF16, DType.F16], ids=str)
@pytest.mark.parametrize("src", INT_SOURCES, ids=str)
def test_int_cast_rounds_once(src: DType, dt: DType) -> None:
    """Reference interpreter, compiled Cast kernel and (for the C-rendered sources) a cast
    in a native region, each against the integer oracle."""
    x = np.concatenate([int_edge_values(src, dt), int_random_values(src, 3000, 4)])
    assert_same_int(evaluate(int_cast_graph(src, dt, x.size, False), {"x": x})[0], x, dt)
    cg = Session("cpu").compile(int_cast_graph(src, dt, x.size, False), RAW)
    assert_same_int(cg.run({"x": x})[0], x, dt)
    cg = Session("cpu").compile(int_cast_graph(src, dt, x.size, True), RAW)
    if native.available():
        (entry,) = [e for e in cg._executor_any().entries if e.op == "elementwise_region"]
        assert entry.kind is KernelKind.NATIVE, entry.notes
    assert_same_int(cg.run({"x": x})[0], x, dt)
