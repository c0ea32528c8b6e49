"""The native fused attention kernel (``native/csrc/attention_vec.c`` + ``attention.c``)
against a float64 NumPy oracle written here (``softmax(q kᵀ scale + mask) v``), on every
build target this CPU runs (the library is built per target in-process): every mask
kind and broadcast form of a custom mask, fully hidden rows (0 under -inf, the mean of
v under finfo.min), grouped-query heads, odd sizes and head dims, sequences longer than
a block, bf16 / f16 inputs, each target's instructions (objdump); and through the
compiler: the report names the kernel, f16/bf16 and f64-mask inputs, f64 and
``native=False`` keep the BLAS kernel, and the encoders' attention nodes take it."""

from __future__ import annotations

import re
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.kernels import KernelKind
from rlx.backends.cpu.native.attention import attention_lib
from rlx.dtype import DType
from rlx.errors import CompileError
from rlx.models import synthetic
from rlx.ops.nn import MaskKind, MaskType
from rlx.options import CompileOptions

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

TARGETS = native.runnable_targets()
PATHS = {native.Target.PORTABLE: "c", native.Target.AVX2: "avx2", native.Target.AVX512: "avx512"}
PATHS |= {native.Target.NEON: "neon", native.Target.DOTPROD: "neon", native.Target.I8MM: "neon"}
LOWEST = np.finfo(np.float32).min
BF16 = np.dtype(ml_dtypes.bfloat16)


def oracle(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    h: int,
    hkv: int,
    d: int,
    scale: float,
    kind: MaskKind,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """float64 ``softmax(q kᵀ scale + mask) v`` per head; query head i reads kv head
    i // (h // hkv); a causal / sliding-window key j is visible to query i when
    i + Skv - Sq - window < j <= i + Skv - Sq (plain loops over heads); a query whose
    every key is hidden (-inf) gives 0."""
    b, sq, _ = q.shape
    skv = k.shape[1]
    out = np.empty((b, sq, h, d))
    q4 = q.astype(np.float64).reshape(b, sq, h, d)
    k4 = k.astype(np.float64).reshape(b, skv, hkv, d)
    v4 = v.astype(np.float64).reshape(b, skv, hkv, d)
    i = np.arange(sq)[:, None] + skv - sq
    j = np.arange(skv)[None, :]
    vis = np.ones((sq, skv), bool)
    if kind.type in (MaskType.CAUSAL, MaskType.SLIDING_WINDOW):
        vis = j <= i
    if kind.type is MaskType.SLIDING_WINDOW:
        vis &= j > i - kind.window
    m4 = None if mask is None else np.broadcast_to(mask.astype(np.float64), (b, h, sq, skv))
    for bi in range(b):
        for hi in range(h):
            g = hi // (h // hkv)
            s = q4[bi, :, hi] @ k4[bi, :, g].T * scale
            if m4 is not None:
                s = s + m4[bi, hi]
            s = np.where(vis, s, -np.inf)
            with np.errstate(invalid="ignore"):
                e = np.exp(s - s.max(-1, keepdims=True))
                o = (e / e.sum(-1, keepdims=True)) @ v4[bi, :, g]
            out[bi, :, hi] = np.where(np.isneginf(s).all(-1, keepdims=True), 0.0, o)
    return out.reshape(b, sq, h * d)


def _check(got: np.ndarray, want: np.ndarray, tol: float = 2e-5) -> None:
    assert np.isfinite(got).all(), "non-finite values"
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _qkv(rng, b, sq, skv, h, hkv, d):
    f = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    return f(b, sq, h * d), f(b, skv, hkv * d), f(b, skv, hkv * d)


def _run(target, q, k, v, h, hkv, d, scale, kind, mask=None, threads=2) -> np.ndarray:
    out = np.full(q.shape, 7.0, np.float32)
    attention_lib(target).run(
        q, k, v, out, num_heads=h, num_kv_heads=hkv, head_dim=d, scale=scale,
        mask_type=kind.type, window=kind.window, mask=mask, num_threads=threads,
    )  # fmt: skip
    return out


KINDS = st.one_of(
    st.just(MaskKind.none()),
    st.just(MaskKind.causal()),
    st.integers(1, 80).map(MaskKind.sliding_window),
    st.just(MaskKind.custom()),
)
# broadcast forms of a custom mask over [B,H,Sq,Skv] (True: the dim is kept)
MASK_FORMS = st.sampled_from(
    [(1, 1, 1, 1), (1, 0, 0, 1), (0, 0, 1, 1), (1, 1, 1, 1), (0, 1, 0, 1), (0, 0, 0, 1)]
)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.value)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    b=st.integers(1, 2),
    sq=st.sampled_from([1, 2, 7, 16, 33, 64, 65, 97]),
    skv=st.sampled_from([1, 5, 16, 63, 64, 65, 130]),
    heads=st.sampled_from([(1, 1), (2, 2), (4, 2), (4, 1), (3, 3), (6, 2)]),
    d=st.sampled_from([1, 3, 8, 17, 32]),
    kind=KINDS,
    form=MASK_FORMS,
    scale=st.sampled_from([None, 0.5, 2.0]),
    threads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_matches_the_float64_oracle(
    target, b, sq, skv, heads, d, kind, form, scale, threads, seed
) -> None:
    h, hkv = heads
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, b, sq, skv, h, hkv, d)
    sc = 1.0 / np.sqrt(d) if scale is None else scale
    mask = None
    if kind.type is MaskType.CUSTOM:
        dims = tuple(n if keep else 1 for n, keep in zip((b, h, sq, skv), form, strict=True))
        mask = rng.standard_normal(dims).astype(np.float32)
        mask[rng.random(dims) < 0.3] = -np.inf  # hidden keys; some rows entirely
        mask[rng.random(dims) < 0.1] = LOWEST
    got = _run(target, q, k, v, h, hkv, d, sc, kind, mask, threads)
    _check(got, oracle(q, k, v, h, hkv, d, sc, kind, mask))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.value)
