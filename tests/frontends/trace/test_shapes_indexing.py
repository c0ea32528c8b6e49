"""rlx.numpy shape functions, constructors and traced indexing against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
import rlx.numpy as rnp
from rlx.errors import TraceError

X = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)

SHAPE_CASES = [
    ("reshape", lambda x: rnp.reshape(x, (6, -1)), lambda x: np.reshape(x, (6, -1))),
    ("method_reshape", lambda x: x.reshape(4, 6), lambda x: x.reshape(4, 6)),
    ("transpose", lambda x: rnp.transpose(x), lambda x: np.transpose(x)),
    ("transpose_axes", lambda x: x.transpose(1, 0, 2), lambda x: x.transpose(1, 0, 2)),
    ("T", lambda x: x.T, lambda x: x.T),
    ("swapaxes", lambda x: rnp.swapaxes(x, 0, 2), lambda x: np.swapaxes(x, 0, 2)),
    ("moveaxis", lambda x: rnp.moveaxis(x, 0, -1), lambda x: np.moveaxis(x, 0, -1)),
    ("expand_dims", lambda x: rnp.expand_dims(x, 1), lambda x: np.expand_dims(x, 1)),
    ("squeeze", lambda x: rnp.squeeze(x[:1]), lambda x: np.squeeze(x[:1])),
    ("ravel", lambda x: rnp.ravel(x), lambda x: np.ravel(x)),
    ("concatenate", lambda x: rnp.concatenate([x, x * 2], axis=-1),
     lambda x: np.concatenate([x, x * 2], axis=-1)),
    ("stack", lambda x: rnp.stack([x, x + 1], axis=1), lambda x: np.stack([x, x + 1], axis=1)),
    ("split", lambda x: rnp.split(x, 2, axis=2)[1], lambda x: np.split(x, 2, axis=2)[1]),
    ("take", lambda x: rnp.take(x, np.array([2, 0, 2]), axis=1),
     lambda x: np.take(x, [2, 0, 2], axis=1)),
    ("take_flat", lambda x: rnp.take(x, np.array([[5, 1], [0, 23]])),
     lambda x: np.take(x, [[5, 1], [0, 23]])),
    ("broadcast_to", lambda x: rnp.broadcast_to(x[0, 0], (3, 4)),
     lambda x: np.broadcast_to(x[0, 0], (3, 4))),
    ("astype", lambda x: x.astype(np.int32), lambda x: x.astype(np.int32)),
    ("zeros_like", lambda x: rnp.zeros_like(x) + x, lambda x: np.zeros_like(x) + x),
    ("ones", lambda x: rnp.ones((3, 4)) + x, lambda x: np.ones((3, 4)) + x),
    ("full", lambda x: rnp.full((4,), 2.5) * x, lambda x: np.full((4,), 2.5) * x),
    ("arange", lambda x: x + rnp.arange(4), lambda x: x + np.arange(4)),
    ("eye", lambda x: x[0, :, :3] @ rnp.eye(3), lambda x: x[0, :, :3] @ np.eye(3)),
]  # fmt: skip


@pytest.mark.parametrize("fn,ref", [c[1:] for c in SHAPE_CASES], ids=[c[0] for c in SHAPE_CASES])
def test_shape_functions_vs_numpy(fn, ref):
    got = rlx.jit(fn)(X)
    want = ref(X)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want)


INDEX_CASES = [
    (1,), (-1,), (slice(None, None, 2),), (Ellipsis, slice(None, 4)), (Ellipsis, slice(1, 3)),
    (None,), (slice(None), None, 1), (0, slice(None), -2), (Ellipsis, None),
    (slice(None, None, -1),), (1, np.array([2, 0])), (np.array([[1, 0], [1, 1]]),),
    (slice(None), np.array([0, 2, 2])), (Ellipsis, np.array([3, 0])), (slice(None), [1, 2]),
    (0, 1, 2), (slice(1, None), slice(None, 2), slice(None, None, 3)),
]  # fmt: skip


@pytest.mark.parametrize("key", INDEX_CASES, ids=[repr(k) for k in INDEX_CASES])
def test_indexing_vs_numpy(key):
    got = rlx.jit(lambda x: x[key])(X)
    want = X[key]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@settings(max_examples=25)
@given(
    starts=st.tuples(*[st.one_of(st.none(), st.integers(-5, 5))] * 3),
    stops=st.tuples(*[st.one_of(st.none(), st.integers(-5, 5))] * 3),
    steps=st.tuples(*[st.sampled_from([None, 1, 2, -1, -2])] * 3),
)
def test_basic_slicing_property(starts, stops, steps):
    key = tuple(slice(a, b, c) for a, b, c in zip(starts, stops, steps))
    want = X[key]
    got = rlx.jit(lambda x: x[key])(X)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_traced_integer_index_is_a_gather():
    idx = np.array([2, 0, 1, 1], np.int32)
    f = rlx.jit(lambda x, i: x[:, i])
    np.testing.assert_array_equal(f(X, idx), X[:, idx])
    assert "gather" in f.lower(X, idx).inspect()


@pytest.mark.parametrize(
    "key,match",
    [
        ((X[0] > 1,), "boolean mask"),
        ((np.array([0]), np.array([1])), "2 array indices"),
        ((0, slice(None), np.array([1, 2])), "separated by a slice"),
        ((5,), "out of bounds"),
        ((0, 0, 0, 0), "too many indices"),
    ],
)
def test_unsupported_indexing_is_a_trace_error(key, match):
    with pytest.raises(TraceError, match=match):
        rlx.jit(lambda x: x[key])(X)


def test_constructors_outside_a_trace_are_numpy():
    np.testing.assert_array_equal(rnp.zeros((2, 3)), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(rnp.arange(5), np.arange(5))
    np.testing.assert_array_equal(rnp.full(3, 7, dtype=np.int32), np.full(3, 7))
