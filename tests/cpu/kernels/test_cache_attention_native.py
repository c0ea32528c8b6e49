"""The native cache-attention entries (``csrc/cache_attention.c``: position check, row
write and attention in one call; the decode kernel's split over the keys) through
compiled ``cache_attention`` / ``slot_cache_attention`` graphs, against an f64 oracle
written out here over the rows rounded to the cache dtype (int8: absmax per row and kv
head): f32 / bf16 / f16 / int8 caches, S = 1 and S > 1, starts at 0, in the middle and
at the end of the cache, sliding windows, soft-capping, grouped-query heads, contexts
longer than one key chunk, 1 and 2 threads (the same bits), bad positions."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from rlx.dtype import DType
from rlx.errors import InputError
from rlx.ir.mir import Graph
from rlx.options import CompileOptions
from rlx.runtime.session import Session

NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16, "i8": np.int8}
DT = {"f32": DType.F32, "bf16": DType.BF16, "f16": DType.F16, "i8": DType.I8}
TOL = {
    "f32": dict(rtol=2e-5, atol=2e-5),
    "i8": dict(rtol=2e-5, atol=2e-5),
    "bf16": dict(rtol=1e-2, atol=1e-2),
    "f16": dict(rtol=2e-3, atol=2e-3),
}


def absmax(x: np.ndarray, groups: int) -> np.ndarray:
    """Rows through int8 with an absmax / 127 scale per row and group (f64 back)."""
    out = np.zeros(x.shape)
    d = x.shape[1] // groups
    for i in range(x.shape[0]):
        for h in range(groups):
            seg = x[i, h * d : (h + 1) * d].astype(np.float32)
            s = np.float32(np.abs(seg).max()) / np.float32(127)
            if s > 0:
                out[i, h * d : (h + 1) * d] = np.clip(np.rint(seg / s), -127, 127) * np.float64(s)
    return out


def oracle(q, keys, vals, pos, h, hkv, d, scale, cap, window):  # type: ignore[no-untyped-def]
    """f64 attention of one query row at ``pos`` over ``keys[:pos+1]`` (windowed)."""
    out = np.zeros(h * d)
    lo = max(0, pos - window + 1) if window else 0
    for hh in range(h):
        kv = hh // (h // hkv)
        kk = keys[lo : pos + 1, kv * d : (kv + 1) * d]
        s = kk @ q[hh * d : (hh + 1) * d].astype(np.float64) * scale
        if cap:
            s = cap * np.tanh(s / cap)
        e = np.exp(s - s.max())
        out[hh * d : (hh + 1) * d] = e @ vals[lo : pos + 1, kv * d : (kv + 1) * d] / e.sum()
    return out


def _compile(h, hkv, d, rows, window, dt, cap, threads, batch=1):  # type: ignore[no-untyped-def]
    g = Graph("cache")
    seq = g.sym("seq", max=rows)
    q = g.input("q", (batch, seq, h * d), DType.F32)
    k = g.input("k", (batch, seq, hkv * d), DType.F32)
    v = g.input("v", (batch, seq, hkv * d), DType.F32)
    pos = g.input("positions", (seq,), DType.I64)
    kc = g.param("kc", (batch, rows, hkv * d), DT[dt])
    vc = g.param("vc", (batch, rows, hkv * d), DT[dt])
    extra = {}
    params = {
        "kc": np.zeros((batch, rows, hkv * d), NP[dt]),
        "vc": np.zeros((batch, rows, hkv * d), NP[dt]),
    }
    if dt == "i8":
        extra = {f"{x}_scale": g.param(f"{x}s", (batch, rows, hkv), DType.F32) for x in "kv"}
        params |= {n: np.zeros((batch, rows, hkv), np.float32) for n in ("ks", "vs")}
    out = g.cache_attention(q, k, v, kc, vc, pos, h, d, hkv, window, 0.2, softcap=cap, **extra)
    g.set_outputs([out])
    opts = CompileOptions(use_cache=False, num_threads=threads)
    return Session("cpu").compile(g, opts, params=params)


def _rows(x: np.ndarray, dt: str, groups: int) -> np.ndarray:
    if dt == "i8":
        return absmax(x, groups)
    return x.astype(NP[dt]).astype(np.float64)


@pytest.mark.parametrize("dt", ["f32", "bf16", "f16", "i8"])
@pytest.mark.parametrize(("window", "cap"), [(0, 0.0), (150, 0.0), (0, 3.0)])
def test_cache_attention_chunks_and_steps(dt, window, cap) -> None:
    """A prompt at 0, a chunk in the middle, decode steps past several key chunks (128
    keys; without a window, from 1024 keys on, enough work to split over 2 threads) up to
    the cache's last row, GQA (8 heads over 2 kv heads): every output against the f64
    oracle, and the 2-thread run the same bits as the 1-thread one."""
    h, hkv, d, rows = 8, 2, 64, 1040
    runs = [_compile(h, hkv, d, rows, window, dt, cap, t) for t in (1, 2)]
    rng = np.random.default_rng(len(dt) + window)
    qs = rng.standard_normal((rows, h * d)).astype(np.float32)
    ks = rng.standard_normal((rows, hkv * d)).astype(np.float32)
    vs = rng.standard_normal((rows, hkv * d)).astype(np.float32)
    kr, vr = _rows(ks, dt, hkv), _rows(vs, dt, hkv)
    rq = (lambda x: x) if dt in ("f32", "i8") else (lambda x: x.astype(NP[dt]).astype(np.float64))
    chunks = [(0, 5), (5, 130), (130, 131), (131, 1020), *[(p, p + 1) for p in range(1020, rows)]]
    for a, b in chunks:
        feed = {"q": qs[None, a:b], "k": ks[None, a:b], "v": vs[None, a:b]}
        feed["positions"] = np.arange(a, b)
        outs = [c.run(feed)[0] for c in runs]
        np.testing.assert_array_equal(outs[0], outs[1])
        for i in (0, b - a - 1) if b - a > 1 else (0,):
            want = oracle(rq(qs[a + i]), kr, vr, a + i, h, hkv, d, 0.2, cap, window)
            got = outs[0][0, i].astype(np.float64)
            if dt in ("bf16", "f16"):  # the output is rounded once to the cache dtype
                want = want.astype(NP[dt]).astype(np.float64)
            np.testing.assert_allclose(got, want, **TOL[dt])


@pytest.mark.parametrize("dt", ["f32", "bf16", "i8"])
def test_bad_positions_raise_and_write_nothing(dt) -> None:
    """Positions past the cache or not consecutive: the op's InputError (naming the
    node), and the cache rows stay as they were (the next step sees the old rows)."""
    h, hkv, d, rows = 4, 1, 32, 8
    c = _compile(h, hkv, d, rows, 0, dt, 0.0, 1, batch=2)
    rng = np.random.default_rng(5)
    qs = rng.standard_normal((2, rows, h * d)).astype(np.float32)
    ks = rng.standard_normal((2, rows, hkv * d)).astype(np.float32)
    vs = rng.standard_normal((2, rows, hkv * d)).astype(np.float32)
    c.run({"q": qs[:, :5], "k": ks[:, :5], "v": vs[:, :5], "positions": np.arange(5)})
    junk = {"q": qs[:, :3], "k": ks[:, :3] + 9, "v": vs[:, :3] - 9}
    with pytest.raises(InputError, match=r"cache_attention %\d+: .*max context 8, asked for 9"):
        c.run(junk | {"positions": np.arange(6, 9)})
    with pytest.raises(InputError, match=r"cache_attention %\d+: .*consecutive"):
        c.run(junk | {"positions": np.array([1, 3, 4])})
    with pytest.raises(InputError, match="consecutive"):
        c.run(junk | {"positions": np.array([-1, 0, 1])})
    (out,) = c.run({"q": qs[:, 5:6], "k": ks[:, 5:6], "v": vs[:, 5:6], "positions": np.array([5])})
    rq = (lambda x: x) if dt in ("f32", "i8") else (lambda x: x.astype(NP[dt]).astype(np.float64))
    for b in range(2):
        want = oracle(rq(qs[b, 5]), _rows(ks[b], dt, hkv), _rows(vs[b], dt, hkv), 5, h, hkv, d,
                      0.2, 0.0, 0)  # fmt: skip
        if dt == "bf16":
            want = want.astype(NP[dt]).astype(np.float64)
        np.testing.assert_allclose(out[b, 0].astype(np.float64), want, **TOL[dt])


def _slot_graph(h, hkv, d, nslots, rows, dt, threads, window):  # type: ignore[no-untyped-def]
    g = Graph("slots")
    t = g.sym("t", max=rows)
    q, k, v = (g.input(n, (1, t, w * d)) for n, w in (("q", h), ("k", hkv), ("v", hkv)))
    pos, sl = g.input("positions", (t,), "i64"), g.input("slots", (t,), "i64")
    kc, vc = (g.param(n, (nslots, rows, hkv * d), DT[dt]) for n in ("kc", "vc"))
    out = g.slot_cache_attention(q, k, v, kc, vc, pos, sl, h, d, hkv, window, 0.25)
    g.set_outputs([out])
    zeros = np.zeros((nslots, rows, hkv * d), NP[dt])
    opts = CompileOptions(use_cache=False, num_threads=threads)
    return Session("cpu").compile(g, opts, params={"kc": zeros, "vc": zeros})


@pytest.mark.parametrize("dt", ["f32", "f16"])
@pytest.mark.parametrize("window", [0, 100])
def test_slot_cache_attention_native(dt, window) -> None:
    """Prompts of different lengths into 4 slots (one run each, one call), then decode
    steps of all 4 slots in one call (one decode job per slot, past a key chunk), then a
    bad call (a slot out of range; two tokens on one row) that raises and writes
    nothing: each token against the f64 oracle over its slot's rows; 2 threads give the
    same bits as 1."""
    h, hkv, d, nslots, rows = 4, 2, 128, 4, 600
    cgs = [_slot_graph(h, hkv, d, nslots, rows, dt, t, window) for t in (1, 2)]
    rng = np.random.default_rng(9)
    keys, vals = np.zeros((nslots, rows, hkv * d)), np.zeros((nslots, rows, hkv * d))
    lens = [550, 3, 531, 40]  # decode steps of all 4: enough work for 2 threads
    rq = (lambda x: x) if dt == "f32" else (lambda x: x.astype(NP[dt]).astype(np.float64))

    def call(positions, slots, check=True):  # type: ignore[no-untyped-def]
        n = len(positions)
        feed = {x: rng.standard_normal((1, n, w * d)).astype(np.float32)
                for x, w in (("q", h), ("k", hkv), ("v", hkv))}  # fmt: skip
        feed["positions"], feed["slots"] = np.array(positions), np.array(slots)
        if not check:
            return feed
        outs = [c.run(feed)[0] for c in cgs]
        np.testing.assert_array_equal(outs[0], outs[1])
        keys[slots, positions] = _rows(feed["k"][0], dt, hkv)
        vals[slots, positions] = _rows(feed["v"][0], dt, hkv)
        for i, (p, s) in enumerate(zip(positions, slots, strict=True)):
            if i % 17 and i != n - 1:
                continue
            want = oracle(rq(feed["q"][0, i]), keys[s], vals[s], p, h, hkv, d, 0.25, 0.0, window)
            if dt != "f32":
                want = want.astype(NP[dt]).astype(np.float64)
            np.testing.assert_allclose(outs[0][0, i].astype(np.float64), want, **TOL[dt])
        return feed

    for part in ((0, 1), (2, 3)):  # two prompt runs per call
        call([p for s in part for p in range(lens[s])], [s for s in part for _ in range(lens[s])])
    for step in range(3):
        call([n + step for n in lens], [0, 1, 2, 3])
    for bad in (([560, 9], [0, 4]), ([560, 560], [0, 0])):
        feed = call(*bad, check=False)
        for c in cgs:
            with pytest.raises(InputError, match=r"slot_cache_attention %\d+: token"):
                c.run(feed)
    call([n + 3 for n in lens], [0, 1, 2, 3])
