"""Arena kernels for the ops that used to run their NumPy reference on the CPU backend:
fft, topk, gated_delta_net, integer matmul / dot_general, integer pow, If / While /
Scan. Each compiled result is checked against an independent oracle (NumPy, a loop) or
the reference interpreter where the reference's exact semantics are the point (ties,
NaN, wrap-around), the report must name the new kernel (not ``reference``), and the
kernel closures must not allocate per run (tracemalloc over the schedule)."""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx import DType, Shape
from rlx.backends.cpu.kernels import KernelKind
from rlx.errors import InputError
from rlx.ops.recurrent import GdnResult, gated_delta_rule

RNG = np.random.default_rng(11)
SESSION = rlx.Session("cpu")


def _compile(build, **arrays):
    g = rlx.Graph("k")
    ids = {k: g.input(k, v.shape, DType.from_numpy(v.dtype)) for k, v in arrays.items()}
    outs = build(g, **ids)
    g.set_outputs(list(outs) if isinstance(outs, (list, tuple)) else [outs])
    return g, SESSION.compile(g)


def _check(build, kinds=None, **arrays):
    """Compiled == reference (exactly, NaN == NaN); no reference kernel; returns both."""
    g, cg = _compile(build, **arrays)
    ref = g.evaluate(arrays)
    got = cg.run(arrays)
    for r, c in zip(ref, got, strict=True):
        assert c.dtype == r.dtype and c.shape == r.shape
        if c.dtype.name == "bfloat16":  # NaN == NaN only once NumPy sees a float dtype
            c, r = c.astype(np.float32), r.astype(np.float32)
        np.testing.assert_array_equal(c, r)
    rep = cg.report()
    used = {k.kind for k in rep.kernels if k.view_of is None}
    assert KernelKind.REFERENCE not in used, str(rep)
    if kinds is not None:
        assert used <= kinds, used
    return ref, got, cg


def _schedule_allocations(cg, feed):
    """Peak bytes NumPy allocates while the compiled schedule's closures run (inputs
    already in the arena, outputs not copied out)."""
    cg.run(feed)
    ex = cg._last  # the executor of that run
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        for f in ex.schedule:
            f()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


# ---- fft -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "shape", "n", "axis", "norm"),
    [
        ("fft", (4, 16), None, -1, "backward"),
        ("ifft", (6, 5), 8, 0, "ortho"),
        ("rfft", (3, 20), 15, -1, "forward"),
        ("rfft", (7, 3, 2), 12, 0, "backward"),
        ("irfft", (2, 9), None, -1, "backward"),
        ("irfft", (5, 4), 11, 0, "ortho"),
        ("irfft", (2, 3), 12, 1, "backward"),
    ],
)
def test_fft_kernel_matches_numpy(fn, shape, n, axis, norm):
    if fn in ("rfft",):
        x = RNG.standard_normal(shape).astype(np.float32)
    else:
        x = (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex64)
    _, (got,), cg = _check(lambda g, x: getattr(g, fn)(x, n=n, axis=axis, norm=norm), x=x)
    want = getattr(np.fft, fn)(
        x.astype(np.complex128 if x.dtype.kind == "c" else np.float64), n=n, axis=axis, norm=norm
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    if fn != "irfft":
        assert _schedule_allocations(cg, {"x": x}) < 4096


# ---- topk ----------------------------------------------------------------------------

TOPK_DTYPES = ["f32", "f16", "bf16", "f64", "i8", "i32", "u8", "u32", "i64"]


def _values(dt, shape):
    if dt in ("f32", "f16", "bf16", "f64"):
        x = RNG.integers(-4, 4, shape).astype(np.float32)  # many ties
        x.flat[::7] = np.nan
        x.flat[1::11] = -0.0
        x.flat[2::13] = -np.inf
        return x.astype(DType.parse(dt).np)
    info = np.iinfo(DType.parse(dt).np)
    lo, hi = max(int(info.min), -(2**40)), min(int(info.max), 2**40)
    x = RNG.integers(lo, hi, shape, dtype=np.int64)
    x.flat[::5] = lo
    x.flat[1::5] = hi
    x.flat[2::3] = 0
    return x.astype(DType.parse(dt).np)


@pytest.mark.parametrize("dt", TOPK_DTYPES)
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize(
    ("shape", "k", "axis"),
    [((5, 17), 4, -1), ((9, 3, 2), 9, 0), ((6, 8), 1, 0), ((11,), 3, 0), ((3, 7, 4), 2, 1)],
)
def test_topk_kernel_matches_the_reference_order(dt, largest, shape, k, axis):
    x = _values(dt, shape)
    (vals, idx), _, cg = _check(lambda g, x: g.topk(x, k, axis, largest), x=x)
    # independent oracle: a Python sort of (key, index) per line, NaN largest
    xs = np.moveaxis(x.astype(np.float64) if x.dtype.kind == "f" or dt == "bf16" else x, axis, -1)
    want = np.empty(xs.shape[:-1] + (k,), np.int64)
    for pos in np.ndindex(*xs.shape[:-1]):
        line = xs[pos].tolist()  # Python numbers: no wrap-around in -v

        def key(i, line=line):
            v = line[i]
            big = v != v  # NaN counts as the largest value
            return ((not big, -v if not big else 0) if largest else (big, v if not big else 0), i)

        want[pos] = sorted(range(len(line)), key=key)[:k]
    np.testing.assert_array_equal(np.moveaxis(idx, axis, -1), want)
    if x.dtype.itemsize <= 4:
        assert _schedule_allocations(cg, {"x": x}) < 4096


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 40),
    rows=st.integers(1, 4),
    seed=st.integers(0, 2**31),
    largest=st.booleans(),
    data=st.data(),
)
def test_topk_kernel_random(n, rows, seed, largest, data):
    k = data.draw(st.integers(0, n))
    x = np.random.default_rng(seed).standard_normal((rows, n)).astype(np.float32)
    x = np.round(x, 1)  # ties
    _check(lambda g, x: g.topk(x, k, -1, largest), x=x)


