"""Attention-logit soft-capping (Gemma 2: scaled scores ``s`` become ``c * tanh(s / c)``
before the mask and the softmax) in the CPU kernels of ``cache_attention`` and
``slot_cache_attention`` (rlx/backends/cpu/kernels/kvcache.py) and the native attention
library they call (csrc/attention.c), under RLX_ISA=avx512 / avx2 / portable (x86-64) or
i8mm / dotprod / neon (aarch64), against
an f64 NumPy oracle written out here and against the ops' NumPy references."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.attention import attention_lib
from rlx.dtype import DType
from rlx.ir.mir import Graph
from rlx.ops.nn import MaskType
from rlx.options import CompileOptions
from rlx.runtime.session import Session

# this machine's targets, best first (avx512 avx2 portable; i8mm dotprod neon)
ISAS = [t.value for t in reversed(cpu.targets_of(cpu.machine_arch()))]
PATHS = {"avx512": "avx512", "avx2": "avx2", "portable": "c"}
PATHS |= {"neon": "neon", "dotprod": "neon", "i8mm": "neon"}
NP_DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
CACHE_DTYPES = {"f32": DType.F32, "bf16": DType.BF16, "f16": DType.F16}


def _force(monkeypatch: pytest.MonkeyPatch, isa: str) -> None:
    """RLX_ISA=isa, skipping only when this CPU cannot run that target."""
    if cpu.Target(isa) not in cpu.runnable_targets(cpu.cpu_flags()):
        pytest.skip(f"this CPU cannot run the {isa} target")
    monkeypatch.setenv("RLX_ISA", isa)


def oracle(q, k, v, h, hkv, d, scale, softcap, mask: MaskType, window=0):  # type: ignore[no-untyped-def]
    """``softmax(cap(q kᵀ scale) + mask) v`` per head in f64 (``cap(s) = c tanh(s / c)``,
    end-aligned causal / sliding-window masks), from q, k, v widened as given."""
    b, sq, _ = q.shape
    skv = k.shape[1]
    g = h // hkv
    i = np.arange(sq)[:, None] + (skv - sq)
    j = np.arange(skv)[None, :]
    seen = np.ones((sq, skv), bool)
    if mask is not MaskType.NONE:
        seen = j <= i
        if mask is MaskType.SLIDING_WINDOW:
            seen &= j > i - window
    out = np.zeros((b, sq, h * d))
    for bi in range(b):
        for hh in range(h):
            kv = hh // g
            qh = q[bi, :, hh * d : (hh + 1) * d].astype(np.float64)
            kh = k[bi, :, kv * d : (kv + 1) * d].astype(np.float64)
            vh = v[bi, :, kv * d : (kv + 1) * d].astype(np.float64)
            s = qh @ kh.T * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            s = np.where(seen, s, -np.inf)
            e = np.exp(s - s.max(axis=1, keepdims=True))
            out[bi, :, hh * d : (hh + 1) * d] = e / e.sum(axis=1, keepdims=True) @ vh
    return out


# every element dtype each target builds (f16 needs F16C or aarch64: not on portable)
TARGET_DTYPES = [(i, t) for i in ISAS for t in NP_DTYPES if (i, t) != ("portable", "f16")]


@pytest.mark.parametrize(("isa", "dt"), TARGET_DTYPES)
@pytest.mark.parametrize(
    ("sq", "skv", "mask"),
    [
        (1, 37, MaskType.CAUSAL),  # a decode step
        (9, 70, MaskType.SLIDING_WINDOW),  # a prompt chunk after a prefix, windowed
        (70, 70, MaskType.CAUSAL),  # a prefill: several query blocks and key blocks
        (5, 19, MaskType.NONE),  # no mask: the capped scores give the block max
    ],
)
def test_native_softcap_matches_the_f64_oracle(monkeypatch, isa, dt, sq, skv, mask) -> None:
    _force(monkeypatch, isa)
    npdt = NP_DTYPES[dt]
    lib = attention_lib(dtype=npdt)
    assert lib.path == PATHS[isa]
    h, hkv, d, scale, cap = 4, 2, 24, 0.3, 2.5
    rng = np.random.default_rng(sq * 100 + skv)
    q = (rng.standard_normal((2, sq, h * d)) * 1.5).astype(npdt)
    k = (rng.standard_normal((2, skv, hkv * d)) * 1.5).astype(npdt)
    v = rng.standard_normal((2, skv, hkv * d)).astype(npdt)
    kw = dict(num_heads=h, num_kv_heads=hkv, head_dim=d, scale=scale, mask_type=mask, window=7)
    out = np.zeros_like(q)
    lib.run(q, k, v, out, softcap=cap, **kw)
    want = oracle(q, k, v, h, hkv, d, scale, cap, mask, 7)
    if dt == "f32":
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)
    else:  # the output is rounded once to the element dtype
        eps = float(ml_dtypes.finfo(npdt).eps)
        np.testing.assert_allclose(out.astype(np.float64), want, rtol=eps, atol=1e-3 * eps)
    # and the cap matters here: uncapped scores give another result
    plain = np.zeros_like(q)
    lib.run(q, k, v, plain, **kw)
    assert np.abs(plain.astype(np.float64) - want).max() > 0.05
    np.testing.assert_allclose(
        plain.astype(np.float64),
        oracle(q, k, v, h, hkv, d, scale, 0.0, mask, 7),
        rtol=1e-5 if dt == "f32" else float(ml_dtypes.finfo(npdt).eps),
        atol=2e-6,
    )


def test_native_softcap_of_extreme_scores() -> None:
    """Scores far beyond the cap (|s / c| up to ~400) saturate at +-c: finite, the keys
    with the highest scores share the weight (the oracle's tanh is exactly +-1 there)."""
    lib = attention_lib(dtype=np.float32)
    rng = np.random.default_rng(3)
    h, d = 2, 16
    q = (rng.standard_normal((1, 3, h * d)) * 30).astype(np.float32)
    k = (rng.standard_normal((1, 40, h * d)) * 30).astype(np.float32)
    v = rng.standard_normal((1, 40, h * d)).astype(np.float32)
    out = np.zeros_like(q)
    kw = dict(num_heads=h, num_kv_heads=h, head_dim=d, scale=0.25, mask_type=MaskType.CAUSAL)
    lib.run(q, k, v, out, softcap=1.0, **kw)
    want = oracle(q, k, v, h, h, d, 0.25, 1.0, MaskType.CAUSAL)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)


