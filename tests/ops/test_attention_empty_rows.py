"""A query row that sees no key gives exactly 0 on every attention path and precision
(issue 29, section 2): every key hidden by ``-inf`` (a causal or sliding-window mask
with more queries than keys, a custom additive mask with a fully hidden row, a fully
padded sequence of a batch) makes that row 0, never NaN, and its gradients 0.

The oracle is written here in float64 NumPy: per head, softmax over the visible keys
(a visible key's additive mask value included), a row with no visible key 0. Checked
against it: the Attention reference; the native kernel (``csrc/attention.c``) on every
build target this CPU runs, in f32 and bf16 / f16; the compiled op under every
PrecisionPolicy with native kernels on and off (the BLAS kernel, f64 with the native
``rows`` softmax); the spelled-out chain through ``fuse_attention``; the HIR attention
block under both fusion policies (static and symbolic lengths, custom mask input); the
attention backward (reference, native ``csrc/attention_grad.c`` per target, BLAS) and
jvp; the ONNX Attention importer and ``rlx.from_torch`` of SDPA with a boolean mask; and
``cache_attention`` (every query sees its own key: no row can be empty). torch's SDPA
agrees on the rows that see a key (its empty rows are compared with nothing)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import rlx
from rlx.backends.cpu import native
from rlx.dtype import DType
from rlx.ir.hir import HirModule
from rlx.ir.hir_blocks import FusionPolicy
from rlx.ir.mir import Graph
from rlx.ops.nn import Attention, MaskKind, MaskType
from rlx.ops.nn_grad import AttentionBackward, AttentionJvp
from rlx.options import CompileOptions
from rlx.passes.precision import PrecisionPolicy
from rlx.runtime.session import Session

B, H, HKV, D = 2, 4, 2, 8
SCALE = 1.0 / math.sqrt(D)
LOWEST = float(np.finfo(np.float32).min)
POLICIES = {
    "AlwaysF32": (PrecisionPolicy.AlwaysF32, 1e-5),
    "AlwaysF16": (PrecisionPolicy.AlwaysF16, 5e-3),
    "AutoMixedConservative": (PrecisionPolicy.AutoMixedConservative, 5e-3),
    "AutoMixed": (PrecisionPolicy.AutoMixed, 5e-3),
    "AutoMixedBf16": (PrecisionPolicy.AutoMixedBf16, 4e-2),
}
TARGETS = native.runnable_targets() if native.available() else []
needs_gcc = pytest.mark.skipif(not native.available(), reason="gcc is not installed")


# ---- the oracle and the cases -----------------------------------------------------------


def visible(kind: MaskKind, sq: int, skv: int, add: np.ndarray | None) -> np.ndarray:
    """Bool [B,H,Sq,Skv]: which keys each query sees (end-aligned causal / window rule
    written out here; a custom mask hides a key with -inf)."""
    vis = np.ones((B, H, sq, skv), bool)
    i = np.arange(sq)[:, None] + (skv - sq)
    j = np.arange(skv)[None, :]
    if kind.type in (MaskType.CAUSAL, MaskType.SLIDING_WINDOW):
        vis &= j <= i
    if kind.type is MaskType.SLIDING_WINDOW:
        vis &= j > i - kind.window
    if add is not None:
        vis &= ~np.isneginf(np.broadcast_to(add, (B, H, sq, skv)))
    return vis


def oracle(q, k, v, kind: MaskKind, add=None, h=H, hkv=HKV) -> np.ndarray:  # noqa: ANN001
    """float64 attention, [B,Sq,H*D]: softmax over the visible keys, 0 for a row that sees
    none; query head i reads kv head i // (h // hkv)."""
    sq, skv = q.shape[1], k.shape[1]
    vis = visible(kind, sq, skv, add)
    a = np.zeros((B, h, sq, skv)) if add is None else np.broadcast_to(add, (B, h, sq, skv))
    out = np.zeros((B, sq, h, D))
    for b in range(B):
        for hh in range(h):
            g = hh // (h // hkv)
            qh = q[b, :, hh * D : (hh + 1) * D].astype(np.float64)
            kh = k[b, :, g * D : (g + 1) * D].astype(np.float64)
            vh = v[b, :, g * D : (g + 1) * D].astype(np.float64)
            for i in range(sq):
                js = np.flatnonzero(vis[b, hh, i])
                if js.size == 0:
                    continue  # sees no key: 0
                s = qh[i] @ kh[js].T * SCALE + a[b, hh, i, js].astype(np.float64)
                e = np.exp(s - s.max())
                out[b, i, hh] = e / e.sum() @ vh[js]
    return out.reshape(B, sq, h * D)