# ---- gated delta net -------------------------------------------------------------------


def _gdn_inputs(dtype, b=2, t=5, h=3, dk=4, dv=6):
    k = RNG.standard_normal((b, t, h, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return {
        "q": RNG.standard_normal((b, t, h, dk)).astype(dtype),
        "k": k.astype(dtype),
        "v": RNG.standard_normal((b, t, h, dv)).astype(dtype),
        "g": -RNG.random((b, t, h)).astype(dtype),
        "beta": RNG.random((b, t, h)).astype(dtype),
        "state": RNG.standard_normal((b, h, dk, dv)).astype(dtype),
    }


def _gdn_loop(q, k, v, g, beta, state):
    """The recurrence per (batch, head), one step at a time, in f64."""
    b, t, h, dk = k.shape
    o = np.zeros(v.shape)
    s_all = np.array(state, np.float64)
    for bi in range(b):
        for hi in range(h):
            s = s_all[bi, hi]
            for i in range(t):
                s = np.exp(g[bi, i, hi]) * s
                kt = k[bi, i, hi].astype(np.float64)
                s = s + np.outer(kt, beta[bi, i, hi] * (v[bi, i, hi] - s.T @ kt))
                o[bi, i, hi] = s.T @ q[bi, i, hi] / np.sqrt(dk)
            s_all[bi, hi] = s
    return o, s_all


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("returns", list(GdnResult))
@pytest.mark.parametrize("carry", [True, False])
def test_gated_delta_net_kernel(dtype, returns, carry):
    feed = _gdn_inputs(dtype)
    if not carry:
        del feed["state"]

    def build(g, q, k, v, g_, beta, state=None):
        return g.gated_delta_net(q, k, v, g_, beta, state, returns=returns)

    gr = rlx.Graph("gdn")
    ids = {n: gr.input(n, a.shape, DType.from_numpy(a.dtype)) for n, a in feed.items()}
    gr.set_outputs(
        [build(gr, ids["q"], ids["k"], ids["v"], ids["g"], ids["beta"], ids.get("state"))]
    )
    cg = SESSION.compile(gr)
    (got,) = cg.run(feed)
    (ref,) = gr.evaluate(feed)
    assert {k.kind for k in cg.report().kernels} == {KernelKind.BLAS}
    st0 = feed.get("state", np.zeros((2, 3, 4, 6)))
    o, s = _gdn_loop(*(feed[n].astype(np.float64) for n in ("q", "k", "v", "g", "beta")), st0)
    want = s if returns is GdnResult.FINAL_STATE else o
    tol = 2e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol)
    ref_o, ref_s = gated_delta_rule(
        *(feed[n] for n in ("q", "k", "v", "g", "beta")), feed.get("state")
    )
    assert got.shape == (ref_s if returns is GdnResult.FINAL_STATE else ref_o).shape
    assert _schedule_allocations(cg, feed) < 4096


# ---- integer matmul / dot_general --------------------------------------------------------


@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32])
@pytest.mark.parametrize(
    ("sa", "sb"), [((5, 7), (7, 3)), ((2, 4, 6), (6, 5)), ((3, 2, 4), (3, 4, 2)), ((6,), (6, 2))]
)
def test_int_matmul_wraps_like_numpy(dt, sa, sb):
    info = np.iinfo(dt)
    a = RNG.integers(info.min, info.max, sa, dtype=np.int64, endpoint=True).astype(dt)
    b = RNG.integers(info.min, info.max, sb, dtype=np.int64, endpoint=True).astype(dt)
    a.flat[0], b.flat[0] = info.max, info.max  # overflow in the first dot product
    (got,), _, cg = _check(lambda g, a, b: g.matmul(a, b), a=a, b=b)
    # oracle: Python ints, reduced modulo 2**bits into the dtype
    want = np.matmul(a.astype(object), b.astype(object))
    bits = 8 * np.dtype(dt).itemsize
    wrap = np.vectorize(lambda v: ((int(v) - int(info.min)) % (1 << bits)) + int(info.min))
    np.testing.assert_array_equal(got, wrap(want).astype(dt))
    assert _schedule_allocations(cg, {"a": a, "b": b}) < 4096


