"""Reduced precision and elementwise regions: a node that reads its float input at f32
(a comparison, a cast to an integer) sees the unrounded value whether or not fusion put
it into a region with narrowed ops.

In: small graphs whose leaves sit next to a comparison threshold or just below an
integer, compiled under every reduced-precision policy, fused and unfused, native and
NumPy kernels. Out: results equal (bit for bit) to a NumPy oracle that compares and
truncates in f32 and rounds only the narrowed values (through ``np.float16`` /
``ml_dtypes.bfloat16``).
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest

from rlx.dtype import DType
from rlx.ir.mir import Graph
from rlx.ops.base import OpKind
from rlx.ops.fused import ElementwiseRegion
from rlx.options import CompileOptions
from rlx.passes.precision import AutoMixedPrecision, Precision, PrecisionPolicy
from rlx.runtime.session import Session

P = PrecisionPolicy
# each policy with the dtype its elementwise ops run at (written out, not asked of rlx)
POLICIES: dict[str, tuple[PrecisionPolicy, type]] = {
    "AlwaysF16": (P.AlwaysF16, np.float16),
    "AutoMixedConservative": (P.AutoMixedConservative, np.float16),
    "AutoMixed": (P.AutoMixed, np.float16),
    "AutoMixedBf16": (P.AutoMixedBf16, ml_dtypes.bfloat16),
    "CustomBf16": (P.Custom({OpKind.ELEMENTWISE: Precision.BF16}), ml_dtypes.bfloat16),
}
F32 = np.float32


def _near(th: float) -> list[float]:
    """f32 values a few ulps around ``th`` and ones that round onto it in f16 / bf16."""
    th32 = F32(th)
    up, down = np.nextafter(th32, F32(np.inf)), np.nextafter(th32, F32(-np.inf))
    return [th, float(up), float(down), th + 8.4e-6, th - 8.4e-6, th + 1e-3, th - 1e-3]


X = np.array([_near(-0.5) + _near(0.0)[1:] + _near(0.75)], F32)  # [1, 20]
P_VAL = np.array([[7.0]], F32)
TRUNC = np.array([[2.9999, -2.9999, 1.9995, 0.99995, 3.0, -0.9999]], F32)


def _r(v: np.ndarray, low: type) -> np.ndarray:
    """``v`` rounded once to ``low`` and back to f32 (what a narrowed node stores)."""
    return np.asarray(v, F32).astype(low).astype(F32)


# name -> (builder over (g, x, p), oracle over (x, p, low))
Case = tuple[Callable, Callable]
CASES: dict[str, Case] = {
    # the fault's repro: the selected x is narrowed, the comparison is not
    "where_lt": (
        lambda g, x, p: g.where(g.lt(x, -0.5), x, p),
        lambda x, p, low: _r(np.where(x < F32(-0.5), _r(x, low), _r(p, low)), low),
    ),
    # x read by the comparison (f32) and by a narrowed multiply in one region
    "where_ge_mul": (
        lambda g, x, p: g.where(g.ge(x, 0.75), g.mul(x, p), g.neg(x)),
        lambda x, p, low: _r(
            np.where(x >= F32(0.75), _r(_r(x, low) * _r(p, low), low), -_r(x, low)), low
        ),
    ),
    # both comparison operands are leaves; the threshold is a param
    "where_gt_param": (
        lambda g, x, p: g.where(g.gt(x, g.mul(p, 0.0)), g.add(x, 1.0), p),
        lambda x, p, low: _r(np.where(x > F32(0.0), _r(_r(x, low) + 1.0, low), _r(p, low)), low),
    ),
}


def _trunc_case(g: Graph, x, p):
    """cast(x, i32) truncates the f32 value; the rest of the region is narrowed."""
    return g.add(g.cast(g.cast(x, "i32"), "f32"), g.mul(p, 0.0))


def _trunc_oracle(x: np.ndarray, p: np.ndarray, low: type) -> np.ndarray:
    t = _r(np.trunc(x.astype(np.float64)), low)
    return _r(t + _r(_r(p, low) * 0.0, low), low)


CASES["cast_to_int"] = (_trunc_case, _trunc_oracle)


def _graph(case: str, x: np.ndarray) -> Graph:
    g = Graph(case)
    xi, pi = g.input("x", x.shape), g.param("p", (1, 1))
    g.set_outputs([CASES[case][0](g, xi, pi)])
    return g


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
@pytest.mark.parametrize("case", list(CASES))
def test_f32_readers_see_unrounded_inputs(policy: str, fuse: bool, native: bool, case: str):
    pol, low = POLICIES[policy]
    x = TRUNC if case == "cast_to_int" else X
    g = _graph(case, x)
    opts = CompileOptions(precision=pol, fuse=fuse, native=native, use_cache=False, verbose=False)
    cg = Session("cpu").compile(g, opts, params={"p": P_VAL})
    if fuse:  # the case is about regions: the compare / cast must be in one
        assert any(isinstance(n.op, ElementwiseRegion) for n in cg.graph.nodes)
    want = CASES[case][1](x, P_VAL, low)
    (got,) = cg.run({"x": x})
    np.testing.assert_array_equal(got, want)


def test_region_input_read_at_f32_stays_f32_and_others_narrow():
    """The pass feeds an input a body comparison reads as f32 (the body casts it for its
    narrow readers) and still narrows an input only narrow nodes read."""
    from .test_fusion import fuse_all

    g = _graph("where_ge_mul", X)
    fused, _ = fuse_all(g)
    amp = AutoMixedPrecision(P.AutoMixed)
    out = amp.run(fused)
    (r,) = [n for n in out.nodes if isinstance(n.op, ElementwiseRegion)]
    fed = [out.nodes[i].dtype for i in r.inputs]
    assert fed == [DType.F32, DType.F16]  # x (compared) as is; p (multiplied) narrowed
    assert r.dtype is DType.F16
    assert "kept f32" not in " ".join(amp.notes)