def empty_rows(kind: MaskKind, sq: int, skv: int, add=None) -> np.ndarray:  # noqa: ANN001
    """Bool [B,Sq,H]: the (batch, query, head) rows that see no key."""
    return ~visible(kind, sq, skv, add).any(axis=-1).transpose(0, 2, 1)


def _custom_row(rng: np.random.Generator) -> np.ndarray:
    m = rng.standard_normal((B, H, 5, 6)).astype(np.float32)
    m[rng.random(m.shape) < 0.3] = -np.inf  # hidden keys
    m[0, 1, 2] = -np.inf  # one (batch, head, query) row hidden entirely
    m[1, :, 4] = -np.inf  # a query of batch 1 hidden in every head
    m[0, 0, 3] = LOWEST  # finfo.min hides no key: the mean of v
    m[:, :, 0, 0] = 0.0  # query 0 sees key 0 (so it is not empty by chance)
    return m


def _key_padding(rng: np.random.Generator) -> np.ndarray:
    keep = np.ones((B, 5), bool)
    keep[0, 3:] = False
    keep[1, :] = False  # batch 1 is all padding: every row of it sees no key
    return np.where(keep, 0.0, -np.inf).astype(np.float32)[:, None, None, :]


def _start_aligned(rng: np.random.Generator) -> np.ndarray:
    # torch's is_causal (top left): query i sees keys j <= i; with Sq > Skv none is empty
    tri = np.arange(3)[None, :] <= np.arange(5)[:, None]
    return np.where(tri, 0.0, -np.inf).astype(np.float32)


# name -> (Sq, Skv, mask kind, additive mask builder or None)
CASES = {
    "causal_sq7_skv3": (7, 3, MaskKind.causal(), None),
    "causal_sq3_skv1": (3, 1, MaskKind.causal(), None),
    "sliding2_sq6_skv4": (6, 4, MaskKind.sliding_window(2), None),
    "custom_row": (5, 6, MaskKind.custom(), _custom_row),
    "key_padding": (4, 5, MaskKind.custom(), _key_padding),
    "custom_start_aligned_causal": (5, 3, MaskKind.custom(), _start_aligned),
}
EMPTY = [c for c in CASES if c != "custom_start_aligned_causal"]


def case(name: str, seed: int = 0, hkv: int = HKV) -> tuple[dict[str, np.ndarray], MaskKind]:
    sq, skv, kind, mk = CASES[name]
    rng = np.random.default_rng(seed)
    f = {
        "q": rng.standard_normal((B, sq, H * D)).astype(np.float32),
        "k": rng.standard_normal((B, skv, hkv * D)).astype(np.float32),
        "v": rng.standard_normal((B, skv, hkv * D)).astype(np.float32),
    }
    if mk is not None:
        f["m"] = mk(rng)
    return f, kind


def want_for(f: dict[str, np.ndarray], kind: MaskKind, hkv: int = HKV) -> np.ndarray:
    return oracle(f["q"], f["k"], f["v"], kind, f.get("m"), hkv=hkv)


def check(got: np.ndarray, f: dict[str, np.ndarray], kind: MaskKind, tol: float, what: str,
          hkv: int = HKV) -> None:  # fmt: skip
    """Finite everywhere, exactly 0 on the rows that see no key, within ``tol`` (relative
    to the largest value) of the oracle elsewhere."""
    got = np.asarray(got, np.float64)
    want = want_for(f, kind, hkv)
    assert np.isfinite(got).all(), f"{what}: non-finite values"
    sq, skv = f["q"].shape[1], f["k"].shape[1]
    dead = empty_rows(kind, sq, skv, f.get("m"))
    rows = got.reshape(B, sq, H, D)
    assert np.array_equal(rows[dead], np.zeros_like(rows[dead])), f"{what}: empty rows not 0"
    err = float(np.max(np.abs(got - want), initial=0.0))
    assert err <= tol * max(1.0, float(np.max(np.abs(want)))), f"{what}: error {err:.3g}"


def op_graph(f: dict[str, np.ndarray], kind: MaskKind, dtype: str = "f32", hkv: int = HKV):
    g = rlx.Graph("att")
    q, k, v = (g.input(n, f[n].shape, dtype) for n in "qkv")
    m = g.input("m", f["m"].shape, dtype) if "m" in f else None
    g.set_outputs([g.attention(q, k, v, H, D, mask=kind, num_kv_heads=hkv, mask_input=m)])
    return g


def compile_(g: Graph, policy: str = "AlwaysF32", native_: bool = True, fuse: bool = True):
    opts = CompileOptions(
        precision=POLICIES[policy][0], native=native_, fuse=fuse, use_cache=False, verbose=False
    )
    return Session("cpu").compile(g, opts)


