"""rlx's sgemm on small products (issue 31): the path that reads A in place (one K block,
at most 4 column panels), its half-width last panel (N - 32 p <= 16 on AVX-512), the f32
erf / tanh epilogues and the unmeasured native choice of products under
``engines.sgemm.SMALL_WORK`` multiply-adds.

Oracles: NumPy float64 matmul (tolerance ``2 K eps32 (|a| @ |b|)``, the bound of an f32
dot product of K terms in any order) and the float64 formulas of the activations
(SciPy's erf, NumPy's tanh); the reference interpreter (``Graph.evaluate``) for compiled
graphs. Every runnable build target (AVX-512, AVX2, portable C)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import erf

from rlx.backends.cpu import native
from rlx.backends.cpu.engines import sgemm as ks
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.sgemm import sgemm_lib
from rlx.dtype import DType
from rlx.ir.mir import Graph
from rlx.options import CompileOptions
from rlx.runtime.session import Session

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

TARGETS = cpu.runnable_targets()
EPS = float(np.finfo(np.float32).eps)


def _bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    k = a.shape[-1]
    return 2 * max(k, 1) * EPS * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _act64(act: str | None, y: np.ndarray) -> np.ndarray:
    if act == "gelu":
        return 0.5 * y * (1 + erf(y / np.sqrt(2.0)))
    if act == "tanh":
        return np.tanh(y)
    if act == "gelu_tanh":
        return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
    return y


@pytest.fixture(params=TARGETS, ids=lambda t: t.value)
def lib(request):
    return sgemm_lib(request.param)


@pytest.mark.parametrize("act", [None, "gelu", "tanh", "gelu_tanh"])
def test_small_products_match_float64(lib, act) -> None:
    """M = 1 .. 64 x odd N on each side of the panel and half-panel widths x K below and
    above the in-place path's limit, with bias and activation, at 1 and 2 threads."""
    rng = np.random.default_rng(31)
    ns = sorted({1, 3, 10, lib.nr // 2, lib.nr // 2 + 1, lib.nr, lib.nr + 5, 2 * lib.nr + 3})
    ns += [4 * lib.nr, 4 * lib.nr + 7]  # 4 panels (M <= 2: the 4-panel kernels), and past
    for k in (1, 7, 32, 64, 130, 600):
        a_all = _rand(rng, 64, k)
        for n in ns:
            b, bias = _rand(rng, k, n), _rand(rng, n)
            packed = lib.pack_b(b)
            for m in (1, 2, 3, 5, 7, 8, 9, 13, 14, 17, 31, 64):
                a = a_all[:m]
                pre = a.astype(np.float64) @ b + bias
                want = _act64(act, pre)
                tol = 1.2 * _bound(a, b) + 16 * EPS * (np.abs(pre) + np.abs(want))
                for threads in (1, 2):
                    out = np.full((m, n), np.nan, np.float32)
                    lib.gemm(a, packed, out, bias=bias, act=act, threads=threads)
                    bad = np.abs(out - want) > tol
                    assert not bad.any(), (act, m, n, k, threads, np.argwhere(bad)[:3])


def test_small_products_with_strided_rows_and_output(lib) -> None:
    """A with a row stride past its K (a column slice) and an output inside a wider array
    on the in-place path: the neighbouring columns stay untouched."""
    rng = np.random.default_rng(5)
    big = _rand(rng, 40, 90)
    a = big[:, 3:50]  # [40, 47], row stride 90
    b, bias = _rand(rng, 47, 21), _rand(rng, 21)
    out_big = np.zeros((40, 60), np.float32)
    lib.gemm(a, lib.pack_b(b), out_big[:, 5:26], bias=bias, act="tanh")
    want = np.tanh(a.astype(np.float64) @ b + bias)
    assert np.all(np.abs(out_big[:, 5:26] - want) <= 1.2 * _bound(a, b) + 16 * EPS)
    assert np.all(out_big[:, :5] == 0) and np.all(out_big[:, 26:] == 0)


def test_rows_keep_their_bits_at_every_m(lib) -> None:
    """A row's result does not depend on how many rows the product has (the in-place
    kernels of 8 / 4 / 2 / 1 rows and the packed ones run the same FMA chain per element):
    what ``CompileOptions.batch_invariant`` relies on."""
    rng = np.random.default_rng(9)
    for n, k in [(10, 64), (64, 32), (2 * lib.nr + 3, 100), (3 * lib.nr, 700)]:
        a, b, bias = _rand(rng, 64, k), _rand(rng, k, n), _rand(rng, n)
        packed = lib.pack_b(b)
        full = np.empty((64, n), np.float32)
        lib.gemm(a, packed, full, bias=bias, act="gelu")
        for m in (1, 2, 3, 7, 9, 15, 33):
            out = np.empty((m, n), np.float32)
            lib.gemm(a[:m], packed, out, bias=bias, act="gelu")
            assert np.array_equal(out, full[:m]), (n, k, m)


def test_nan_and_large_inputs_through_the_f32_erf_and_tanh(lib) -> None:
    """NaN stays NaN, and the clamped ranges of erf / tanh give the limits (|x| up to 1e4);
    tolerance as the epilogue contract: 16 eps32 (|x| + |act(x)|)."""
    x = np.array([np.nan, -1e4, -9.0, -4.5, -1.0, 0.0, 3e-4, 0.7, 4.5, 9.0, 1e4], np.float32)
    one = lib.pack_b(np.ones((1, 1), np.float32))
    for act in ("gelu", "tanh"):
        out = np.empty((x.size, 1), np.float32)
        lib.gemm(x[:, None], one, out, act=act)
        want = _act64(act, x.astype(np.float64))
        assert np.isnan(out[0, 0])
        err = np.abs(out[1:, 0] - want[1:])
        assert np.all(err <= 16 * EPS * (np.abs(x[1:]) + np.abs(want[1:]))), (act, err)
        assert out[1, 0] == want[1] and out[-1, 0] == want[-1]  # the limits exactly


# choice_dir: tests/cpu/engines/conftest.py


def test_small_choice_is_native_without_measuring(choice_dir, monkeypatch) -> None:
    seen: list[str] = []

    def make():
        return (lambda: seen.append("n")), (lambda: seen.append("b"))

    use, why = ks.choose("k6", make, 1, small=True)
    assert use and why.startswith("small product") and not seen
    assert not ks.choice_path().exists()
    monkeypatch.setenv("RLX_SGEMM", "blas")  # the user's explicit choice still wins
    assert ks.choose("k6", make, 1, small=True) == (False, "RLX_SGEMM=blas")


@pytest.mark.parametrize("threads", [1, 2])
def test_tiny_mlp_runs_native_with_every_epilogue_in_the_tile(choice_dir, threads) -> None:
    """The ONNX MLP's shape (32-64-64-10, gelu then tanh, batch 64 and odd batches)
    compiled: each product is one native sgemm call with bias and activation in its tiles
    (no separate activation pass), and the outputs match the reference interpreter."""
    rng = np.random.default_rng(4)
    g = Graph("tiny_mlp")
    x = g.input("x", ("batch", 32), DType.F32)
    dims = [(32, 64), (64, 64), (64, 10)]
    params = {}
    h = x
    for i, (k, n) in enumerate(dims):
        w, b = g.param(f"w{i}", (k, n), DType.F32), g.param(f"b{i}", (n,), DType.F32)
        params[f"w{i}"], params[f"b{i}"] = _rand(rng, k, n) / np.float32(np.sqrt(k)), _rand(rng, n)
        h = g.add(g.matmul(h, w), b)
        h = g.gelu(h) if i == 0 else g.tanh(h) if i == 1 else h
    g.set_outputs([h])
    opts = CompileOptions(use_cache=False, num_threads=threads)
    cg = Session("cpu").compile(g, opts, params=params)
    for batch in (64, 1, 5, 17):
        xv = _rand(rng, batch, 32)
        (got,) = cg.run({"x": xv})
        (want,) = g.evaluate({"x": xv}, params)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        fused = [e for e in cg.report().kernels if e.op == "fused_matmul_bias_act"]
        assert len(fused) == 3 and all(e.kind.value == "native" for e in fused)
        notes = [" ".join(e.notes) for e in fused]
        assert all("rlx sgemm" in n and "pass" not in n for n in notes), notes
        assert "bias + gelu in the tile" in notes[0] and "bias + tanh in the tile" in notes[1]


def test_native_only_run_skips_errstate_and_stays_quiet(choice_dir) -> None:
    """A schedule of C kernels only runs without np.errstate (``Executor.quiet``): an
    overflow inside the native GEMM still raises nothing, even with NumPy set to raise,
    and the output is what NumPy's f32 chain gives."""
    g = Graph("lin")
    x = g.input("x", ("batch", 16), DType.F32)
    y = g.add(g.matmul(x, g.param("w", (16, 8), DType.F32)), g.param("b", (8,), DType.F32))
    g.set_outputs([g.tanh(g.add(g.matmul(y, g.param("w2", (8, 8), DType.F32)), y))])
    params = {
        "w": np.full((16, 8), 1e30, np.float32),
        "b": np.zeros(8, np.float32),
        "w2": np.eye(8, dtype=np.float32),
    }
    cg = Session("cpu").compile(g, CompileOptions(use_cache=False), params=params)
    xv = np.full((3, 16), 1e30, np.float32)
    cg.run({"x": xv})  # the prologue (param packing) runs under np.errstate
    assert cg._last is not None and cg._last.quiet
    with np.errstate(all="raise"):
        (got,) = cg.run({"x": xv})
    with np.errstate(all="ignore"):  # NumPy in f32: y = inf, inf @ eye = nan (inf * 0)
        y32 = xv @ params["w"] + params["b"]
        want = np.tanh(y32 @ params["w2"] + y32)
    assert np.isinf(y32).all() and np.array_equal(got, want, equal_nan=True), got
