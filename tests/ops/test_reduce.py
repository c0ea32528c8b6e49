"""Reductions (rlx/ops/reduce.py): shape rules and references against NumPy/SciPy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import special

import rlx
from rlx import DType, Shape
from rlx.errors import InputError, ShapeError
from rlx.ops.reduce import ArgMax, ArgMin, Cumsum, LogSoftmax, Reduce, ReduceKind, Softmax, TopK

from .helpers import run

NP_REDUCE = {
    ReduceKind.SUM: np.sum,
    ReduceKind.MEAN: np.mean,
    ReduceKind.MAX: np.max,
    ReduceKind.MIN: np.min,
    ReduceKind.PROD: np.prod,
}


def infer(op, *shapes):
    return op.infer(tuple(shapes))


finite = st.floats(-8, 8, width=32)
small_shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)


@st.composite
def array_and_axes(draw, dtype=np.float32):
    x = draw(hnp.arrays(dtype, small_shapes, elements=finite))
    r = x.ndim
    axes = draw(st.lists(st.integers(0, r - 1), unique=True, max_size=r))
    # some axes negative, to check normalisation
    axes = [a - r if draw(st.booleans()) else a for a in axes]
    return x, tuple(axes)


# ---- reduce ---------------------------------------------------------------------------


@pytest.mark.parametrize("fn", list(ReduceKind))
@given(data=array_and_axes(), keepdims=st.booleans())
def test_reduce_matches_numpy(fn, data, keepdims):
    x, axes = data
    got = run(lambda g, a: g.reduce(fn, a, axes, keepdims), x)
    with np.errstate(over="ignore"):  # products of up to 256 values may overflow to inf
        want = NP_REDUCE[fn](x, axis=axes, keepdims=keepdims)
    assert got.shape == np.shape(want) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod"])
def test_named_builders_reduce_all_axes_by_default(name):
    x = np.arange(1, 7, dtype=np.float64).reshape(2, 3)
    got = run(lambda g, a: getattr(g, name)(a), x)
    assert got.shape == () and got == getattr(np, name)(x)
    kept = run(lambda g, a: getattr(g, name)(a, 1, keepdims=True), x)
    np.testing.assert_allclose(kept, getattr(np, name)(x, axis=1, keepdims=True))


def test_reduce_shape_rule_keeps_symbolic_dims():
    b = rlx.sym("batch")
    x = Shape((b, 4, 5), DType.F32)
    assert infer(Reduce(ReduceKind.SUM, (1,), False), x) == Shape((b, 5))
    assert infer(Reduce(ReduceKind.MAX, (0, 2), True), x) == Shape((1, 4, 1))
    assert infer(Reduce(ReduceKind.MEAN, (-1,), False), x) == Shape((b, 4))
    assert infer(Reduce(ReduceKind.SUM, (), False), x) == x
    g = rlx.Graph()
    xi = g.input("x", (b, 4))
    g.set_outputs([g.mean(xi, -1), g.max(xi, 0, keepdims=True)])
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    mean, mx = g.evaluate({"x": a})
    np.testing.assert_allclose(mean, a.mean(-1))
    np.testing.assert_array_equal(mx, a.max(0, keepdims=True))


def test_reduce_builder_normalises_axes_so_equal_ops_hash_equal():
    g = rlx.Graph()
    x = g.input("x", (2, 3, 4))
    a = g.nodes[g.sum(x, (-1, 0))].op
    b = g.nodes[g.sum(x, (0, 2))].op
    assert a == b and hash(a) == hash(b) and a.axes == (0, 2)
    assert g.nodes[g.softmax(x, -1)].op == Softmax(2)
    assert g.nodes[g.argmax(x, -2)].op == ArgMax(1, False)


def test_integer_sum_and_prod_wrap_in_the_input_dtype():
    x = np.full((100,), 100, np.int8)
    assert run(lambda g, a: g.sum(a), x) == np.int8(np.int64(10000).astype(np.int8))
    y = np.array([3, 5, 7], np.int32)
    out = run(lambda g, a: g.prod(a), y)
    assert out.dtype == np.int32 and out == 105


def test_low_precision_sums_accumulate_in_f32():
    ones16 = np.ones(4096, np.float16)  # an f16 accumulator would stall at 2048
    assert run(lambda g, a: g.sum(a), ones16) == 4096
    onesbf = np.ones(1000, ml_dtypes.bfloat16)  # a bf16 accumulator would stall at 256
    out = run(lambda g, a: g.sum(a), onesbf)
    assert out.dtype == ml_dtypes.bfloat16 and float(out) == 1000.0
    out = run(lambda g, a: g.mean(a), ones16 * np.float16(3))
    assert out.dtype == np.float16 and out == 3


def test_max_min_of_an_empty_axis_give_the_identity():
    x = np.zeros((2, 0), np.float32)
    np.testing.assert_array_equal(run(lambda g, a: g.max(a, 1), x), [-np.inf, -np.inf])
    np.testing.assert_array_equal(run(lambda g, a: g.min(a, 1), x), [np.inf, np.inf])
    xi = np.zeros((0,), np.int32)
    assert run(lambda g, a: g.max(a), xi) == np.iinfo(np.int32).min


def test_reduce_errors_name_expected_and_given():
    g = rlx.Graph()
    x = g.input("x", (2, 3))
    with pytest.raises(ShapeError, match=r"axis 5 out of range for rank-2 input f32\[2,3\]"):
        g.sum(x, 5)
    with pytest.raises(ShapeError, match=r"-2 <= axis < 2"):
        g.apply(Reduce(ReduceKind.SUM, (-3,), False), [x])
    with pytest.raises(ShapeError, match=r"repeat an axis.*normalised: \(1, 1\)"):
        g.apply(Reduce(ReduceKind.SUM, (1, -1), False), [x])
    i = g.input("i", (2, 3), DType.I32)
    with pytest.raises(ShapeError, match=r"mean needs a float input, got i32\[2,3\]"):
        g.mean(i)
    bo = g.input("b", (2,), DType.BOOL)
    with pytest.raises(ShapeError, match=r"sum of a bool tensor bool\[2\]"):
        g.sum(bo)
    with pytest.raises(
        ShapeError,
        match=r"fn must be a ReduceKind or one of \['sum', 'mean', 'max', 'min', 'prod'\], got 'median'",
    ):
        g.reduce("median", x)
    assert g.nodes[g.reduce("max", x, 0)].op == Reduce(ReduceKind.MAX, (0,), False)


# ---- softmax / log_softmax ----------------------------------------------------------


@given(x=hnp.arrays(np.float32, small_shapes, elements=finite), data=st.data())
def test_softmax_and_log_softmax_match_scipy(x, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    sm, lsm = run(lambda g, a: [g.softmax(a, axis), g.log_softmax(a, axis)], x)
    np.testing.assert_allclose(sm, special.softmax(x, axis=axis), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lsm, special.log_softmax(x, axis=axis), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sm.sum(axis=axis), 1.0, rtol=1e-5)


def test_softmax_is_numerically_stable():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, -1e30]], np.float32)
    sm, lsm = run(lambda g, a: [g.softmax(a), g.log_softmax(a)], x)
    assert np.all(np.isfinite(sm)) and np.all(np.isfinite(lsm))
    np.testing.assert_allclose(sm[0], special.softmax([0.0, 1.0, 2.0]), rtol=1e-6)
    np.testing.assert_allclose(sm[1], [0.5, 0.5, 0.0], atol=1e-7)
    np.testing.assert_allclose(lsm[0], special.log_softmax([0.0, 1.0, 2.0]), rtol=1e-6)


def test_softmax_f16_computes_in_f32():
    x = np.linspace(-4, 4, 2048).astype(np.float16)
    out = run(lambda g, a: g.softmax(a), x)
    assert out.dtype == np.float16
    want = special.softmax(x.astype(np.float64))
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=2e-3, atol=1e-7)


def test_softmax_shape_rule_and_errors():
    s = Shape(("batch", 7), DType.BF16)
    assert infer(Softmax(-1), s) == s and infer(LogSoftmax(0), s) == s
    with pytest.raises(ShapeError, match=r"softmax: needs a float input, got i32\[3\]"):
        infer(Softmax(0), Shape((3,), DType.I32))
    with pytest.raises(ShapeError, match=r"axis 2 out of range for rank-2"):
        infer(LogSoftmax(2), s)


# ---- cumsum --------------------------------------------------------------------------


def test_cumsum_variants_hand_computed():
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    cases = {
        (False, False): [1, 3, 6, 10],
        (True, False): [10, 9, 7, 4],
        (False, True): [0, 1, 3, 6],
        (True, True): [9, 7, 4, 0],
    }
    for (rev, exc), want in cases.items():
        got = run(lambda g, a, r=rev, e=exc: g.cumsum(a, 0, reverse=r, exclusive=e), x)
        np.testing.assert_array_equal(got, want)


@given(x=hnp.arrays(np.int32, small_shapes, elements=st.integers(-100, 100)), data=st.data())
def test_cumsum_matches_numpy(x, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    rev = data.draw(st.booleans())
    got = run(lambda g, a: g.cumsum(a, axis, reverse=rev), x)
    want = np.flip(np.cumsum(np.flip(x, axis), axis), axis) if rev else np.cumsum(x, axis)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_cumsum_shape_rule_and_errors():
    s = Shape(("n", 3), DType.F32)
    assert infer(Cumsum(0, True, True), s) == s
    with pytest.raises(ShapeError, match=r"cumsum of a bool tensor"):
        infer(Cumsum(0), Shape((3,), DType.BOOL))
    with pytest.raises(ShapeError, match=r"axis -3 out of range"):
        infer(Cumsum(-3), s)


# ---- topk ----------------------------------------------------------------------------


def _topk_oracle(row, k, largest):
    """Sort positions by (value desc/asc, index asc) with Python's sorted."""
    sign = -1 if largest else 1
    order = sorted(range(len(row)), key=lambda i: (sign * row[i], i))[:k]
    return [row[i] for i in order], order