def kernel_notes(cg, op: str = "attention") -> list[str]:  # noqa: ANN001
    return [n for r in cg.report().kernels if r.op == op for n in r.notes]


def test_the_cases_have_empty_rows_and_the_oracle_zeros_them() -> None:
    """The cases hide what they say: causal Sq=3, Skv=1 leaves queries 0, 1 without a key
    (the issue's example), a fully padded batch item leaves all its rows empty; the
    start-aligned causal mask none; a finfo.min row sees its keys (the mean of v)."""
    for name in CASES:
        f, kind = case(name)
        n = int(empty_rows(kind, f["q"].shape[1], f["k"].shape[1], f.get("m")).sum())
        assert (n > 0) == (name in EMPTY), name
    f, kind = case("causal_sq3_skv1")
    assert empty_rows(kind, 3, 1)[0, :, 0].tolist() == [True, True, False]
    f, kind = case("key_padding")
    assert empty_rows(kind, 4, 5, f["m"])[1].all() and not empty_rows(kind, 4, 5, f["m"])[0].any()
    f, kind = case("custom_row")
    v = f["v"].reshape(B, 6, HKV, D).astype(np.float64)
    row = want_for(f, kind).reshape(B, 5, H, D)[0, 3, 0]
    np.testing.assert_allclose(row, v[0, :, 0].mean(0), rtol=1e-6, atol=1e-9)


# ---- the op's reference -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16", "f16"])
def test_reference(name: str, dtype: str) -> None:
    f, kind = case(name)
    np_dt = {"f32": np.float32, "f64": np.float64, "bf16": ml_dtypes.bfloat16,
             "f16": np.float16}[dtype]  # fmt: skip
    with np.errstate(over="ignore"):  # f16: finfo(f32).min overflows to -inf
        f = {n: a.astype(np_dt) for n, a in f.items()}
    (got,) = op_graph(f, kind, dtype).evaluate(f)
    tol = {"f32": 1e-5, "f64": 1e-12, "bf16": 1e-2, "f16": 1e-3}[dtype]
    check(got.astype(np.float64), f, kind, tol, f"reference {dtype}")


def test_reference_with_non_finite_values_still_gives_zero_rows() -> None:
    """An empty row is exactly 0 whatever v holds; NaN in q still reaches its own row."""
    f, kind = case("causal_sq3_skv1")
    f["v"] = f["v"].copy()
    f["v"][0, 0, 0] = np.inf
    f["q"] = f["q"].copy()
    f["q"][1, 2, 0] = np.nan
    (got,) = op_graph(f, kind).evaluate(f)
    rows = got.reshape(B, 3, H, D)
    assert (rows[:, :2] == 0).all()
    assert np.isnan(rows[1, 2, 0]).all() and not np.isnan(rows[0, 2]).any()


# ---- the native kernel on every target ----------------------------------------------------


def _native(target, f, kind, dtype=np.float32, threads=2):  # noqa: ANN001
    from rlx.backends.cpu.native.attention import attention_lib

    q, k, v = (f[n].astype(dtype) for n in "qkv")
    out = np.full(q.shape, 7.0, dtype)
    attention_lib(target, dtype).run(
        q, k, v, out, num_heads=H, num_kv_heads=HKV, head_dim=D, scale=SCALE,
        mask_type=kind.type, window=kind.window, mask=f.get("m"), num_threads=threads,
    )  # fmt: skip
    return out.astype(np.float64)


@needs_gcc
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.value)
@pytest.mark.parametrize("name", list(CASES))
def test_native_kernel_every_target(target, name: str) -> None:
    f, kind = case(name)
    for threads in (1, 2):
        check(_native(target, f, kind, threads=threads), f, kind, 2e-5, f"{target.value}")


@needs_gcc
def test_native_kernel_long_rows_and_blocks() -> None:
    """Sequences over a key block (64) and a query block: causal Sq=150 > Skv=70 leaves
    80 rows without a key; those in the same query block as rows that see keys are 0."""
    rng = np.random.default_rng(3)
    f = {
        "q": rng.standard_normal((B, 150, H * D)).astype(np.float32),
        "k": rng.standard_normal((B, 70, HKV * D)).astype(np.float32),
        "v": rng.standard_normal((B, 70, HKV * D)).astype(np.float32),
    }
    for target in TARGETS:
        for kind in (MaskKind.causal(), MaskKind.sliding_window(30)):
            check(_native(target, f, kind), f, kind, 2e-5, f"{target.value} {kind}")


