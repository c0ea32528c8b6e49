"""bf16 / f16 matmuls on a target without avx512_bf16 (RLX_ISA=avx2 forced here, so the
AVX-512 machine runs the path an AVX2-only CPU takes): a weight that does not change
between runs (a constant, or a param repacked after set_param) is widened to f32 and
packed into rlx sgemm panels once, and every run multiplies on the f32 micro-kernel
(``engines.lowp_gemm._f32_panels``). Results against a NumPy float64 product of the same
bf16 / f16 values, within one 16-bit ulp plus the f32 accumulation bound."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.engines import lowp_gemm as klg
from rlx.backends.cpu.engines import lowp_lib as kl
from rlx.backends.cpu.native.cpu import Target
from rlx.dtype import DType
from rlx.ir.mir import Graph
from rlx.options import CompileOptions
from rlx.runtime.session import Session

BF16 = np.dtype(ml_dtypes.bfloat16)
OPTS = CompileOptions(use_cache=False, verbose=False)

pytestmark = [
    pytest.mark.skipif(not native.available(), reason="gcc is not installed"),
    pytest.mark.skipif(
        Target.AVX2 not in native.runnable_targets(), reason="this CPU cannot run AVX2 code"
    ),
]


@pytest.fixture(autouse=True)
def _avx2(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-native"))
    monkeypatch.setenv("RLX_ISA", "avx2")


def _oracle(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float64 product of the 16-bit values and its error bound for a 16-bit result
    (mantissa ``bits``): one rounding of the output plus the f32 accumulation bound."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = x64 @ w64
    k = x.shape[-1]
    acc = (np.abs(x64) @ np.abs(w64)) * (k + 1) * 2.0**-24
    ulp = 2.0**-8 if x.dtype == BF16 else 2.0**-11
    return want, np.abs(want) * ulp + 2 * acc


def _entry(cg):
    (entry,) = [e for e in cg.report().kernels if e.op == "matmul"]
    return entry


@pytest.mark.parametrize("dt", [DType.BF16, DType.F16], ids=["bf16", "f16"])
@pytest.mark.parametrize(("sa", "sb"), [((16, 384), (384, 96)), ((2, 5, 33), (33, 40))])
def test_constant_weight_runs_on_f32_panels(dt, sa, sb) -> None:
    assert not kl.lowp_lib().has_dpbf16  # the AVX2 build has no vdpbf16ps
    npdt = BF16 if dt is DType.BF16 else np.dtype(np.float16)
    rng = np.random.default_rng(7)
    xv = rng.standard_normal(sa).astype(npdt)
    wv = rng.standard_normal(sb).astype(npdt)
    g = Graph("mm")
    g.set_outputs([g.matmul(g.input("x", sa, dt), g.constant(wv))])
    cg = Session("cpu").compile(g, OPTS)
    got = cg.run({"x": xv})[0]
    assert got.dtype == npdt
    want, bound = _oracle(xv, wv)
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound)
    entry = _entry(cg)
    assert entry.kind.value == "native" and klg.PANELS_NOTE in " ".join(entry.notes)


def test_param_weight_is_repacked_into_panels_after_set_param() -> None:
    rng = np.random.default_rng(8)
    w1 = rng.standard_normal((64, 48)).astype(BF16)
    w2 = rng.standard_normal((64, 48)).astype(BF16)
    xv = rng.standard_normal((9, 64)).astype(BF16)
    g = Graph("mm")
    g.set_outputs([g.matmul(g.input("x", (9, 64), DType.BF16), g.param("w", (64, 48), DType.BF16))])
    cg = Session("cpu").compile(g, OPTS, params={"w": w1})
    assert klg.PANELS_NOTE in " ".join(_entry(cg).notes)
    for w in (w1, w2):
        cg.set_param("w", w)
        got = cg.run({"x": xv})[0].astype(np.float64)
        want, bound = _oracle(xv, w)
        assert np.all(np.abs(got - want) <= bound)


def test_special_values_propagate() -> None:
    """inf and NaN in the activations give the IEEE results of the f64 product."""
    rng = np.random.default_rng(9)
    xv = rng.standard_normal((4, 16)).astype(BF16)
    xv[1, 3] = np.inf
    xv[2, 5] = np.nan
    wv = np.abs(rng.standard_normal((16, 8))).astype(BF16) + BF16.type(0.5)
    g = Graph("mm")
    g.set_outputs([g.matmul(g.input("x", (4, 16), DType.BF16), g.constant(wv))])
    got = Session("cpu").compile(g, OPTS).run({"x": xv})[0].astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = xv.astype(np.float64) @ wv.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
