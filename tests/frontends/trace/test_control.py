"""rlx.cond / rlx.while_loop / rlx.scan against plain Python control flow."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
import rlx.numpy as rnp
from rlx.errors import TraceError

f32 = np.float32


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(f32)


@settings(max_examples=10)
@given(s=st.floats(-2, 2, width=32))
def test_cond_vs_python_if(s):
    @rlx.jit
    def f(x, w):
        return rlx.cond(x.sum() > 0, lambda a: a @ w, lambda a: a * 2.0 - 1.0, x)

    x = rand(2, 3) * 0 + f32(s)
    w = rand(3, 3, seed=1)
    want = x @ w if x.sum() > 0 else x * 2 - 1
    np.testing.assert_allclose(f(x, w), want, rtol=1e-5, atol=1e-6)
    assert f.trace_count == 1


def test_cond_pytrees_captures_and_weak_branches():
    @rlx.jit
    def f(p, x, y):
        def yes(a, b):
            return {"s": a + y, "t": (b * 2.0, 1.0)}  # y captured from outside

        def no(a, b):
            return {"s": a - 1.0, "t": (b, a.sum())}

        return rlx.cond(p, yes, no, x, x[0])

    x, y = rand(2, 3), rand(2, 3, seed=2)
    for p in (True, False):
        out = f(np.bool_(p), x, y)
        if p:
            want = {"s": x + y, "t": (x[0] * 2, 1.0)}
        else:
            want = {"s": x - 1, "t": (x[0], x.sum())}
        np.testing.assert_allclose(out["s"], want["s"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out["t"][0], want["t"][0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out["t"][1], want["t"][1], rtol=1e-5)
    assert f.lower(np.bool_(True), x, y).graph.find(rlx.ops.control.If)


def test_cond_with_a_python_predicate_just_calls_the_branch():
    f = rlx.jit(lambda x, flag: rlx.cond(flag, lambda a: a + 1.0, lambda a: a, x), static_argnums=1)
    x = rand(3)
    np.testing.assert_allclose(f(x, True), x + 1)
    assert "if" not in f.lower(x, True).inspect()


def test_cond_branch_mismatch_names_the_output():
    def f(x):
        return rlx.cond(x[0] > 0, lambda a: a, lambda a: a[:2], x)

    with pytest.raises(TraceError, match="cond false_fun: output is f32\\[2\\]"):
        rlx.jit(f)(rand(3))


@settings(max_examples=10)
@given(n=st.integers(0, 6), step=st.floats(0.5, 2, width=32))
def test_while_loop_vs_python_while(n, step):
    @rlx.jit
    def f(x, limit, step):
        def body(c):
            i, acc = c
            return i + 1, acc * 0.5 + x * step

        return rlx.while_loop(lambda c: c[0] < limit, body, (0, x))

    x = rand(4)
    i, acc = 0, x.copy()
    while i < n:
        i, acc = i + 1, (acc * f32(0.5) + x * f32(step)).astype(f32)
    got_i, got = f(x, n, step)
    assert int(got_i) == n
    np.testing.assert_allclose(got, acc, rtol=1e-5, atol=1e-6)
    assert f.trace_count == 1


def test_while_loop_data_dependent_trip_count():
    # halve until the norm drops below 1: the trip count depends on the data
    @rlx.jit
    def f(x):
        return rlx.while_loop(lambda v: rnp.sqrt((v * v).sum()) >= 1.0, lambda v: v / 2.0, x)

    for scale in (0.5, 3.0, 100.0):
        x = np.full(3, scale, f32)
        v = x.copy()
        while np.sqrt((v * v).sum()) >= 1:
            v = v / 2
        np.testing.assert_allclose(f(x), v)


def test_while_loop_body_must_keep_the_carry():
    def f(x):
        return rlx.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1][:1]), (0, x))

    with pytest.raises(TraceError, match="carry.1 is f32\\[1\\] but must be f32\\[3\\]"):
        rlx.jit(f)(rand(3))


@settings(max_examples=10)
@given(t=st.integers(1, 6), reverse=st.booleans())
def test_scan_vs_python_loop(t, reverse):
    @rlx.jit
    def rnn(h0, xs, w, u):
        def step(h, x):
            h = rnp.tanh(h @ w + x @ u)
            return h, {"h": h, "n": h.sum()}

        return rlx.scan(step, h0, xs, reverse=reverse)

    h0, xs, w, u = rand(2, 3), rand(t, 2, 4, seed=1), rand(3, 3, seed=2), rand(4, 3, seed=3)
    h, ys = h0, [None] * t
    for k in reversed(range(t)) if reverse else range(t):
        h = np.tanh(h @ w + xs[k] @ u)
        ys[k] = h
    got_h, got_ys = rnn(h0, xs, w, u)
    np.testing.assert_allclose(got_h, h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_ys["h"], np.stack(ys), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_ys["n"], np.stack(ys).sum(axis=(1, 2)), rtol=1e-5, atol=1e-5)


def test_scan_with_length_and_no_xs_and_captured_values():
    @rlx.jit
    def f(x, k):
        return rlx.scan(lambda c, _: (c * k + 1.0, c), x, None, length=4)

    x, k = rand(3), rand(3, seed=1)
    c, ys = x, []
    for _ in range(4):
        ys.append(c)
        c = c * k + 1
    got_c, got_ys = f(x, k)
    np.testing.assert_allclose(got_c, c, rtol=1e-5)
    np.testing.assert_allclose(got_ys, np.stack(ys), rtol=1e-5)


def test_scan_over_a_dynamic_length_serves_two_lengths():
    f = rlx.jit(
        lambda xs: rlx.scan(lambda c, x: (c + x, c), rnp.zeros((2,)), xs)[0],
        dynamic={"xs": {0: "t"}},
    )
    for t in (3, 5):
        xs = rand(t, 2, seed=t)
        np.testing.assert_allclose(f(xs), xs.sum(0), rtol=1e-5, atol=1e-6)
    assert f.trace_count == 1


def test_nested_control_flow_captures_through_two_levels():
    @rlx.jit
    def f(xs, w):
        def step(c, x):
            y = rlx.cond(x.sum() > 0, lambda a: a * w, lambda a: a - w, x)
            return c + y, y

        return rlx.scan(step, rnp.zeros_like(w), xs)

    xs, w = rand(4, 3), rand(3, seed=1)
    c, ys = np.zeros(3, f32), []
    for x in xs:
        y = x * w if x.sum() > 0 else x - w
        c = c + y
        ys.append(y)
    got_c, got_ys = f(xs, w)
    np.testing.assert_allclose(got_c, c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_ys, np.stack(ys), rtol=1e-5, atol=1e-6)
