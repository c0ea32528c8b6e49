"""Fused ops against their unfused primitive chains (bit for bit, every dtype) and
against NumPy computed in f64; ElementwiseRegion bodies against the same ops unfused."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import erf

import rlx
from rlx import DType, Shape
from rlx.errors import ShapeError, VerifyError
from rlx.ops.base import OpKind
from rlx.ops.control import build_subgraph
from rlx.ops.elementwise import Unary, UnaryKind
from rlx.ops.fused import (
    Activation,
    ElementwiseRegion,
    FusedMatMulBiasAct,
    FusedResidualLN,
    FusedResidualRmsNorm,
    FusedSwiGLU,
)

DTYPES = [DType.F32, DType.BF16, DType.F16]
TOL = {DType.F32: 2e-5, DType.BF16: 3e-2, DType.F16: 4e-3}


def _rand(rng, shape, dt: DType, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dt.np)


def _run_pair(build_fused, build_chain, feed):
    """Evaluate the fused graph and the chain graph on the same inputs."""
    outs = []
    for build in (build_fused, build_chain):
        g = rlx.Graph("g")
        ids = {k: g.input(k, Shape(v.shape, DType.from_numpy(v.dtype))) for k, v in feed.items()}
        g.set_outputs(build(g, ids))
        g.verify()
        outs.append(g.evaluate(feed)[0])
    return outs


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


NP_ACT = {
    None: lambda y: y,
    UnaryKind.RELU: lambda y: np.maximum(y, 0),
    UnaryKind.GELU: lambda y: 0.5 * y * (1 + erf(y / np.sqrt(2))),
    UnaryKind.SILU: lambda y: y / (1 + np.exp(-y)),
    UnaryKind.TANH: np.tanh,
}


@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("act", list(NP_ACT), ids=lambda a: a.value if a else "none")
@pytest.mark.parametrize("has_bias", [True, False])
def test_matmul_bias_act_equals_its_chain_bit_for_bit(dt, act, has_bias):
    rng = np.random.default_rng(0)
    feed = {"x": _rand(rng, (2, 5, 8), dt), "w": _rand(rng, (8, 6), dt, 0.3)}
    if has_bias:
        feed["b"] = _rand(rng, (6,), dt)

    def fused(g, i):
        return g.fused_matmul_bias_act(i["x"], i["w"], i.get("b"), act)

    def chain(g, i):
        y = g.matmul(i["x"], i["w"])
        y = g.add(y, i["b"]) if has_bias else y
        return y if act is None else g.unary(act, y)

    got, want = _run_pair(fused, chain, feed)
    assert got.dtype == dt.np and got.shape == (2, 5, 6)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    f64 = {k: v.astype(np.float64) for k, v in feed.items()}
    ref = NP_ACT[act](f64["x"] @ f64["w"] + f64.get("b", 0.0))
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=TOL[dt], atol=TOL[dt] * 4)


@given(
    st.lists(st.integers(1, 3), min_size=0, max_size=2),
    st.lists(st.integers(1, 3), min_size=0, max_size=2),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 4),
)
def test_matmul_bias_act_follows_np_matmul_broadcasting(ba, bb, m, k, n):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    x = rng.standard_normal((*ba, m, k)).astype(np.float32)
    w = rng.standard_normal((*bb, k, n)).astype(np.float32)
    g = rlx.Graph("g")
    xi, wi = g.input("x", x.shape), g.input("w", w.shape)
    try:
        want = np.maximum(np.matmul(x, w), 0)
    except ValueError:  # batch dims that do not broadcast: rlx refuses them too
        with pytest.raises(ShapeError, match="do not broadcast"):
            g.fused_matmul_bias_act(xi, wi, act=Activation.RELU)
        return
    y = g.fused_matmul_bias_act(xi, wi, act=Activation.RELU)
    g.set_outputs(y)
    (got,) = g.evaluate({"x": x, "w": w})
    assert got.shape == want.shape == g.shape(y).dims
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_matmul_bias_act_vectors_and_integers():
    g = rlx.Graph("g")
    v = g.input("v", (4,))
    m = g.input("m", (4, 3))
    a = g.input("a", (2, 4), DType.I32)
    b = g.input("b", (4, 2), DType.I32)
    g.set_outputs(
        [
            g.fused_matmul_bias_act(v, m, act=Activation.RELU),
            g.fused_matmul_bias_act(
                a, b, g.constant(np.array([1, -100], np.int32)), Activation.RELU
            ),
        ]
    )
    rng = np.random.default_rng(1)
    feed = {
        "v": rng.standard_normal(4).astype(np.float32),
        "m": rng.standard_normal((4, 3)).astype(np.float32),
        "a": rng.integers(-5, 5, (2, 4)).astype(np.int32),
        "b": rng.integers(-5, 5, (4, 2)).astype(np.int32),
    }
    vm, ab = g.evaluate(feed)
    np.testing.assert_allclose(vm, np.maximum(feed["v"] @ feed["m"], 0), rtol=1e-6)
    np.testing.assert_array_equal(ab, np.maximum(feed["a"] @ feed["b"] + [1, -100], 0))


def test_matmul_bias_act_shape_errors():
    g = rlx.Graph("g")
    x = g.input("x", (2, 4))
    w = g.input("w", (5, 3))
    w2 = g.input("w2", (4, 3))
    wh = g.input("wh", (4, 3), DType.F16)
    xi = g.input("xi", (2, 4), DType.I32)
    wi = g.input("wi", (4, 3), DType.I32)
    with pytest.raises(ShapeError, match="contracted dims differ"):
        g.fused_matmul_bias_act(x, w)
    with pytest.raises(ShapeError, match="equal dtypes"):
        g.fused_matmul_bias_act(x, wh)
    with pytest.raises(
        ShapeError, match=r"bias f32\[4\] does not broadcast to the product f32\[2,3\]"
    ):
        g.fused_matmul_bias_act(x, w2, g.input("b", (4,)))
    with pytest.raises(ShapeError, match="gelu needs a float input"):
        g.fused_matmul_bias_act(xi, wi, act=Activation.GELU)
    with pytest.raises(ShapeError, match="expected 3 inputs, got 2"):
        g.apply(FusedMatMulBiasAct(None, True), [x, w2])


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_swiglu_equals_its_chain_bit_for_bit(dt):
    rng = np.random.default_rng(2)
    feed = {
        "x": _rand(rng, (3, 8), dt),
        "wg": _rand(rng, (8, 5), dt, 0.4),
        "wu": _rand(rng, (8, 5), dt, 0.4),
    }

    def chain(g, i):
        return g.mul(g.silu(g.matmul(i["x"], i["wg"])), g.matmul(i["x"], i["wu"]))

    got, want = _run_pair(lambda g, i: g.fused_swiglu(i["x"], i["wg"], i["wu"]), chain, feed)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    f = {k: v.astype(np.float64) for k, v in feed.items()}
    gate = f["x"] @ f["wg"]
    ref = gate / (1 + np.exp(-gate)) * (f["x"] @ f["wu"])
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=TOL[dt], atol=TOL[dt] * 4)


def test_swiglu_shape_errors():
    g = rlx.Graph("g")
    x = g.input("x", (2, 4))
    with pytest.raises(ShapeError, match=r"x @ w_gate is f32\[2,3\] but x @ w_up is f32\[2,5\]"):
        g.fused_swiglu(x, g.input("a", (4, 3)), g.input("b", (4, 5)))
    assert FusedSwiGLU().kind is OpKind.ELEMENTWISE  # the seed's precision class


def _np_rms(h, gamma, beta, eps):
    y = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps) * gamma
    return y if beta is None else y + beta


def _np_ln(h, gamma, beta, eps):
    c = h - h.mean(-1, keepdims=True)
    y = c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * gamma
    return y if beta is None else y + beta


@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("has_beta", [True, False])
@pytest.mark.parametrize("which", ["rms", "ln"])
def test_residual_norms_equal_their_chains_bit_for_bit(dt, has_beta, which):
    rng = np.random.default_rng(3)
    feed = {
        "x": _rand(rng, (2, 3, 16), dt),
        "r": _rand(rng, (2, 3, 16), dt),
        "gamma": _rand(rng, (16,), dt),
    }
    if has_beta:
        feed["beta"] = _rand(rng, (16,), dt)
    eps = 1e-5

    def fused(g, i):
        build = g.fused_residual_rms_norm if which == "rms" else g.fused_residual_layer_norm
        return build(i["x"], i["r"], i["gamma"], i.get("beta"), eps=eps)

    def chain(g, i):
        build = g.rms_norm if which == "rms" else g.layer_norm
        return build(g.add(i["x"], i["r"]), i["gamma"], i.get("beta"), eps=eps)

    got, want = _run_pair(fused, chain, feed)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    f = {k: v.astype(np.float64) for k, v in feed.items()}
    ref = (_np_rms if which == "rms" else _np_ln)(f["x"] + f["r"], f["gamma"], f.get("beta"), eps)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=TOL[dt] * 2, atol=TOL[dt] * 4)


def test_residual_norm_broadcasts_the_residual_and_checks_gamma():
    g = rlx.Graph("g")
    x = g.input("x", (2, 4))
    r = g.input("r", (4,))
    gamma = g.input("gamma", (4,))
    y = g.fused_residual_rms_norm(x, r, gamma)
    g.set_outputs(y)
    xv = np.arange(8, dtype=np.float32).reshape(2, 4)
    rv = np.float32([1, -1, 2, 0])
    gv = np.float32([1, 2, 3, 4])
    (out,) = g.evaluate({"x": xv, "r": rv, "gamma": gv})
    np.testing.assert_allclose(out, _np_rms(xv + rv, gv, None, 1e-6), rtol=1e-6)
    with pytest.raises(ShapeError, match="gamma must have dims \\[4\\]"):
        g.fused_residual_layer_norm(x, r, g.input("g3", (3,)))
    with pytest.raises(ShapeError, match="residual is f16\\[4\\] but x is f32\\[2,4\\]"):
        g.fused_residual_rms_norm(x, g.input("rh", (4,), DType.F16), gamma)
    with pytest.raises(ShapeError, match="needs a float input"):
        xi = g.input("xi", (2, 4), DType.I32)
        g.fused_residual_rms_norm(xi, xi, g.input("gi", (4,), DType.I32))
    assert FusedResidualRmsNorm().eps == 1e-6 and not FusedResidualRmsNorm().has_beta
    assert FusedResidualLN().eps == 1e-5 and FusedResidualLN().has_beta


# ---- ElementwiseRegion ----------------------------------------------------------------


def _diamond(s, a, b, c):
    """A DAG, not a chain: t feeds two branches that meet again."""
    t = s.mul(a, b)
    u = s.exp(s.neg(t))
    v = s.maximum(t, s.constant(np.float32(0.5)))
    return s.where(s.gt(c, 0.0), s.add(u, v), s.sub(u, v))


@given(st.integers(0, 1000))
def test_region_equals_the_same_ops_unfused(seed):
    rng = np.random.default_rng(seed)
    feed = {
        "a": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.standard_normal((4,)).astype(np.float32),  # broadcasts against a
        "c": rng.standard_normal((3, 1)).astype(np.float32),
    }

    def fused(g, i):
        return g.elementwise_region([i["a"], i["b"], i["c"]], _diamond)

    got, want = _run_pair(fused, lambda g, i: _diamond(g, i["a"], i["b"], i["c"]), feed)
    assert got.shape == (3, 4)
    np.testing.assert_array_equal(got, want)


def test_region_in_low_precision_and_with_given_body():
    body = build_subgraph(
        "body",
        [Shape((5,), DType.BF16), Shape((5,), DType.BF16)],
        lambda s, a, b: s.gelu(s.add(a, b)),
    )
    g = rlx.Graph("g")
    a, b = g.input("a", (5,), "bf16"), g.input("b", (5,), "bf16")
    g.set_outputs([g.elementwise_region([a, b], body), g.gelu(g.add(a, b))])
    x = np.linspace(-2, 2, 5).astype(ml_dtypes.bfloat16)
    got, want = g.evaluate({"a": x, "b": x[::-1].copy()})
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_region_flags_and_printing():
    g = rlx.Graph("g")
    x = g.input("x", (2,))
    y = g.elementwise_region([x], lambda s, a: s.relu(a))
    g.set_outputs(y)
    op = g.nodes[y].op
    assert op.kind is OpKind.ELEMENTWISE and op.elementwise is False
    assert op.subgraphs() == (op.body,)
    assert "elementwise_region[body=g.region, nodes=2]" in g.inspect()
    assert "graph g.region(in0: f32[2])" in g.inspect()


def test_region_rejects_bad_bodies():
    g = rlx.Graph("g")
    x = g.input("x", (2, 3))
    w = g.input("w", (3, 3))
    with pytest.raises(ShapeError, match="body node %2 fused_matmul_bias_act.* is not elementwise"):
        g.elementwise_region([x, w], lambda s, a, b: s.fused_matmul_bias_act(a, b, act=None))
    with pytest.raises(ShapeError, match="exactly one output, has 2"):
        g.elementwise_region([x], lambda s, a: [s.relu(a), s.exp(a)])
    half = build_subgraph("half", [Shape((2, 3), DType.F16)], lambda s, a: s.relu(a))
    with pytest.raises(
        ShapeError, match=r"body input 'in0' is f16\[2,3\] but operand 0 is f32\[2,3\]"
    ):
        g.elementwise_region([x], half)
    one = build_subgraph("one", [Shape((2, 3))], lambda s, a: s.relu(a))
    with pytest.raises(ShapeError, match=r"body lacks inputs \['in1'\] for its 2 operands"):
        g.elementwise_region([x, x], one)
    skip = rlx.Graph("skip")
    skip.input("in0", (2, 3))
    skip.set_outputs(skip.relu(skip.input("in2", (2, 3))))
    with pytest.raises(ShapeError, match=r"body lacks inputs \['in1'\]"):
        g.apply(ElementwiseRegion(skip), [x, x, x])
    with_param = rlx.Graph("p")
    with_param.set_outputs(
        with_param.add(with_param.input("in0", (2, 3)), with_param.param("k", (2, 3)))
    )
    with pytest.raises(ShapeError, match="holds param 'k'"):
        g.elementwise_region([x], with_param)


def test_verifier_checks_region_bodies():
    body = build_subgraph("body", [Shape((3,))], lambda s, a: s.exp(a))
    g = rlx.Graph("g")
    g.set_outputs(g.elementwise_region([g.input("x", (3,))], body))
    g.verify()
    body.add_node(Unary(UnaryKind.NEG), [1], Shape((3,), DType.F16))
    with pytest.raises(VerifyError, match="sub-graph 'body'"):
        g.verify()
