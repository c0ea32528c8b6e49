"""Calibration: the seed's max-abs calibrator, percentile and entropy calibrators, the
streaming histogram, calibrate() with and without a progress bar."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.backends.cpu.calibrate import (
    CalibrationMethod,
    Calibrator,
    EntropyCalibrator,
    PercentileCalibrator,
    StreamingHistogram,
    calibrate,
    kl_threshold,
)
from rlx.errors import QuantizationError
from rlx.runtime.options import CompileOptions
from rlx.runtime.session import Session


def relu_graph(n: int = 4) -> tuple[rlx.Graph, int, int]:
    g = rlx.Graph("calib_demo")
    x = g.input("x", (n,))
    y = g.relu(x)
    g.set_outputs([x, y])  # tap on x and y
    return g, x, y


def compile_(g: rlx.Graph) -> rlx.runtime.compiled.CompiledGraph:
    return Session("cpu").compile(g, CompileOptions(use_cache=False))


def test_calibrator_tracks_max_abs_across_batches() -> None:
    """The seed's test: three hand-packed batches with known max-abs."""
    g, x, y = relu_graph()
    cal = Calibrator(compile_(g), [x, y])
    cal.step({"x": np.array([-3.0, 1.0, -2.0, 0.5], np.float32)})
    cal.step({"x": np.array([-7.0, 0.0, -7.0, -2.0], np.float32)})  # relu zeroes these
    np.testing.assert_allclose(cal.max_abs(), [7.0, 1.0])
    cal.step({"x": np.array([10.0, 0.0, 0.0, 5.0], np.float32)})
    np.testing.assert_allclose(cal.max_abs(), [10.0, 10.0], atol=1e-6)
    np.testing.assert_allclose(cal.scales(), [10.0 / 127.0] * 2, atol=1e-6)
    assert cal.batches == 3 and set(cal.scale_map()) == {x, y}


def test_flat_tensor_scale_is_floored() -> None:
    g, x, y = relu_graph()
    cal = Calibrator(compile_(g), [y])
    cal.step({"x": -np.ones(4, np.float32)})
    assert cal.max_abs()[0] == 0.0 and cal.scales()[0] == np.float32(1e-6)


def test_tap_must_be_an_output() -> None:
    g = rlx.Graph("t")
    x = g.input("x", (4,))
    hidden = g.exp(x)
    g.set_outputs([g.relu(hidden)])
    with pytest.raises(QuantizationError, match=r"taps \[1\] are not outputs.*set_outputs"):
        Calibrator(compile_(g), [hidden])
    with pytest.raises(QuantizationError, match="at least one tap"):
        Calibrator(compile_(g), [])


@given(
    batches=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    scales=st.lists(st.floats(1e-3, 1e3), min_size=6, max_size=6),
    seed=st.integers(0, 1000),
)
def test_streaming_histogram_equals_one_shot(
    batches: list[int], scales: list[float], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    data = [np.abs(rng.standard_normal(n)) * s for n, s in zip(batches, scales, strict=False)]
    stream = StreamingHistogram(256)
    for d in data:
        stream.add(d)
    once = StreamingHistogram(256)
    once.add(np.concatenate(data))
    assert stream.hi == once.hi
    np.testing.assert_array_equal(stream.counts, once.counts)
    assert stream.total == sum(batches) and stream.counts.size == 256


def test_histogram_memory_is_bounded_and_zeros_are_counted() -> None:
    h = StreamingHistogram(128)
    h.add(np.zeros(10))
    assert h.hi is None and h.total == 10
    for k in range(200):
        h.add(np.full(3, 1.5**k))
    assert h.counts.size == 128 and h.total == 610
    with pytest.raises(QuantizationError, match="power of two"):
        StreamingHistogram(100)


def feed_batches(data: np.ndarray, batch: int) -> list[dict[str, np.ndarray]]:
    return [{"x": data[i : i + batch]} for i in range(0, data.size, batch)]


def test_percentile_calibrator_matches_numpy() -> None:
    n = 4000
    rng = np.random.default_rng(0)
    data = rng.standard_normal(n * 10).astype(np.float32)
    g, x, _ = relu_graph(n)
    cal = PercentileCalibrator(compile_(g), [x], percentile=99.0)
    for b in feed_batches(data, n):
        cal.step(b)
    want = np.percentile(np.abs(data), 99.0)
    width = cal.histograms[0].width
    assert abs(cal.amax()[0] - want) <= width + 1e-6
    np.testing.assert_allclose(cal.max_abs()[0], np.abs(data).max())
    with pytest.raises(QuantizationError, match="percentile"):
        PercentileCalibrator(compile_(g), [x], percentile=0.0)


def test_entropy_calibrator_on_known_distributions() -> None:
    n = 5000
    rng = np.random.default_rng(1)
    # uniform |x|: no tail to clip, the threshold stays near the max
    uni = rng.uniform(-1, 1, n * 4).astype(np.float32)
    g, x, _ = relu_graph(n)
    cal = EntropyCalibrator(compile_(g), [x])
    for b in feed_batches(uni, n):
        cal.step(b)
    assert 0.9 <= cal.amax()[0] <= np.abs(uni).max()
    # a Gaussian with a few huge outliers: clip far below the max (TensorRT picks a few sigma)
    gauss = rng.standard_normal(n * 4).astype(np.float32)
    gauss[::2000] = 60.0
    cal = EntropyCalibrator(compile_(g), [x])
    for b in feed_batches(gauss, n):
        cal.step(b)
    t = float(cal.amax()[0])
    assert 3.0 <= t <= 10.0, t
    assert cal.scales()[0] == pytest.approx(t / 127, rel=1e-6)


def test_kl_threshold_prefers_full_range_without_outliers() -> None:
    counts = np.zeros(2048, np.int64)
    counts[:1024] = 100  # flat up to half the range, nothing above
    assert kl_threshold(counts, 1.0) == 1024.0
    assert kl_threshold(np.zeros(2048), 0.5) == 1024.0  # empty: the whole range


@pytest.mark.parametrize("method", list(CalibrationMethod))
def test_calibrate_runs_every_method(method: CalibrationMethod) -> None:
    g, x, y = relu_graph(64)
    cg = compile_(g)
    data = np.random.default_rng(2).standard_normal(64 * 5).astype(np.float32)
    cal = calibrate(cg, feed_batches(data, 64), method, progress=True)
    assert cal.batches == 5 and cal.taps == (x, y)
    assert (cal.scales() > 0).all() and (cal.amax() <= cal.max_abs() + 1e-6).all()
    cal2 = calibrate(cg, iter(feed_batches(data, 64)), method, taps=[y], progress=False)
    np.testing.assert_allclose(cal2.amax(), cal.amax()[1:], rtol=1e-6)


def test_calibrate_rejects_no_batches_and_bad_method() -> None:
    g, x, _ = relu_graph()
    with pytest.raises(QuantizationError, match="no batches"):
        calibrate(compile_(g), [], progress=False)
    with pytest.raises(QuantizationError, match="CalibrationMethod"):
        calibrate(compile_(g), [], "entropy", progress=False)  # type: ignore[arg-type]


def test_progress_bar_when_tqdm_installed_silent_fallback_without(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    g, x, _ = relu_graph()
    cg = compile_(g)
    batches = [{"x": np.ones(4, np.float32)}] * 3
    calibrate(cg, batches, progress=True)
    assert "calibrate" in capsys.readouterr().err  # tqdm writes its bar to stderr
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # as if tqdm were not installed
    cal = calibrate(cg, batches, progress=True)
    captured = capsys.readouterr()
    assert cal.batches == 3 and captured.err == "" and captured.out == ""
