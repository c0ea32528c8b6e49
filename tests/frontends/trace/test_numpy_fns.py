"""rlx.numpy functions, traced and compiled by rlx.jit, against NumPy itself."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlx
import rlx.numpy as rnp

f32 = np.float32
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)


def arrays(shape, lo=-3.0, hi=3.0, seed=0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(f32)


UNARY = [
    (rnp.exp, np.exp, (-3, 3)),
    (rnp.log, np.log, (0.1, 5)),
    (rnp.tanh, np.tanh, (-3, 3)),
    (rnp.sqrt, np.sqrt, (0, 5)),
    (rnp.abs, np.abs, (-3, 3)),
    (rnp.negative, np.negative, (-3, 3)),
    (rnp.square, np.square, (-3, 3)),
    (rnp.sin, np.sin, (-3, 3)),
    (rnp.cos, np.cos, (-3, 3)),
    (rnp.floor, np.floor, (-3, 3)),
    (rnp.ceil, np.ceil, (-3, 3)),
    (rnp.sign, np.sign, (-3, 3)),
    (rnp.reciprocal, np.reciprocal, (0.5, 3)),
    (rnp.log1p, np.log1p, (0, 3)),
    (rnp.expm1, np.expm1, (-1, 1)),
    (rnp.erf, None, (-3, 3)),
    (rnp.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-3, 3)),
    (rnp.rsqrt, lambda x: 1 / np.sqrt(x), (0.5, 3)),
]


@pytest.mark.parametrize("fn,ref,rng", UNARY, ids=[u[0].__name__ for u in UNARY])
@settings(max_examples=8)
@given(shape=shapes)
def test_unary_vs_numpy(fn, ref, rng, shape):
    if ref is None:
        import math

        ref = np.vectorize(math.erf)
    x = arrays(shape, *rng)
    got = rlx.jit(fn)(x)
    np.testing.assert_allclose(got, ref(x.astype(np.float64)), rtol=2e-6, atol=2e-6)
    assert got.dtype == f32


BINARY = [
    (rnp.add, np.add),
    (rnp.subtract, np.subtract),
    (rnp.multiply, np.multiply),
    (rnp.divide, np.divide),
    (rnp.maximum, np.maximum),
    (rnp.minimum, np.minimum),
    (rnp.power, np.power),
    (rnp.floor_divide, np.floor_divide),
    (rnp.remainder, np.remainder),
]


@pytest.mark.parametrize("fn,ref", BINARY, ids=[b[0].__name__ for b in BINARY])
@settings(max_examples=8)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4))
def test_binary_broadcasting_vs_numpy(fn, ref, shapes):
    a_shape, b_shape = shapes.input_shapes
    a = arrays(a_shape, 0.5, 3, 1)
    b = arrays(b_shape, 0.5, 3, 2)
    got = rlx.jit(fn)(a, b)
    np.testing.assert_allclose(got, ref(a, b), rtol=2e-6, atol=1e-6)
    assert got.shape == shapes.result_shape


@pytest.mark.parametrize(
    "fn,ref", [(rnp.floor_divide, np.floor_divide), (rnp.remainder, np.remainder)]
)
def test_integer_floor_divide_and_remainder_follow_numpy_signs(fn, ref):
    a = np.array([7, -7, 7, -7, 0, 6], np.int32)
    b = np.array([2, 2, -2, -2, 3, -3], np.int32)
    np.testing.assert_array_equal(rlx.jit(fn)(a, b), ref(a, b))


COMPARE = [
    (rnp.equal, np.equal),
    (rnp.not_equal, np.not_equal),
    (rnp.less, np.less),
    (rnp.less_equal, np.less_equal),
    (rnp.greater, np.greater),
    (rnp.greater_equal, np.greater_equal),
]


@pytest.mark.parametrize("fn,ref", COMPARE, ids=[c[0].__name__ for c in COMPARE])
def test_compare_vs_numpy(fn, ref):
    a = np.array([[1, 2, 3], [3, 2, 1]], f32)
    b = np.array([2, 2, 2], f32)
    got = rlx.jit(fn)(a, b)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, ref(a, b))


REDUCE = [
    (rnp.sum, np.sum),
    (rnp.mean, np.mean),
    (rnp.max, np.max),
    (rnp.min, np.min),
    (rnp.prod, np.prod),
    (rnp.var, np.var),
    (rnp.std, np.std),
    (rnp.logsumexp, None),
]


@pytest.mark.parametrize("fn,ref", REDUCE, ids=[r[0].__name__ for r in REDUCE])
@settings(max_examples=8)
@given(shape=shapes, data=st.data())
def test_reductions_vs_numpy(fn, ref, shape, data):
    if ref is None:

        def ref(x, axis=None, keepdims=False):
            m = np.max(x, axis=axis, keepdims=True)
            out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
            return out if keepdims else np.squeeze(out, axis=axis)

    x = arrays(shape, 0.5, 1.5)
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    keepdims = data.draw(st.booleans())
    got = rlx.jit(lambda v: fn(v, axis, keepdims=keepdims))(x)
    want = ref(x.astype(np.float64), axis=axis, keepdims=keepdims)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got.shape == np.shape(want)


@pytest.mark.parametrize("fn,ref", [(rnp.argmax, np.argmax), (rnp.argmin, np.argmin)])
@settings(max_examples=8)
@given(shape=shapes, data=st.data())
def test_argmax_argmin_vs_numpy(fn, ref, shape, data):
    x = arrays(shape, seed=3)
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    np.testing.assert_array_equal(rlx.jit(lambda v: fn(v, axis))(x), ref(x, axis))


def test_sum_of_bools_and_mean_of_ints():
    b = np.array([[True, False, True], [True, True, True]])
    i = np.array([1, 2, 4], np.int32)
    s, m = rlx.jit(lambda b, i: (rnp.sum(b, axis=1), rnp.mean(i)))(b, i)
    np.testing.assert_array_equal(s, [2, 3])
    np.testing.assert_allclose(m, 7 / 3, rtol=1e-6, atol=1e-6)
    assert m.dtype == f32


def test_cumsum_where_clip_logical():
    x = arrays((3, 4), seed=5)

    def f(x):
        return (
            rnp.cumsum(x, axis=1),
            rnp.cumsum(x),
            rnp.where(x > 0, x, -1.0),
            rnp.clip(x, -1.0, 0.5),
            rnp.logical_and(x > 0, x < 1),
            rnp.logical_or(x > 2, x < -2),
            rnp.logical_not(x > 0),
            rnp.round(x),
        )

    got = rlx.jit(f)(x)
    want = (
        np.cumsum(x, 1),
        np.cumsum(x),
        np.where(x > 0, x, -1.0),
        np.clip(x, -1.0, 0.5),
        (x > 0) & (x < 1),
        (x > 2) | (x < -2),
        ~(x > 0),
        np.round(x),
    )
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@settings(max_examples=8)
@given(
    m=st.integers(1, 5),
    k=st.integers(1, 5),
    n=st.integers(1, 5),
    batch=st.sampled_from([(), (2,), (1, 3)]),
)
def test_matmul_and_dot_vs_numpy(m, k, n, batch):
    a = arrays((*batch, m, k), seed=1)
    b = arrays((k, n), seed=2)
    got_mm, got_op = rlx.jit(lambda a, b: (rnp.matmul(a, b), a @ b))(a, b)
    np.testing.assert_allclose(got_mm, a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_op, a @ b, rtol=1e-5, atol=1e-5)
    v = arrays((k,), seed=4)
    np.testing.assert_allclose(rlx.jit(rnp.dot)(a, v), np.dot(a, v), rtol=1e-5, atol=1e-5)


def test_dot_nd_and_dot_general_vs_numpy():
    a = arrays((2, 3, 4), seed=1)
    b = arrays((5, 4, 6), seed=2)
    np.testing.assert_allclose(rlx.jit(rnp.dot)(a, b), np.dot(a, b), rtol=1e-5, atol=1e-5)
    c = arrays((2, 4, 5), seed=3)
    got = rlx.jit(lambda a, c: rnp.dot_general(a, c, ((2,), (1,)), ((0,), (0,))))(a, c)
    np.testing.assert_allclose(got, np.einsum("bik,bkj->bij", a, c), rtol=1e-5, atol=1e-5)


EINSUM = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bij,bjk->bki", [(2, 3, 4), (2, 4, 5)]),
    ("bij,bjk", [(2, 3, 4), (2, 4, 5)]),
    ("ij,kj->ik", [(3, 4), (5, 4)]),
    ("bij,jk->bik", [(2, 3, 4), (4, 5)]),
    ("ij,ij->", [(3, 4), (3, 4)]),
    ("bij,k->bik", [(2, 3, 4), (5,)]),
    ("bthd,bshd->bhts", [(2, 3, 2, 4), (2, 5, 2, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ij->i", [(3, 4)]),
    ("ij->", [(3, 4)]),
]


@pytest.mark.parametrize("spec,shapes", EINSUM, ids=[e[0] for e in EINSUM])
def test_einsum_vs_numpy(spec, shapes):
    ops = [arrays(s, seed=i) for i, s in enumerate(shapes)]
    got = rlx.jit(lambda *o: rnp.einsum(spec, *o))(*ops)
    np.testing.assert_allclose(got, np.einsum(spec, *ops), rtol=1e-5, atol=1e-5)


def test_einsum_unsupported_forms_are_trace_errors():
    from rlx.errors import TraceError

    x = arrays((3, 3))
    for spec, ops in (("ii->i", (x,)), ("...i->i", (x,)), ("ij,jk,kl->il", (x, x, x))):
        with pytest.raises(TraceError, match="einsum"):
            rlx.jit(lambda *o, spec=spec: rnp.einsum(spec, *o))(*ops)


def test_outer_vs_numpy():
    a, b = arrays((3,)), arrays((2, 2), seed=1)
    np.testing.assert_allclose(rlx.jit(rnp.outer)(a, b), np.outer(a, b), rtol=1e-6, atol=1e-6)
