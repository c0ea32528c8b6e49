"""Regression tests for issue 19's runtime faults: CompiledGraph.run from several threads,
thread-count validation, RLX_* flag parsing and the streaming histogram's range."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import config
from rlx.errors import CompileError, ConfigError
from rlx.quant.calibrate import StreamingHistogram
from rlx.runtime.session import clear_compile_cache


def _tanh_mlp() -> tuple[rlx.Graph, np.ndarray]:
    g = rlx.Graph("threads")
    x = g.input("x", rlx.Shape(("b", 64), rlx.DType.F32))
    w = g.param("w", rlx.Shape((64, 64), rlx.DType.F32))
    g.set_outputs(g.tanh(g.matmul(x, w)))
    w_val = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) * 0.1
    return g, w_val


def test_one_compiled_graph_shared_by_8_threads_gives_each_its_own_result():
    g, w = _tanh_mlp()
    compiled = rlx.Session("cpu").compile(g, params={"w": w})
    wrong: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        rng = np.random.default_rng(100 + t)
        try:
            for i in range(60):
                # different batch sizes: threads also race on the shape-plan LRU
                x = rng.standard_normal((1 + (t + i) % 4, 64)).astype(np.float32)
                (y,) = compiled.run({"x": x})
                if y.shape != x.shape or not np.allclose(y, np.tanh(x @ w), atol=1e-5):
                    wrong.append((t, i))
                if i % 20 == 7:
                    compiled.set_param("w", w)  # concurrent param writes of the same value
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert wrong == []


def test_compile_cache_from_several_threads():
    g, w = _tanh_mlp()
    clear_compile_cache()
    results: list[bool] = []

    def worker() -> None:
        c = rlx.Session("cpu").compile(g, params={"w": w})
        x = np.ones((2, 64), np.float32)
        results.append(bool(np.allclose(c.run({"x": x})[0], np.tanh(x @ w), atol=1e-5)))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 6


@pytest.mark.parametrize("bad", [0, -1, -8, 2.0, True, "2"])
def test_num_threads_below_one_or_not_an_int_is_rejected(bad):
    g, w = _tanh_mlp()
    with pytest.raises(CompileError, match="num_threads"):
        rlx.Session("cpu").compile(g, params={"w": w}, options=rlx.CompileOptions(num_threads=bad))


def test_num_threads_beyond_the_machine_is_clamped_with_a_warning():
    g, w = _tanh_mlp()
    with pytest.warns(RuntimeWarning, match="100000 exceeds"):
        c = rlx.Session("cpu").compile(
            g, params={"w": w}, options=rlx.CompileOptions(num_threads=100000)
        )
    assert c.num_threads == config.available_cpus()


def test_huge_thread_count_in_a_large_fused_region_runs(tmp_path: Path):
    """Was a segfault (an OpenMP team of 100000 in a native region): run in a child."""
    script = textwrap.dedent(
        """
        import warnings, numpy as np, rlx
        warnings.simplefilter("ignore")
        g = rlx.Graph("big")
        x = g.input("x", rlx.Shape((512, 4096), rlx.DType.F32))
        g.set_outputs(g.tanh(g.exp(g.neg(g.mul(x, x)))))
        for opts in (rlx.CompileOptions(num_threads=100000), rlx.CompileOptions()):
            c = rlx.Session("cpu").compile(g, options=opts)
            xv = np.random.default_rng(0).standard_normal((512, 4096)).astype(np.float32)
            (y,) = c.run({"x": xv})
            assert np.allclose(y, np.tanh(np.exp(-(xv * xv))), atol=1e-6)
        print("ok")
        """
    )
    env = {"RLX_NUM_THREADS": "100000", "RLX_CACHE_DIR": str(tmp_path)}
    r = _run_child(script, env)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def _run_child(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("value", ["-3", "0", "abc", "1.5"])
def test_bad_rlx_num_threads_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("RLX_NUM_THREADS", value)
    with pytest.raises(ConfigError, match="RLX_NUM_THREADS"):
        config.num_threads()


def test_rlx_num_threads_is_clamped(monkeypatch):
    monkeypatch.setenv("RLX_NUM_THREADS", "100000")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert config.num_threads() == config.available_cpus()


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("off", False),
        ("False", False),
        ("no", False),
        ("0", False),
        ("", False),
        ("1", True),
        ("ON", True),
        ("true", True),
    ],
)
def test_rlx_verbose_spellings(monkeypatch, value, want):
    monkeypatch.setenv("RLX_VERBOSE", value)
    assert config.verbose() is want


def test_rlx_verbose_garbage_names_the_variable(monkeypatch):
    monkeypatch.setenv("RLX_VERBOSE", "maybe")
    with pytest.raises(ConfigError, match="RLX_VERBOSE='maybe'"):
        config.verbose()


def test_empty_cache_dir_is_refused_not_the_working_directory(monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", "")  # neither the cwd nor, silently, the default
    with pytest.raises(ConfigError, match="RLX_CACHE_DIR='' is empty"):
        config.cache_dir()
    monkeypatch.delenv("RLX_CACHE_DIR")
    assert config.cache_dir() == Path.home() / ".cache" / "rlx"
    monkeypatch.setenv("RLX_CACHE_DIR", "relative/dir")
    assert config.cache_dir().is_absolute()


@pytest.mark.parametrize(("name", "value"), [("RLX_VERIFY", "sometimes"), ("RLX_ISA", "sse9")])
def test_bad_enumerated_flags_name_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        config.verify_mode() if name == "RLX_VERIFY" else config.isa()


def test_streaming_histogram_takes_the_f64_maximum():
    big = np.finfo(np.float64).max
    h = StreamingHistogram(256)
    h.add(np.array([1.0, 2.0]))
    h.add(np.array([big]))
    assert h.total == 3
    assert h.counts[0] == 2 and h.counts[-1] == 1  # small values merged, max in the top bin
    assert np.isfinite(h.percentile(50)) and h.percentile(100) == big
    once = StreamingHistogram(256)
    once.add(np.array([big, big / 2, 0.0]))
    assert (
        once.counts[-1] == 1 and once.counts[127] == 1
    )  # just below 2**1023 and once.counts[0] == 1


def test_streaming_histogram_rejects_non_finite_and_negative():
    h = StreamingHistogram(16)
    for bad in ([np.inf], [np.nan], [-1.0]):
        with pytest.raises(rlx.errors.QuantizationError, match="finite and >= 0"):
            h.add(np.array(bad))
    assert h.total == 0 and h.hi is None
