"""If / While / Scan: semantics against plain Python loops (lax.cond / while_loop / scan),
shape rules, sub-graph checks and the verifier's recursion."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx import DType, Shape
from rlx.errors import InputError, ShapeError, VerifyError
from rlx.ops.control import If, Scan, While, build_subgraph
from rlx.ops.elementwise import Unary, UnaryKind

F32 = np.float32


def _f(v):
    return np.asarray(v, F32)


# ---- If ---------------------------------------------------------------------------


def _if_graph(output_index=0):
    g = rlx.Graph("if")
    x = g.input("x", (3,))
    t = g.input("t", ())
    pred = g.gt(t, 0.0)

    def then(s, a):
        return [s.mul(a, 2.0), s.exp(a)]

    def other(s, a):
        return [s.neg(a), s.abs(a)]

    y = g.cond(pred, then, other, [x], output_index=output_index)
    g.set_outputs([y])
    return g.verify()


@pytest.mark.parametrize("t", [1.0, -1.0])
@pytest.mark.parametrize("k", [0, 1])
def test_if_takes_the_branch_the_predicate_selects(t, k):
    x = _f([1.0, -2.0, 3.0])
    (out,) = _if_graph(k).evaluate({"x": x, "t": _f(t)})
    want = [[2 * x, np.exp(x)], [-x, np.abs(x)]][0 if t > 0 else 1][k]
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_if_branch_may_ignore_an_operand_and_accepts_given_graphs():
    g = rlx.Graph("g")
    a = g.input("a", (2,))
    b = g.input("b", (2,))
    p = g.input("p", (1,), DType.BOOL)
    only_b = rlx.Graph("only_b")
    only_b.set_outputs(only_b.relu(only_b.input("in1", (2,))))
    both = build_subgraph("both", [Shape((2,)), Shape((2,))], lambda s, u, v: s.sub(u, v))
    g.set_outputs(g.cond(p, only_b, both, [a, b]))
    g.verify()
    av, bv = _f([1, 2]), _f([-3, 5])
    (yes,) = g.evaluate({"a": av, "b": bv, "p": np.array([True])})
    (no,) = g.evaluate({"a": av, "b": bv, "p": np.array([False])})
    np.testing.assert_array_equal(yes, [0, 5])
    np.testing.assert_array_equal(no, av - bv)


def test_if_shape_rule_errors():
    g = rlx.Graph("g")
    x = g.input("x", (3,))
    p = g.input("p", (), DType.BOOL)
    f = g.input("f", ())
    same = lambda s, a: s.relu(a)  # noqa: E731
    with pytest.raises(ShapeError, match="single-element bool"):
        g.cond(f, same, same, [x])
    with pytest.raises(ShapeError, match="same shapes"):
        g.cond(p, same, lambda s, a: s.cast(a, "f16"), [x])
    with pytest.raises(ShapeError, match="output_index 2 out of range"):
        g.cond(p, same, same, [x], output_index=2)
    wrong = build_subgraph("wrong", [Shape((4,))], lambda s, a: s.relu(a))
    with pytest.raises(
        ShapeError, match=r"then_branch input 'in0' is f32\[4\] but operand 0 is f32\[3\]"
    ):
        g.cond(p, wrong, same, [x])
    named = rlx.Graph("named")
    named.set_outputs(named.relu(named.input("x", (3,))))
    with pytest.raises(ShapeError, match="'x'.*not one of in0..in0"):
        g.cond(p, named, same, [x])
    with_param = rlx.Graph("with_param")
    with_param.set_outputs(
        with_param.add(with_param.input("in0", (3,)), with_param.param("w", (3,)))
    )
    with pytest.raises(ShapeError, match="holds param 'w'"):
        g.cond(p, with_param, same, [x])
    no_out = rlx.Graph("no_out")
    no_out.input("in0", (3,))
    with pytest.raises(ShapeError, match="no outputs"):
        g.cond(p, no_out, same, [x])


# ---- While --------------------------------------------------------------------------


def _collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def _collatz_graph(max_iterations=None):
    g = rlx.Graph("collatz")
    n = g.input("n", (), DType.I64)
    zero = g.constant(0, "i64")

    def cond(s, v, _):
        return s.ne(v, s.constant(1, "i64"))

    def body(s, v, k):
        one, two, three = (s.constant(c, "i64") for c in (1, 2, 3))
        even = s.eq(s.binary(rlx.ops.elementwise.BinaryKind.MOD, v, two), s.constant(0, "i64"))
        nxt = s.where(even, s.div(v, two), s.add(s.mul(v, three), one))
        return [nxt, s.add(k, one)]

    steps = g.while_loop(cond, body, [n, zero], output_index=1, max_iterations=max_iterations)
    final = g.while_loop(cond, body, [n, zero], output_index=0, max_iterations=max_iterations)
    g.set_outputs([steps, final])
    return g.verify()


@given(st.integers(1, 60))
def test_while_matches_a_python_loop(n):
    steps, final = _collatz_graph().evaluate({"n": np.int64(n)})
    assert int(steps) == _collatz_steps(n) and int(final) == 1


def test_while_runs_zero_times_when_cond_is_false_at_once():
    g = rlx.Graph("g")
    x = g.input("x", (2,))
    y = g.while_loop(
        lambda s, a: s.lt(s.constant(np.float32(1)), s.constant(np.float32(0))),
        lambda s, a: s.mul(a, 3.0),
        [x],
    )
    g.set_outputs(y)
    (out,) = g.evaluate({"x": _f([1, 2])})
    np.testing.assert_array_equal(out, [1, 2])


def test_while_max_iterations_bounds_a_runaway_loop():
    steps, _ = _collatz_graph(max_iterations=3).evaluate({"n": np.int64(8)})  # 3 steps
    assert int(steps) == 3
    with pytest.raises(InputError, match="max_iterations=2"):
        _collatz_graph(max_iterations=2).evaluate({"n": np.int64(8)})
    with pytest.raises(InputError, match="max_iterations=8"):
        _collatz_graph(max_iterations=8).evaluate({"n": np.int64(27)})  # 111 steps
    g = rlx.Graph("forever")
    x = g.input("x", ())
    g.set_outputs(
        g.while_loop(lambda s, a: s.ge(a, a), lambda s, a: s.add(a, 1.0), [x], max_iterations=50)
    )
    with pytest.raises(InputError, match="still holds after max_iterations=50"):
        g.evaluate({"x": _f(0)})


def test_while_shape_rule_errors():
    g = rlx.Graph("g")
    x = g.input("x", (2,))
    ok_cond = lambda s, a: s.lt(s.constant(np.float32(1)), s.constant(np.float32(0)))  # noqa: E731
    with pytest.raises(ShapeError, match="cond must return one single-element bool"):
        g.while_loop(lambda s, a: s.lt(a, a), lambda s, a: a, [x])
    with pytest.raises(ShapeError, match=r"body must return the carries' shapes \[f32\[2\]\]"):
        g.while_loop(ok_cond, lambda s, a: s.cast(a, "f16"), [x])
    with pytest.raises(ShapeError, match="max_iterations must be None or an int >= 0"):
        g.while_loop(ok_cond, lambda s, a: a, [x], max_iterations=-1)
    with pytest.raises(ShapeError, match="output_index 1 out of range"):
        g.while_loop(ok_cond, lambda s, a: a, [x], output_index=1)


# ---- Scan -------------------------------------------------------------------------


def _cumsum_scan(n, d, output_index, reverse=False):
    g = rlx.Graph("scan")
    xs = g.input("xs", (n, d))
    init = g.input("init", (d,))

    def body(s, c, x):
        c2 = s.add(c, x)
        return [c2, s.mul(c2, 2.0), s.neg(x)]

    g.set_outputs(g.scan(body, [init], [xs], output_index=output_index, reverse=reverse))
    return g.verify()


@given(st.integers(1, 6), st.integers(1, 4), st.booleans())
def test_scan_matches_cumsum(n, d, reverse):
    rng = np.random.default_rng(n * 10 + d)
    xs = rng.standard_normal((n, d)).astype(F32)
    init = rng.standard_normal(d).astype(F32)
    feed = {"xs": xs, "init": init}
    carry, ys, negs = (_cumsum_scan(n, d, k, reverse).evaluate(feed)[0] for k in range(3))
    order = xs[::-1] if reverse else xs
    run = init + np.cumsum(order, axis=0, dtype=F32)
    run = run[::-1] if reverse else run
    np.testing.assert_allclose(carry, run[0] if reverse else run[-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ys, 2 * run, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(negs, -xs)
    assert ys.shape == (n, d)


def test_scan_without_carries_or_xs():
    g = rlx.Graph("g")
    xs = g.input("xs", (4, 3))
    mapped = g.scan(lambda s, x: s.exp(x), [], [xs])
    counter = g.scan(
        lambda s, c: [s.add(c, 1.0), c], [g.constant(np.float32(0))], length=5, output_index=1
    )
    g.set_outputs([mapped, counter])
    g.verify()
    x = np.arange(12, dtype=F32).reshape(4, 3) / 10
    m, c = g.evaluate({"xs": x})
    np.testing.assert_allclose(m, np.exp(x), rtol=1e-6)
    np.testing.assert_array_equal(c, [0, 1, 2, 3, 4])


def test_scan_of_length_zero_returns_the_initial_carry_and_empty_ys():
    g = rlx.Graph("g")
    init = g.input("init", (2,))
    body = lambda s, c: [s.add(c, 1.0), s.cast(c, "f64")]  # noqa: E731
    g.set_outputs([g.scan(body, [init], length=0), g.scan(body, [init], length=0, output_index=1)])
    carry, ys = g.evaluate({"init": _f([3, 4])})
    np.testing.assert_array_equal(carry, [3, 4])
    assert ys.shape == (0, 2) and ys.dtype == np.float64


def test_scan_over_a_symbolic_length():
    g = rlx.Graph("g")
    seq = g.sym("seq", max=16)
    xs = g.input("xs", (seq, 2))
    y = g.scan(
        lambda s, c, x: [s.maximum(c, x), c],
        [g.constant(np.full(2, -np.inf, F32))],
        [xs],
        output_index=1,
    )
    g.set_outputs(y)
    assert g.shape(y) == Shape((seq, 2))
    x = np.array([[1, 5], [3, 2], [0, 9]], F32)
    (out,) = g.evaluate({"xs": x})
    np.testing.assert_array_equal(out, [[-np.inf, -np.inf], [1, 5], [3, 5]])


def test_scan_shape_rule_errors():
    g = rlx.Graph("g")
    xs = g.input("xs", (4, 3))
    init = g.input("init", (3,))
    body = build_subgraph("b", [Shape((3,)), Shape((3,))], lambda s, c, x: [s.add(c, x)])
    with pytest.raises(
        ShapeError, match=r"xs\[0\] is f32\[4,3\] but must have leading axis length 5"
    ):
        g.apply(Scan(body, 5, 1), [init, xs])
    with pytest.raises(ShapeError, match="num_carry 3 out of range"):
        g.apply(Scan(body, 4, 3), [init, xs])
    with pytest.raises(ShapeError, match="carries' shapes"):
        g.scan(lambda s, c, x: [s.cast(c, "f16")], [init], [xs])
    with pytest.raises(ShapeError, match="give length"):
        g.scan(lambda s, c: c, [init])
    with pytest.raises(ShapeError, match="length must be an int >= 0"):
        g.apply(Scan(body, -1, 1), [init])


# ---- shared behaviour ---------------------------------------------------------------


def test_control_ops_expose_subgraphs_and_print_them():
    g = _if_graph()
    (node,) = g.find(If)
    assert [s.name for s in node.op.subgraphs()] == ["if.then", "if.else"]
    text = g.inspect()
    assert "graph if.then(in0: f32[3])" in text and "graph if.else(in0: f32[3])" in text
    w = _collatz_graph().find(While)[0].op
    assert len(w.subgraphs()) == 2 and w.kind is rlx.ops.OpKind.DATA_MOVEMENT


def test_verifier_recurses_into_subgraphs():
    body = build_subgraph("body", [Shape((3,))], lambda s, a: s.relu(a))
    g = rlx.Graph("g")
    g.set_outputs(g.scan(body, [], [g.input("xs", (2, 3))]))
    g.verify()
    body.add_node(Unary(UnaryKind.EXP), [0], Shape((4,)))  # a node with a wrong shape
    with pytest.raises(VerifyError, match="sub-graph 'body'.*recorded shape f32\\[4\\]"):
        g.verify()
