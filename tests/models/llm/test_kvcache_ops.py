"""``cache_attention`` and ``dequant_gather`` (rlx/ops/kvcache.py) against plain loops and
``gguf.quants``: the reference, and the CPU kernel over several steps (its cache state)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlx.dtype import DType
from rlx.errors import InputError
from rlx.ir.mir import Graph
from rlx.ops.kvcache import CacheAttention, DequantGather
from rlx.options import CompileOptions
from rlx.runtime.session import Session


def loop_attention(qs, ks, vs, h, hkv, d, window, scale, start):
    """Plain-Python attention of queries at positions start.. over all keys so far."""
    s = qs.shape[0]
    out = np.zeros((s, h * d))
    for i in range(s):
        pos = start + i
        for head in range(h):
            kvh = head // (h // hkv)
            q = qs[i, head * d : (head + 1) * d].astype(np.float64)
            lo = max(0, pos - window + 1) if window else 0
            scores = [float(q @ ks[j, kvh * d : (kvh + 1) * d]) * scale for j in range(lo, pos + 1)]
            m = max(scores)
            w = [math.exp(x - m) for x in scores]
            tot = sum(w)
            for j, wj in zip(range(lo, pos + 1), w, strict=True):
                out[i, head * d : (head + 1) * d] += wj / tot * vs[j, kvh * d : (kvh + 1) * d]
    return out


def cache_graph(h, hkv, d, cap, window, dt=DType.F32):
    """f32 q / k / v of a symbolic length -> ``cache_attention`` (scale 0.3) over ``dt`` caches
    ``kc`` / ``vc`` of ``cap`` rows."""
    g = Graph("ca")
    seq = g.sym("seq", max=cap)
    q = g.input("q", (1, seq, h * d), DType.F32)
    k = g.input("k", (1, seq, hkv * d), DType.F32)
    v = g.input("v", (1, seq, hkv * d), DType.F32)
    pos = g.input("positions", (seq,), DType.I64)
    kc = g.param("kc", (1, cap, hkv * d), dt)
    vc = g.param("vc", (1, cap, hkv * d), dt)
    g.set_outputs([g.cache_attention(q, k, v, kc, vc, pos, h, d, hkv, window, 0.3)])
    return g


def run_steps(c, qs, ks, vs):
    """Feed compiled ``cache_graph`` ``c`` a prompt, decode steps, a chunk and a step of the
    rows of ``qs`` / ``ks`` / ``vs`` -> yields (start position, row slice, output)."""
    start = 0
    for n in (6, 1, 1, 4, 1):
        sl = slice(start, start + n)
        feed = {"q": qs[None, sl], "k": ks[None, sl], "v": vs[None, sl]}
        feed["positions"] = np.arange(start, start + n)
        (out,) = c.run(feed)
        yield start, sl, out
        start += n


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize(("h", "hkv", "d", "window"), [(4, 1, 16, 0), (4, 2, 8, 5), (2, 2, 32, 3)])
def test_cache_attention_steps_match_a_loop(native, h, hkv, d, window) -> None:
    cap = 24
    rng = np.random.default_rng(h * 7 + d + window)
    g = cache_graph(h, hkv, d, cap, window)
    zeros = np.zeros((1, cap, hkv * d), np.float32)
    c = Session("cpu").compile(
        g, CompileOptions(native=native, use_cache=False), params={"kc": zeros, "vc": zeros}
    )
    total = 13
    qs = rng.standard_normal((total, h * d)).astype(np.float32)
    ks = rng.standard_normal((total, hkv * d)).astype(np.float32)
    vs = rng.standard_normal((total, hkv * d)).astype(np.float32)
    steps = 0
    for start, sl, out in run_steps(c, qs, ks, vs):
        want = loop_attention(qs[sl], ks, vs, h, hkv, d, window, 0.3, start)
        np.testing.assert_allclose(out[0], want, rtol=2e-5, atol=2e-5)
        steps += 1
    assert steps == 5 and sl.stop == total


def test_cache_attention_reference_is_pure_and_matches_a_loop() -> None:
    h, hkv, d, cap, p, s = 4, 2, 8, 10, 3, 2
    rng = np.random.default_rng(0)
    op = CacheAttention(h, d, hkv, 0, 0.25)
    kc = rng.standard_normal((1, cap, hkv * d)).astype(np.float32)
    vc = rng.standard_normal((1, cap, hkv * d)).astype(np.float32)
    q = rng.standard_normal((1, s, h * d)).astype(np.float32)
    k = rng.standard_normal((1, s, hkv * d)).astype(np.float32)
    v = rng.standard_normal((1, s, hkv * d)).astype(np.float32)
    kc0 = kc.copy()
    from rlx.ops.base import RefCtx

    ctx = RefCtx((1, s, h * d), np.dtype(np.float32), {}, {}, {})
    out = op.reference([q, k, v, kc, vc, np.arange(p, p + s)], ctx)
    keys, vals = kc[0].copy(), vc[0].copy()
    keys[p : p + s], vals[p : p + s] = k[0], v[0]
    want = loop_attention(q[0], keys, vals, h, hkv, d, 0, 0.25, p)
    np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(kc, kc0)  # the reference changes nothing


def test_cache_attention_rejects_positions_past_the_cache() -> None:
    g = cache_graph(2, 1, 8, 6, 0)
    zeros = np.zeros((1, 6, 8), np.float32)
    c = Session("cpu").compile(
        g, CompileOptions(use_cache=False), params={"kc": zeros, "vc": zeros}
    )
    x = np.zeros((1, 3, 16), np.float32)
    kv = np.zeros((1, 3, 8), np.float32)
    with pytest.raises(InputError, match=r"max context 6, asked for 8"):
        c.run({"q": x, "k": kv, "v": kv, "positions": np.arange(5, 8)})
    with pytest.raises(InputError, match="consecutive"):
        c.run({"q": x, "k": kv, "v": kv, "positions": np.array([0, 2, 3])})


def test_cache_attention_refuses_a_caller_owned_cache() -> None:
    from rlx.errors import CompileError

    g = cache_graph(2, 1, 8, 6, 0)
    ro = np.zeros((1, 6, 8), np.float32)
    ro.flags.writeable = False  # shared in place: the kernel must not write it
    # refused when the kernel is built: at compile (the compile probe binds the given
    # params) or, at the latest, at the first run
    x, kv = np.zeros((1, 1, 16), np.float32), np.zeros((1, 1, 8), np.float32)
    with pytest.raises(CompileError, match="given by the caller"):
        c = Session("cpu").compile(g, CompileOptions(use_cache=False), params={"kc": ro, "vc": ro})
        c.run({"q": x, "k": kv, "v": kv, "positions": np.arange(1)})
    assert not ro.any()  # nothing was written


@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_0", "Q4_K", "Q6_K"])
def test_dequant_gather_matches_gguf_quants(type_name) -> None:
    gq = pytest.importorskip("gguf.quants")
    import gguf

    from rlx.formats import schemes

    qtype = gguf.GGMLQuantizationType[type_name]
    scheme = schemes.GGUF_SCHEMES[type_name]()
    rng = np.random.default_rng(1)
    n, k = 12, 512
    if type_name in ("Q8_0", "Q5_0"):  # what llama.cpp's quantizer writes
        w = rng.standard_normal((n, k)).astype(np.float32)
        packed = np.asarray(gq.quantize(w, qtype), np.uint8)
    else:  # any bytes are blocks (gguf.quants has no K-quant quantizer)
        bb = gguf.GGML_QUANT_SIZES[qtype][1]
        packed = rng.integers(0, 256, (n, k // 256 * bb), dtype=np.uint8)
    ids = np.array([[3, 0, 11], [3, 7, 5]], np.int64)
    want = gq.dequantize(packed, qtype)[ids]
    g = Graph("dg")
    wp = g.param("w", packed.shape, DType.U8)
    x = g.input("ids", (2, 3), DType.I64)
    g.set_outputs([g.dequant_gather(wp, x, scheme)])
    c = Session("cpu").compile(g, CompileOptions(use_cache=False), params={"w": packed})
    (out,) = c.run({"ids": ids})
    np.testing.assert_array_equal(out, want)
    from rlx.ops.base import RefCtx

    ref = DequantGather(scheme).reference([packed, ids], RefCtx(want.shape, out.dtype, {}, {}, {}))
    np.testing.assert_array_equal(ref, want)
    with pytest.raises(InputError, match="id 12 is outside the table of 12 rows"):
        c.run({"ids": np.full((2, 3), 12)})
