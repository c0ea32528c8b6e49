"""Differential fuzzing of the backward / forward-mode derivative ops against
``torch.autograd`` and ``torch.func.jvp`` in float64 (harness.py: rlx's reference
interpreter and the compiled graph under every precision policy and native target).

Each op is built directly (``g.apply``) on hypothesis-drawn shapes and attributes; its
oracle differentiates the PyTorch form of the forward op (tests/fuzz/torch_oracles.py, or
torch's own functional op) at the same, rounded, operands:

* ``layer_norm_backward`` / ``layer_norm_backward_gamma`` / ``rms_norm_backward`` (wrt x,
  gamma): ``F.layer_norm`` / ``F.rms_norm``;
* ``softmax_backward`` / ``log_softmax_backward`` (from the forward's output ``y``):
  torch's ``_softmax_backward_data`` / ``_log_softmax_backward_data``;
* ``attention_backward`` (wrt q, k, v, the full score mask, qkv stacked) and
  ``attention_jvp``: every mask kind, grouped-query heads, scale;
* ``rope_backward`` (wrt cos, sin): NeoX and interleaved, partial rotation;
* ``conv_backward_data`` / ``conv_backward_weight``: 1-D and 2-D, stride, (lo, hi)
  padding, dilation, groups;
* ``pool_backward`` (max, average) and ``max_pool_select`` (the max pool's jvp): values on
  a grid of quarters, so ties occur and the first maximum must win as in PyTorch;
* ``gather_backward``: ``index_select``'s gradient, repeated and negative indices.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.ops.base import OpKind
from rlx.ops.grad_util import GatherBackward
from rlx.ops.nn import Attention, Conv, MaskKind, Pool, PoolKind, Rope
from rlx.ops.nn_grad import (
    AttentionBackward,
    AttentionJvp,
    ConvBackwardData,
    ConvBackwardWeight,
    LayerNormBackward,
    LayerNormBackwardGamma,
    MaxPoolSelect,
    PoolBackward,
    RmsNormBackward,
    RopeBackward,
)
from rlx.ops.reduce_grad import LogSoftmaxBackward, SoftmaxBackward

from . import torch_oracles as T
from .harness import EXACT, SEEDS, Tol, check, exact_values, examples

# torch.func.jvp scripts a helper through the deprecated torch.jit.script on first use
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning"
)
GRAD_TOL = Tol(2e-5, 8e-3, 6e-2)
ROWS = st.sampled_from([(1,), (3,), (2, 2), (1, 4)])
WIDTHS = st.sampled_from([1, 2, 3, 8, 17, 64, 100])


def _grad(out: torch.Tensor, wrt: list[torch.Tensor], ct: np.ndarray) -> list[np.ndarray]:
    gs = torch.autograd.grad(out, wrt, T.t64(ct), allow_unused=True)
    return [
        np.zeros(w.shape) if gr is None else gr.detach().numpy()
        for w, gr in zip(wrt, gs, strict=True)
    ]


# ---- norms ---------------------------------------------------------------------------------


@examples(10)
@given(
    rows=ROWS,
    d=WIDTHS,
    rms=st.booleans(),
    wrt=st.sampled_from(["x", "gamma"]),
    eps=st.sampled_from([1e-5, 0.1]),
    seed=SEEDS,
)
def test_norm_backward_matches_autograd(rows, d, rms, wrt, eps, seed) -> None:
    rng = np.random.default_rng(seed)
    shape = (*rows, d)
    x = (rng.standard_normal(shape) * 2 + rng.standard_normal((*rows, 1))).astype(np.float32)
    gamma = rng.standard_normal(d).astype(np.float32)
    ct = rng.standard_normal(shape).astype(np.float32)
    g = rlx.Graph("norm_bwd")
    ins = [g.input("x", shape), g.input("gamma", (d,)), g.input("ct", shape)]
    if rms:
        op = RmsNormBackward(eps, wrt)
    elif wrt == "x":
        op = LayerNormBackward(eps, wrt)
    else:  # layer norm's dgamma is its own op, which does not read gamma
        op, ins = LayerNormBackwardGamma(eps), [ins[0], ins[2]]
    g.set_outputs([g.apply(op, ins)])

    def oracle(rnd):
        xt, gt = T.t64(rnd(x), True), T.t64(rnd(gamma), True)
        fn = F.rms_norm if rms else F.layer_norm
        y = fn(xt, (d,), weight=gt, eps=eps)
        dx, dg = _grad(y, [xt, gt], rnd(ct))
        return [dx if wrt == "x" else dg]

    check(g, {"x": x, "gamma": gamma, "ct": ct}, {}, oracle, [OpKind.REDUCTION], GRAD_TOL, "max")


@examples(10)
@given(rows=ROWS, d=WIDTHS, log=st.booleans(), seed=SEEDS)
def test_softmax_backward_matches_torch(rows, d, log, seed) -> None:
    rng = np.random.default_rng(seed)
    shape = (*rows, d)
    x = rng.standard_normal(shape) * 3
    z = x - x.max(-1, keepdims=True)
    y = (z - np.log(np.exp(z).sum(-1, keepdims=True))) if log else np.exp(z) / np.exp(z).sum(-1, keepdims=True)  # fmt: skip
    y = y.astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    axis = len(shape) - 1 if rng.random() < 0.5 else -1
    g = rlx.Graph("softmax_bwd")
    op = LogSoftmaxBackward(axis) if log else SoftmaxBackward(axis)
    g.set_outputs([g.apply(op, [g.input("dy", shape), g.input("y", shape)])])

    def oracle(rnd):
        fn = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data  # fmt: skip
        return [fn(T.t64(rnd(dy)), T.t64(rnd(y)), -1, torch.float64).numpy()]

    check(g, {"dy": dy, "y": y}, {}, oracle, [OpKind.REDUCTION], GRAD_TOL, "max")


# ---- attention ----------------------------------------------------------------------------


@st.composite
def attention_cases(draw: st.DrawFn):
    b = draw(st.integers(1, 2))
    h, hkv = draw(st.sampled_from([(1, 1), (2, 2), (2, 1), (4, 2)]))
    d = draw(st.sampled_from([1, 2, 4, 8, 32, 64]))
    kind = draw(st.sampled_from(["none", "causal", "window", "custom"]))
    skv = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 17, 70]))
    sq = draw(
        st.sampled_from(
            [s for s in (1, 2, 3, 5, 6, 17, 33) if kind not in ("causal", "window") or s <= skv]
        )
    )
    window = draw(st.integers(1, 4)) if kind == "window" else 0
    form = draw(st.sampled_from([(1, 1, 1, 1), (0, 0, 1, 1), (1, 0, 0, 1), (0, 1, 1, 1)]))
    scale = draw(st.sampled_from([None, 0.5]))
    return b, h, hkv, d, kind, sq, skv, window, form, scale


def _attention_setup(case, rng):
    b, h, hkv, d, kind, sq, skv, window, form, scale = case
    mk = {"none": MaskKind.none(), "causal": MaskKind.causal(), "custom": MaskKind.custom()}
    mask_kind = MaskKind.sliding_window(window) if kind == "window" else mk[kind]
    fwd = Attention(h, d, mask_kind, None if hkv == h else hkv, scale)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    arrays = {"q": f(b, sq, h * d), "k": f(b, skv, hkv * d), "v": f(b, skv, hkv * d)}
    if kind == "custom":
        dims = tuple(n if keep else 1 for n, keep in zip((b, h, sq, skv), form, strict=True))
        arrays["mask"] = f(*dims)
    sc = 1.0 / np.sqrt(d) if scale is None else scale
    return fwd, arrays, T.visible(sq, skv, kind, window), sc


@examples(14)
@given(case=attention_cases(), wrt=st.sampled_from(["q", "k", "v", "mask", "qkv"]), seed=SEEDS)
def test_attention_backward_matches_autograd(case, wrt, seed) -> None:
    b, h, hkv, d, kind, sq, skv = case[:7]
    if wrt == "mask" and kind != "custom":
        wrt = "v"
    if wrt == "qkv" and not (h == hkv and sq == skv):
        wrt = "q"
    rng = np.random.default_rng(seed)
    fwd, arrays, vis, sc = _attention_setup(case, rng)
    arrays["ct"] = rng.standard_normal((b, sq, h * d)).astype(np.float32)
    g = rlx.Graph("attention_bwd")
    ins = [g.input(k, a.shape) for k, a in arrays.items()]
    g.set_outputs([g.apply(AttentionBackward(fwd, wrt), ins)])

    def oracle(rnd):
        leaves = [T.t64(rnd(arrays[n]), True) for n in "qkv"]
        full = None
        if "mask" in arrays:  # the score gradient: wrt the mask broadcast to [B,H,Sq,Skv]
            full = T.t64(np.broadcast_to(rnd(arrays["mask"]), (b, h, sq, skv)).copy(), True)
            leaves.append(full)
        out = T.attention(*leaves[:3], full, h, hkv, sc, vis)
        grads = _grad(out, leaves, rnd(arrays["ct"]))
        if wrt == "qkv":
            return [np.stack(grads[:3])]
        return [grads[3] if wrt == "mask" else grads["qkv".index(wrt)]]

    check(g, arrays, {}, oracle, [OpKind.COMPUTE], GRAD_TOL, "max")


@examples(10)
@given(case=attention_cases(), seed=SEEDS)
def test_attention_jvp_matches_torch_func_jvp(case, seed) -> None:
    rng = np.random.default_rng(seed)
    fwd, arrays, vis, sc = _attention_setup(case, rng)
    b, h, hkv, d, kind, sq, skv = case[:7]
    names = list(arrays)
    tangents = {f"t{n}": rng.standard_normal(a.shape).astype(np.float32) for n, a in arrays.items()}
    feeds = {**arrays, **tangents}
    g = rlx.Graph("attention_jvp")
    ins = [g.input(k, a.shape) for k, a in feeds.items()]
    g.set_outputs([g.apply(AttentionJvp(fwd), ins)])

    def oracle(rnd):
        def f(*xs):
            mask = xs[3] if len(xs) == 4 else None
            return T.attention(xs[0], xs[1], xs[2], mask, h, hkv, sc, vis)

        prim = tuple(T.t64(rnd(arrays[n])) for n in names)
        tang = tuple(T.t64(rnd(tangents[f"t{n}"])) for n in names)
        return [torch.func.jvp(f, prim, tang)[1].numpy()]

    check(g, feeds, {}, oracle, [OpKind.COMPUTE], GRAD_TOL, "max")


# ---- rope ------------------------------------------------------------------------------------


@examples(10)
@given(
    b=st.integers(1, 2),
    s=st.integers(1, 5),
    heads=st.integers(1, 3),
    dims=st.sampled_from([(2, 2), (4, 2), (4, 4), (8, 6), (6, 4), (64, 64), (64, 32)]),
    interleaved=st.booleans(),
    wrt=st.sampled_from(["cos", "sin"]),
    seed=SEEDS,
)
def test_rope_backward_matches_autograd(b, s, heads, dims, interleaved, wrt, seed) -> None:
    head_dim, n_rot = dims
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, s, heads * head_dim)).astype(np.float32)
    ct = rng.standard_normal(x.shape).astype(np.float32)
    g = rlx.Graph("rope_bwd")
    op = RopeBackward(Rope(head_dim, n_rot, interleaved), wrt)
    g.set_outputs([g.apply(op, [g.input("x", x.shape), g.input("ct", x.shape)])])

    def oracle(rnd):
        xt = T.t64(rnd(x))
        cos, sin = T.t64(rng_tab(s, n_rot), True), T.t64(rng_tab(s, n_rot) + 1, True)
        out = T.rope(xt, cos, sin, head_dim, n_rot, interleaved)
        dc, ds = _grad(out, [cos, sin], rnd(ct))
        return [dc if wrt == "cos" else ds]

    check(g, {"x": x, "ct": ct}, {}, oracle, [OpKind.REDUCTION], GRAD_TOL, "max")


def rng_tab(s: int, n_rot: int) -> np.ndarray:
    """A table: the gradient of rope wrt it does not depend on its values."""
    return np.linspace(-1.0, 1.0, s * (n_rot // 2)).reshape(s, n_rot // 2)


# ---- conv and pool ----------------------------------------------------------------------------


@st.composite
def conv_cases(draw: st.DrawFn):
    nd = draw(st.sampled_from([1, 2]))
    groups = draw(st.sampled_from([1, 2]))
    c = groups * draw(st.sampled_from([1, 2, 9]))
    o = groups * draw(st.sampled_from([1, 2, 17]))
    k = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    dil = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    pads = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(nd))
    sp = tuple(
        dd * (kk - 1) + 1 + draw(st.sampled_from([0, 1, 2, 4, 19]))
        for kk, dd in zip(k, dil, strict=True)
    )
    return nd, draw(st.integers(1, 2)), c, o, groups, k, stride, dil, pads, sp


def _conv_out(sp, k, stride, dil, pads):
    return tuple(
        (n + lo + hi - d * (kk - 1) - 1) // s + 1
        for n, kk, s, d, (lo, hi) in zip(sp, k, stride, dil, pads, strict=True)
    )


@examples(12)
@given(case=conv_cases(), data_grad=st.booleans(), seed=SEEDS)
def test_conv_backward_matches_autograd(case, data_grad, seed) -> None:
    nd, n, c, o, groups, k, stride, dil, pads, sp = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, *sp)).astype(np.float32)
    w = rng.standard_normal((o, c // groups, *k)).astype(np.float32)
    ct = rng.standard_normal((n, o, *_conv_out(sp, k, stride, dil, pads))).astype(np.float32)
    fwd = Conv(stride, pads, dil, groups, False)
    g = rlx.Graph("conv_bwd")
    op = ConvBackwardData(fwd) if data_grad else ConvBackwardWeight(fwd)
    ins = [g.input("x", x.shape), g.input("w", w.shape), g.input("ct", ct.shape)]
    g.set_outputs([g.apply(op, ins)])

    def oracle(rnd):
        xt, wt = T.t64(rnd(x), True), T.t64(rnd(w), True)
        dx, dw = _grad(T.conv(xt, wt, stride, pads, dil, groups), [xt, wt], rnd(ct))
        return [dx if data_grad else dw]

    check(g, {"x": x, "w": w, "ct": ct}, {}, oracle, [OpKind.COMPUTE], GRAD_TOL, "max")


@st.composite
def pool_cases(draw: st.DrawFn):
    nd = draw(st.sampled_from([1, 2]))
    window = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    pads = tuple((draw(st.integers(0, w - 1)), draw(st.integers(0, w - 1))) for w in window)
    sp = tuple(w + draw(st.sampled_from([0, 1, 2, 4, 35])) for w in window)
    return nd, draw(st.integers(1, 2)), draw(st.integers(1, 2)), window, stride, pads, sp


@examples(12)
@given(case=pool_cases(), fn=st.sampled_from(["max", "avg", "select"]), seed=SEEDS)
def test_pool_backward_and_max_pool_select_match_torch(case, fn, seed) -> None:
    nd, n, c, window, stride, pads, sp = case
    rng = np.random.default_rng(seed)
    x = exact_values(rng, (n, c, *sp), lim=6)  # few values: ties, first maximum wins
    out = (n, c, *_conv_out(sp, window, stride, (1,) * nd, pads))
    kind = PoolKind.AVG if fn == "avg" else PoolKind.MAX
    fwd = Pool(kind, window, stride, pads)
    g = rlx.Graph("pool_bwd")
    xi = g.input("x", x.shape)
    if fn == "select":
        t = exact_values(rng, x.shape)
        g.set_outputs([g.apply(MaxPoolSelect(fwd), [xi, g.input("t", x.shape)])])
        feeds = {"x": x, "t": t}

        def oracle(rnd):
            f = lambda a: T.pool(a, "max", window, stride, pads)  # noqa: E731
            return [torch.func.jvp(f, (T.t64(x),), (T.t64(t),))[1].numpy()]

    else:
        ct = exact_values(rng, out)
        g.set_outputs([g.apply(PoolBackward(fwd), [xi, g.input("ct", out)])])
        feeds = {"x": x, "ct": ct}

        def oracle(rnd):
            xt = T.t64(x, True)
            return _grad(T.pool(xt, fn, window, stride, pads), [xt], rnd(ct))

    # max: data movement of exact values (sums of a few quarters): exact at every precision
    tol = EXACT if fn != "avg" else Tol(2e-6, 2e-3, 1.6e-2)
    check(g, feeds, {}, oracle, [OpKind.DATA_MOVEMENT], tol)


@examples(10)
@given(
    shape=st.sampled_from([(4,), (3, 2), (2, 3, 2), (5, 1)]),
    idx_shape=st.sampled_from([(), (1,), (3,), (2, 2)]),
    data=st.data(),
    seed=SEEDS,
)
def test_gather_backward_matches_index_select_grad(shape, idx_shape, data, seed) -> None:
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    rng = np.random.default_rng(seed)
    idx = rng.integers(-n, n, idx_shape).astype(data.draw(st.sampled_from([np.int32, np.int64])))
    ct_shape = (*shape[:axis], *idx_shape, *shape[axis + 1 :])
    ct = exact_values(rng, ct_shape, lim=32)
    g = rlx.Graph("gather_bwd")
    op = GatherBackward(axis, shape)
    ii = g.input(
        "idx", idx_shape, {np.dtype(np.int32): "i32", np.dtype(np.int64): "i64"}[idx.dtype]
    )
    g.set_outputs([g.apply(op, [g.input("ct", ct_shape), ii])])

    def oracle(rnd):
        xt = T.t64(np.zeros(shape), True)
        flat = torch.as_tensor(np.where(idx < 0, idx + n, idx).reshape(-1).astype(np.int64))
        y = xt.index_select(axis, flat).reshape(ct_shape)
        return _grad(y, [xt], ct)

    check(g, {"ct": ct, "idx": idx}, {}, oracle, [OpKind.DATA_MOVEMENT], EXACT)
