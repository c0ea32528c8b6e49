import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.errors import ShapeError
from rlx.ops.recurrent import GatedDeltaNet, GdnResult, gated_delta_rule


def naive(q, k, v, g, beta, state=None):
    """Scalar loops, straight from S_t = a S (I - b k k^T) + b k v^T, o = S^T q / sqrt(K)."""
    b_, t_, h_, dk = k.shape
    dv = v.shape[-1]
    out = np.zeros((b_, t_, h_, dv))
    final = np.zeros((b_, h_, dk, dv))
    for b in range(b_):
        for h in range(h_):
            s = np.zeros((dk, dv)) if state is None else state[b, h].astype(np.float64).copy()
            for t in range(t_):
                a = math.exp(g[b, t, h])
                kk = k[b, t, h].astype(np.float64)
                proj = np.eye(dk) - beta[b, t, h] * np.outer(kk, kk)
                s = a * proj @ s + beta[b, t, h] * np.outer(kk, v[b, t, h])
                for j in range(dv):
                    out[b, t, h, j] = sum(s[i, j] * q[b, t, h, i] for i in range(dk)) / math.sqrt(
                        dk
                    )
            final[b, h] = s
    return out, final


def make(rng, b, t, h, dk, dv, dtype=np.float32):
    q = rng.standard_normal((b, t, h, dk)).astype(dtype)
    k = rng.standard_normal((b, t, h, dk))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(dtype)
    v = rng.standard_normal((b, t, h, dv)).astype(dtype)
    g = (-rng.uniform(0.0, 1.0, (b, t, h))).astype(dtype)
    beta = rng.uniform(0.0, 1.0, (b, t, h)).astype(dtype)
    return q, k, v, g, beta


@given(
    b=st.integers(1, 2),
    t=st.integers(1, 5),
    h=st.integers(1, 3),
    dk=st.integers(1, 4),
    dv=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_reference_matches_naive_loop(b, t, h, dk, dv, seed):
    rng = np.random.default_rng(seed)
    arrays = make(rng, b, t, h, dk, dv)
    state = rng.standard_normal((b, h, dk, dv)).astype(np.float32)
    for st0 in (None, state):
        out, final = gated_delta_rule(*arrays, state=st0)
        want_out, want_final = naive(*arrays, state=st0)
        np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(final, want_final, rtol=1e-4, atol=1e-5)


def build(b, t, h, dk, dv, carry, returns=GdnResult.OUTPUT, dtype="f32"):
    g = rlx.Graph("gdn")
    ids = [
        g.input("q", (b, t, h, dk), dtype),
        g.input("k", (b, t, h, dk), dtype),
        g.input("v", (b, t, h, dv), dtype),
        g.input("g", (b, t, h), dtype),
        g.input("beta", (b, t, h), dtype),
    ]
    state = g.input("state", (b, h, dk, dv), dtype) if carry else None
    y = g.gated_delta_net(*ids, state=state, state_size=dk, returns=returns)
    g.set_outputs([y])
    g.verify()
    return g


def feed(arrays, state=None):
    d = dict(zip(("q", "k", "v", "g", "beta"), arrays, strict=True))
    if state is not None:
        d["state"] = state
    return d


def test_graph_op_output_and_final_state():
    rng = np.random.default_rng(0)
    arrays = make(rng, 2, 4, 2, 3, 5)
    want_out, want_final = naive(*arrays)
    (out,) = build(2, 4, 2, 3, 5, carry=False).evaluate(feed(arrays))
    assert out.shape == (2, 4, 2, 5) and out.dtype == np.float32
    np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-5)
    gs = build(2, 4, 2, 3, 5, carry=False, returns=GdnResult.FINAL_STATE)
    assert gs.nodes[-1].shape == rlx.Shape((2, 2, 3, 5))
    (final,) = gs.evaluate(feed(arrays))
    np.testing.assert_allclose(final, want_final, rtol=1e-4, atol=1e-5)


def test_carry_splits_the_sequence():
    # running T=6 at once equals T=4 then T=2 with the state carried between calls
    rng = np.random.default_rng(1)
    arrays = make(rng, 1, 6, 2, 4, 3)
    first = [a[:, :4] for a in arrays]
    second = [a[:, 4:] for a in arrays]
    (full,) = build(1, 6, 2, 4, 3, carry=False).evaluate(feed(arrays))
    (s4,) = build(1, 4, 2, 4, 3, carry=False, returns=GdnResult.FINAL_STATE).evaluate(feed(first))
    (o1,) = build(1, 4, 2, 4, 3, carry=False).evaluate(feed(first))
    (o2,) = build(1, 2, 2, 4, 3, carry=True).evaluate(feed(second, s4))
    np.testing.assert_allclose(np.concatenate([o1, o2], axis=1), full, rtol=1e-5, atol=1e-6)


def test_f16_computes_in_f32():
    rng = np.random.default_rng(2)
    arrays = make(rng, 1, 3, 1, 2, 2, dtype=np.float16)
    (out,) = build(1, 3, 1, 2, 2, carry=False, dtype="f16").evaluate(feed(arrays))
    assert out.dtype == np.float16
    want, _ = naive(*[a.astype(np.float64) for a in arrays])
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=1e-2, atol=1e-2)


def test_shape_errors_name_the_tensor():
    g = rlx.Graph("bad")
    q = g.input("q", (1, 3, 2, 4))
    k = g.input("k", (1, 3, 2, 4))
    v = g.input("v", (1, 3, 2, 5))
    gg = g.input("g", (1, 3, 2))
    beta = g.input("beta", (1, 3, 1))
    with pytest.raises(ShapeError, match="beta"):
        g.gated_delta_net(q, k, v, gg, beta)
    with pytest.raises(ShapeError, match="state_size=8"):
        g.gated_delta_net(q, k, v, gg, gg, state_size=8)
    bad_state = g.input("s", (1, 2, 4, 4))
    with pytest.raises(ShapeError, match=r"state must be \[B, H, K, V\]"):
        g.gated_delta_net(q, k, v, gg, gg, state=bad_state)
    with pytest.raises(ShapeError, match="expected 6 inputs"):
        g.apply(GatedDeltaNet(4, carry=True), [q, k, v, gg, gg])