# each (target, dtype) is a library build: the selected target's are fast, the others slow;
# f16 needs F16C, so the portable target has no f16 library (that pair is not a case)
LOWP_CASES = [
    pytest.param(
        t,
        dt,
        id=f"{name}-{t.value}",
        marks=() if t is native.selected_target() else (pytest.mark.slow,),
    )
    for name, dt in (("bf16", ml_dtypes.bfloat16), ("f16", np.float16))
    for t in TARGETS
    if not (dt == np.float16 and t is native.Target.PORTABLE)
]


@needs_gcc
@pytest.mark.parametrize(("target", "dtype"), LOWP_CASES)
def test_native_kernel_low_precision(target, dtype) -> None:  # noqa: ANN001
    for name in CASES:
        f, kind = case(name)
        with np.errstate(over="ignore"):  # the rounded inputs (f16: finfo.min -> -inf)
            f = {n: a.astype(dtype).astype(np.float32) for n, a in f.items()}
        check(_native(target, f, kind, dtype), f, kind, 1e-2, f"{target.value} {name}")


# ---- the compiled op: every precision policy, native and BLAS kernels -----------------------


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("native_", [True, False], ids=["native", "blas"])
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_every_policy(policy: str, native_: bool, name: str) -> None:
    f, kind = case(name)
    cg = compile_(op_graph(f, kind), policy, native_)
    notes = " ".join(kernel_notes(cg))
    f16 = policy in ("AlwaysF16", "AutoMixedConservative", "AutoMixed")
    if native_ and native.available():
        if f16 and native.selected_target() is native.Target.PORTABLE:
            assert "needs F16C" in notes, notes  # no portable f16 library: BLAS attention
        else:
            assert "native attention" in notes, notes
    check(cg.run(f)[0], f, kind, POLICIES[policy][1], f"{policy} native={native_}")
    check(cg.graph.evaluate(f)[0], f, kind, POLICIES[policy][1], f"{policy} reference")


@pytest.mark.parametrize("native_", [True, False], ids=["rows", "numpy"])
@pytest.mark.parametrize("name", EMPTY)
def test_compiled_f64_blas_kernel(native_: bool, name: str) -> None:
    """f64 takes the BLAS kernel; with native kernels on its softmax is the native 'rows'
    codegen function (a row of -inf gives zeros), else NumPy passes."""
    f, kind = case(name)
    f64 = {n: a.astype(np.float64) for n, a in f.items()}
    cg = compile_(op_graph(f64, kind, "f64"), native_=native_)
    notes = " ".join(kernel_notes(cg))
    assert "BLAS attention" in notes or not native_, notes
    assert ("native: softmax" in notes) == (native_ and native.available()), notes
    check(cg.run(f64)[0], f, kind, 1e-12, f"f64 native={native_}")


# ---- the fused path: the spelled-out chain through fuse_attention ---------------------------


def chain_graph(f: dict[str, np.ndarray], kind: MaskKind) -> Graph:
    """``softmax(q kᵀ / sqrt(D) + mask) v`` spelled out (MHA, kv heads repeated by hand in
    q's layout: H = HKV here); a causal / window mask as a constant of 0 / -inf."""
    sq, skv = f["q"].shape[1], f["k"].shape[1]
    g = rlx.Graph("chain")
    q, k, v = (g.input(n, f[n].shape) for n in "qkv")
    qh = g.transpose(g.reshape(q, (B, sq, H, D)), (0, 2, 1, 3))
    kt = g.transpose(g.reshape(k, (B, skv, H, D)), (0, 2, 3, 1))
    vh = g.transpose(g.reshape(v, (B, skv, H, D)), (0, 2, 1, 3))
    s = g.mul(g.matmul(qh, kt), SCALE)
    if "m" in f:
        s = g.add(s, g.input("m", f["m"].shape))
    elif kind.type is not MaskType.NONE:
        bias = np.where(kind.allowed(sq, skv), 0.0, -np.inf).astype(np.float32)
        s = g.add(s, g.constant(bias))
    o = g.matmul(g.softmax(s, -1), vh)
    g.set_outputs([g.reshape(g.transpose(o, (0, 2, 1, 3)), (B, sq, H * D))])
    return g


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("native_", [True, False], ids=["native", "blas"])
@pytest.mark.parametrize("name", list(CASES))
def test_fused_chain(policy: str, native_: bool, name: str) -> None:
    """fuse_attention makes the chain one attention node, which gives 0 on the rows that
    see no key (the chain's softmax alone gives NaN there: fusion repairs those rows)."""
    f, kind = case(name, hkv=H)
    g = chain_graph(f, kind)
    cg = compile_(g, policy, native_)
    (op,) = [n.op for n in cg.graph.nodes if isinstance(n.op, Attention)]
    want_kind = MaskType.CUSTOM if "m" in f else kind.type
    if kind.type is MaskType.SLIDING_WINDOW:
        want_kind = MaskType.CUSTOM  # a window constant is not recognised as causal
    assert op.mask.type is want_kind
    check(cg.run(f)[0], f, kind, POLICIES[policy][1], f"fused {policy}", hkv=H)