@pytest.mark.parametrize("d", [32, 64, 80, 96, 128, 256, 5])
def test_head_dims(target, d) -> None:
    rng = np.random.default_rng(d)
    q, k, v = _qkv(rng, 2, 70, 90, 4, 2, d)
    got = _run(target, q, k, v, 4, 2, d, 0.1, MaskKind.causal())
    _check(got, oracle(q, k, v, 4, 2, d, 0.1, MaskKind.causal()))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.value)
def test_fully_hidden_rows_zero_or_mean(target) -> None:
    """-inf on a whole row gives 0 (a query that sees no key); finfo.min on a whole row
    gives the mean of v (the scores become equal); other rows are untouched."""
    rng = np.random.default_rng(1)
    b, sq, skv, h, d = 1, 5, 70, 2, 8
    q, k, v = _qkv(rng, b, sq, skv, h, h, d)
    mask = np.zeros((b, h, sq, skv), np.float32)
    mask[0, 0, 1] = -np.inf
    mask[0, 1, 3] = LOWEST
    mask[0, 1, 4, :65] = -np.inf  # only the last 5 keys (the second block) visible
    got = _run(target, q, k, v, h, h, d, 0.3, MaskKind.custom(), mask).reshape(sq, h, d)
    assert (got[1, 0] == 0).all() and np.isfinite(got).all()
    np.testing.assert_allclose(got[3, 1], v.reshape(skv, h, d)[:, 1].mean(0), rtol=1e-5, atol=1e-6)
    _check(got.reshape(1, sq, h * d), oracle(q, k, v, h, h, d, 0.3, MaskKind.custom(), mask))
    # causal with more queries than keys: the first Sq - Skv rows see no key
    q, k, v = _qkv(rng, 1, 100, 30, 2, 1, 16)
    got = _run(target, q, k, v, 2, 1, 16, 0.25, MaskKind.causal())
    assert (got[0, :70] == 0).all() and np.isfinite(got).all()
    _check(got, oracle(q, k, v, 2, 1, 16, 0.25, MaskKind.causal()))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.value)
