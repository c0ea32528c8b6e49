"""Derivative rules of attention, rope, conv and pool and their backward ops
(AttentionBackward, AttentionJvp, RopeBackward, ConvBackwardData, ConvBackwardWeight,
PoolBackward, MaxPoolSelect) against finite differences in f64 (``rlx.autodiff.check``:
reference interpreter and compiled CPU graph) on hypothesis-drawn shapes; attention (with
a padding mask, and causal), conv2d and max_pool gradients against torch.autograd in f32;
every backward kernel against its reference under RLX_ISA=auto/avx2/portable; an
encoder block with symbolic (batch, seq) differentiated and run; vmap of attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.autodiff import grad, vjp, vmap
from rlx.autodiff.check import check_jvp, check_vjp
from rlx.backends.cpu.native.cpu import Arch, machine_arch
from rlx.ops.nn import MaskKind
from rlx.options import CompileOptions
from rlx.runtime.session import Session

FEW = settings(max_examples=3, deadline=None)
RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)
MASKS = [MaskKind.none(), MaskKind.causal(), MaskKind.sliding_window(2), MaskKind.custom()]


def _check(g: rlx.Graph, values: dict[str, np.ndarray]) -> None:
    check_vjp(g, values, list(values), compiled=True)
    check_jvp(g, values, list(values), compiled=True)


def _graph(shapes: dict[str, tuple[int, ...]], seed: int) -> tuple[rlx.Graph, dict, dict]:
    g = rlx.Graph("t")
    rng = np.random.default_rng(seed)
    ids = {k: g.input(k, s, "f64") for k, s in shapes.items()}
    return g, ids, {k: rng.standard_normal(s) for k, s in shapes.items()}


@pytest.mark.parametrize("mask", MASKS, ids=str)
@FEW
@given(
    b=st.integers(1, 2),
    sq=st.integers(1, 3),
    extra=st.integers(0, 2),
    hkv=st.integers(1, 2),
    group=st.integers(1, 2),
    d=st.integers(1, 3),
    scale=st.sampled_from([None, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_attention(mask, b, sq, extra, hkv, group, d, scale, seed) -> None:
    """Attention and AttentionBackward / AttentionJvp: every mask kind, grouped heads."""
    skv, h = sq + extra, hkv * group
    shapes = {"q": (b, sq, h * d), "k": (b, skv, hkv * d), "v": (b, skv, hkv * d)}
    if mask.type.value == "custom":
        shapes["m"] = (b, 1, sq, skv) if seed % 2 else (skv,)
    g, i, values = _graph(shapes, seed)
    out = g.attention(
        i["q"],
        i["k"],
        i["v"],
        h,
        d,
        mask=mask,
        mask_input=i.get("m"),
        num_kv_heads=hkv,
        scale=scale,
    )
    g.set_outputs([out])
    _check(g, values)


@pytest.mark.parametrize("interleaved", [False, True])
@FEW
@given(
    d_half=st.integers(1, 3),
    rot_half=st.integers(1, 3),
    heads=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_rope(interleaved: bool, d_half: int, rot_half: int, heads: int, seed: int) -> None:
    """Rope and RopeBackward: full and partial rotation, both layouts, grads of the tables."""
    d, r = 2 * max(d_half, rot_half), 2 * rot_half
    g, i, values = _graph({"x": (2, 3, heads * d), "c": (3, r // 2), "s": (3, r // 2)}, seed)
    g.set_outputs([g.rope(i["x"], i["c"], i["s"], d, n_rot=r, interleaved=interleaved)])
    _check(g, values)


@pytest.mark.parametrize("nd", [1, 2])
@FEW
@given(
    groups=st.integers(1, 2),
    stride=st.integers(1, 2),
    pad=st.integers(0, 2),
    dil=st.integers(1, 2),
    k=st.integers(1, 3),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_conv(nd, groups, stride, pad, dil, k, bias, seed) -> None:
    """Conv and ConvBackwardData / ConvBackwardWeight: strides, padding, dilation, groups."""
    sp = (6,) * nd
    shapes = {"x": (2, 2 * groups, *sp), "w": (3 * groups, 2, *(k,) * nd)}
    if bias:
        shapes["b"] = (3 * groups,)
    g, i, values = _graph(shapes, seed)
    g.set_outputs(
        [
            g.conv(
                i["x"], i["w"], i.get("b"), stride=stride, padding=pad, dilation=dil, groups=groups
            )
        ]
    )
    _check(g, values)


@pytest.mark.parametrize("fn", ["max_pool", "avg_pool"])
@pytest.mark.parametrize("nd", [1, 2])
@FEW
@given(
    window=st.integers(1, 3),
    stride=st.integers(1, 2),
    pad=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_pool(fn: str, nd: int, window: int, stride: int, pad: int, seed: int) -> None:
    """Pool, PoolBackward and (max) MaxPoolSelect; values distinct so maxima are unique."""
    pad = min(pad, window - 1)
    shape = (2, 2, *(5,) * nd)
    g, i, _ = _graph({"x": shape}, seed)
    rng = np.random.default_rng(seed)
    x = (rng.permutation(int(np.prod(shape))) * 0.1).reshape(shape)
    g.set_outputs([getattr(g, fn)(i["x"], window, stride=stride, padding=pad)])
    _check(g, {"x": x})


@pytest.mark.parametrize("fn", ["max_pool", "avg_pool"])
def test_pool_second_order(fn: str) -> None:
    """PoolBackward / MaxPoolSelect are linear in the gradient: their own rules let a
    second derivative (vjp of the vjp) through."""
    g, i, _ = _graph({"x": (1, 2, 6)}, 0)
    g.set_outputs([getattr(g, fn)(i["x"], 2, stride=1)])
    back = vjp(g, ["x"])
    ct = next(n.op.name for n in back.input_nodes() if n.op.name != "x")
    back.set_outputs([back.outputs[-1]])
    x = (np.random.default_rng(0).permutation(12) * 0.1).reshape(1, 2, 6)
    u = np.random.default_rng(1).standard_normal((1, 2, 5))
    _check(back, {"x": x, ct: u})  # x: zero derivative (it only selects)


def test_attention_second_order_fails_clearly() -> None:
    g, i, _ = _graph({"q": (1, 2, 2), "k": (1, 2, 2), "v": (1, 2, 2)}, 0)
    g.set_outputs([g.sum(g.attention(i["q"], i["k"], i["v"], 1, 2))])
    first = grad(g, ["q"])
    first.set_outputs([first.sum(first.outputs[0])])
    with pytest.raises(rlx.errors.AutodiffError, match="attention_backward.*not differentiable"):
        grad(first, ["q"])


# ---- against torch.autograd (f32) --------------------------------------------------------


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def _grads(g: rlx.Graph, feed: dict[str, np.ndarray], wrt: list[str]) -> list[np.ndarray]:
    return Session("cpu").compile(grad(g, wrt)).run(feed)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_torch(causal: bool) -> None:
    """MiniLM-like heads (B=2, S=9, H=4, D=8): a key-padding mask, or causal."""
    rng = np.random.default_rng(0)
    b, s, h, d = 2, 9, 4, 8
    q, k, v, w = (rng.standard_normal((b, s, h * d)).astype(np.float32) for _ in range(4))
    keep = np.ones((b, s), bool)
    keep[1, 6:] = False
    add = np.where(keep, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None, None, :]
    g = rlx.Graph("att")
    iq, ik, iv, iw = (g.input(n, (b, s, h * d), "f32") for n in "qkvw")
    if causal:
        out = g.attention(iq, ik, iv, h, d, mask=MaskKind.causal())
    else:
        out = g.attention(iq, ik, iv, h, d, mask_input=g.input("m", add.shape, "f32"))
    g.set_outputs([g.sum(g.mul(out, iw))])
    feed = {"q": q, "k": k, "v": v, "w": w} | ({} if causal else {"m": add})
    got = _grads(g, feed, ["q", "k", "v"])
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(b, s, h, d).transpose(1, 2)

    o = torch.nn.functional.scaled_dot_product_attention(
        heads(tq),
        heads(tk),
        heads(tv),
        attn_mask=None if causal else torch.tensor(add),
        is_causal=causal,
    )
    (o.transpose(1, 2).reshape(b, s, h * d) * torch.tensor(w)).sum().backward()
    for a, t in zip(got, (tq, tk, tv), strict=True):
        assert _rel(a, t.grad.numpy()) <= 1e-5


def test_conv2d_and_max_pool_match_torch() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    g = rlx.Graph("cnn")
    ix, iw, ib = (
        g.input("x", x.shape, "f32"),
        g.input("w", w.shape, "f32"),
        g.input("b", (6,), "f32"),
    )
    y = g.conv(ix, iw, ib, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    p = g.max_pool(g.tanh(y), 2, stride=1, padding=1)
    u = rng.standard_normal(g.shape(p).dims).astype(np.float32)
    g.set_outputs([g.sum(g.mul(p, g.input("u", u.shape, "f32")))])
    got = _grads(g, {"x": x, "w": w, "b": bias, "u": u}, ["x", "w", "b"])
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, bias))
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    tp = torch.nn.functional.max_pool2d(torch.tanh(ty), 2, stride=1, padding=1)
    (tp * torch.tensor(u)).sum().backward()
    for a, t in zip(got, (tx, tw, tb), strict=True):
        assert _rel(a, t.grad.numpy()) <= 1e-5


# ---- kernels vs references, every ISA target ------------------------------------------------


def _backward_graphs() -> list[rlx.Graph]:
    """The vjp (and jvp) graphs whose nodes are every backward op of nn_grad."""
    out = []
    specs = [
        (
            {"q": (2, 3, 12), "k": (2, 4, 6), "v": (2, 4, 6), "m": (2, 1, 3, 4)},
            lambda g, i: g.attention(
                i["q"], i["k"], i["v"], 4, 3, mask_input=i["m"], num_kv_heads=2
            ),
        ),
        (
            {"q": (1, 5, 8), "k": (1, 5, 8), "v": (1, 5, 8)},
            lambda g, i: g.attention(i["q"], i["k"], i["v"], 2, 4, mask=MaskKind.sliding_window(2)),
        ),
        (
            {"x": (2, 3, 12), "c": (3, 2), "s": (3, 2)},
            lambda g, i: g.rope(i["x"], i["c"], i["s"], 6, n_rot=4, interleaved=True),
        ),
        (
            {"x": (2, 4, 7, 6), "w": (6, 2, 2, 3)},
            lambda g, i: g.conv(
                i["x"], i["w"], stride=(2, 1), padding=((1, 0), (1, 2)), dilation=(1, 2), groups=2
            ),
        ),
        ({"x": (2, 3, 7)}, lambda g, i: g.max_pool(i["x"], 3, stride=2, padding=1)),
        (
            {"x": (2, 3, 5, 6)},
            lambda g, i: g.avg_pool(i["x"], (2, 3), stride=(1, 2), padding=((1, 0), (1, 1))),
        ),
        ({"x": (3, 5), "g": (5,), "b": (5,)}, lambda g, i: g.layer_norm(i["x"], i["g"], i["b"])),
        ({"x": (3, 5), "g": (5,)}, lambda g, i: g.rms_norm(i["x"], i["g"])),
    ]
    from rlx.autodiff import jvp

    for shapes, build in specs:
        g = rlx.Graph("k")
        ids = {k: g.input(k, s, "f32") for k, s in shapes.items()}
        g.set_outputs([build(g, ids)])
        out += [vjp(g, list(shapes)), jvp(g, list(shapes))]
    return out


@pytest.mark.parametrize("isa", ["auto", "avx2", "portable"])
def test_backward_kernels_match_their_references(isa: str, monkeypatch) -> None:
    monkeypatch.setenv("RLX_ISA", isa)
    seen = set()
    rng = np.random.default_rng(0)
    for g in _backward_graphs():
        feed = {
            n.op.name: rng.standard_normal(n.shape.dims).astype(np.float32) for n in g.input_nodes()
        }
        cg = Session("cpu").compile(g, RAW)
        kinds = {k.op: k.kind.value for k in cg.report().kernels}
        seen |= {op for op, kind in kinds.items() if kind != "reference"}
        for got, want in zip(cg.run(feed), g.evaluate(feed, {}), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    want_ops = {
        "attention_backward",
        "attention_jvp",
        "rope_backward",
        "conv_backward_data",
        "conv_backward_weight",
        "pool_backward",
        "max_pool_select",
        "layer_norm_backward",
        "rms_norm_backward",
    }
    assert want_ops <= seen


# ---- symbolic dims and vmap ---------------------------------------------------------------


def test_encoder_block_grad_on_symbolic_batch_and_seq() -> None:
    """layer_norm(x + attention(x W) ...) with x [batch, seq, 8] and a padding mask: the
    gradient graph compiles once and runs at two (batch, seq), equal to the reference."""
    g = rlx.Graph("enc")
    b, s = g.sym("batch"), g.sym("seq")
    x = g.input("x", (b, s, 8), "f32")
    m = g.input("m", (b, 1, 1, s), "f32")
    wq, wk, wv = (g.param(n, (8, 8), "f32") for n in ("wq", "wk", "wv"))
    gamma, beta = g.param("gamma", (8,), "f32"), g.param("beta", (8,), "f32")
    a = g.attention(g.matmul(x, wq), g.matmul(x, wk), g.matmul(x, wv), 2, 4, mask_input=m)
    y = g.layer_norm(g.add(x, a), gamma, beta)
    g.set_outputs([g.sum(g.mul(y, y))])
    back = grad(g, ["wq", "wk", "wv", "gamma", "beta"])
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal((8, 8)).astype(np.float32) * 0.3 for n in ("wq", "wk", "wv")}
    params |= {"gamma": np.ones(8, np.float32), "beta": np.zeros(8, np.float32)}
    cg = Session("cpu").compile(back, params=params)
    for nb, ns in ((1, 5), (3, 2)):
        mask = np.zeros((nb, 1, 1, ns), np.float32)
        mask[0, ..., ns - 1 :] = np.finfo(np.float32).min
        feed = {"x": rng.standard_normal((nb, ns, 8)).astype(np.float32), "m": mask}
        for got, want in zip(cg.run(feed), back.evaluate(feed, params), strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-4)


def test_vmap_attention_folds_into_the_batch() -> None:
    rng = np.random.default_rng(2)
    g = rlx.Graph("a")
    q, k, v = (g.input(n, (2, 3, 4), "f64") for n in "qkv")
    m = g.input("m", (2, 1, 3, 3), "f64")
    g.set_outputs([g.attention(q, k, v, 2, 2, mask_input=m)])
    vals = {n: rng.standard_normal((5, 2, 3, 4)) for n in "qkv"}
    vals["m"] = rng.standard_normal((2, 1, 3, 3))
    mapped = vmap(g, {"q": 0, "k": 0, "v": 0, "m": None}, size=5)
    assert sum(n.op.mnemonic == "attention" for n in mapped.nodes) == 1
    (got,) = mapped.evaluate(vals, {})
    for i in range(5):
        (want,) = g.evaluate(
            {"q": vals["q"][i], "k": vals["k"][i], "v": vals["v"][i], "m": vals["m"]}, {}
        )
        np.testing.assert_allclose(got[i], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mask_axis", [None, 0, 2])
def test_vmap_attention_with_a_mapped_mask_and_grouped_heads(mask_axis) -> None:
    """A per-example additive mask (mapped on any axis, or broadcast), GQA heads, q
    mapped on axis 1 and k / v unmapped."""
    rng = np.random.default_rng(3)
    g = rlx.Graph("a")
    q = g.input("q", (2, 3, 8), "f64")
    k, v = (g.input(n, (2, 4, 4), "f64") for n in "kv")
    m = g.input("m", (2, 1, 3, 4), "f64")
    g.set_outputs([g.attention(q, k, v, 4, 2, mask_input=m, num_kv_heads=2)])
    n = 3
    vals = {"q": rng.standard_normal((2, n, 3, 8)), "k": rng.standard_normal((2, 4, 4))}
    vals["v"] = rng.standard_normal((2, 4, 4))
    masks = rng.standard_normal((n, 2, 1, 3, 4))
    vals["m"] = masks[0] if mask_axis is None else np.moveaxis(masks, 0, mask_axis)
    mapped = vmap(g, {"q": 1, "k": None, "v": None, "m": mask_axis}, size=n)
    assert sum(nd.op.mnemonic == "attention" for nd in mapped.nodes) == 1
    (got,) = mapped.evaluate(vals, {})
    for i in range(n):
        mi = masks[0] if mask_axis is None else masks[i]
        feed = {"q": vals["q"][:, i], "k": vals["k"], "v": vals["v"], "m": mi}
        (want,) = g.evaluate(feed, {})
        np.testing.assert_allclose(got[i], want, rtol=1e-12, atol=1e-12)


# the forced targets: x86-64's (avx2, portable) or aarch64's baseline (neon)
_GRAD_ISAS = ["auto", "neon"] if machine_arch() is Arch.AARCH64 else ["auto", "avx2", "portable"]


@pytest.mark.parametrize("isa", _GRAD_ISAS)
@pytest.mark.parametrize(
    "mask,hkv,sq",
    [(MaskKind.custom(), 4, 24), (MaskKind.causal(), 2, 24), (MaskKind.sliding_window(5), 1, 30)],
    ids=["padding", "causal-gqa", "sliding-rows-without-keys"],
)
def test_native_attention_backward_on_two_threads(isa, mask, hkv, sq, monkeypatch) -> None:
    """csrc/attention_grad.c per build target at a size that runs the OpenMP team: every
    gradient (and the score gradient of a padding mask) against the reference, 0 where
    a query row sees no key (Sq > Skv under a causal mask), as the reference."""
    monkeypatch.setenv("RLX_ISA", isa)
    from rlx.ops.nn import Attention
    from rlx.ops.nn_grad import AttentionBackward

    rng = np.random.default_rng(5)
    b, skv, h, d = 6, 24, 4, 32  # 442k score x head-dim products: two threads
    fwd = Attention(h, d, mask, hkv)
    shapes = {"q": (b, sq, h * d), "k": (b, skv, hkv * d), "v": (b, skv, hkv * d)}
    feed = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    if mask.type.value == "custom":
        m = np.zeros((b, 1, 1, skv), np.float32)
        m[1, ..., 17:] = np.finfo(np.float32).min
        feed["m"] = m
    feed["ct"] = rng.standard_normal((b, sq, h * d)).astype(np.float32)
    g = rlx.Graph("ab")
    ids = [g.input(k, v.shape, "f32") for k, v in feed.items()]
    wrts = ("q", "k", "v", "mask") if "m" in feed else ("q", "k", "v")
    g.set_outputs([g.apply(AttentionBackward(fwd, w), ids) for w in wrts])
    cg = Session("cpu").compile(g, CompileOptions(num_threads=2, use_cache=False))
    assert {k.kind.value for k in cg.report().kernels if k.op == "attention_backward"} == {"native"}
    for got, want in zip(cg.run(feed), g.evaluate(feed, {}), strict=True):
        assert np.isfinite(got).all() and np.isfinite(want).all()
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