@pytest.mark.parametrize("name", list(CASES))
def test_unfused_chain_agrees_on_rows_that_see_a_key(name: str) -> None:
    """Unfused, the chain is the softmax op's math: the rows that see a key agree."""
    f, kind = case(name, hkv=H)
    got = compile_(chain_graph(f, kind), fuse=False).run(f)[0]
    dead = empty_rows(kind, f["q"].shape[1], f["k"].shape[1], f.get("m"))
    want = want_for(f, kind, hkv=H).reshape(dead.shape + (D,))
    np.testing.assert_allclose(got.reshape(want.shape)[~dead], want[~dead], rtol=1e-5, atol=1e-5)


# ---- HIR lowering -------------------------------------------------------------------------


def hir_module(f: dict[str, np.ndarray], kind: MaskKind, policy: FusionPolicy,
               sym: bool = False, hkv: int = HKV) -> HirModule:  # fmt: skip
    m = HirModule("attn", policy)
    sq, skv = ("sq", "skv") if sym else (f["q"].shape[1], f["k"].shape[1])
    q = m.input("q", (B, sq, H * D))
    k = m.input("k", (B, skv, hkv * D))
    v = m.input("v", (B, skv, hkv * D))
    mask = m.input("m", f["m"].shape) if "m" in f else None
    m.set_outputs(
        m.attention(q, k, v, mask, num_heads=H, head_dim=D, mask_kind=kind, num_kv_heads=hkv)
    )
    return m