def test_each_target_reports_its_path(target) -> None:
    assert attention_lib(target).path == PATHS[target]


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump is not installed")
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.value)
def test_built_code_uses_the_targets_registers(target) -> None:
    """objdump (an independent oracle) of each target's library: zmm on AVX-512, ymm and
    no zmm on AVX2, neither on the portable build; 4-lane FMLAs on the aarch64 ones."""
    lib = attention_lib(target).lib
    tool = "objdump"
    if PATHS[target] == "neon":  # an x86-64 host's objdump (under qemu) reads no aarch64
        tool = shutil.which("aarch64-linux-gnu-objdump") or tool
    text = subprocess.run([tool, "-d", lib._name], capture_output=True, text=True).stdout
    if PATHS[target] == "neon":
        assert re.search(r"\bfmla\s+v\d+\.4s", text)
        return
    regs = set(re.findall(r"%([xyz]mm)\d+", text))
    want, never = {
        "avx512": ({"zmm"}, set()),
        "avx2": ({"ymm"}, {"zmm"}),
        "portable": (set(), {"ymm", "zmm"}),
    }[target.value]
    assert want <= regs and not never & regs, regs


# each (target, dtype) is a library build: the selected target's are fast, the others slow
LOWP_TARGETS = [
    t if t is native.selected_target() else pytest.param(t, marks=pytest.mark.slow) for t in TARGETS
]


@pytest.mark.parametrize("target", LOWP_TARGETS, ids=lambda t: t.value)
@pytest.mark.parametrize(("dtype", "tol"), [(BF16, 8e-3), (np.dtype(np.float16), 1e-3)], ids=str)
def test_low_precision_inputs(target, dtype, tol) -> None:
    """bf16 / f16 q, k, v read directly (keys and values widened a block at a time), f32
    arithmetic, the output rounded once: within an output ulp of the oracle on the same
    rounded inputs; rows that see no key are 0. f16 needs F16C: no portable library."""
    if dtype == np.float16 and target is native.Target.PORTABLE:
        with pytest.raises(CompileError, match="F16C"):
            attention_lib(target, dtype)
        return
    rng = np.random.default_rng(11)
    for kind, sq, skv in ((MaskKind.causal(), 90, 70), (MaskKind.custom(), 33, 140)):
        q, k, v = (x.astype(dtype) for x in _qkv(rng, 2, sq, skv, 4, 2, 24))
        mask = None
        if kind.type is MaskType.CUSTOM:
            mask = np.where(rng.random((2, 4, sq, skv)) < 0.2, -np.inf, 0.0).astype(np.float32)
        out = np.zeros_like(q)
        attention_lib(target, dtype).run(
            q, k, v, out, num_heads=4, num_kv_heads=2, head_dim=24, scale=0.2,
            mask_type=kind.type, mask=mask, num_threads=2,
        )  # fmt: skip
        _check(out.astype(np.float32), oracle(q, k, v, 4, 2, 24, 0.2, kind, mask), tol)


def test_long_causal_sequence() -> None:
    """Many query and key blocks, sliding window cutting blocks, 2 threads."""
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, 1, 600, 600, 2, 1, 64)
    for kind in (MaskKind.causal(), MaskKind.sliding_window(100)):
        got = _run(None, q, k, v, 2, 1, 64, 0.125, kind)
        _check(got, oracle(q, k, v, 2, 1, 64, 0.125, kind))


def _attention_graph(b, sq, skv, h, hkv, d, kind, dtype=DType.F32, mask_dims=None, mask_dt=None):
    g = rlx.Graph("att")
    q = g.input("q", (b, sq, h * d), dtype)
    k = g.input("k", (b, skv, hkv * d), dtype)
    v = g.input("v", (b, skv, hkv * d), dtype)
    m = None if mask_dims is None else g.input("m", mask_dims, mask_dt or dtype)
    g.set_outputs([g.attention(q, k, v, h, d, mask=kind, num_kv_heads=hkv, mask_input=m)])
    return g


def _attention_records(cg):
    return [r for r in cg.report().kernels if r.op == "attention"]


