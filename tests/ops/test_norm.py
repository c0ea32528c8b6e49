"""Normalisations (rlx/ops/norm.py): shape rules and references against NumPy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlx
from rlx import DType, Shape
from rlx.errors import ShapeError
from rlx.ops.norm import GroupNorm, LayerNorm, RmsNorm

from .helpers import run

rng = np.random.default_rng(0)


def ln64(x, gamma, beta, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * gamma.astype(np.float64)
    return y if beta is None else y + beta.astype(np.float64)


def rms64(x, gamma, beta, eps):
    x = x.astype(np.float64)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gamma.astype(np.float64)
    return y if beta is None else y + beta.astype(np.float64)


def gn_loops(x, gamma, beta, groups, eps):
    """Group norm by explicit loops over samples and groups (independent of the op)."""
    x = x.astype(np.float64)
    n, c = x.shape[:2]
    per = c // groups
    y = np.empty_like(x)
    for s in range(n):
        for gi in range(groups):
            block = x[s, gi * per : (gi + 1) * per]
            y[s, gi * per : (gi + 1) * per] = (block - block.mean()) / np.sqrt(block.var() + eps)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return y * gamma.reshape(shape) + beta.reshape(shape)


@pytest.mark.parametrize("with_beta", [False, True])
def test_layer_norm_matches_numpy(with_beta):
    x = rng.normal(3.0, 2.0, (2, 5, 16)).astype(np.float32)
    gamma = rng.normal(size=16).astype(np.float32)
    beta = rng.normal(size=16).astype(np.float32)
    if with_beta:
        got = run(lambda g, a, w, b: g.layer_norm(a, w, b, eps=1e-3), x, gamma, beta)
    else:
        got = run(lambda g, a, w: g.layer_norm(a, w, eps=1e-3), x, gamma)
    want = ln64(x, gamma, beta if with_beta else None, 1e-3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got.dtype == np.float32


@pytest.mark.parametrize("with_beta", [False, True])
def test_rms_norm_matches_numpy(with_beta):
    x = rng.normal(size=(3, 32)).astype(np.float32)
    gamma = rng.normal(size=32).astype(np.float32)
    beta = rng.normal(size=32).astype(np.float32)
    if with_beta:
        got = run(lambda g, a, w, b: g.rms_norm(a, w, b), x, gamma, beta)
    else:
        got = run(lambda g, a, w: g.rms_norm(a, w), x, gamma)
    want = rms64(x, gamma, beta if with_beta else None, 1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("shape", "groups"), [((2, 6, 5), 3), ((1, 8, 3, 4), 2), ((3, 4), 4)])
def test_group_norm_matches_loops(shape, groups):
    x = rng.normal(1.0, 3.0, shape).astype(np.float32)
    c = shape[1]
    gamma = rng.normal(size=c).astype(np.float32)
    beta = rng.normal(size=c).astype(np.float32)
    got = run(lambda g, a, w, b: g.group_norm(a, w, b, groups, eps=1e-4), x, gamma, beta)
    np.testing.assert_allclose(got, gn_loops(x, gamma, beta, groups, 1e-4), rtol=1e-4, atol=1e-5)


@given(
    x=hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=6),
        elements=st.floats(-100, 100),
    ),
    scale=st.floats(0.5, 20),
    shift=st.floats(-50, 50),
)
def test_layer_norm_is_invariant_to_affine_input_changes(x, scale, shift):
    # rows that are (almost) constant normalise to ~0 but amplify rounding: not these
    assume(np.all(x.std(-1) > 1e-3))
    d = x.shape[-1]
    ones, zeros = np.ones(d), np.zeros(d)
    y1 = run(lambda g, a, w, b: g.layer_norm(a, w, b, eps=0.0), x, ones, zeros)
    y2 = run(lambda g, a, w, b: g.layer_norm(a, w, b, eps=0.0), x * scale + shift, ones, zeros)
    np.testing.assert_allclose(y1, y2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y1.mean(-1), 0.0, atol=1e-9)
    np.testing.assert_allclose(y1.var(-1), 1.0, rtol=1e-9)


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16])
def test_low_precision_norms_compute_in_f32(dt):
    x = (rng.normal(size=(4, 256)) * 50 + 300).astype(dt)
    gamma = np.ones(256, dt)
    got = run(lambda g, a, w: g.layer_norm(a, w), x, gamma)
    assert got.dtype == dt
    want = ln64(x.astype(np.float64), np.ones(256), None, 1e-5)
    tol = 1e-2 if dt is np.float16 else 4e-2  # one rounding of the result, no accumulation
    np.testing.assert_allclose(got.astype(np.float64), want, atol=tol * np.abs(want).max())
    got = run(lambda g, a, w: g.rms_norm(a, w), x, gamma)
    want = rms64(x.astype(np.float64), np.ones(256), None, 1e-6)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol)


def test_norm_shape_rules_with_symbolic_dims():
    b = rlx.sym("batch")
    x = Shape((b, "seq", 64), DType.F16)
    w = Shape((64,), DType.F16)
    assert LayerNorm(1e-5, True).infer((x, w, w)) == x
    assert RmsNorm(1e-6).infer((x, w)) == x
    img = Shape((b, 32, 7, 7))
    c = Shape((32,))
    assert GroupNorm(8).infer((img, c, c)) == img
    sym_c = Shape((2, rlx.sym("c") * 4, 3))
    gc = Shape((rlx.sym("c") * 4,))
    assert GroupNorm(4).infer((sym_c, gc, gc)) == sym_c


def test_norm_builders_pick_the_input_count():
    g = rlx.Graph()
    x = g.input("x", (2, 8))
    w = g.param("w", (8,))
    assert g.nodes[g.layer_norm(x, w)].op == LayerNorm(1e-5, False)
    assert g.nodes[g.layer_norm(x, w, w)].op == LayerNorm(1e-5, True)
    assert g.nodes[g.rms_norm(x, w, eps=1e-5)].op == RmsNorm(1e-5, False)
    with pytest.raises(
        ShapeError, match=r"layer_norm\[eps=1e-05, has_beta=True\]: expected 3 inputs, got 2"
    ):
        g.apply(LayerNorm(1e-5, True), [x, w])
    with pytest.raises(ShapeError, match=r"expected 2 inputs \(x, gamma\), got 3"):
        RmsNorm().infer((Shape((2, 8)), Shape((8,)), Shape((8,))))


def test_norm_errors_name_expected_and_given():
    x = Shape((2, 8))
    with pytest.raises(ShapeError, match=r"gamma must have dims \[8\].*got f32\[7\]"):
        LayerNorm().infer((x, Shape((7,)), Shape((8,))))
    with pytest.raises(ShapeError, match=r"beta must have dims \[8\].*got f32\[1,8\]"):
        RmsNorm(1e-6, True).infer((x, Shape((8,)), Shape((1, 8))))
    with pytest.raises(ShapeError, match=r"gamma dtype f16 differs from the input's f32"):
        RmsNorm().infer((x, Shape((8,), DType.F16)))
    with pytest.raises(ShapeError, match=r"needs a float input, got i32\[2,8\]"):
        LayerNorm(1e-5, False).infer((Shape((2, 8), DType.I32), Shape((8,), DType.I32)))
    with pytest.raises(ShapeError, match=r"eps must be a float >= 0, got -0.1"):
        LayerNorm(-0.1, False).infer((x, Shape((8,))))
    with pytest.raises(ShapeError, match=r"rank >= 1, got f32\[\]"):
        RmsNorm().infer((Shape(()), Shape(())))
    img = Shape((1, 6, 4))
    c = Shape((6,))
    with pytest.raises(
        ShapeError, match=r"channel dim 6 of f32\[1,6,4\] is not a multiple of num_groups=4"
    ):
        GroupNorm(4).infer((img, c, c))
    with pytest.raises(ShapeError, match=r"rank >= 2, got f32\[6\]"):
        GroupNorm(2).infer((c, c, c))
    with pytest.raises(ShapeError, match=r"num_groups must be >= 1, got 0"):
        GroupNorm(0).infer((img, c, c))
    with pytest.raises(ShapeError, match=r"gamma must have dims \[6\] \(the channel dim"):
        GroupNorm(2).infer((img, Shape((4,)), c))
