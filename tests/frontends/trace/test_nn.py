"""rlx.nn functions against NumPy formulas, and a jitted MLP and attention block against
NumPy and PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
import rlx.nn as rnn
import rlx.numpy as rnp

f32 = np.float32
erf = np.vectorize(math.erf)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(f32)


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


ACTS = [
    ("relu", rnn.relu, lambda x: np.maximum(x, 0)),
    ("gelu_tanh", rnn.gelu,
     lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))),
    ("gelu_exact", lambda x: rnn.gelu(x, approximate=False),
     lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2)))),
    ("silu", rnn.silu, lambda x: x / (1 + np.exp(-x))),
    ("sigmoid", rnn.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    ("softplus", rnn.softplus, lambda x: np.log1p(np.exp(x))),
    ("leaky_relu", rnn.leaky_relu, lambda x: np.where(x >= 0, x, 0.01 * x)),
    ("elu", rnn.elu, lambda x: np.where(x > 0, x, np.expm1(x))),
    ("softmax", rnn.softmax, np_softmax),
    ("softmax_axis0", lambda x: rnn.softmax(x, axis=0), lambda x: np_softmax(x, 0)),
    ("log_softmax", rnn.log_softmax, lambda x: np.log(np_softmax(x))),
    ("logsumexp", lambda x: rnn.logsumexp(x, axis=-1),
     lambda x: np.log(np.exp(x).sum(-1))),
]  # fmt: skip


@pytest.mark.parametrize("fn,ref", [a[1:] for a in ACTS], ids=[a[0] for a in ACTS])
def test_activations_vs_numpy(fn, ref):
    x = rand(3, 5) * 3
    np.testing.assert_allclose(rlx.jit(fn)(x), ref(x.astype(np.float64)), rtol=2e-5, atol=2e-6)


@settings(max_examples=10)
@given(rows=st.integers(1, 4), d=st.integers(2, 16), bias=st.booleans())
def test_layer_norm_and_rms_norm_vs_numpy(rows, d, bias):
    x, g, b = rand(rows, d) * 2 + 1, rand(d, seed=1), rand(d, seed=2)
    beta = b if bias else None
    ln = rlx.jit(lambda x, g: rnn.layer_norm(x, g, b if bias else None, eps=1e-5))(x, g)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    want = (x - mu) / np.sqrt(var + 1e-5) * g + (0 if beta is None else beta)
    np.testing.assert_allclose(ln, want, rtol=1e-4, atol=1e-5)
    rms = rlx.jit(lambda x, g: rnn.rms_norm(x, g, eps=1e-6))(x, g)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g
    np.testing.assert_allclose(rms, want, rtol=1e-4, atol=1e-5)


def test_one_hot():
    got = rlx.jit(lambda i: rnn.one_hot(i, 4))(np.array([0, 3, 1], np.int32))
    np.testing.assert_array_equal(got, np.eye(4, dtype=f32)[[0, 3, 1]])


def np_attention(q, k, v, bias=None, causal=False, scale=None):
    """q [B,T,N,H], k/v [B,S,K,H] -> [B,T,N,H] (grouped-query when K < N)."""
    n, kh = q.shape[2], k.shape[2]
    k = np.repeat(k, n // kh, axis=2)
    v = np.repeat(v, n // kh, axis=2)
    s = np.einsum("btnh,bsnh->bnts", q, k) * (scale or 1 / math.sqrt(q.shape[-1]))
    if bias is not None:
        s = s + bias
    if causal:
        t, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((t, S), bool), S - t), s, -np.inf)
    return np.einsum("bnts,bsnh->btnh", np_softmax(s), v)


@pytest.mark.parametrize(
    "case",
    ["plain", "causal", "mask", "bias", "gqa", "unbatched", "causal_mask", "scale"],
)
def test_dot_product_attention_vs_numpy(case):
    b, t, s, n, h = 2, 5, 5, 4, 8
    kh = 2 if case == "gqa" else n
    q, k, v = rand(b, t, n, h), rand(b, s, kh, h, seed=1), rand(b, s, kh, h, seed=2)
    mask = rand(b, 1, t, s, seed=3) > -0.5
    mask[..., 0] = True
    bias = rand(1, n, t, s, seed=4)
    kw: dict = {}
    want_kw: dict = {}
    if case in ("causal", "causal_mask"):
        kw["is_causal"] = want_kw["causal"] = True
    if case in ("mask", "causal_mask"):
        kw["mask"] = mask
        want_kw["bias"] = np.where(mask, 0, -np.inf)
    if case == "bias":
        kw["bias"] = want_kw["bias"] = bias
    if case == "scale":
        kw["scale"] = want_kw["scale"] = 0.3
    if case == "unbatched":
        got = rlx.jit(lambda q, k, v: rnn.dot_product_attention(q, k, v))(q[0], k[0], v[0])
        np.testing.assert_allclose(got, np_attention(q[:1], k[:1], v[:1])[0], rtol=1e-4, atol=1e-5)
        return
    got = rlx.jit(lambda q, k, v: rnn.dot_product_attention(q, k, v, **kw))(q, k, v)
    np.testing.assert_allclose(got, np_attention(q, k, v, **want_kw), rtol=1e-4, atol=1e-5)


def mlp(params, x):
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = rnn.gelu(h, approximate=False)
    return rnn.log_softmax(h)


def attention_block(p, x):
    b, t, d = x.shape
    n = p["heads"]
    y = rnn.layer_norm(x, p["g"], p["beta"])
    q, k, v = (rnp.reshape(y @ p[w], (b, t, n, d // n)) for w in ("wq", "wk", "wv"))
    a = rnn.dot_product_attention(q, k, v, is_causal=True)
    h = x + rnp.reshape(a, (b, t, d)) @ p["wo"]
    return h + rnn.silu(h @ p["w1"]) @ p["w2"]


def _mlp_params(sizes, seed=0):
    return [(rand(a, c, seed=seed + i) / f32(np.sqrt(a)), rand(c, seed=99 + i) * f32(0.1))
            for i, (a, c) in enumerate(zip(sizes[:-1], sizes[1:]))]  # fmt: skip


def test_jitted_mlp_vs_numpy_and_torch():
    torch = pytest.importorskip("torch")
    params = _mlp_params([16, 32, 32, 10])
    x = rand(8, 16, seed=7)
    got = rlx.jit(mlp)(params, x)
    assert got.dtype == f32
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
    want = (
        h
        - np.log(np.exp(h - h.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - h.max(-1, keepdims=True)
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    th = torch.from_numpy(x)
    for i, (w, b) in enumerate(params):
        th = th @ torch.from_numpy(w) + torch.from_numpy(b)
        if i < len(params) - 1:
            th = torch.nn.functional.gelu(th)
    np.testing.assert_allclose(got, torch.log_softmax(th, -1).numpy(), rtol=1e-4, atol=1e-5)


def test_jitted_attention_block_vs_torch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    d, n = 32, 4
    s = f32(1 / np.sqrt(d))
    p = {
        "g": rand(d, seed=1) * f32(0.1) + 1, "beta": rand(d, seed=2) * f32(0.1),
        **{w: rand(d, d, seed=3 + i) * s for i, w in enumerate(("wq", "wk", "wv", "wo"))},
        "w1": rand(d, 2 * d, seed=8) * s, "w2": rand(2 * d, d, seed=9) * s,
    }  # fmt: skip
    params = dict(p)
    x = rand(2, 6, d, seed=10)
    block = rlx.jit(lambda p, x: attention_block({**p, "heads": n}, x))
    got = block(params, x)
    T = {k: torch.from_numpy(v) for k, v in p.items()}
    tx = torch.from_numpy(x)
    y = F.layer_norm(tx, (d,), T["g"], T["beta"], eps=1e-5)
    q, k, v = ((y @ T[w]).reshape(2, 6, n, d // n).transpose(1, 2) for w in ("wq", "wk", "wv"))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 6, d)
    h = tx + a @ T["wo"]
    want = h + F.silu(h @ T["w1"]) @ T["w2"]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)
    assert "attention" in block.lower(params, x).inspect()


def test_attention_block_with_dynamic_batch_and_seq_vs_numpy():
    d, n = 16, 2
    s = f32(1 / np.sqrt(d))
    p = {
        "g": rand(d, seed=1), "beta": rand(d, seed=2),
        **{w: rand(d, d, seed=3 + i) * s for i, w in enumerate(("wq", "wk", "wv", "wo"))},
        "w1": rand(d, 2 * d, seed=8) * s, "w2": rand(2 * d, d, seed=9) * s,
    }  # fmt: skip
    block = lambda p, x: attention_block({**p, "heads": n}, x)  # noqa: E731
    dyn = rlx.jit(block, dynamic={"x": {0: "batch", 1: "seq"}})
    for b, t in ((2, 6), (3, 5), (1, 9)):
        x = rand(b, t, d, seed=b)
        np.testing.assert_allclose(dyn(p, x), np_block(p, x, n), rtol=1e-4, atol=1e-5)
    assert dyn.trace_count == 1


def np_block(p, x, n):
    """attention_block in NumPy (f64)."""
    b, t, d = x.shape
    x = x.astype(np.float64)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + 1e-5) * p["g"] + p["beta"]
    q, k, v = ((y @ p[w]).reshape(b, t, n, d // n) for w in ("wq", "wk", "wv"))
    a = np_attention(q, k, v, causal=True).reshape(b, t, d)
    h = x + a @ p["wo"]
    u = h @ p["w1"]
    return h + (u / (1 + np.exp(-u))) @ p["w2"]
