"""The synthetic encoder/decoder graphs, checked against NumPy twins written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import erf

import rlx
from rlx.errors import ShapeError
from rlx.models import decoder, encoder, random_inputs, random_params, rope_tables
from rlx.ops.core import Param
from rlx.ops.nn import Attention
from rlx.shape import Sym

SMALL = dict(hidden=32, heads=4, ffn=48)

# ---- NumPy twins -------------------------------------------------------------------


def _ln(x, g, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def _rms(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _mha(q, k, v, heads, kv, causal):
    """q [B,S,heads*hd], k/v [B,S,kv*hd] -> [B,S,heads*hd], looping over heads."""
    b, s, _ = q.shape
    hd = q.shape[-1] // heads
    out = np.zeros_like(q)
    mask = np.triu(np.full((s, s), -np.inf), 1) if causal else 0.0
    for h in range(heads):
        j = h // (heads // kv)
        qh, kh, vh = (
            q[..., h * hd : (h + 1) * hd],
            k[..., j * hd : (j + 1) * hd],
            v[..., j * hd : (j + 1) * hd],
        )
        p = _softmax(qh @ kh.transpose(0, 2, 1) / math.sqrt(hd) + mask)
        out[..., h * hd : (h + 1) * hd] = p @ vh
    return out


def numpy_encoder(x, p, layers, heads, eps=1e-12):
    gelu = lambda t: 0.5 * t * (1 + erf(t / math.sqrt(2)))  # noqa: E731
    for i in range(layers):
        lin = lambda t, n: t @ p[f"layer{i}.{n}.weight"] + p[f"layer{i}.{n}.bias"]  # noqa: E731, B023
        a = _mha(lin(x, "attn.q"), lin(x, "attn.k"), lin(x, "attn.v"), heads, heads, False)
        x = _ln(x + lin(a, "attn.o"), p[f"layer{i}.ln1.gamma"], p[f"layer{i}.ln1.beta"], eps)
        x = _ln(
            x + lin(gelu(lin(x, "ffn.up")), "ffn.down"),
            p[f"layer{i}.ln2.gamma"],
            p[f"layer{i}.ln2.beta"],
            eps,
        )
    return x


def numpy_decoder(x, p, layers, heads, kv, eps=1e-6):
    silu = lambda t: t / (1 + np.exp(-t))  # noqa: E731
    for i in range(layers):
        w = lambda n: p[f"layer{i}.{n}.weight"]  # noqa: E731, B023
        h = _rms(x, p[f"layer{i}.attn_norm.gamma"], eps)
        x = x + _mha(h @ w("attn.q"), h @ w("attn.k"), h @ w("attn.v"), heads, kv, True) @ w(
            "attn.o"
        )
        h = _rms(x, p[f"layer{i}.mlp_norm.gamma"], eps)
        x = x + (silu(h @ w("mlp.gate")) * (h @ w("mlp.up"))) @ w("mlp.down")
    return _rms(x, p["final_norm.gamma"], eps)


def _f64(params):
    return {k: v.astype(np.float64) for k, v in params.items()}


# ---- tests ---------------------------------------------------------------------------


def test_encoder_matches_numpy_twin():
    g = encoder(layers=2, seq=6, batch=2, **SMALL)
    g.verify()
    params, inputs = random_params(g, 3), random_inputs(g, seed=4)
    (got,) = g.evaluate(inputs, params)
    want = numpy_encoder(inputs["x"].astype(np.float64), _f64(params), 2, 4)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("kv_heads", [None, 2, 1])
def test_decoder_matches_numpy_twin(kv_heads):
    g = decoder(layers=2, seq=7, batch=2, kv_heads=kv_heads, rope=False, **SMALL)
    g.verify()
    params, inputs = random_params(g, 5), random_inputs(g, seed=6)
    (got,) = g.evaluate(inputs, params)
    want = numpy_decoder(inputs["x"].astype(np.float64), _f64(params), 2, 4, kv_heads or 4)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_spelled_out_attention_equals_the_attention_op(kv_heads):
    kw = dict(layers=2, seq=5, batch=2, kv_heads=kv_heads, vocab=11, **SMALL)
    explicit, fused = decoder(**kw), decoder(fused_attention=True, **kw)
    assert not explicit.find(Attention) and len(fused.find(Attention)) == 2
    params, inputs = random_params(explicit, 0), random_inputs(explicit, seed=1)
    (a,), (b,) = explicit.evaluate(inputs, params), fused.evaluate(inputs, params)
    assert a.shape == (2, 5, 11)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    e1, e2 = (
        encoder(layers=1, seq=4, **SMALL),
        encoder(layers=1, seq=4, fused_attention=True, **SMALL),
    )
    p1, i1 = random_params(e1, 2), random_inputs(e1, seed=2)
    np.testing.assert_allclose(e1.evaluate(i1, p1)[0], e2.evaluate(i1, p1)[0], rtol=1e-5, atol=1e-5)


def test_decoder_is_causal():
    g = decoder(layers=2, seq=6, **SMALL)
    params, inputs = random_params(g, 0), random_inputs(g, seed=0)
    (before,) = g.evaluate(inputs, params)
    inputs["x"][:, -1] += 3.0
    (after,) = g.evaluate(inputs, params)
    np.testing.assert_array_equal(before[:, :-1], after[:, :-1])
    assert not np.allclose(before[:, -1], after[:, -1])


def test_minilm_sizes_and_param_names():
    g = encoder(vocab=30522, seq=128)
    names = g.param_names
    per_layer = 4 * (384 * 384 + 384) + (384 * 1536 + 1536) + (1536 * 384 + 384) + 4 * 384
    counts = {n.op.name: math.prod(n.shape.concrete()) for n in g.param_nodes()}
    embed = 30522 * 384 + 128 * 384 + 2 * 384
    assert sum(counts.values()) == 6 * per_layer + embed
    assert "layer5.ffn.down.weight" in names and "embed.weight" in names
    assert g.nodes[g.outputs[0]].shape.dims == (1, 128, 384)
    assert g.input_names == ["input_ids"]


def test_symbolic_batch_and_seq():
    batch, seq = rlx.sym("batch"), rlx.sym("seq")
    g = decoder(layers=1, seq=seq, batch=batch, fused_attention=True, vocab=13, **SMALL)
    assert set(g.sym_bounds) == {"batch", "seq"}
    out = g.nodes[g.outputs[0]].shape
    assert isinstance(out.dims[0], Sym) and isinstance(out.dims[1], Sym) and out.dims[2] == 13
    params = random_params(g, 0)
    for b in ({"batch": 1, "seq": 2}, {"batch": 3, "seq": 5}):
        (y,) = g.evaluate(random_inputs(g, b, 0), params)
        assert y.shape == (b["batch"], b["seq"], 13)
    e = encoder(layers=1, seq=seq, batch=batch, vocab=9, **SMALL)
    assert "embed.position" not in e.param_names  # a learned table needs a static seq
    (y,) = e.evaluate(random_inputs(e, {"batch": 2, "seq": 3}, 0), random_params(e, 0))
    assert y.shape == (2, 3, 32)


def test_random_params_are_deterministic_and_complete():
    g = decoder(layers=1, seq=4, vocab=10, **SMALL)
    a, b, c = random_params(g, 7), random_params(g, 7), random_params(g, 8)
    assert set(a) == set(g.param_names)
    for n in g.nodes:
        if isinstance(n.op, Param):
            assert a[n.op.name].shape == n.shape.concrete() and a[n.op.name].dtype == np.float32
            np.testing.assert_array_equal(a[n.op.name], b[n.op.name])
    assert not np.array_equal(a["lm_head.weight"], c["lm_head.weight"])
    gamma = a["final_norm.gamma"]
    assert np.all(np.abs(gamma - 1.0) < 0.2)
    assert np.std(a["layer0.mlp.up.weight"]) == pytest.approx(1 / math.sqrt(32), rel=0.2)


def test_bad_sizes_are_shape_errors():
    with pytest.raises(ShapeError, match="hidden=30 is not divisible by heads=4"):
        encoder(hidden=30, heads=4)
    with pytest.raises(ShapeError, match="heads=4 is not a multiple of kv_heads=3"):
        decoder(hidden=32, heads=4, kv_heads=3)
    with pytest.raises(ShapeError, match="static seq"):
        decoder(layers=1, seq=rlx.sym("seq"), **SMALL)
    with pytest.raises(ShapeError, match="batch/seq must be"):
        encoder(layers=1, batch=0, **SMALL)
    with pytest.raises(ShapeError, match="even head dim"):
        decoder(layers=1, hidden=12, heads=4)


def test_rope_tables_rotate_each_pair_by_its_angle():
    t = rope_tables(6, 8)
    cos, sin = t["rope_cos"], t["rope_sin"]
    assert cos.shape == sin.shape == (6, 4) and cos.dtype == np.float32
    np.testing.assert_allclose(cos**2 + sin**2, 1.0, rtol=1e-6)
    np.testing.assert_array_equal(cos[0], 1.0)
    np.testing.assert_allclose(
        np.arctan2(sin[1], cos[1]), 10000.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-6
    )
    # rotation keeps each head's norm: the decoder's q/k rope with real tables
    g = rlx.Graph("r")
    x = g.input("x", (1, 6, 16))
    c, s = g.input("rope_cos", (6, 4)), g.input("rope_sin", (6, 4))
    g.set_outputs([g.rope(x, c, s, 8)])
    xv = np.random.default_rng(0).standard_normal((1, 6, 16)).astype(np.float32)
    (y,) = g.evaluate({"x": xv, **t})
    np.testing.assert_allclose(
        np.linalg.norm(y.reshape(6, 2, 8), axis=-1),
        np.linalg.norm(xv.reshape(6, 2, 8), axis=-1),
        rtol=1e-5,
    )
    with pytest.raises(ShapeError, match="head_dim must be even"):
        rope_tables(4, 7)


@pytest.mark.parametrize(
    "build",
    [
        lambda: encoder(
            layers=2, seq=rlx.sym("seq"), batch=2, vocab=17, fused_attention=True, **SMALL
        ),
        lambda: decoder(layers=2, seq=9, kv_heads=2, vocab=17, **SMALL),
    ],
    ids=["encoder", "decoder"],
)
def test_cpu_session_runs_the_planned_graphs_like_the_reference(build):
    g = build()
    params = random_params(g, 0)
    cg = rlx.Session("cpu").compile(g, params=params)
    for seq in (9, 4) if "seq" in g.sym_bounds else (9,):
        inputs = random_inputs(g, {"seq": seq}, seq)
        if "rope_cos" in g.input_names:
            inputs.update(rope_tables(seq, SMALL["hidden"] // SMALL["heads"]))
        (got,) = cg.run(inputs)
        (want,) = g.evaluate(inputs, params)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