@pytest.mark.parametrize(
    ("dtype", "mask_dt", "tol"),
    [
        (DType.F32, DType.F32, 2e-5),
        (DType.F32, DType.F64, 2e-5),
        (DType.BF16, DType.BF16, 8e-3),
        (DType.F16, DType.F32, 1e-3),
    ],
)
def test_compiled_node_takes_the_native_kernel(dtype, mask_dt, tol) -> None:
    """bf16 / f16 are read by the kernel (f32 arithmetic, output rounded once); an f64 or
    bf16 mask is cast to f32 scratch (the reference adds it in f32). The oracle sees the
    same (rounded) inputs; the tolerance is about one ulp of the output dtype."""
    rng = np.random.default_rng(5)
    b, sq, skv, h, hkv, d = 2, 9, 70, 4, 2, 16
    g = _attention_graph(b, sq, skv, h, hkv, d, MaskKind.custom(), dtype, (b, 1, 1, skv), mask_dt)
    cg = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False, num_threads=2))
    (rec,) = _attention_records(cg)
    if dtype is DType.F16 and native.selected_target() is native.Target.PORTABLE:
        assert rec.kind is KernelKind.BLAS and "F16C" in rec.notes[0]
    else:
        assert rec.kind is KernelKind.NATIVE
        assert rec.notes == (f"native attention ({attention_lib().path})",)
    npdt, mdt = dtype.np, mask_dt.np
    feed = {n: x.astype(npdt) for n, x in zip("qkv", _qkv(rng, b, sq, skv, h, hkv, d), strict=True)}
    feed["m"] = np.where(rng.random((b, 1, 1, skv)) < 0.3, -1e30, 0.0).astype(mdt)
    (got,) = cg.run(feed)
    want = oracle(feed["q"], feed["k"], feed["v"], h, hkv, d, d**-0.5, MaskKind.custom(), feed["m"])
    _check(np.asarray(got, np.float32), want.astype(npdt).astype(np.float32), tol)


def test_f64_and_non_native_take_the_blas_kernel() -> None:
    g = _attention_graph(1, 4, 4, 2, 2, 8, MaskKind.causal(), DType.F64)
    (rec,) = _attention_records(rlx.Session("cpu").compile(g, CompileOptions(use_cache=False)))
    assert rec.kind is KernelKind.BLAS and "takes f32, bf16 or f16" in rec.notes[0]
    g = _attention_graph(1, 4, 4, 2, 2, 8, MaskKind.causal())
    opts = CompileOptions(use_cache=False, native=False)
    (rec,) = _attention_records(rlx.Session("cpu").compile(g, opts))
    assert rec.kind is KernelKind.BLAS


def test_synthetic_encoder_attention_is_native() -> None:
    """The spelled-out attention of the MiniLM-shaped encoder fuses into attention nodes
    that all take the native kernel (symbolic batch and seq, bound at run time)."""
    batch, seq = rlx.sym("batch"), rlx.sym("seq")
    g = synthetic.encoder(layers=2, hidden=64, heads=4, ffn=128, seq=seq, batch=batch)
    opts = CompileOptions(use_cache=False)
    cg = rlx.Session("cpu").compile(g, opts, params=synthetic.random_params(g))
    x = np.random.default_rng(0).standard_normal((2, 16, 64), dtype=np.float32)
    cg.run({"x": x})
    recs = _attention_records(cg)
    assert len(recs) == 2
    assert all(
        r.kind is KernelKind.NATIVE and r.notes[0].startswith("native attention") for r in recs
    )


def test_bert_padding_mask_attention_is_native(tmp_path) -> None:
    """A BERT checkpoint's padding mask arrives as a custom [B,1,1,S] f32 mask input."""
    from rlx.models import hf
    from tests.models import tiny_checkpoints as tc

    model = hf.load(tc.build("bert", tmp_path / "bert"))
    cg = model.compile()
    cg.run(model.inputs(["a dog runs", "the quick brown fox jumps over the lazy dog"]))
    recs = _attention_records(cg)
    assert len(recs) == tc.LAYERS
    for r in recs:
        assert r.kind is KernelKind.NATIVE, r.notes
        node = cg.graph.node(r.node)
        assert node.op.mask.type is MaskType.CUSTOM