@given(
    x=hnp.arrays(np.float32, (3, 6), elements=st.integers(-3, 3).map(float)),
    k=st.integers(0, 6),
    largest=st.booleans(),
)
def test_topk_matches_a_stable_sort(x, k, largest):
    vals, idx = run(lambda g, a: g.topk(a, k, largest=largest), x)
    assert vals.dtype == np.float32 and idx.dtype == np.int64
    for r in range(3):
        want_v, want_i = _topk_oracle(list(x[r]), k, largest)
        np.testing.assert_array_equal(vals[r], want_v)
        np.testing.assert_array_equal(idx[r], want_i)


def test_topk_ties_take_the_lower_index_and_nan_is_largest():
    x = np.array([1, 3, 3, 2, 1], np.float32)
    vals, idx = run(lambda g, a: g.topk(a, 3), x)
    assert vals.tolist() == [3, 3, 2] and idx.tolist() == [1, 2, 3]
    vals, idx = run(lambda g, a: g.topk(a, 2, largest=False), x)
    assert vals.tolist() == [1, 1] and idx.tolist() == [0, 4]
    y = np.array([0.0, np.nan, 5.0], np.float32)
    _, idx = run(lambda g, a: g.topk(a, 2), y)
    assert idx.tolist() == [1, 2]