def test_int_matmul_paths_in_the_report():
    """int8: one exact f64 product; int32: four exact products of 16-bit halves; int64:
    NumPy's integer loop."""
    a = RNG.integers(-128, 128, (4, 8)).astype(np.int8)
    for dt, kind, note in (
        (np.int8, KernelKind.BLAS, "exact below 2**53"),
        (np.int32, KernelKind.BLAS, "16-bit halves"),
        (np.int64, KernelKind.NUMPY, ""),
    ):
        x = a.astype(dt) * (70001 if dt != np.int8 else 1)
        _, _, cg = _check(lambda g, a, b: g.matmul(a, b), a=x, b=x.T.copy())
        rec = [k for k in cg.report().kernels if k.op == "matmul"][0]
        assert rec.kind is kind and note in " ".join(rec.notes)


@pytest.mark.parametrize("dt", [np.int16, np.int32])
def test_int_dot_general(dt):
    a = RNG.integers(-300, 300, (3, 4, 5)).astype(dt)
    b = RNG.integers(-300, 300, (5, 3, 2)).astype(dt)

    def build(g, a, b):
        return g.dot_general(a, b, ((2,), (0,)), ((0,), (1,)))

    (got,), _, _ = _check(build, a=a, b=b)
    want = np.einsum("bik,kbj->bij", a.astype(np.int64), b.astype(np.int64)).astype(dt)
    np.testing.assert_array_equal(got, want)


# ---- integer pow -------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32])
def test_int_pow_edge_cases(dt):
    signed = np.dtype(dt).kind == "i"
    base = [0, 0, 1, 1, 2, 3, 7, 100]
    expo = [0, 3, 0, 9, 7, 40, 2, 5]
    if signed:
        base += [0, 1, -1, -1, -1, 2, -2, -3, -5, 5]
        expo += [-1, -4, -3, -2, 0, -1, 3, 5, 33, -7]
    a, b = np.array(base, dt), np.array(expo, dt)
    (got,), _, cg = _check(lambda g, a, b: g.pow(a, b), a=a, b=b)
    bits = 8 * np.dtype(dt).itemsize
    lo = -(1 << (bits - 1)) if signed else 0

    def oracle(x, e):  # Python ints: truncated reciprocal for e < 0, then wrap
        if e < 0:
            v = 1 if x == 1 else ((-1 if e % 2 else 1) if x == -1 else 0)
        else:
            v = x**e
        return ((v - lo) % (1 << bits)) + lo

    np.testing.assert_array_equal(got, np.array([oracle(int(x), int(e)) for x, e in zip(a, b)], dt))
    assert _schedule_allocations(cg, {"a": a, "b": b}) < 4096


def test_int_pow_broadcast_and_in_place():
    a = RNG.integers(-4, 5, (3, 5)).astype(np.int32)
    b = np.array([-2, -1, 0, 1, 3], np.int32)
    # (a ** b) + a: the pow's output may take a's slot when a dies there
    _check(lambda g, a, b: g.add(g.pow(g.neg(a), b), b), a=a, b=b)