@pytest.mark.parametrize("policy", [FusionPolicy.DIRECT, FusionPolicy.FUSABLE], ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_hir_attention_block(policy: FusionPolicy, name: str) -> None:
    """The attention block lowered to MIR (the op, or the primitive chain with the empty
    rows selected to 0 after it), evaluated and compiled with and without fusion."""
    f, kind = case(name)
    g = hir_module(f, kind, policy).lower_to_mir().verify()
    assert bool(g.find(Attention)) == (policy is FusionPolicy.DIRECT)
    check(g.evaluate(f)[0], f, kind, 1e-5, f"{policy} reference")
    for fuse in (True, False):
        check(compile_(g, fuse=fuse).run(f)[0], f, kind, 1e-5, f"{policy} fuse={fuse}")


@pytest.mark.parametrize("kind", [MaskKind.causal(), MaskKind.sliding_window(2)], ids=str)
@pytest.mark.parametrize("policy", [FusionPolicy.DIRECT, FusionPolicy.FUSABLE], ids=str)
def test_hir_attention_block_symbolic_lengths(kind: MaskKind, policy: FusionPolicy) -> None:
    """Symbolic Sq and Skv: the FUSABLE lowering finds the rows that see no key at run time
    (position counters), so one graph serves Sq > Skv, Sq = Skv and Sq < Skv."""
    f0, _ = case("causal_sq7_skv3")
    g = hir_module(f0, kind, policy, sym=True).lower_to_mir().verify()
    cg = compile_(g, fuse=False)
    for sq, skv in ((7, 3), (3, 1), (4, 4), (2, 6)):
        rng = np.random.default_rng(sq * 10 + skv)
        f = {
            "q": rng.standard_normal((B, sq, H * D)).astype(np.float32),
            "k": rng.standard_normal((B, skv, HKV * D)).astype(np.float32),
            "v": rng.standard_normal((B, skv, HKV * D)).astype(np.float32),
        }
        check(g.evaluate(f)[0], f, kind, 1e-5, f"{policy} reference {sq}x{skv}")
        check(cg.run(f)[0], f, kind, 1e-5, f"{policy} compiled {sq}x{skv}")


@pytest.mark.parametrize("name", ["causal_sq7_skv3", "custom_row", "key_padding"])
def test_hir_fusable_select_leaves_the_chain_fusable(name: str) -> None:
    """The select of the empty rows comes after the chain's final reshape, so
    fuse_attention still matches the chain (given a dce after simplify, which removes the
    transpose that simplify leaves behind); static lengths where every query sees a key
    get no select at all."""
    from rlx.passes.dce import DeadCodeElimination
    from rlx.passes.pipeline import CompilePipeline, default_passes

    f, kind = case(name, hkv=H)  # grouped kv heads are repeated by an expand: no match
    g = hir_module(f, kind, FusionPolicy.FUSABLE, hkv=H).lower_to_mir()
    assert "where" in {n.op.mnemonic for n in g.nodes}
    opts = CompileOptions(use_cache=False)
    passes = default_passes(opts)
    passes.insert(4, DeadCodeElimination())
    out = CompilePipeline(opts, passes=passes).run(g).graph
    assert any(isinstance(n.op, Attention) for n in out.nodes)
    check(out.evaluate(f)[0], f, kind, 1e-5, "fused", hkv=H)
    f3 = {n: a[:, :3] if n == "q" else a for n, a in case("causal_sq7_skv3")[0].items()}
    plain = hir_module(f3, MaskKind.causal(), FusionPolicy.FUSABLE).lower_to_mir()
    assert "where" not in {n.op.mnemonic for n in plain.nodes}  # Sq = Skv = 3


# ---- backward and jvp ------------------------------------------------------------------


def oracle_grads(f: dict[str, np.ndarray], ct: np.ndarray, kind: MaskKind) -> dict:
    """float64 dq, dk, dv and the score gradient [B,H,Sq,Skv] of ``sum(out * ct)``, per head
    from the probabilities (0 on the rows that see no key)."""
    q, k, v = (f[n].astype(np.float64) for n in "qkv")
    sq, skv = q.shape[1], k.shape[1]
    vis = visible(kind, sq, skv, f.get("m"))
    add = np.zeros((B, H, sq, skv)) if "m" not in f else np.broadcast_to(f["m"], vis.shape)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    ds_all = np.zeros((B, H, sq, skv))
    for b in range(B):
        for h in range(H):
            g = h // (H // HKV)
            qs, ks, cs = slice(h * D, (h + 1) * D), slice(g * D, (g + 1) * D), ct[b, :, h * D : (h + 1) * D]  # fmt: skip
            s = q[b, :, qs] @ k[b, :, ks].T * SCALE + np.where(vis[b, h], add[b, h], 0.0)
            p = np.zeros((sq, skv))
            for i in range(sq):
                js = vis[b, h, i]
                if js.any():
                    e = np.exp(s[i, js] - s[i, js].max())
                    p[i, js] = e / e.sum()
            dv[b, :, ks] += p.T @ cs
            dp = cs @ v[b, :, ks].T
            ds = p * (dp - (p * dp).sum(-1, keepdims=True))
            ds_all[b, h] = ds
            dq[b, :, qs] = ds @ k[b, :, ks] * SCALE
            dk[b, :, ks] += ds.T @ q[b, :, qs] * SCALE
    return {"q": dq, "k": dk, "v": dv, "mask": ds_all}


def backward_graph(f: dict[str, np.ndarray], kind: MaskKind) -> tuple[Graph, list[str]]:
    fwd = Attention(H, D, kind, HKV)
    g = rlx.Graph("back")
    ids = [g.input(n, f[n].shape, "f32") for n in ("q", "k", "v", "m", "ct") if n in f]
    wrts = ["q", "k", "v"] + (["mask"] if "m" in f else [])
    g.set_outputs([g.apply(AttentionBackward(fwd, w), ids) for w in wrts])
    return g, wrts


def check_grads(got: list[np.ndarray], f: dict[str, np.ndarray], kind: MaskKind,
                wrts: list[str], tol: float, what: str) -> None:  # fmt: skip
    want = oracle_grads(f, f["ct"], kind)
    sq, skv = f["q"].shape[1], f["k"].shape[1]
    dead = empty_rows(kind, sq, skv, f.get("m"))
    for w, a in zip(wrts, got, strict=True):
        assert np.isfinite(a).all(), f"{what} d{w}: non-finite"
        if w == "q":
            assert (a.reshape(B, sq, H, D)[dead] == 0).all(), f"{what} dq of empty rows"
        if w == "mask":
            assert (a.transpose(0, 2, 1, 3)[dead] == 0).all(), f"{what} dmask of empty rows"
        np.testing.assert_allclose(a, want[w], rtol=tol, atol=tol, err_msg=f"{what} d{w}")


def _with_ct(name: str) -> tuple[dict[str, np.ndarray], MaskKind]:
    f, kind = case(name)
    f["ct"] = np.random.default_rng(9).standard_normal(f["q"].shape).astype(np.float32)
    return f, kind


@pytest.mark.parametrize("name", EMPTY)
def test_backward_reference_and_blas(name: str) -> None:
    f, kind = _with_ct(name)
    g, wrts = backward_graph(f, kind)
    check_grads(g.evaluate(f), f, kind, wrts, 1e-5, "reference")
    cg = compile_(g, native_=False)
    check_grads(cg.run(f), f, kind, wrts, 1e-4, "BLAS")


@needs_gcc
@pytest.mark.parametrize("isa", ["auto", "avx2", "portable"])
@pytest.mark.parametrize("name", EMPTY)
def test_backward_native_every_target(isa: str, name: str, monkeypatch) -> None:  # noqa: ANN001
    if isa != "auto" and native.Target(isa) not in TARGETS:
        pytest.skip(f"this CPU does not run {isa}")
    monkeypatch.setenv("RLX_ISA", isa)
    f, kind = _with_ct(name)
    g, wrts = backward_graph(f, kind)
    cg = compile_(g)
    kinds = {r.kind.value for r in cg.report().kernels if r.op == "attention_backward"}
    assert kinds == {"native"}, kinds
    check_grads(cg.run(f), f, kind, wrts, 1e-4, f"native {isa}")


@pytest.mark.parametrize("name", ["causal_sq7_skv3", "key_padding"])
def test_grad_through_the_op_is_finite(name: str) -> None:
    """rlx.grad of sum(attention * ct) (the vjp rule emits the backward op), compiled."""
    f, kind = _with_ct(name)
    g = op_graph({n: a for n, a in f.items() if n != "ct"}, kind)
    out = g.outputs[0]
    ct = g.input("ct", f["ct"].shape)
    g.set_outputs([g.sum(g.mul(out, ct))])
    got = Session("cpu").compile(rlx.grad(g, ["q", "k", "v"])).run(f)
    check_grads(got, f, kind, ["q", "k", "v"], 1e-4, "rlx.grad")


@pytest.mark.parametrize("native_", [True, False], ids=["native", "blas"])
def test_jvp_of_empty_rows_is_zero(native_: bool) -> None:
    f, kind = case("key_padding")
    rng = np.random.default_rng(4)
    t = {f"t{n}": rng.standard_normal(a.shape).astype(np.float32) for n, a in f.items()}
    g = rlx.Graph("jvp")
    ids = [g.input(n, a.shape) for n, a in (f | t).items()]
    g.set_outputs([g.apply(AttentionJvp(Attention(H, D, kind, HKV)), ids)])
    feed = f | t
    for got in (g.evaluate(feed)[0], compile_(g, native_=native_).run(feed)[0]):
        assert np.isfinite(got).all()
        assert (got.reshape(B, 4, H, D)[1] == 0).all()  # batch 1 sees no key
    # against a central difference of the oracle on the rows that see a key
    eps = 1e-3
    plus = {n: f[n] + eps * t[f"t{n}"] for n in f}
    minus = {n: f[n] - eps * t[f"t{n}"] for n in f}
    fd = (want_for(plus, kind) - want_for(minus, kind)) / (2 * eps)
    np.testing.assert_allclose(g.evaluate(feed)[0], fd, rtol=1e-2, atol=1e-2)


# ---- against torch, and the frontends ------------------------------------------------------


def _torch_sdpa(f: dict[str, np.ndarray], kind: MaskKind) -> np.ndarray:
    sq, skv = f["q"].shape[1], f["k"].shape[1]
    q, k, v = (torch.tensor(f[n]).reshape(B, -1, h, D).transpose(1, 2)
               for n, h in (("q", H), ("k", HKV), ("v", HKV)))  # fmt: skip
    mask = torch.tensor(visible(kind, sq, skv, f.get("m")))  # bool: True attends
    if "m" in f:
        add = np.where(np.isneginf(f["m"]), 0.0, f["m"]).astype(np.float32)
        mask = torch.where(mask, torch.tensor(add), torch.tensor(-np.inf))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return o.transpose(1, 2).reshape(B, sq, H * D).numpy()


@pytest.mark.parametrize("name", list(CASES))
def test_torch_agrees_on_rows_that_see_a_key(name: str) -> None:
    """torch's SDPA (NaN or 0 on empty rows, depending on its version and backend) is
    compared on the other rows only; ours are exactly 0 there (checked by ``check``)."""
    f, kind = case(name)
    got = compile_(op_graph(f, kind)).run(f)[0]
    check(got, f, kind, 1e-5, "compiled")
    dead = empty_rows(kind, f["q"].shape[1], f["k"].shape[1], f.get("m"))
    theirs = _torch_sdpa(f, kind).reshape(dead.shape + (D,))
    ours = got.reshape(theirs.shape)
    np.testing.assert_allclose(ours[~dead], theirs[~dead], rtol=1e-5, atol=1e-5)


def test_from_torch_sdpa_with_a_boolean_padding_mask() -> None:
    """A padded batch through rlx.from_torch: SDPA with a bool key-padding mask (one
    sequence all padding) -> the Attention op, 0 on its rows, torch's values elsewhere."""

    class Block(torch.nn.Module):
        def forward(self, q, k, v, keep):  # noqa: ANN001, ANN202
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=keep[:, None, None, :]
            )

    rng = np.random.default_rng(2)
    q, k, v = (torch.tensor(rng.standard_normal((B, H, 4, D)).astype(np.float32)) for _ in "qkv")
    keep = torch.ones(B, 4, dtype=torch.bool)
    keep[1] = False
    keep[0, 3] = False
    m = rlx.from_torch(Block().eval(), (q, k, v, keep))
    assert any(isinstance(n.op, Attention) for n in m.compile().graph.nodes)
    (got,) = m.run(q, k, v, keep)
    got = np.asarray(got)
    assert np.isfinite(got).all() and (got[1] == 0).all()
    with torch.no_grad():
        want = Block()(q[:1], k[:1], v[:1], keep[:1]).numpy()
    np.testing.assert_allclose(got[:1], want, rtol=1e-5, atol=1e-5)