def test_topk_along_axis_0_and_ints():
    x = np.array([[4, 1], [9, 7], [2, 8]], np.uint8)
    vals, idx = run(lambda g, a: g.topk(a, 2, axis=0), x)
    np.testing.assert_array_equal(vals, [[9, 8], [4, 7]])
    np.testing.assert_array_equal(idx, [[1, 2], [0, 1]])
    assert vals.dtype == np.uint8


def test_topk_shape_rule_and_errors():
    s = Shape(("batch", 10), DType.F32)
    assert infer(TopK(3), s) == Shape(("batch", 3), DType.F32)
    assert infer(TopK(3, 1, True, True), s) == Shape(("batch", 3), DType.I64)
    with pytest.raises(ShapeError, match=r"k=11 exceeds the size 10 of axis 1"):
        infer(TopK(11), s)
    # on a symbolic axis k is checked when the graph runs
    g = rlx.Graph()
    x = g.input("x", ("n",))
    v, _ = g.topk(x, 4)
    g.set_outputs([v])
    with pytest.raises(InputError, match=r"k=4 exceeds the size 3 of axis 0"):
        g.evaluate({"x": np.zeros(3, np.float32)})


# ---- argmax / argmin -----------------------------------------------------------------


@given(
    x=hnp.arrays(np.float32, small_shapes, elements=st.integers(-3, 3).map(float)),
    data=st.data(),
)
def test_argmax_argmin_match_numpy(x, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    kd = data.draw(st.booleans())
    amax, amin = run(lambda g, a: [g.argmax(a, axis, kd), g.argmin(a, axis, kd)], x)
    assert amax.dtype == np.int64 and amin.dtype == np.int64
    np.testing.assert_array_equal(amax, np.argmax(x, axis=axis, keepdims=kd))
    np.testing.assert_array_equal(amin, np.argmin(x, axis=axis, keepdims=kd))


def test_argmax_shape_rule_and_errors():
    s = Shape(("b", 5), DType.F16)
    assert infer(ArgMax(1), s) == Shape(("b",), DType.I64)
    assert infer(ArgMin(0, True), s) == Shape((1, 5), DType.I64)
    with pytest.raises(ShapeError, match=r"argmax over the empty axis 1 of f32\[2,0\]"):
        infer(ArgMax(1), Shape((2, 0)))
    with pytest.raises(ShapeError, match=r"argmin: axis 3 out of range"):
        infer(ArgMin(3), s)
    g = rlx.Graph()
    x = g.input("x", (2, "n"))
    g.set_outputs([g.argmin(x)])
    with pytest.raises(InputError, match=r"argmin over the empty axis 1"):
        g.evaluate({"x": np.zeros((2, 0), np.float32)})