def test_int_pow_without_negative_exponents_wraps():
    a = np.array([3, -3, 7, 0, -1, 2], np.int32)
    b = np.array([21, 21, 12, 0, 7, 31], np.int32)
    (got,), _, _ = _check(lambda g, a, b: g.pow(a, b), a=a, b=b)
    want = [((int(x) ** int(e) + 2**31) % 2**32) - 2**31 for x, e in zip(a, b)]
    np.testing.assert_array_equal(got, np.array(want, np.int32))


def test_float_pow_edge_cases_match_numpy():
    a = np.array([0.0, 0.0, -2.0, -2.0, np.inf, np.nan, 1.0, -0.0], np.float32)
    b = np.array([0.0, -1.0, 3.0, 0.5, -1.0, 0.0, np.nan, -3.0], np.float32)
    (got,), _, _ = _check(lambda g, a, b: g.pow(a, b), a=a, b=b)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, np.power(a, b))


# ---- control flow ------------------------------------------------------------------------


def test_if_kernel_runs_the_taken_branch():
    x = RNG.standard_normal((4,)).astype(np.float32)
    for p in (True, False):
        pred = np.array([p])

        def build(g, p, x):
            return g.cond(p, lambda s, a: s.mul(a, 2.0), lambda s, a: s.exp(a), [x])

        (got,), _, cg = _check(build, p=pred, x=x)
        np.testing.assert_allclose(got, x * 2 if p else np.exp(x), rtol=1e-6)
        notes = " ".join(n for k in cg.report().kernels for n in k.notes)
        assert "then: compiled sub-program" in notes


def test_while_kernel_counts_and_respects_max_iterations():
    def build(g, i, acc):
        return g.while_loop(
            lambda s, i, a: s.lt(i, s.constant(np.int32(10))),
            lambda s, i, a: [s.add(i, s.constant(np.int32(1))), s.add(a, s.cast(i, "f32"))],
            [i, acc],
            output_index=1,
        )

    feed = {"i": np.array(0, np.int32), "acc": np.array(0.5, np.float32)}
    (got,), _, cg = _check(build, **feed)
    assert float(got) == 0.5 + sum(range(10))
    assert _schedule_allocations(cg, feed) < 4096

    g = rlx.Graph("w")
    i = g.input("i", Shape((), DType.I32))
    g.set_outputs(
        [
            g.while_loop(
                lambda s, i: s.lt(i, s.constant(np.int32(10))),
                lambda s, i: s.add(i, s.constant(np.int32(1))),
                [i],
                max_iterations=3,
            )
        ]
    )
    with pytest.raises(InputError, match="max_iterations=3"):
        SESSION.compile(g).run({"i": np.array(0, np.int32)})


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("output_index", [0, 1])
def test_scan_kernel_against_a_loop(reverse, output_index):
    c0 = RNG.standard_normal((3,)).astype(np.float32)
    xs = RNG.standard_normal((6, 3)).astype(np.float32)

    def body(s, c, x):
        h = s.tanh(s.add(s.mul(c, 0.5), x))
        return [h, s.mul(h, 2.0)]

    (got,), _, cg = _check(
        lambda g, c, xs: g.scan(body, [c], [xs], output_index=output_index, reverse=reverse),
        c=c0,
        xs=xs,
    )
    c, ys = c0.copy(), np.zeros_like(xs)
    for t in range(5, -1, -1) if reverse else range(6):
        c = np.tanh(c * np.float32(0.5) + xs[t])
        ys[t] = c * 2
    np.testing.assert_allclose(got, c if output_index == 0 else ys, rtol=1e-6)
    assert _schedule_allocations(cg, {"c": c0, "xs": xs}) < 4096


def test_nested_control_flow_and_a_symbolic_scan_length():
    g = rlx.Graph("n")
    t = g.sym("t", max=16)
    xs = g.input("xs", Shape((t, 2), DType.F32))
    c = g.input("c", Shape((2,), DType.F32))

    def body(s, c, x):
        p = s.gt(s.sum(x), s.constant(np.float32(0)))
        p = s.reshape(p, [1])
        return [s.cond(p, lambda b, u, v: b.add(u, v), lambda b, u, v: b.sub(u, v), [c, x])]

    g.set_outputs([g.scan(body, [c], [xs])])
    cg = SESSION.compile(g)
    for n in (1, 5, 9):
        x = RNG.standard_normal((n, 2)).astype(np.float32)
        c0 = np.zeros(2, np.float32)
        (got,) = cg.run({"xs": x, "c": c0})
        want = c0.copy()
        for row in x:
            want = want + row if row.sum() > 0 else want - row
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert KernelKind.REFERENCE not in {k.kind for k in cg.report().kernels}
