"""Calibration faults of issues 35 and 29: the percentile rank, the int8 scale floor and
degenerate calibration data.

1. The percentile calibrator's threshold is the bin holding the value of rank
   ``ceil(q / 100 * n)`` (1-based): np.percentile's ``inverted_cdf`` definition. The rank
   used to be computed in floating point, where ``99.9 / 100 * 1000`` is
   ``999.0000000000001``, so the threshold moved up one rank (999 N(0,1) values and one
   40.0: p99.9 was 40.0 instead of about 3.3).
2. A tap whose int8 step ``amax / 127`` is below the scale floor (1e-6) used to get the
   floored scale (coarser grid; below 5e-7 every value quantized to 0, relative error
   1.0), silently, while the u8 path used no floor at all. Both paths now follow one
   rule: the floor bounds every activation step, and a tap whose step it would coarsen
   keeps its layers in float (warning and ``kept_float`` entry naming the tensor).
3. Calibration data that cannot describe real inputs is refused or worked around, and
   said: a tap whose values did not spread (constant data) keeps its layers in float; a
   range whose square overflows f32 (1e30, the f32 maximum) is a QuantizationError; NaN /
   Inf among the values is a warning naming the tensor; no numpy overflow leaks out of
   the calibrators; the report's error is the one the returned model has on the data it
   was measured on, and never prints nan.
"""

from __future__ import annotations

import math
import re
import warnings
from fractions import Fraction

import numpy as np
import pytest

import rlx
from rlx.errors import QuantizationError, QuantizationWarning
from rlx.ops.linalg import MatMul
from rlx.ops.quant import QMatMul
from rlx.options import CompileOptions
from rlx.quant.api import quantize
from rlx.quant.calibrate import (
    SCALE_FLOOR,
    EntropyCalibrator,
    PercentileCalibrator,
    StreamingHistogram,
)
from rlx.quant.report import ErrorAccumulator
from rlx.quant.static import TapStats, act_entry
from rlx.runtime.session import Session

NAN_IN_A_NUMBER = re.compile(r"(max abs|relative|cosine|scale) nan", re.IGNORECASE)
F32_MAX = float(np.finfo(np.float32).max)

# ---- 1. the percentile rank -------------------------------------------------------------

QS = (99.0, 99.9, 99.99, 99.999)


def rank_pairs() -> list[tuple[float, int, int]]:
    """(q, n, rank) where ``q / 100 * n`` is within 1e-9 of an integer (the rank), for
    n in 1..100000: the pairs where floating point lands on either side of a whole
    number (or on it)."""
    out = []
    for q in QS:
        for n in range(1, 100_001):
            t = q / 100.0 * n
            if abs(t - round(t)) < 1e-9:
                out.append((q, n, round(t)))
    return out


PAIRS = rank_pairs()


_POOL = np.random.default_rng(35)
_SMALL = np.minimum(np.abs(_POOL.standard_normal(100_000)), 3.99)
_BIG = 40.0 + _POOL.random(100_000)


def rank_data(n: int, rank: int) -> np.ndarray:
    """``rank`` values of |N(0,1)| (< 4) and ``n - rank`` outliers >= 40: the values of
    rank ``rank`` and ``rank + 1`` lie 36 apart, many bins (order does not matter to a
    histogram or a percentile)."""
    return np.concatenate([_SMALL[:rank], _BIG[: n - rank]])


def want_percentile(data: np.ndarray, q: float, rank: int) -> float:
    """The oracle. The calibrator's definition is np.percentile's ``inverted_cdf`` (the
    smallest value whose empirical CDF reaches q%: rank ``ceil(q / 100 * n)``). NumPy
    evaluates ``q / 100 * n`` in floating point too, so its ``inverted_cdf`` shares the
    fault on exactly these pairs (``np.percentile(np.arange(1, 1001), 99.9,
    method='inverted_cdf')`` is 1000.0). ``method='lower'`` takes the value of rank
    ``floor((n - 1) q / 100) + 1``, which equals ``ceil(n q / 100)`` whenever
    ``n q / 100`` is a whole number, and its virtual index ``(n - 1) q / 100 = rank -
    q / 100`` lies ~0.01..0.99 away from any integer here, so float rounding cannot move
    it: on these pairs it is the exact inverted-CDF value."""
    return float(np.percentile(data, q, method="lower"))


def test_the_rank_pairs_cover_float_rounding_both_ways():
    above = [(q, n) for q, n, r in PAIRS if q / 100.0 * n > r]
    below = [(q, n) for q, n, r in PAIRS if q / 100.0 * n < r]
    assert (99.9, 1000) in above and above and below
    assert {q for q, _, _ in PAIRS} == set(QS)
    assert all(Fraction(str(q)) * n / 100 == r for q, n, r in PAIRS)


@pytest.mark.parametrize("q", QS)
def test_histogram_percentile_picks_the_exact_rank(q):
    pairs = [(n, r) for qq, n, r in PAIRS if qq == q]
    wrong = []
    for n, rank in pairs:
        data = rank_data(n, rank)
        want = want_percentile(data, q, rank)
        h = StreamingHistogram(2048)
        h.add(data)
        got = h.percentile(q)
        # the upper edge of the bin holding the rank's value: within one bin width above
        if not want < got <= want + h.width:
            wrong.append((n, rank, want, got))
    assert not wrong, f"q={q}: {len(wrong)} of {len(pairs)} pairs wrong, first {wrong[:3]}"