def _onnx_attention(sq: int, skv: int, keep: np.ndarray, causal: bool):  # noqa: ANN202
    from onnx import TensorProto, helper

    node = helper.make_node(
        "Attention", ["q", "k", "v", "mask"], ["y"], q_num_heads=H, kv_num_heads=HKV,
        is_causal=int(causal),
    )  # fmt: skip
    ins = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, (B, sq, H * D)),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, (B, skv, HKV * D)),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, (B, skv, HKV * D)),
        helper.make_tensor_value_info("mask", TensorProto.BOOL, keep.shape),
    ]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, (B, sq, H * D))
    graph = helper.make_graph([node], "att", ins, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


@pytest.mark.parametrize("policy", list(POLICIES))
def test_onnx_attention_importer(policy: str) -> None:
    """ONNX Attention (opset 23) with a bool key-padding mask hiding batch 1 entirely, and
    is_causal with Sq > Skv: 0 on the empty rows under every policy, as ONNX specifies."""
    pytest.importorskip("onnx")
    f, _ = case("key_padding")
    keep = ~np.isneginf(f["m"])  # [B,1,1,Skv]
    for causal, sq in ((False, 4), (True, 7)):
        rng = np.random.default_rng(sq)
        g = {"q": rng.standard_normal((B, sq, H * D)).astype(np.float32), "k": f["k"], "v": f["v"]}
        # ONNX aligns is_causal to the top left (no cache): query i sees keys j <= i
        seen = keep & (np.arange(5)[None, :] <= np.arange(sq)[:, None]) if causal else keep
        g["m"] = np.where(seen, 0.0, -np.inf).astype(np.float32)
        m = rlx.onnx.load(_onnx_attention(sq, 5, keep, causal))
        cg = m.compile(CompileOptions(precision=POLICIES[policy][0], use_cache=False))
        got = cg.run({"q": g["q"], "k": g["k"], "v": g["v"], "mask": keep})[0]
        check(got, g, MaskKind.custom(), POLICIES[policy][1], f"onnx {policy} causal={causal}")


# ---- cache_attention ----------------------------------------------------------------------


@pytest.mark.parametrize("native_", [True, False], ids=["native", "numpy"])
@pytest.mark.parametrize("window", [0, 1])
def test_cache_attention_has_no_empty_rows(native_: bool, window: int) -> None:
    """Every query of cache_attention sees its own new key (positions p..p+S-1 attend
    keys j <= p+i), so it has no row without a key: window 1 gives exactly v's rows."""
    hkv, cap, s = HKV, 16, 5
    g = rlx.Graph("ca")
    q = g.input("q", (1, s, H * D))
    k = g.input("k", (1, s, hkv * D))
    v = g.input("v", (1, s, hkv * D))
    pos = g.input("positions", (s,), DType.I64)
    kc = g.param("kc", (1, cap, hkv * D))
    vc = g.param("vc", (1, cap, hkv * D))
    g.set_outputs([g.cache_attention(q, k, v, kc, vc, pos, H, D, hkv, window)])
    rng = np.random.default_rng(window)
    f = {n: rng.standard_normal(g.node(i).shape.dims).astype(np.float32)
         for n, i in (("q", q), ("k", k), ("v", v))}  # fmt: skip
    f["positions"] = np.arange(s)
    zero = {"kc": np.zeros((1, cap, hkv * D), np.float32), "vc": np.zeros((1, cap, hkv * D), np.float32)}  # fmt: skip
    (ref,) = g.evaluate(f, zero)
    cg = Session("cpu").compile(g, CompileOptions(native=native_, use_cache=False), params=zero)
    (got,) = cg.run(f)
    for out in (ref, got):
        assert np.isfinite(out).all()
    if window == 1:
        rep = np.repeat(f["v"].reshape(1, s, hkv, 1, D), H // hkv, axis=3).reshape(1, s, H * D)
        np.testing.assert_allclose(ref, rep, rtol=1e-6)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
