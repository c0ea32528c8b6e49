"""Control-flow kernels (``kernels/control.py``): If runs the taken branch, While counts
and stops at its maximum, Scan against a loop, nested control flow and a symbolic scan
length; sub-programs planned once, without per-run allocation."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx import DType, Shape
from rlx.backends.cpu.dispatch import KernelKind
from rlx.errors import InputError
from tests.cpu.kernels.checks import (
    SESSION,
    check_exact,
    schedule_allocations,
)

RNG = np.random.default_rng(11)


def test_if_kernel_runs_the_taken_branch():
    x = RNG.standard_normal((4,)).astype(np.float32)
    for p in (True, False):
        pred = np.array([p])

        def build(g, p, x):
            return g.cond(p, lambda s, a: s.mul(a, 2.0), lambda s, a: s.exp(a), [x])

        (got,), _, cg = check_exact(build, p=pred, x=x)
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
    (got,), _, cg = check_exact(build, **feed)
    assert float(got) == 0.5 + sum(range(10))
    assert schedule_allocations(cg, feed) < 4096

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

    (got,), _, cg = check_exact(
        lambda g, c, xs: g.scan(body, [c], [xs], output_index=output_index, reverse=reverse),
        c=c0,
        xs=xs,
    )
    c, ys = c0.copy(), np.zeros_like(xs)
    for t in range(5, -1, -1) if reverse else range(6):
        c = np.tanh(c * np.float32(0.5) + xs[t])
        ys[t] = c * 2
    np.testing.assert_allclose(got, c if output_index == 0 else ys, rtol=1e-6)
    assert schedule_allocations(cg, {"c": c0, "xs": xs}) < 4096


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
