"""Differential fuzzing of the neural-network forward ops and the fused ops (harness.py:
reference interpreter and compiled graph, every precision policy and native target)
against PyTorch in float64 (tests/fuzz/torch_oracles.py and ``torch.nn.functional``):

* ``attention``: every mask kind (custom masks with ``-inf`` keys, rows hidden entirely by
  ``-inf`` (NaN) or by ``finfo.min`` (the mean of v), causal rows with no key), grouped
  heads, scale;
* ``conv`` (1-D / 2-D, bias, stride, (lo, hi) padding, dilation, groups), ``pool`` (max
  and average over real elements), ``rope`` (NeoX, interleaved, partial);
* ``layer_norm`` / ``rms_norm`` (with and without beta), ``group_norm``, ``softmax`` /
  ``log_softmax`` on any axis;
* ``fused_matmul_bias_act`` (each activation), ``fused_swiglu``,
  ``fused_residual_layer_norm`` / ``fused_residual_rms_norm`` (broadcast residual).

Float operands are read at the policy's precision (the oracle rounds them the same way)
except an attention mask, which keeps its dtype under every policy.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.ops.base import OpKind
from rlx.ops.elementwise import UnaryKind
from rlx.ops.fused import FusedMatMulBiasAct, FusedResidualLN, FusedResidualRmsNorm, FusedSwiGLU
from rlx.ops.nn import Attention, Conv, MaskKind, Pool, PoolKind, Rope
from rlx.ops.norm import GroupNorm, LayerNorm, RmsNorm
from rlx.ops.reduce import LogSoftmax, Softmax

from . import torch_oracles as T
from .harness import SEEDS, WEIGHTS, Tol, check, exact_values, examples, leaves
from .test_ops_grad import attention_cases, conv_cases, pool_cases

F32 = np.float32
NN_TOL = Tol(2e-5, 4e-3, 3e-2)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


@examples(14)
@given(case=attention_cases(), hidden=st.sampled_from(["", "-inf", "lowest", "keys"]), seed=SEEDS)
def test_attention_matches_torch(case, hidden, seed) -> None:
    b, h, hkv, d, kind, sq, skv, window, form, scale = case
    if kind in ("causal", "window") and hidden == "keys":  # more queries than keys
        sq = skv + 2
    rng = np.random.default_rng(seed)
    mk = {"none": MaskKind.none(), "causal": MaskKind.causal(), "custom": MaskKind.custom()}
    mask_kind = MaskKind.sliding_window(window) if kind == "window" else mk[kind]
    f = lambda *s: rng.standard_normal(s).astype(F32)  # noqa: E731
    arrays = {"q": f(b, sq, h * d), "k": f(b, skv, hkv * d), "v": f(b, skv, hkv * d)}
    if kind == "custom":
        dims = tuple(n if keep else 1 for n, keep in zip((b, h, sq, skv), form, strict=True))
        m = f(*dims)
        m[rng.random(dims) < 0.3] = -np.inf
        if hidden in ("-inf", "lowest"):  # one query row hidden entirely
            m[..., rng.integers(dims[2]), :] = -np.inf if hidden == "-inf" else np.finfo(F32).min
        arrays["mask"] = m
    g = rlx.Graph("attention")
    op = Attention(h, d, mask_kind, None if hkv == h else hkv, scale)
    g.set_outputs([g.apply(op, [g.input(n, a.shape) for n, a in arrays.items()])])
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    vis = T.visible(sq, skv, kind, window)

    def oracle(rnd):
        q, k, v = (T.t64(rnd(arrays[n])) for n in "qkv")
        mask = T.t64(arrays["mask"]) if "mask" in arrays else None  # keeps its dtype
        return [_np(T.attention(q, k, v, mask, h, hkv, sc, vis))]

    check(g, arrays, {}, oracle, [OpKind.COMPUTE], NN_TOL, "max")


@examples(12)
@given(case=conv_cases(), has_bias=st.booleans(), weights=WEIGHTS, seed=SEEDS)
def test_conv_matches_torch(case, has_bias, weights, seed) -> None:
    nd, n, c, o, groups, k, stride, dil, pads, sp = case
    rng = np.random.default_rng(seed)
    feeds = {
        "x": rng.standard_normal((n, c, *sp)).astype(F32),
        "w": rng.standard_normal((o, c // groups, *k)).astype(F32),
    }
    if has_bias:
        feeds["b"] = rng.standard_normal(o).astype(F32)
    g = rlx.Graph("conv")
    op = Conv(stride, pads, dil, groups, has_bias)
    ids, inputs, params = leaves(g, feeds, () if weights == "inputs" else ("w", "b"))
    g.set_outputs([g.apply(op, list(ids.values()))])

    def run(rnd, f):
        bias = T.t64(f(rnd(feeds["b"]))) if has_bias else None
        return _np(T.conv(T.t64(f(rnd(feeds["x"]))), T.t64(f(rnd(feeds["w"]))), stride, pads, dil, groups, bias))  # fmt: skip

    def scale(rnd):
        return [1.0 + run(rnd, np.abs)]

    frozen = weights == "frozen"
    oracle = lambda rnd: [run(rnd, lambda a: a)]  # noqa: E731
    check(g, inputs, params, oracle, [OpKind.COMPUTE], NN_TOL, scale, freeze_params=frozen)


@examples(12)
@given(case=pool_cases(), avg=st.booleans(), seed=SEEDS)
def test_pool_matches_torch(case, avg, seed) -> None:
    nd, n, c, window, stride, pads, sp = case
    rng = np.random.default_rng(seed)
    x = exact_values(rng, (n, c, *sp), lim=20)
    g = rlx.Graph("pool")
    op = Pool(PoolKind.AVG if avg else PoolKind.MAX, window, stride, pads)
    g.set_outputs([g.apply(op, [g.input("x", x.shape)])])
    want = [_np(T.pool(T.t64(x), "avg" if avg else "max", window, stride, pads))]
    # max: exact values move exactly; avg: one rounding of the mean
    check(g, {"x": x}, {}, want, [OpKind.DATA_MOVEMENT], Tol(1e-6, 1e-3, 8e-3) if avg else Tol(0, 0, 0))  # fmt: skip


@examples(10)
@given(
    b=st.integers(1, 2),
    s=st.integers(1, 5),
    heads=st.integers(1, 3),
    dims=st.sampled_from([(2, 2), (4, 2), (4, 4), (8, 6), (6, 4), (64, 64), (64, 32)]),
    interleaved=st.booleans(),
    seed=SEEDS,
)
def test_rope_matches_torch(b, s, heads, dims, interleaved, seed) -> None:
    head_dim, n_rot = dims
    rng = np.random.default_rng(seed)
    ang = rng.uniform(0, 6, (s, n_rot // 2))
    feeds = {
        "x": rng.standard_normal((b, s, heads * head_dim)).astype(F32),
        "cos": np.cos(ang).astype(F32),
        "sin": np.sin(ang).astype(F32),
    }
    g = rlx.Graph("rope")
    ins = [g.input(n, a.shape) for n, a in feeds.items()]
    g.set_outputs([g.apply(Rope(head_dim, n_rot, interleaved), ins)])

    def oracle(rnd):
        x, c, sn = (T.t64(rnd(feeds[n])) for n in ("x", "cos", "sin"))
        return [_np(T.rope(x, c, sn, head_dim, n_rot, interleaved))]

    check(g, feeds, {}, oracle, [OpKind.DATA_MOVEMENT], NN_TOL, "max")


ROWS = st.sampled_from([(1,), (3,), (2, 2)])


@examples(14)
@given(
    rows=ROWS,
    d=st.sampled_from([1, 2, 5, 16, 64, 100]),
    which=st.sampled_from(["layer", "rms", "res_layer", "res_rms"]),
    has_beta=st.booleans(),
    res_bcast=st.booleans(),
    eps=st.sampled_from([1e-5, 0.1]),
    weights=WEIGHTS,
    seed=SEEDS,
)
def test_norms_match_torch(rows, d, which, has_beta, res_bcast, eps, weights, seed) -> None:
    rng = np.random.default_rng(seed)
    shape = (*rows, d)
    feeds = {"x": (rng.standard_normal(shape) * 2 + rng.standard_normal((*rows, 1))).astype(F32)}
    residual = which.startswith("res")
    if residual:
        feeds["r"] = rng.standard_normal((1, d) if res_bcast else shape).astype(F32)
    feeds["gamma"] = rng.standard_normal(d).astype(F32)
    if has_beta:
        feeds["beta"] = rng.standard_normal(d).astype(F32)
    rms = which.endswith("rms")
    op = {
        "layer": LayerNorm(eps, has_beta),
        "rms": RmsNorm(eps, has_beta),
        "res_layer": FusedResidualLN(eps, has_beta),
        "res_rms": FusedResidualRmsNorm(eps, has_beta),
    }[which]
    g = rlx.Graph("norm")
    ids, inputs, params = leaves(g, feeds, () if weights == "inputs" else ("gamma", "beta"))
    g.set_outputs([g.apply(op, list(ids.values()))])

    def oracle(rnd):
        t = {n: T.t64(rnd(a)) for n, a in feeds.items()}
        h = t["x"] + t["r"] if residual else t["x"]
        fn = F.rms_norm if rms else F.layer_norm
        y = fn(h, (d,), weight=t["gamma"], eps=eps)
        return [_np(y + t["beta"] if has_beta else y)]

    frozen = weights == "frozen"
    check(g, inputs, params, oracle, [OpKind.REDUCTION], NN_TOL, "max", freeze_params=frozen)


@examples(10)
@given(
    n=st.integers(1, 2),
    groups=st.sampled_from([1, 2, 3]),
    per_group=st.integers(1, 3),
    sp=st.sampled_from([(), (4,), (2, 3), (5, 13)]),
    eps=st.sampled_from([1e-5, 0.1]),
    seed=SEEDS,
)
def test_group_norm_matches_torch(n, groups, per_group, sp, eps, seed) -> None:
    c = groups * per_group
    if per_group * math.prod(sp) == 1:  # torch refuses a group of one element
        sp = (2,)
    rng = np.random.default_rng(seed)
    feeds = {
        "x": (rng.standard_normal((n, c, *sp)) * 2 + 1).astype(F32),
        "gamma": rng.standard_normal(c).astype(F32),
        "beta": rng.standard_normal(c).astype(F32),
    }
    g = rlx.Graph("group_norm")
    g.set_outputs([g.apply(GroupNorm(groups, eps), [g.input(k, a.shape) for k, a in feeds.items()])])  # fmt: skip

    def oracle(rnd):
        t = {k: T.t64(rnd(a)) for k, a in feeds.items()}
        return [_np(F.group_norm(t["x"], groups, t["gamma"], t["beta"], eps))]

    check(g, feeds, {}, oracle, [OpKind.REDUCTION], NN_TOL, "max")


@examples(10)
@given(shape=st.sampled_from([(5,), (3, 4), (2, 3, 4), (3, 100), (2, 65, 2)]), log=st.booleans(), data=st.data(), seed=SEEDS)  # fmt: skip
def test_softmax_and_log_softmax_match_torch(shape, log, data, seed) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(F32)
    g = rlx.Graph("softmax")
    op = LogSoftmax(axis) if log else Softmax(axis)
    g.set_outputs([g.apply(op, [g.input("x", shape)])])
    fn = torch.log_softmax if log else torch.softmax
    oracle = lambda rnd: [_np(fn(T.t64(rnd(x)), axis))]  # noqa: E731
    check(g, {"x": x}, {}, oracle, [OpKind.REDUCTION], NN_TOL, "max")


ACTS = [None, UnaryKind.RELU, UnaryKind.GELU, UnaryKind.GELU_TANH, UnaryKind.SILU,
        UnaryKind.SIGMOID, UnaryKind.TANH]  # fmt: skip
TORCH_ACTS = {
    None: lambda y: y,
    UnaryKind.RELU: torch.relu,
    UnaryKind.GELU: F.gelu,
    UnaryKind.GELU_TANH: lambda y: F.gelu(y, approximate="tanh"),
    UnaryKind.SILU: F.silu,
    UnaryKind.SIGMOID: torch.sigmoid,
    UnaryKind.TANH: torch.tanh,
}


@examples(14)
@given(
    lead=st.sampled_from([(1,), (3,), (2, 3)]),
    k=st.sampled_from([1, 3, 16, 33, 100]),
    n=st.sampled_from([1, 4, 17, 70]),
    swiglu=st.booleans(),
    act=st.sampled_from(ACTS),
    bias=st.sampled_from(["none", "row", "full"]),
    weights=WEIGHTS,
    seed=SEEDS,
)
def test_fused_matmul_ops_match_torch(lead, k, n, swiglu, act, bias, weights, seed) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*lead, k)).astype(F32)
    feeds = {"x": x, "w": (rng.standard_normal((k, n)) / math.sqrt(k)).astype(F32)}
    if swiglu:
        feeds["wu"] = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(F32)
        op = FusedSwiGLU()
        kind = OpKind.ELEMENTWISE
    else:
        if bias != "none":
            feeds["b"] = rng.standard_normal((n,) if bias == "row" else (*lead, n)).astype(F32)
        op = FusedMatMulBiasAct(act, bias != "none")
        kind = OpKind.COMPUTE
    g = rlx.Graph("fused_matmul")
    ids, inputs, params = leaves(g, feeds, () if weights == "inputs" else ("w", "wu", "b"))
    g.set_outputs([g.apply(op, list(ids.values()))])

    def oracle(rnd):
        t = {nm: T.t64(rnd(a)) for nm, a in feeds.items()}
        y = t["x"] @ t["w"]
        if swiglu:
            return [_np(F.silu(y) * (t["x"] @ t["wu"]))]
        return [_np(TORCH_ACTS[act](y + t["b"] if "b" in t else y))]

    def scale(rnd):
        ax, aw = np.abs(rnd(x)), np.abs(rnd(feeds["w"]))
        s = ax @ aw
        if swiglu:
            s = s * (1 + ax @ np.abs(rnd(feeds["wu"])))
        return [1.0 + s + (np.abs(feeds["b"]) if "b" in feeds else 0)]

    check(g, inputs, params, oracle, [kind], NN_TOL, scale, freeze_params=weights == "frozen")
