"""Differential fuzzing of the linear-algebra, recurrent, KV-cache and FFT ops (harness.py:
reference interpreter and compiled graph, every precision policy and native target)
against SciPy and explicit float64 loops written here from the ops' definitions:

* ``matmul`` (1-D operands, broadcast batch dims) and ``dot_general`` (any contracting
  and batch dims): a sum over explicit index loops; ``lora_matmul``, ``grouped_matmul``
  (per-row expert loop);
* ``dense_solve`` / ``batched_dense_solve``: ``scipy.linalg.solve`` per system, on
  diagonally dominant (well-conditioned) matrices;
* ``selective_scan`` (d, z, delta bias, softplus) and ``gated_delta_net`` (carry, output
  or final state): the recurrences as per-(batch, head, step) loops;
* ``cache_attention``: a compiled graph run over a prefill, decode steps and a chunk (its
  cache state carried by the runtime), from a random start position over random initial
  cache rows, f32 / f16 / bf16 caches (rows, q and the output rounded to the cache dtype
  as documented), grouped heads, sliding windows; the reference interpreter is fed the
  oracle's cache state at each step;
* ``slot_cache_attention``: steps of tokens spread over random slots (decode tokens of
  several slots and runs of consecutive positions in one slot, in random order) against
  per-token loops over the slot caches the oracle keeps, f32 / f16 / bf16 caches;
* ``fft`` (fft, ifft, rfft, irfft; every norm; crop / pad ``n``; any axis): explicit DFT
  sums.
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
import scipy.linalg
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.ops.base import OpKind
from rlx.ops.fft import Fft, FftKind, FftNorm
from rlx.ops.kvcache import CacheAttention, SlotCacheAttention
from rlx.ops.linalg import (
    BatchedDenseSolve,
    DenseSolve,
    DotGeneral,
    GroupedMatMul,
    LoraMatMul,
    MatMul,
)
from rlx.ops.recurrent import GatedDeltaNet, GdnResult, SelectiveScan

from .harness import SEEDS, WEIGHTS, Tol, check, compiled, examples, leaves

F32 = np.float32
COMPUTE = [OpKind.COMPUTE]
MM_TOL = Tol(2e-6, 2e-3, 1.6e-2)  # per unit of the sum of |terms|


def _dot_loops(a: np.ndarray, b: np.ndarray, lc, rc, lb, rb):
    """``dot_general`` by loops: out[batch, lhs free, rhs free] and the sum of |terms|."""
    lfree = [i for i in range(a.ndim) if i not in lc and i not in lb]
    rfree = [i for i in range(b.ndim) if i not in rc and i not in rb]
    bshape = [a.shape[i] for i in lb]
    out_shape = bshape + [a.shape[i] for i in lfree] + [b.shape[i] for i in rfree]
    out, mag = np.zeros(out_shape), np.zeros(out_shape)
    csizes = [a.shape[i] for i in lc]
    for idx in np.ndindex(*out_shape):
        bi, li, ri = (
            idx[: len(lb)],
            idx[len(lb) : len(lb) + len(lfree)],
            idx[len(lb) + len(lfree) :],
        )
        for ci in itertools.product(*(range(c) for c in csizes)):
            ia, ib = [0] * a.ndim, [0] * b.ndim
            for ax, v in zip(lb, bi, strict=True):
                ia[ax] = v
            for ax, v in zip(rb, bi, strict=True):
                ib[ax] = v
            for ax, v in zip(lfree, li, strict=True):
                ia[ax] = v
            for ax, v in zip(rfree, ri, strict=True):
                ib[ax] = v
            for axa, axb, v in zip(lc, rc, ci, strict=True):
                ia[axa], ib[axb] = v, v
            t = float(a[tuple(ia)]) * float(b[tuple(ib)])
            out[idx] += t
            mag[idx] += abs(t)
    return out, mag


@st.composite
def dot_cases(draw: st.DrawFn):
    nb, nc = draw(st.integers(0, 1)), draw(st.integers(1, 2))
    nlf, nrf = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    size = st.integers(1, 3)
    bsz = [draw(size) for _ in range(nb)]
    csz = [draw(size) for _ in range(nc)]
    la = draw(st.permutations(range(nb + nc + nlf)))
    ra = draw(st.permutations(range(nb + nc + nrf)))
    lb, lc = tuple(la[:nb]), tuple(la[nb : nb + nc])
    rb, rc = tuple(ra[:nb]), tuple(ra[nb : nb + nc])
    ash, bsh = [0] * len(la), [0] * len(ra)
    for axes, sizes in ((lb, bsz), (lc, csz)):
        for ax, s in zip(axes, sizes, strict=True):
            ash[ax] = s
    for axes, sizes in ((rb, bsz), (rc, csz)):
        for ax, s in zip(axes, sizes, strict=True):
            bsh[ax] = s
    ash = [s or draw(size) for s in ash]
    bsh = [s or draw(size) for s in bsh]
    return tuple(ash), tuple(bsh), lc, rc, lb, rb


@examples(12)
@given(case=dot_cases(), mm=st.sampled_from([None, "1d_lhs", "1d_rhs", "batched"]), seed=SEEDS)
def test_dot_general_and_matmul_match_loops(case, mm, seed) -> None:
    rng = np.random.default_rng(seed)
    if mm is not None:  # matmul's forms as dot_general cases of its own
        k = int(rng.integers(1, 5))
        ash = {"1d_lhs": (k,), "1d_rhs": (2, 3, k), "batched": (2, 1, 3, k)}[mm]
        bsh = {"1d_lhs": (2, k, 3), "1d_rhs": (k,), "batched": (4, k, 2)}[mm]
    else:
        ash, bsh, lc, rc, lb, rb = case
    a, b = rng.standard_normal(ash).astype(F32), rng.standard_normal(bsh).astype(F32)
    g = rlx.Graph("dot")
    ins = [g.input("a", ash), g.input("b", bsh)]
    g.set_outputs([g.apply(MatMul() if mm else DotGeneral(lc, rc, lb, rb), ins)])

    def run(rnd):
        ar, br = rnd(a), rnd(b)
        if mm is None:
            return _dot_loops(ar, br, lc, rc, lb, rb)
        a2 = ar[None] if ar.ndim == 1 else ar  # np.matmul's 1-D rules
        b2 = br[:, None] if br.ndim == 1 else br
        shape = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        a3 = np.broadcast_to(a2, shape + a2.shape[-2:])
        b3 = np.broadcast_to(b2, shape + b2.shape[-2:])
        outs = [_dot_loops(a3[i], b3[i], (1,), (0,), (), ()) for i in np.ndindex(*shape)]
        o = np.array([x[0] for x in outs]).reshape(shape + (a2.shape[-2], b2.shape[-1]))
        m = np.array([x[1] for x in outs]).reshape(o.shape)
        sq = [ax for ax, cond in ((-2, ar.ndim == 1), (-1, br.ndim == 1)) if cond]
        return (o.squeeze(tuple(sq)), m.squeeze(tuple(sq))) if sq else (o, m)

    check(
        g, {"a": a, "b": b}, {}, lambda r: [run(r)[0]], COMPUTE, MM_TOL, lambda r: [1 + run(r)[1]]
    )


@examples(10)
@given(
    m=st.integers(1, 6), k=st.sampled_from([1, 3, 9, 40]), n=st.sampled_from([1, 5, 33]), r=st.integers(1, 3),
    e=st.integers(1, 4), lead=st.sampled_from([(), (2,)]), scale=st.sampled_from([1.0, 0.25, 2.0]),
    weights=WEIGHTS, seed=SEEDS,
)  # fmt: skip
def test_lora_and_grouped_matmul_match_loops(m, k, n, r, e, lead, scale, weights, seed) -> None:
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(F32)  # noqa: E731
    feeds = {"x": f(*lead, m, k), "w": f(k, n), "a": f(k, r), "b": f(r, n),
             "xe": f(m, k), "we": f(e, k, n), "idx": rng.integers(0, e, m).astype(np.int32)}  # fmt: skip
    g = rlx.Graph("lora_grouped")
    i, inputs, params = leaves(g, feeds, () if weights == "inputs" else ("w", "a", "b", "we"))
    g.set_outputs([
        g.apply(LoraMatMul(scale), [i["x"], i["w"], i["a"], i["b"]]),
        g.apply(GroupedMatMul(), [i["xe"], i["we"], i["idx"]]),
    ])  # fmt: skip

    def run(rnd, fn=lambda v: v):
        x, w, a, b = (fn(rnd(feeds[nm])) for nm in "xwab")
        xe, we = fn(rnd(feeds["xe"])), fn(rnd(feeds["we"]))
        lora = np.zeros((*lead, m, n))
        for p in np.ndindex(*lead, m):
            for j in range(n):
                lora[p + (j,)] = sum(x[p + (t,)] * w[t, j] for t in range(k)) + scale * sum(
                    sum(x[p + (t,)] * a[t, q] for t in range(k)) * b[q, j] for q in range(r)
                )
        grouped = np.array([[sum(xe[row, t] * we[feeds["idx"][row], t, j] for t in range(k))
                             for j in range(n)] for row in range(m)])  # fmt: skip
        return [lora, grouped]

    mag = lambda r: [1 + v for v in run(r, np.abs)]  # noqa: E731
    check(g, inputs, params, run, COMPUTE, MM_TOL, mag, freeze_params=weights == "frozen")


@examples(10)
@given(
    n=st.integers(1, 5), rhs=st.sampled_from([None, 1, 3]), batch=st.sampled_from([(2,), (2, 3)]),
    seed=SEEDS,
)  # fmt: skip
def test_dense_solves_match_scipy(n, rhs, batch, seed) -> None:
    rng = np.random.default_rng(seed)

    def system(*lead):
        a = rng.uniform(-1, 1, (*lead, n, n)) + np.eye(n) * (n + 1)  # diagonally dominant
        b = rng.standard_normal((*lead, n) if rhs is None else (*lead, n, rhs))
        return a.astype(F32), b.astype(F32)

    (a, b), (ab, bb) = system(), system(*batch)
    g = rlx.Graph("solve")
    g.set_outputs([
        g.apply(DenseSolve(), [g.input("a", a.shape), g.input("b", b.shape)]),
        g.apply(BatchedDenseSolve(), [g.input("ab", ab.shape), g.input("bb", bb.shape)]),
    ])  # fmt: skip

    def oracle(rnd):
        one = scipy.linalg.solve(rnd(a), rnd(b))
        many = np.empty(bb.shape)
        for i in np.ndindex(*batch):
            many[i] = scipy.linalg.solve(rnd(ab[i]), rnd(bb[i]))
        return [one, many]

    # cond(A) <= 3: a relative perturbation u of A and b moves x by about 6u
    check(
        g, {"a": a, "b": b, "ab": ab, "bb": bb}, {}, oracle, COMPUTE, Tol(1e-5, 4e-3, 3e-2), "max"
    )


def _softplus(v: float) -> float:
    return v + math.log1p(math.exp(-v)) if v > 0 else math.log1p(math.exp(v))


@examples(10)
@given(
    b=st.integers(1, 2), s=st.integers(1, 6), h=st.sampled_from([1, 3, 17]), n=st.sampled_from([1, 4, 16]),
    opts=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()), seed=SEEDS,
)  # fmt: skip
def test_selective_scan_matches_loops(b, s, h, n, opts, seed) -> None:
    has_d, has_z, has_bias, softplus = opts
    rng = np.random.default_rng(seed)
    f = lambda *sh: rng.standard_normal(sh).astype(F32)  # noqa: E731
    feeds = {"x": f(b, s, h), "delta": rng.uniform(0.05, 1.0, (b, s, h)).astype(F32),
             "a": -rng.uniform(0.1, 2.0, (h, n)).astype(F32), "b": f(b, s, n), "c": f(b, s, n)}  # fmt: skip
    if has_d:
        feeds["d"] = f(h)
    if has_z:
        feeds["z"] = f(b, s, h)
    if has_bias:
        feeds["db"] = rng.uniform(-0.2, 0.2, h).astype(F32)
    g = rlx.Graph("selective_scan")
    op = SelectiveScan(n, has_d, has_z, has_bias, softplus)
    g.set_outputs([g.apply(op, [g.input(k, v.shape) for k, v in feeds.items()])])

    def oracle(rnd):
        v = {k: rnd(a) for k, a in feeds.items()}
        y = np.zeros((b, s, h))
        for bi, hi in itertools.product(range(b), range(h)):
            state = [0.0] * n
            for t in range(s):
                dt = v["delta"][bi, t, hi] + (v["db"][hi] if has_bias else 0.0)
                dt = _softplus(dt) if softplus else dt
                for j in range(n):
                    state[j] = math.exp(dt * v["a"][hi, j]) * state[j] + dt * v["b"][bi, t, j] * v["x"][bi, t, hi]  # fmt: skip
                out = sum(v["c"][bi, t, j] * state[j] for j in range(n))
                out += v["d"][hi] * v["x"][bi, t, hi] if has_d else 0.0
                if has_z:
                    zz = v["z"][bi, t, hi]
                    out *= zz / (1 + math.exp(-zz))
                y[bi, t, hi] = out
        return [y]

    check(g, feeds, {}, oracle, [OpKind.REDUCTION], Tol(2e-5, 8e-3, 6e-2), "max")


@examples(10)
@given(
    b=st.integers(1, 2), t=st.integers(1, 5), h=st.integers(1, 2), dk=st.sampled_from([1, 4, 16]),
    dv=st.sampled_from([1, 3, 17]), carry=st.booleans(), final=st.booleans(), seed=SEEDS,
)  # fmt: skip
def test_gated_delta_net_matches_loops(b, t, h, dk, dv, carry, final, seed) -> None:
    rng = np.random.default_rng(seed)
    f = lambda *sh: rng.standard_normal(sh).astype(F32)  # noqa: E731
    k = f(b, t, h, dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # L2-normalised keys, as Qwen3-Next
    feeds = {"q": f(b, t, h, dk), "k": k, "v": f(b, t, h, dv),
             "g": -rng.uniform(0, 1, (b, t, h)).astype(F32),
             "beta": rng.uniform(0, 1, (b, t, h)).astype(F32)}  # fmt: skip
    if carry:
        feeds["state"] = f(b, h, dk, dv)
    g = rlx.Graph("gdn")
    op = GatedDeltaNet(dk, carry, GdnResult.FINAL_STATE if final else GdnResult.OUTPUT)
    g.set_outputs([g.apply(op, [g.input(nm, a.shape) for nm, a in feeds.items()])])

    def oracle(rnd):
        v = {nm: rnd(a) for nm, a in feeds.items()}
        out, fin = np.zeros((b, t, h, dv)), np.zeros((b, h, dk, dv))
        for bi, hi in itertools.product(range(b), range(h)):
            st_ = v["state"][bi, hi].copy() if carry else np.zeros((dk, dv))
            for i in range(t):
                st_ = st_ * math.exp(v["g"][bi, i, hi])
                kt = v["k"][bi, i, hi]
                for c in range(dv):
                    recalled = sum(st_[r, c] * kt[r] for r in range(dk))
                    delta = (v["v"][bi, i, hi, c] - recalled) * v["beta"][bi, i, hi]
                    for r in range(dk):
                        st_[r, c] += kt[r] * delta
                for c in range(dv):
                    out[bi, i, hi, c] = sum(st_[r, c] * v["q"][bi, i, hi, r] for r in range(dk)) / math.sqrt(dk)  # fmt: skip
            fin[bi, hi] = st_
        return [fin if final else out]

    check(g, feeds, {}, oracle, [OpKind.REDUCTION], Tol(2e-5, 8e-3, 6e-2), "max")


CACHE_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.mark.slow  # about 1 s with a warm native cache, 50 s with a cold one (9 kernels x 3 targets)
@examples(8)
@given(
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2), (2, 2)]), d=st.sampled_from([1, 4, 8, 64]),
    window=st.sampled_from([0, 0, 1, 3]), dt=st.sampled_from(list(CACHE_DTYPES)),
    start=st.sampled_from([0, 1, 4, 40]), chunks=st.lists(st.sampled_from([1, 1, 2, 4, 19]), min_size=1, max_size=4),
    scale=st.sampled_from([None, 0.3]), seed=SEEDS,
)  # fmt: skip
def test_cache_attention_steps_match_loops(
    heads, d, window, dt, start, chunks, scale, seed
) -> None:
    h, hkv = heads
    cap = start + sum(chunks) + 1
    rng = np.random.default_rng(seed)
    cdt = CACHE_DTYPES[dt]
    g = rlx.Graph("cache_attention")
    seq = g.sym("seq", max=cap)
    q, k, v = (g.input(nm, (1, seq, w * d)) for nm, w in (("q", h), ("k", hkv), ("v", hkv)))
    pos = g.input("positions", (seq,), "i64")
    kc, vc = (g.param(nm, (1, cap, hkv * d), dt) for nm in ("kc", "vc"))
    g.set_outputs([g.apply(CacheAttention(h, d, hkv, window, scale), [q, k, v, kc, vc, pos])])
    init = {nm: rng.standard_normal((1, cap, hkv * d)).astype(cdt) for nm in ("kc", "vc")}
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    steps, p = [], start
    for n in chunks:
        f = lambda w: rng.standard_normal((1, n, w * d)).astype(F32)  # noqa: E731, B023
        steps.append({"q": f(h), "k": f(hkv), "v": f(hkv), "positions": np.arange(p, p + n)})
        p += n

    def oracle_steps():
        """(cache state before the step, the step's output), in f64 with the documented
        roundings to the cache dtype."""
        kcache, vcache = (init[nm].astype(np.float64)[0] for nm in ("kc", "vc"))
        for feed in steps:
            p0, n = int(feed["positions"][0]), feed["q"].shape[1]
            before = {"kc": kcache.astype(cdt)[None], "vc": vcache.astype(cdt)[None]}
            kcache[p0 : p0 + n] = feed["k"][0].astype(cdt).astype(np.float64)
            vcache[p0 : p0 + n] = feed["v"][0].astype(cdt).astype(np.float64)
            qr = feed["q"][0].astype(cdt).astype(np.float64)
            out = np.zeros((n, h * d))
            for i, hh in itertools.product(range(n), range(h)):
                kv, at = hh // (h // hkv), p0 + i
                keys = [j for j in range(at + 1) if not window or j > at - window]
                s = [sc * float(qr[i, hh * d : (hh + 1) * d] @ kcache[j, kv * d : (kv + 1) * d]) for j in keys]  # fmt: skip
                e = [math.exp(x - max(s)) for x in s]
                for j, w in zip(keys, e, strict=True):
                    out[i, hh * d : (hh + 1) * d] += w / sum(e) * vcache[j, kv * d : (kv + 1) * d]
            yield before, out.astype(cdt).astype(np.float64)[None]

    t = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2}[dt]  # one rounding to the cache dtype
    want = list(oracle_steps())
    for (before, w), feed in zip(want, steps, strict=True):
        (got,) = g.evaluate(feed, before)
        np.testing.assert_allclose(got, w, rtol=t, atol=t, err_msg="reference")
    for var in compiled(g, init, COMPUTE):  # the caches are params the kernel writes
        for i, ((_, w), feed) in enumerate(zip(want, steps, strict=True)):
            (got,) = var.cg.run(feed)
            np.testing.assert_allclose(got, w, rtol=t, atol=t, err_msg=f"{var.label} step {i}")


def slot_attention_loops(q, kc, vc, pos, slots, h, d, hkv, window, scale, cdt):
    """f64 per-token loops: every token's k / v row is written into its slot (``kc`` /
    ``vc`` f64 ``[SLOTS, C, Hkv*D]``, updated in place; the rows rounded to the cache
    dtype by the caller), then token ``t`` attends over rows ``j <= pos[t]`` (and
    ``j > pos[t] - window``) of its slot; q and the output rounded to the cache dtype."""
    qr = q.astype(cdt).astype(np.float64)
    out = np.zeros(qr.shape)
    for t, hh in itertools.product(range(len(pos)), range(h)):
        sl, at, kv = int(slots[t]), int(pos[t]), hh // (h // hkv)
        keys = [j for j in range(at + 1) if not window or j > at - window]
        s = [scale * float(qr[t, hh * d : (hh + 1) * d] @ kc[sl, j, kv * d : (kv + 1) * d]) for j in keys]  # fmt: skip
        e = [math.exp(x - max(s)) for x in s]
        for j, w in zip(keys, e, strict=True):
            out[t, hh * d : (hh + 1) * d] += w / sum(e) * vc[sl, j, kv * d : (kv + 1) * d]
    return out.astype(cdt).astype(np.float64)


@pytest.mark.slow  # the attention kernels of every target (shared with cache_attention's)
@examples(8)
@given(
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2)]), d=st.sampled_from([1, 4, 8, 64]),
    window=st.sampled_from([0, 0, 2]), dt=st.sampled_from(list(CACHE_DTYPES)),
    nslots=st.sampled_from([1, 2, 3]), scale=st.sampled_from([None, 0.3]), seed=SEEDS,
)  # fmt: skip
def test_slot_cache_attention_matches_loops(heads, d, window, dt, nslots, scale, seed) -> None:
    h, hkv = heads
    cap = 12
    rng = np.random.default_rng(seed)
    cdt = CACHE_DTYPES[dt]
    g = rlx.Graph("slot_cache_attention")
    tok = g.sym("tokens", max=cap * nslots)
    q, k, v = (g.input(nm, (1, tok, w * d)) for nm, w in (("q", h), ("k", hkv), ("v", hkv)))
    pos, sl = (g.input(nm, (tok,), "i64") for nm in ("positions", "slots"))
    kc, vc = (g.param(nm, (nslots, cap, hkv * d), dt) for nm in ("kc", "vc"))
    op = SlotCacheAttention(h, d, hkv, window, scale)
    g.set_outputs([g.apply(op, [q, k, v, kc, vc, pos, sl])])
    init = {nm: rng.standard_normal((nslots, cap, hkv * d)).astype(cdt) for nm in ("kc", "vc")}
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    length = rng.integers(0, 4, nslots)  # tokens already in each slot
    steps = []
    for _ in range(3):  # each step: some slots, each a run of 1-3 new tokens, shuffled
        runs = []
        for s_ in rng.permutation(nslots)[: rng.integers(1, nslots + 1)]:
            n = int(rng.integers(1, 4))
            runs.append((int(s_), np.arange(length[s_], length[s_] + n)))
            length[s_] += n
        f = lambda w, n: rng.standard_normal((1, n, w * d)).astype(F32)  # noqa: E731, B023
        t = sum(len(r[1]) for r in runs)
        steps.append({"q": f(h, t), "k": f(hkv, t), "v": f(hkv, t),
                      "positions": np.concatenate([r[1] for r in runs]),
                      "slots": np.concatenate([np.full(len(r[1]), r[0]) for r in runs])})  # fmt: skip
    want, kcache, vcache = [], init["kc"].astype(np.float64), init["vc"].astype(np.float64)
    for feed in steps:
        before = {"kc": kcache.astype(cdt), "vc": vcache.astype(cdt)}
        p_, s_ = feed["positions"], feed["slots"]
        kcache[s_, p_] = feed["k"][0].astype(cdt).astype(np.float64)
        vcache[s_, p_] = feed["v"][0].astype(cdt).astype(np.float64)
        out = slot_attention_loops(feed["q"][0], kcache, vcache, p_, s_, h, d, hkv, window, sc, cdt)
        want.append((before, out[None]))
    t = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2}[dt]  # one rounding to the cache dtype
    for (before, w), feed in zip(want, steps, strict=True):
        (got,) = g.evaluate(feed, before)
        np.testing.assert_allclose(got, w, rtol=t, atol=t, err_msg="reference")
    for var in compiled(g, init, COMPUTE):  # the caches are params the kernel writes
        for i, ((_, w), feed) in enumerate(zip(want, steps, strict=True)):
            (got,) = var.cg.run(feed)
            np.testing.assert_allclose(got, w, rtol=t, atol=t, err_msg=f"{var.label} step {i}")


def _dft(x: np.ndarray, inverse: bool) -> np.ndarray:
    n = x.shape[-1]
    sign = 1.0 if inverse else -1.0
    w = np.array([[complex(math.cos(2 * math.pi * j * k / n), sign * math.sin(2 * math.pi * j * k / n))
                   for j in range(n)] for k in range(n)])  # fmt: skip
    return x @ w.T


def _fit(x: np.ndarray, n: int) -> np.ndarray:
    """Crop or zero-pad the last axis to ``n``."""
    if x.shape[-1] >= n:
        return x[..., :n]
    return np.concatenate([x, np.zeros((*x.shape[:-1], n - x.shape[-1]), x.dtype)], -1)


@examples(12)
@given(
    fn=st.sampled_from(list(FftKind)), norm=st.sampled_from(list(FftNorm)),
    shape=st.sampled_from([(6,), (2, 5), (3, 4, 2), (2, 64)]), n=st.sampled_from([None, 1, 3, 8, 50]),
    data=st.data(), seed=SEEDS,
)  # fmt: skip
def test_fft_matches_dft_sums(fn, norm, shape, n, data, seed) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(seed)
    complex_in = fn is not FftKind.RFFT
    x = rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if complex_in else 0)
    x = x.astype(np.complex64 if complex_in else F32)
    g = rlx.Graph("fft")
    g.set_outputs([g.apply(Fft(fn, norm, n, axis), [g.input("x", shape, "c64" if complex_in else "f32")])])  # fmt: skip
    xm = np.moveaxis(x.astype(np.complex128), axis, -1)
    m = xm.shape[-1]
    size = n if n is not None else (2 * (m - 1) if fn is FftKind.IRFFT else m)
    inverse = fn in (FftKind.IFFT, FftKind.IRFFT)
    factor = {FftNorm.BACKWARD: 1 / size if inverse else 1.0, FftNorm.ORTHO: 1 / math.sqrt(size),
              FftNorm.FORWARD: 1.0 if inverse else 1 / size}[norm]  # fmt: skip
    if fn is FftKind.IRFFT:  # Hermitian extension of the first size//2 + 1 bins
        half = _fit(xm, size // 2 + 1)
        full = np.zeros((*xm.shape[:-1], size), complex)
        full[..., : size // 2 + 1] = half
        for kk in range(size // 2 + 1, size):
            full[..., kk] = np.conj(half[..., size - kk])
        full[..., 0] = full[..., 0].real
        if size % 2 == 0:
            full[..., size // 2] = full[..., size // 2].real
        y = (_dft(full, True) * factor).real
    else:
        y = _dft(_fit(xm, size), inverse) * factor
        if fn is FftKind.RFFT:
            y = y[..., : size // 2 + 1]
    want = np.moveaxis(y, -1, axis)
    mag = 2 * float(np.abs(xm).sum(-1).max()) * factor + 1  # the sum of |terms|, twice
    t = 2e-6
    check(g, {"x": x}, {}, [want], COMPUTE, Tol(t, t, t), [mag])
