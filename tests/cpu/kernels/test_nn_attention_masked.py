"""Masked attention edge rows (issue 19, fault 18; issue 29): the fused ``attention``
kernel, the unfused softmax chain and the Attention reference agree with an independent
NumPy f64 oracle (``softmax(q·kᵀ·scale + mask) · v``, max subtracted) on rows fully
masked by ``-inf`` (0 from the attention op; the unfused chain's softmax gives NaN there,
so those rows are not compared for it), rows masked by ``finfo.min`` (the mean of v),
causal masks with more queries than keys, and under every reduced-precision policy (the
fused op keeps an f32 mask and computes its softmax in f32: no NaN where f32 gives a
finite result)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import rlx
from rlx.ir.mir import Graph, NodeId
from rlx.ops.nn import Attention, MaskKind, MaskType
from rlx.options import CompileOptions
from rlx.passes.precision import PrecisionPolicy
from rlx.runtime.session import Session

B, H, D = 2, 2, 4
LOWEST = float(np.finfo(np.float32).min)
POLICIES = {
    "AlwaysF32": PrecisionPolicy.AlwaysF32,
    "AlwaysF16": PrecisionPolicy.AlwaysF16,
    "AutoMixedConservative": PrecisionPolicy.AutoMixedConservative,
    "AutoMixed": PrecisionPolicy.AutoMixed,
    "AutoMixedBf16": PrecisionPolicy.AutoMixedBf16,
}
TOL = {"AlwaysF32": 1e-5, "AutoMixedBf16": 4e-2}  # the f16 policies: 5e-3


def oracle(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """softmax(q kᵀ / sqrt(D) + mask) v per head in float64, written out here; a query
    whose every key is hidden by -inf gives 0 (the attention op's rule)."""
    sq, skv = q.shape[1], k.shape[1]
    out = np.empty((B, sq, H * D))
    for b in range(B):
        for h in range(H):
            cols = slice(h * D, (h + 1) * D)
            qh, kh, vh = (x[b, :, cols].astype(np.float64) for x in (q, k, v))
            s = qh @ kh.T / math.sqrt(D)
            if mask is not None:
                s = s + np.broadcast_to(mask.astype(np.float64), (B, H, sq, skv))[b, h]
            with np.errstate(invalid="ignore"):
                e = np.exp(s - s.max(axis=1, keepdims=True))
                o = (e / e.sum(axis=1, keepdims=True)) @ vh
            out[b, :, cols] = np.where(np.isneginf(s).all(axis=1, keepdims=True), 0.0, o)
    return out


def empty_rows(mask: np.ndarray) -> np.ndarray:
    """Bool [Sq]: the queries an [Sq, Skv] mask lets see no key (every key -inf)."""
    return np.isneginf(mask).all(axis=-1)


def chain(g: Graph, q: NodeId, k: NodeId, v: NodeId, sq: int, skv: int, mask: NodeId | None):
    """The spelled-out multi-head attention chain that ``fuse_attention`` matches."""
    qh = g.transpose(g.reshape(q, (B, sq, H, D)), (0, 2, 1, 3))
    kt = g.transpose(g.reshape(k, (B, skv, H, D)), (0, 2, 3, 1))
    vh = g.transpose(g.reshape(v, (B, skv, H, D)), (0, 2, 1, 3))
    s = g.mul(g.matmul(qh, kt), 1.0 / math.sqrt(D))
    if mask is not None:
        s = g.add(s, mask)
    o = g.matmul(g.softmax(s, -1), vh)
    return g.reshape(g.transpose(o, (0, 2, 1, 3)), (B, sq, H * D))


def build(sq: int, skv: int, mask: np.ndarray, as_input: bool) -> tuple[Graph, dict]:
    rng = np.random.default_rng(sq * 10 + skv)
    feeds = {
        "q": rng.standard_normal((B, sq, H * D)).astype(np.float32),
        "k": rng.standard_normal((B, skv, H * D)).astype(np.float32),
        "v": rng.standard_normal((B, skv, H * D)).astype(np.float32),
    }
    g = rlx.Graph("attn")
    q, k, v = (g.input(n, feeds[n].shape) for n in "qkv")
    if as_input:
        feeds["m"] = mask
        m = g.input("m", mask.shape)
    else:
        m = g.constant(mask)
    g.set_outputs([chain(g, q, k, v, sq, skv, m)])
    return g, feeds


def masks(sq: int, skv: int) -> dict[str, np.ndarray]:
    """Name -> [Sq, Skv] additive mask."""
    row = np.zeros((sq, skv), np.float32)
    row[1] = -np.inf
    row[0, 1:] = -np.inf
    low = np.zeros((sq, skv), np.float32)
    low[1] = LOWEST
    low[0, :-1] = LOWEST
    tri = np.arange(skv)[None, :] > np.arange(sq)[:, None] + (skv - sq)
    return {
        "row_neginf": row,
        "row_lowest": low,
        "causal_neginf": np.where(tri, -np.inf, 0).astype(np.float32),
        "causal_lowest": np.where(tri, LOWEST, 0).astype(np.float32),
    }


def check(
    got: np.ndarray, want: np.ndarray, tol: float, what: str, skip: np.ndarray | None = None
) -> None:
    """Within ``tol`` of the oracle and finite; ``skip`` (bool [Sq]) leaves queries out:
    the unfused chain's softmax gives NaN on a query that sees no key."""
    keep = np.ones(want.shape[1], bool) if skip is None else ~skip
    got, want = got[:, keep], want[:, keep]
    assert np.isfinite(got).all(), f"{what}: non-finite values"
    err = np.max(np.abs(got - want), initial=0.0)
    assert err <= tol * max(1.0, np.max(np.abs(want), initial=0.0)), f"{what}: {err:.3g}"


def compiled(g: Graph, policy: str, fuse: bool, native: bool = True):
    opts = CompileOptions(
        precision=POLICIES[policy], fuse=fuse, native=native, use_cache=False, verbose=False
    )
    return Session("cpu").compile(g, opts)


def attention_ops(cg) -> list[Attention]:
    return [n.op for n in cg.graph.nodes if isinstance(n.op, Attention)]


@pytest.mark.parametrize("shape", [(3, 5), (4, 4), (5, 3)], ids=lambda s: f"sq{s[0]}_skv{s[1]}")
@pytest.mark.parametrize("as_input", [False, True], ids=["const", "input"])
@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
def test_fused_unfused_reference_agree_in_f32(shape, as_input: bool, native: bool) -> None:
    sq, skv = shape
    for name, mask in masks(sq, skv).items():
        g, feeds = build(sq, skv, mask, as_input)
        want = oracle(feeds["q"], feeds["k"], feeds["v"], mask)
        if "neginf" in name and sq <= skv and "causal" in name:
            assert not empty_rows(mask).any()
        dead = empty_rows(mask)
        check(g.evaluate(feeds)[0], want, 1e-5, f"{name} reference", skip=dead)
        for fuse in (True, False):
            cg = compiled(g, "AlwaysF32", fuse, native)
            assert bool(attention_ops(cg)) == fuse, name
            skip = None if fuse else dead  # fused: 0 on the rows that see no key
            check(cg.run(feeds)[0], want, 1e-5, f"{name} fuse={fuse}", skip)
            check(cg.graph.evaluate(feeds)[0], want, 1e-5, f"{name} fused reference", skip)


def test_row_masks_have_the_edge_values() -> None:
    """The oracle's edge rows are what the docs promise: 0 for -inf, mean of v for
    finfo.min (so the checks above compare against those values)."""
    ms = masks(3, 5)
    g, feeds = build(3, 5, ms["row_lowest"], False)
    got = compiled(g, "AlwaysF32", True).run(feeds)[0]
    v = feeds["v"].astype(np.float64)
    np.testing.assert_allclose(got[:, 1], v.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[:, 0], v[:, -1], rtol=1e-5, atol=1e-6)  # sees only key 4
    g, feeds = build(3, 5, ms["row_neginf"], False)
    got = compiled(g, "AlwaysF32", True).run(feeds)[0]
    assert (got[:, 1] == 0).all() and np.isfinite(got).all()


def test_causal_constant_fuses_to_causal_only_when_equivalent() -> None:
    """-inf causal constants become MaskKind.causal(); finfo.min ones only when every
    query sees a key (with Sq > Skv the first rows see none: mean of v, not 0)."""
    for (sq, skv), name, want in [
        ((3, 5), "causal_neginf", MaskType.CAUSAL),
        ((5, 3), "causal_neginf", MaskType.CAUSAL),
        ((3, 5), "causal_lowest", MaskType.CAUSAL),
        ((5, 3), "causal_lowest", MaskType.CUSTOM),
    ]:
        g, _ = build(sq, skv, masks(sq, skv)[name], False)
        (op,) = attention_ops(compiled(g, "AlwaysF32", True))
        assert op.mask.type is want, (sq, skv, name)


@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
def test_builtin_causal_with_more_queries_than_keys(native: bool) -> None:
    """MaskKind.causal() hides keys with -inf: a query that sees none gives 0, in the
    reference and in the kernel."""
    sq, skv = 5, 3
    _, feeds = build(sq, skv, np.zeros((sq, skv), np.float32), False)
    g = rlx.Graph("causal")
    q, k, v = (g.input(n, feeds[n].shape) for n in "qkv")
    g.set_outputs([g.attention(q, k, v, H, D, mask=MaskKind.causal())])
    want = oracle(feeds["q"], feeds["k"], feeds["v"], masks(sq, skv)["causal_neginf"])
    assert empty_rows(masks(sq, skv)["causal_neginf"]).tolist() == [True, True, False, False, False]
    assert (want[:, :2] == 0).all()
    check(g.evaluate(feeds)[0], want, 1e-5, "reference")
    check(compiled(g, "AlwaysF32", True, native).run(feeds)[0], want, 1e-5, "kernel")


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "AlwaysF32"])
@pytest.mark.parametrize("as_input", [False, True], ids=["const", "input"])
def test_fused_attention_under_reduced_precision(policy: str, as_input: bool) -> None:
    """The fused op keeps an f32 mask and computes in f32: finfo.min rows give the mean
    of v, as in f32 (never NaN), -inf rows 0, the rest within the policy's rounding."""
    tol = TOL.get(policy, 5e-3)
    sq, skv = 3, 5
    for name, mask in masks(sq, skv).items():
        g, feeds = build(sq, skv, mask, as_input)
        want = oracle(feeds["q"], feeds["k"], feeds["v"], mask)
        cg = compiled(g, policy, True)
        assert attention_ops(cg), name
        check(cg.run(feeds)[0], want, tol, f"{name} {policy}")
        check(cg.graph.evaluate(feeds)[0], want, tol, f"{name} {policy} reference")
        if name != "row_lowest":  # the unfused chain adds finfo.min in f16/bf16: -inf
            got = compiled(g, policy, False).run(feeds)[0]
            check(got, want, tol, f"{name} unfused", skip=empty_rows(mask))