def _loop(q, keys, vals, h, hkv, d, scale, cap, window, pos):  # type: ignore[no-untyped-def]
    """One query row at position ``pos`` over ``keys[:pos+1]`` (f64, windowed)."""
    out = np.zeros(h * d)
    lo = max(0, pos - window + 1) if window else 0
    for hh in range(h):
        kv = hh // (h // hkv)
        kk = keys[lo : pos + 1, kv * d : (kv + 1) * d].astype(np.float64)
        s = kk @ q[hh * d : (hh + 1) * d].astype(np.float64) * scale
        s = cap * np.tanh(s / cap)
        e = np.exp(s - s.max())
        out[hh * d : (hh + 1) * d] = e @ vals[lo : pos + 1, kv * d : (kv + 1) * d] / e.sum()
    return out


def _cache_graph(h, hkv, d, cap_rows, window, dt, softcap) -> Graph:  # type: ignore[no-untyped-def]
    g = Graph("softcap")
    seq = g.sym("seq", max=cap_rows)
    q = g.input("q", (1, seq, h * d), DType.F32)
    k = g.input("k", (1, seq, hkv * d), DType.F32)
    v = g.input("v", (1, seq, hkv * d), DType.F32)
    pos = g.input("positions", (seq,), DType.I64)
    kc = g.param("kc", (1, cap_rows, hkv * d), dt)
    vc = g.param("vc", (1, cap_rows, hkv * d), dt)
    scales = {}
    if dt is DType.I8:  # one scale per row and kv head
        scales = {f"{x}_scale": g.param(f"{x}s", (1, cap_rows, hkv), DType.F32) for x in "kv"}
    out = g.cache_attention(q, k, v, kc, vc, pos, h, d, hkv, window, 0.3, softcap=softcap, **scales)
    g.set_outputs([out])
    return g


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("dt", ["f32", "bf16", "i8"])
@pytest.mark.parametrize("window", [0, 5])
def test_cache_attention_softcap_steps(monkeypatch, isa, native, dt, window) -> None:
    """Prefill, decode steps and a chunk through ``cache_attention`` with a cap: the
    compiled kernel (native or its NumPy fallback) against the f64 loop over the rows
    rounded to the cache dtype (int8: through absmax int8 per row and head), and against
    the op's reference (``Graph.evaluate``)."""
    from tests.models.llm.test_kv_int8 import absmax_int8

    _force(monkeypatch, isa)
    h, hkv, d, rows, softcap = 4, 2, 16, 24, 1.5
    npdt = NP_DTYPES.get(dt, np.int8)
    g = _cache_graph(h, hkv, d, rows, window, CACHE_DTYPES.get(dt, DType.I8), softcap)
    zeros = np.zeros((1, rows, hkv * d), npdt)
    params = {"kc": zeros, "vc": zeros}
    if dt == "i8":
        params |= {n: np.zeros((1, rows, hkv), np.float32) for n in ("ks", "vs")}
    c = Session("cpu").compile(g, CompileOptions(native=native, use_cache=False), params=params)
    rng = np.random.default_rng(window + 11)
    total = 13
    qs = (rng.standard_normal((total, h * d)) * 1.5).astype(np.float32)
    ks = (rng.standard_normal((total, hkv * d)) * 1.5).astype(np.float32)
    vs = rng.standard_normal((total, hkv * d)).astype(np.float32)
    r = (lambda x: x.astype(npdt).astype(np.float64)) if dt == "bf16" else (lambda x: x)
    tol = dict(rtol=8e-3, atol=1e-5) if dt == "bf16" else dict(rtol=2e-5, atol=2e-5)
    kr, vr = (absmax_int8(ks, hkv), absmax_int8(vs, hkv)) if dt == "i8" else (r(ks), r(vs))
    start = 0
    for n in (6, 1, 1, 4, 1):
        sl = slice(start, start + n)
        feed = {"q": qs[None, sl], "k": ks[None, sl], "v": vs[None, sl]}
        feed["positions"] = np.arange(start, start + n)
        state = {n: np.zeros_like(a) for n, a in params.items()}
        if dt == "i8" and start:
            from rlx.ops.kvcache import quantize_heads

            state["kc"][0, :start], state["ks"][0, :start] = quantize_heads(ks[:start], hkv)
            state["vc"][0, :start], state["vs"][0, :start] = quantize_heads(vs[:start], hkv)
        elif dt != "i8":
            state["kc"][0, :start], state["vc"][0, :start] = ks[:start], vs[:start]
        (ref,) = g.evaluate(feed, state)
        (out,) = c.run(feed)
        want = np.stack(
            [
                _loop(r(qs[start + i]), kr, vr, h, hkv, d, 0.3, softcap, window, start + i)
                for i in range(n)
            ]
        )
        np.testing.assert_allclose(out[0], want, **tol)
        np.testing.assert_allclose(ref[0], want, **tol)
        start += n


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("native", [True, False])
def test_slot_cache_attention_softcap(monkeypatch, isa, native) -> None:
    """Decode tokens of two slots and a prefill run of a third in one call, then a
    second call: each token against the f64 loop over its slot's rows."""
    _force(monkeypatch, isa)
    h, d, hkv, nslots, rows, softcap = 4, 8, 2, 3, 16, 2.0
    rng = np.random.default_rng(7)
    g = Graph("slots")
    t = g.sym("t", max=rows)
    q, k, v = (g.input(n, (1, t, w * d)) for n, w in (("q", h), ("k", hkv), ("v", hkv)))
    pos, sl = g.input("positions", (t,), "i64"), g.input("slots", (t,), "i64")
    kc, vc = (g.param(n, (nslots, rows, hkv * d)) for n in ("kc", "vc"))
    out = g.slot_cache_attention(q, k, v, kc, vc, pos, sl, h, d, hkv, 0, 0.5, softcap=softcap)
    g.set_outputs([out])
    zeros = np.zeros((nslots, rows, hkv * d), np.float32)
    cg = Session("cpu").compile(
        g, CompileOptions(native=native, use_cache=False), params={"kc": zeros, "vc": zeros}
    )
    keys, vals = zeros.astype(np.float64), zeros.astype(np.float64)
    for positions, slots in (([0, 0, 0, 1, 2, 3], [0, 1, 2, 2, 2, 2]), ([1, 4], [0, 2])):
        n = len(positions)
        feed = {x: (rng.standard_normal((1, n, w * d)) * 2).astype(np.float32)
                for x, w in (("q", h), ("k", hkv), ("v", hkv))}  # fmt: skip
        feed["positions"], feed["slots"] = np.array(positions), np.array(slots)
        before = {"kc": keys.astype(np.float32), "vc": vals.astype(np.float32)}
        keys[slots, positions], vals[slots, positions] = feed["k"][0], feed["v"][0]
        want = np.stack(
            [
                _loop(feed["q"][0, i], keys[s], vals[s], h, hkv, d, 0.5, softcap, 0, p)
                for i, (p, s) in enumerate(zip(positions, slots, strict=True))
            ]
        )
        (ref,) = g.evaluate(feed, before)
        (got,) = cg.run(feed)
        np.testing.assert_allclose(ref[0], want, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(got[0], want, rtol=2e-5, atol=2e-5)


def test_softcap_attribute_is_checked_printed_and_serialized() -> None:
    """A negative cap is a ShapeError naming it; the attribute prints and survives a
    save / load of the graph."""
    from rlx.errors import ShapeError
    from rlx.ir.serialize import dumps, loads

    g = _cache_graph(2, 1, 8, 8, 0, DType.F32, 4.0)
    node = next(n for n in g.nodes if n.op.mnemonic == "cache_attention")
    assert node.op.softcap == 4.0 and "softcap=4" in str(node.op)
    back, _ = loads(dumps(g))
    assert next(n for n in back.nodes if n.op.mnemonic == "cache_attention").op == node.op
    with pytest.raises(ShapeError, match=r"softcap must be a finite number >= 0.*-1"):
        _cache_graph(2, 1, 8, 8, 0, DType.F32, -1.0)


def test_native_library_refuses_a_negative_cap() -> None:
    from rlx.errors import InputError

    lib = attention_lib(dtype=np.float32)
    x = np.zeros((1, 2, 16), np.float32)
    kw = dict(num_heads=1, num_kv_heads=1, head_dim=16, scale=0.25)
    with pytest.raises(InputError, match="softcap must be a finite number >= 0, given -2.0"):
        lib.prepare(x, x, x, x.copy(), softcap=-2.0, **kw)