@pytest.mark.parametrize(("q", "n"), [(99.9, 1000), (99.0, 100), (99.0, 700), (99.99, 10000)])
def test_percentile_calibrator_on_one_outlier_matches_numpy(q, n):
    """The issue's case (999 N(0,1) values and one 40.0, p99.9) and others like it, through
    the compiled graph (|x| taken by the calibrator, the data in two batches)."""
    rank = int(Fraction(str(q)) * n / 100)
    rng = np.random.default_rng(n)
    data = rng.standard_normal(n)
    data[rng.permutation(n)[: n - rank]] = 40.0  # the outliers (one for 99.9 / 1000)
    data = data.astype(np.float32)
    g = rlx.Graph("pct")
    x = g.input("x", (n // 2,))
    g.set_outputs([x])
    cal = PercentileCalibrator(
        Session("cpu").compile(g, CompileOptions(use_cache=False)), [x], percentile=q
    )
    cal.step({"x": data[: n // 2]})
    cal.step({"x": data[n // 2 :]})
    want = want_percentile(np.abs(data).astype(np.float64), q, rank)
    assert want == float(np.sort(np.abs(data))[rank - 1])  # the rank-th smallest, 1-based
    got = float(cal.amax()[0])
    assert want < got <= want + cal.histograms[0].width  # before: 40.0
    assert got < 5.0


# ---- 2. the scale floor -----------------------------------------------------------------

RNG = np.random.default_rng(35)
W = (RNG.standard_normal((16, 8)) / 4).astype(np.float32)


def one_layer() -> rlx.Graph:
    g = rlx.Graph("one")
    x = g.input("x", (8, 16))
    g.set_outputs([g.matmul(x, g.param("w", (16, 8)))])
    return g


def batches(n: int, scale: float, seed: int, offset: float = 0.0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {"x": (rng.standard_normal((8, 16)) * scale + offset).astype(np.float32)} for _ in range(n)
    ]


def rel_error(result, data: list[dict[str, np.ndarray]]) -> float:
    """Relative L2 error of the quantized model vs a NumPy forward pass on ``data``."""
    num = den = 0.0
    for b in data:
        want = b["x"].astype(np.float64) @ W.astype(np.float64)
        got = result.compiled.run(b)[0].astype(np.float64)
        num += float(np.sum((got - want) ** 2))
        den += float(np.sum(want**2))
    return math.sqrt(num / den)


def quantize_recording(graph, cal, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = quantize(graph, cal, params={"w": W}, **kw)
    return r, [w for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("scale", [1e-7, 5e-6])
@pytest.mark.parametrize("asymmetric", [False, None, True])
def test_a_tap_below_the_scale_floor_is_kept_float_in_both_paths(scale, asymmetric):
    """max |x| ~4e-7 (every value used to quantize to 0: relative error 1.0) and ~2e-5
    (the floored scale left ~20 of 127 levels); s8 and u8 follow the same rule."""
    cal = batches(4, scale, seed=1)
    r, caught = quantize_recording(one_layer(), cal, asymmetric=asymmetric)
    rep = r.report
    assert rep.quantized == [] and list(rep.kept_float) == ["w"]
    why = rep.kept_float["w"]
    assert "input 'x'" in why and f"scale floor {SCALE_FLOOR:g}" in why
    assert any("input 'x'" in str(w.message) and "scale floor" in str(w.message) for w in caught)
    assert not r.graph.find(QMatMul) and len(r.graph.find(MatMul)) == 1
    assert rel_error(r, batches(3, scale, seed=2)) < 1e-5  # before: 1.0 / 0.04 (s8)
    text = str(rep)
    assert re.search(r"kept float: w\b.*input 'x'.*scale floor", text)
    assert not NAN_IN_A_NUMBER.search(text)


@pytest.mark.parametrize("asymmetric", [False, None, True])
def test_a_tap_above_the_floor_is_quantized_in_both_paths(asymmetric):
    cal = batches(4, 1e-3, seed=3)
    r, caught = quantize_recording(one_layer(), cal, asymmetric=asymmetric)
    assert r.report.quantized == ["w"] and not caught
    (entry, _) = r.record["w"]
    assert entry.scales[0] >= SCALE_FLOOR
    assert rel_error(r, batches(3, 1e-3, seed=4)) < 0.05


def test_the_u8_step_has_the_same_floor_as_the_s8_step():
    """One-sided [0, 1.5e-4]: its s8 step 1.18e-6 clears the floor, its natural u8 step
    5.9e-7 does not (it used to be taken as is: the two paths disagreed)."""
    hi = 1.5e-4
    st = TapStats(max(hi / 127, SCALE_FLOOR), hi, 0.0, hi, 100, 0, None, hi)
    e = act_entry(st, None)
    assert e.dtype.name == "U8" and e.scales[0] == pytest.approx(SCALE_FLOOR)
    assert e.zero_points == (0,)
    assert act_entry(st, False).scales[0] == pytest.approx(hi / 127)


# ---- 3. degenerate calibration data -----------------------------------------------------


@pytest.mark.parametrize("asymmetric", [None, False])
@pytest.mark.parametrize("noise", [0.0, 1e-3])
def test_constant_calibration_data_keeps_the_layer_float(asymmetric, noise):
    """3.0 everywhere (or 3.0 +- 1e-3: spread below one int8 step): the range says
    nothing about real inputs (u8 clipped them to [0, 3]: relative error 0.58 here)."""
    cal = batches(3, noise, seed=5, offset=3.0)
    r, caught = quantize_recording(one_layer(), cal, asymmetric=asymmetric)
    rep = r.report
    assert rep.quantized == [] and list(rep.kept_float) == ["w"]
    assert "input 'x'" in rep.kept_float["w"] and "spread" in rep.kept_float["w"]
    assert any("input 'x'" in str(w.message) for w in caught)
    assert rel_error(r, batches(3, 1.0, seed=6)) < 1e-5  # before: 0.58 (u8)
    assert not NAN_IN_A_NUMBER.search(str(rep))


def two_layers() -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    """``relu(x @ w0) @ w1 + z @ wz``: only ``z`` is degenerate."""
    rng = np.random.default_rng(29)
    p = {
        "w0": (rng.standard_normal((16, 32)) / 4).astype(np.float32),
        "w1": (rng.standard_normal((32, 8)) / 4).astype(np.float32),
        "wz": (rng.standard_normal((16, 8)) / 4).astype(np.float32),
    }
    g = rlx.Graph("two")
    x, z = g.input("x", (8, 16)), g.input("z", (8, 16))
    h = g.relu(g.matmul(x, g.param("w0", (16, 32))))
    g.set_outputs([g.add(g.matmul(h, g.param("w1", (32, 8))), g.matmul(z, g.param("wz", (16, 8))))])
    return g, p


def test_the_report_error_is_the_one_the_model_has_on_its_data():
    g, p = two_layers()
    rng = np.random.default_rng(7)
    cal = [
        {"x": rng.standard_normal((8, 16)).astype(np.float32), "z": np.full((8, 16), 3, np.float32)}
        for _ in range(4)
    ]
    with pytest.warns(RuntimeWarning, match=r"layer 'wz' is kept in float: activation input 'z'"):
        r = quantize(g, cal, params=p)
    assert r.report.quantized == ["w0", "w1"] and list(r.report.kept_float) == ["wz"]
    acc = ErrorAccumulator(1)
    for b in cal:  # eval defaults to the first 4 calibration batches: all of them
        acc.add(r.compiled.run(b), r.float_compiled.run(b))
    (err,) = r.report.outputs
    (mine,) = acc.stats()
    assert err.measured and err.relative == pytest.approx(mine.relative, rel=1e-9)
    assert err.max_abs == pytest.approx(mine.max_abs, rel=1e-9)
    assert not NAN_IN_A_NUMBER.search(str(r.report))


@pytest.mark.parametrize("value", [1e30, F32_MAX, -1e25])
@pytest.mark.parametrize("constant", [True, False])
def test_a_saturating_calibration_range_is_an_error(value, constant):
    """Values whose square overflows f32: the quantized model's relative error on real
    inputs was 1.0 while its report said 0.003 (measured on that data) or 'unmeasured'."""
    rng = np.random.default_rng(8)
    cal = [
        {"x": (np.ones((8, 16)) if constant else rng.random((8, 16))).astype(np.float32) * value}
        for _ in range(2)
    ]
    with pytest.raises(QuantizationError, match=r"activation input 'x' .*'w'.* overflows f32"):
        quantize(one_layer(), cal, params={"w": W})


def test_nan_among_the_calibration_values_is_a_warning_naming_the_tensor():
    cal = batches(3, 1.0, seed=9)
    cal[1]["x"][2, 3] = np.nan
    with pytest.warns(QuantizationWarning, match=r"activation input 'x' .*1 NaN/Inf values"):
        r = quantize(one_layer(), cal, params={"w": W}, eval_data=batches(2, 1.0, seed=10))
    assert r.report.quantized == ["w"]
    assert rel_error(r, batches(3, 1.0, seed=11)) < 0.05


@pytest.mark.parametrize("cls", [PercentileCalibrator, EntropyCalibrator])
def test_histogram_calibrators_at_the_f32_maximum_give_a_finite_threshold(cls):
    """The histogram's top edge (2**128) does not fit f32: the cast used to overflow to
    inf with numpy's 'overflow encountered in cast' RuntimeWarning."""
    g = rlx.Graph("top")
    x = g.input("x", (64,))
    g.set_outputs([x])
    cal = cls(Session("cpu").compile(g, CompileOptions(use_cache=False)), [x])
    data = np.full(64, F32_MAX, np.float32)
    data[::2] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cal.step({"x": data})
        amax, scales = cal.amax(), cal.scales()
    assert np.isfinite(amax).all() and np.isfinite(scales).all()
    assert 0 < amax[0] <= F32_MAX
