"""Derivative rules of the fused ops (FusedMatMulBiasAct, FusedSwiGLU, FusedResidualLN,
FusedResidualRmsNorm) against finite differences in f64 (``rlx.autodiff.check``:
reference interpreter and compiled CPU graph) on hypothesis-drawn shapes, and the same
gradients as the unfused chain; ElementwiseRegion (its body's rules) and the gradient
of a graph the compiler fused; GatedDeltaNet and SelectiveScan state why they have none."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.autodiff import grad
from rlx.autodiff.check import check_jvp, check_vjp
from rlx.ops.elementwise import UnaryKind
from rlx.ops.recurrent import GatedDeltaNet, SelectiveScan

FEW = settings(max_examples=3, deadline=None)
ACTS = [
    None,
    UnaryKind.GELU,
    UnaryKind.GELU_TANH,
    UnaryKind.TANH,
    UnaryKind.SILU,
    UnaryKind.SIGMOID,
]


def _check(g: rlx.Graph, values: dict[str, np.ndarray]) -> None:
    check_vjp(g, values, list(values), compiled=True)
    check_jvp(g, values, list(values), compiled=True)


def _graph(shapes: dict[str, tuple[int, ...]], seed: int) -> tuple[rlx.Graph, dict, dict]:
    g = rlx.Graph("f")
    rng = np.random.default_rng(seed)
    ids = {k: g.input(k, s, "f64") for k, s in shapes.items()}
    return g, ids, {k: rng.standard_normal(s) for k, s in shapes.items()}


_SHAPES = st.tuples(
    st.lists(st.integers(1, 3), min_size=1, max_size=2), st.integers(1, 4), st.integers(1, 4)
)


@pytest.mark.parametrize("act", ACTS, ids=lambda a: "none" if a is None else a.value)
@FEW
@given(dims=_SHAPES, bias=st.booleans(), seed=st.integers(0, 2**16))
def test_fused_matmul_bias_act(act, dims, bias, seed) -> None:
    lead, k, n = dims
    shapes = {"x": (*lead, k), "w": (k, n)} | ({"b": (n,)} if bias else {})
    g, i, values = _graph(shapes, seed)
    g.set_outputs([g.fused_matmul_bias_act(i["x"], i["w"], i.get("b"), act=act)])
    _check(g, values)


@FEW
@given(dims=_SHAPES, seed=st.integers(0, 2**16))
def test_fused_swiglu(dims, seed) -> None:
    lead, k, n = dims
    g, i, values = _graph({"x": (*lead, k), "wg": (k, n), "wu": (k, n)}, seed)
    g.set_outputs([g.fused_swiglu(i["x"], i["wg"], i["wu"])])
    _check(g, values)


@pytest.mark.parametrize("norm", ["fused_residual_layer_norm", "fused_residual_rms_norm"])
@FEW
@given(
    lead=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    d=st.integers(2, 5),
    broadcast=st.booleans(),
    beta=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fused_residual_norms(norm, lead, d, broadcast, beta, seed) -> None:
    """FusedResidualLN / FusedResidualRmsNorm, with a residual broadcast over the rows."""
    shapes = {"x": (*lead, d), "r": (1, d) if broadcast else (*lead, d), "g": (d,)}
    if beta:
        shapes["b"] = (d,)
    g, i, values = _graph(shapes, seed)
    g.set_outputs([getattr(g, norm)(i["x"], i["r"], i["g"], i.get("b"), eps=1e-3)])
    _check(g, values)


def test_fused_gradients_equal_the_unfused_chain() -> None:
    rng = np.random.default_rng(0)
    vals = {
        "x": rng.standard_normal((3, 4)),
        "w": rng.standard_normal((4, 5)),
        "b": rng.standard_normal(5),
    }
    vals |= {"r": rng.standard_normal((3, 5)), "gamma": rng.standard_normal(5)}

    def build(fused: bool) -> rlx.Graph:
        g = rlx.Graph("chain")
        x, w, b, r, gamma = (g.input(k, v.shape, "f64") for k, v in vals.items())
        if fused:
            h = g.fused_matmul_bias_act(x, w, b, act=UnaryKind.GELU)
            y = g.fused_residual_layer_norm(h, r, gamma)
        else:
            h = g.gelu(g.add(g.matmul(x, w), b))
            y = g.layer_norm(g.add(h, r), gamma)
        g.set_outputs([g.sum(g.mul(y, y))])
        return grad(g, list(vals))

    for a, b in zip(build(True).evaluate(vals, {}), build(False).evaluate(vals, {}), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@FEW
@given(rows=st.integers(1, 3), cols=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_elementwise_region(rows: int, cols: int, seed: int) -> None:
    """ElementwiseRegion: the body's rules, with a broadcast operand, a constant and a
    bool operand (no gradient) inside."""
    g, i, values = _graph({"x": (rows, cols), "y": (cols,)}, seed)
    cond = g.gt(i["x"], 0.3)

    def body(s: rlx.Graph, x: int, y: int, c: int) -> int:
        return s.where(c, s.mul(s.tanh(x), y), s.exp(s.mul(y, 0.5)))

    g.set_outputs([g.elementwise_region([i["x"], i["y"], cond], body)])
    _check(g, values)


def test_gradient_of_a_fused_graph_equals_the_unfused_one() -> None:
    """The graph the compiler fused (regions, fused matmuls) differentiates to the same
    gradients as the graph as written."""
    rng = np.random.default_rng(1)
    vals = {"x": rng.standard_normal((4, 6)), "w": rng.standard_normal((6, 5))}
    vals |= {"b": rng.standard_normal(5), "gamma": rng.standard_normal(5)}
    g = rlx.Graph("mlp")
    x, w, b, gamma = (g.input(k, v.shape, "f64") for k, v in vals.items())
    h = g.mul(g.sigmoid(g.add(g.matmul(x, w), b)), g.exp(g.neg(g.square(g.add(g.matmul(x, w), b)))))
    g.set_outputs([g.sum(g.square(g.layer_norm(g.add(h, b), gamma)))])
    fused = rlx.Session("cpu").compile(g).graph
    assert {n.op.mnemonic for n in fused.nodes} & {"elementwise_region", "fused_matmul_bias_act"}
    got = grad(fused, list(vals)).evaluate(vals, {})
    for a, want in zip(got, grad(g, list(vals)).evaluate(vals, {}), strict=True):
        np.testing.assert_allclose(a, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", [GatedDeltaNet, SelectiveScan])
def test_recurrent_ops_state_why_they_have_no_rules(op: type) -> None:
    assert "no derivative rule" in op.nondiff and "scan" in op.nondiff
