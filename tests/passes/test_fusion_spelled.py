"""Recognition of spelled-out GELU and layer norm (``fuse_gelu``, ``fuse_layer_norm``): the
op appears (and the matmul / residual fusions take it), the numbers match the unfused
chain in the NumPy reference interpreter and an independent NumPy formula, and chains
that differ (a constant, a shared intermediate, another axis) stay as they are."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx.ir.mir import Graph, NodeId
from rlx.ops.elementwise import Unary, UnaryKind
from rlx.ops.fused import FusedMatMulBiasAct, FusedResidualLN
from rlx.ops.norm import LayerNorm
from rlx.passes.report import FusionPattern

from .test_cleanup import same_numbers
from .test_fusion import fuse_all, ops_of

_erf = np.vectorize(math.erf)


def _gelu_np(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _gelu_tanh_np(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _c(g: Graph, v: float) -> NodeId:
    return g.constant(np.float32(v))


def _erf_gelu(g: Graph, x: NodeId, variant: int) -> NodeId:
    """Spellings of ``0.5 * x * (1 + erf(x / sqrt 2))`` that exporters write."""
    arg = g.div(x, _c(g, math.sqrt(2.0))) if variant % 2 else g.mul(_c(g, 2**-0.5), x)
    one = g.add(g.erf(arg), _c(g, 1.0)) if variant % 3 else g.add(_c(g, 1.0), g.erf(arg))
    if variant % 4 == 0:  # torch.onnx TorchScript: (x * (1 + erf)) * 0.5
        return g.mul(g.mul(x, one), _c(g, 0.5))
    if variant % 4 == 1:  # (0.5 * x) * (1 + erf)
        return g.mul(g.mul(_c(g, 0.5), x), one)
    if variant % 4 == 2:  # x * ((1 + erf) * 0.5)
        return g.mul(x, g.mul(one, _c(g, 0.5)))
    return g.mul(one, g.mul(x, _c(g, 0.5)))


def _tanh_gelu(g: Graph, x: NodeId, cube_by_pow: bool) -> NodeId:
    cube = g.pow(x, _c(g, 3.0)) if cube_by_pow else g.mul(g.mul(x, x), x)
    inner = g.add(x, g.mul(_c(g, 0.044715), cube))
    t = g.tanh(g.mul(inner, _c(g, math.sqrt(2.0 / math.pi))))
    return g.mul(g.mul(_c(g, 0.5), x), g.add(t, _c(g, 1.0)))


def _run(g: Graph, x: np.ndarray, params: dict | None = None) -> Graph:
    fused, _ = fuse_all(g)
    same_numbers(g, fused, {"x": x}, params or {})
    return fused


@settings(max_examples=12, deadline=None)
@given(variant=st.integers(0, 11), rows=st.integers(1, 5))
def test_erf_gelu_spellings_become_gelu(variant: int, rows: int):
    g = Graph("gelu")
    x = g.input("x", (rows, 8))
    g.set_outputs([_erf_gelu(g, x, variant)])
    xv = np.random.default_rng(variant).standard_normal((rows, 8)).astype(np.float32) * 3
    fused = _run(g, xv)
    assert [n.op for n in fused.nodes if isinstance(n.op, Unary)] == [Unary(UnaryKind.GELU)]
    np.testing.assert_allclose(fused.evaluate({"x": xv})[0], _gelu_np(xv), rtol=1e-5, atol=1e-6)


def test_tanh_gelu_spellings_become_gelu_tanh():
    xv = np.linspace(-6, 6, 48, dtype=np.float32).reshape(6, 8)
    for by_pow in (True, False):
        g = Graph("gelu_tanh")
        x = g.input("x", (6, 8))
        g.set_outputs([_tanh_gelu(g, x, by_pow)])
        fused = _run(g, xv)
        assert [n.op for n in fused.nodes if isinstance(n.op, Unary)] == [
            Unary(UnaryKind.GELU_TANH)
        ]
        got = fused.evaluate({"x": xv})[0]
        np.testing.assert_allclose(got, _gelu_tanh_np(xv), rtol=1e-5, atol=1e-6)


def test_gelu_after_linear_goes_into_the_matmul_epilogue():
    g = Graph("linear_gelu")
    x = g.input("x", (4, 16))
    w, b = g.param("w", (16, 8)), g.param("b", (8,))
    g.set_outputs([_erf_gelu(g, g.add(g.matmul(x, w), b), 0)])
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((16, 8)).astype(np.float32), "b": np.ones(8, np.float32)}
    xv = rng.standard_normal((4, 16)).astype(np.float32)
    fused, report = fuse_all(g)
    same_numbers(g, fused, {"x": xv}, params)
    (mm,) = ops_of(fused, FusedMatMulBiasAct)
    assert mm.op.act is UnaryKind.GELU and mm.op.has_bias
    assert report.count(FusionPattern.GELU) == 1


def test_gelu_lookalikes_stay_unfused():
    xv = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    # 0.6 instead of 0.5
    g = Graph("not_gelu")
    x = g.input("x", (3, 8))
    one = g.add(g.erf(g.div(x, _c(g, math.sqrt(2.0)))), _c(g, 1.0))
    g.set_outputs([g.mul(g.mul(x, one), _c(g, 0.6))])
    fused = _run(g, xv)
    assert not [n for n in fused.nodes if isinstance(n.op, Unary) and n.op.fn is UnaryKind.GELU]
    # erf read by a second output: the chain is kept, the report says why
    g = Graph("shared")
    x = g.input("x", (3, 8))
    e = g.erf(g.div(x, _c(g, math.sqrt(2.0))))
    g.set_outputs([g.mul(g.mul(x, g.add(e, _c(g, 1.0))), _c(g, 0.5)), e])
    fused, report = fuse_all(g)
    same_numbers(g, fused, {"x": xv}, {})
    assert report.count(FusionPattern.GELU) == 0
    (miss,) = report.missed_of(FusionPattern.GELU)
    assert "graph output" in miss.reason


def _spelled_ln(g: Graph, x: NodeId, *, by_pow: bool, rsqrt: bool, beta: bool) -> NodeId:
    mean = g.mean(x, -1, keepdims=True)
    d = g.sub(x, mean)
    sq = g.pow(d, _c(g, 2.0)) if by_pow else g.mul(d, d)
    ve = g.add(g.mean(sq, -1, keepdims=True), _c(g, 1e-5))
    n = g.mul(d, g.rsqrt(ve)) if rsqrt else g.div(d, g.sqrt(ve))
    y = g.mul(n, g.param("gamma", (16,)))
    return g.add(y, g.param("beta", (16,))) if beta else y


def _ln_np(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None) -> np.ndarray:
    x = x.astype(np.float64)
    d = x - x.mean(-1, keepdims=True)
    y = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * gamma
    return y + beta if beta is not None else y


def test_spelled_layer_norm_becomes_layer_norm():
    rng = np.random.default_rng(2)
    xv = (rng.standard_normal((2, 3, 16)) * 4 + 1).astype(np.float32)
    params = {"gamma": rng.standard_normal(16).astype(np.float32)}
    params["beta"] = rng.standard_normal(16).astype(np.float32)
    for by_pow, rsqrt, beta in [(True, False, True), (False, True, True), (True, True, False)]:
        g = Graph("ln")
        x = g.input("x", (2, 3, 16))
        g.set_outputs([_spelled_ln(g, x, by_pow=by_pow, rsqrt=rsqrt, beta=beta)])
        p = params if beta else {"gamma": params["gamma"]}
        fused, report = fuse_all(g)
        same_numbers(g, fused, {"x": xv}, p)
        (ln,) = ops_of(fused, LayerNorm)
        assert ln.op == LayerNorm(float(np.float32(1e-5)), beta)  # eps as the f32 constant
        want = _ln_np(xv, params["gamma"], params["beta"] if beta else None)
        got = fused.evaluate({"x": xv}, p)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_spelled_layer_norm_after_residual_add_fuses_both():
    g = Graph("res_ln")
    x, r = g.input("x", (4, 16)), g.input("r", (4, 16))
    g.set_outputs([_spelled_ln(g, g.add(x, r), by_pow=True, rsqrt=False, beta=True)])
    fused, report = fuse_all(g)
    assert len(ops_of(fused, FusedResidualLN)) == 1
    assert report.count(FusionPattern.LAYER_NORM) == 1


def test_layer_norm_lookalikes_stay_unfused():
    # the mean over axis 0, not the last axis
    g = Graph("axis0")
    x = g.input("x", (4, 16))
    mean = g.mean(x, 0, keepdims=True)
    d = g.sub(x, mean)
    ve = g.add(g.mean(g.mul(d, d), 0, keepdims=True), _c(g, 1e-5))
    g.set_outputs(
        [g.add(g.mul(g.div(d, g.sqrt(ve)), g.param("gamma", (16,))), g.param("beta", (16,)))]
    )
    fused, report = fuse_all(g)
    assert not ops_of(fused, LayerNorm) and report.count(FusionPattern.LAYER_NORM) == 0
    # the centred value is also an output
    g = Graph("shared")
    x = g.input("x", (4, 16))
    y = _spelled_ln(g, x, by_pow=True, rsqrt=False, beta=True)
    d = next(n.id for n in g.nodes if n.label and "sub" in n.label)
    g.set_outputs([y, d])
    fused, report = fuse_all(g)
    assert not ops_of(fused, LayerNorm)
    (miss,) = report.missed_of(FusionPattern.LAYER_NORM)
    assert "graph output" in miss.reason
