"""gather_elements / scatter_elements / gather_nd / scatter_nd: reference and CPU kernel
against plain Python loops; shape-rule errors; out-of-range indices."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import rlx
from rlx.errors import InputError, ShapeError
from rlx.ops.indexing import GatherElements, GatherNd, ScatterElements, ScatterNd
from rlx.ops.indexing import ScatterReduction as R

RNG = np.random.default_rng(1)


def _run(op, arrays):  # noqa: ANN001, ANN202
    g = rlx.Graph("ix")
    ids = [g.input(f"a{i}", a.shape, rlx.DType.from_numpy(a.dtype)) for i, a in enumerate(arrays)]
    g.set_outputs(g.apply(op, ids))
    feeds = {f"a{i}": a for i, a in enumerate(arrays)}
    ref = g.evaluate(feeds)[0]
    cpu = rlx.Session("cpu").compile(g).run(feeds)[0]
    np.testing.assert_array_equal(ref, cpu)
    return ref


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_matches_a_loop(axis: int) -> None:
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    n = x.shape[axis]
    idx = RNG.integers(-n, n, size=(3, 2) if axis == 0 else (2, 4))
    if axis != 0:
        idx = RNG.integers(-n, n, size=(3, 5))
    out = _run(GatherElements(axis), [x, idx])
    for i, j in itertools.product(*map(range, idx.shape)):
        src = [i, j]
        src[axis] = idx[i, j] % n
        assert out[i, j] == x[tuple(src)]


@pytest.mark.parametrize("red", list(R))
def test_scatter_elements_matches_a_loop(red: R) -> None:
    x = RNG.integers(1, 5, size=(3, 4)).astype(np.int64)
    idx = np.array([[0, 1, 1], [2, 3, 3], [1, 1, 0]])
    upd = RNG.integers(1, 5, size=(3, 3)).astype(np.int64)
    out = _run(ScatterElements(1, red), [x, idx, upd])
    want = x.copy()
    for i, j in itertools.product(range(3), range(3)):
        k = idx[i, j]
        v = upd[i, j]
        want[i, k] = {R.NONE: v, R.ADD: want[i, k] + v, R.MUL: want[i, k] * v,
                      R.MAX: max(want[i, k], v), R.MIN: min(want[i, k], v)}[red]  # fmt: skip
    np.testing.assert_array_equal(out, want)


def test_gather_nd_with_batch_dims_matches_a_loop() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    idx = np.array([[[1], [0]], [[2], [-1]]])  # batch_dims=1: index dim 1 per batch row
    out = _run(GatherNd(1), [x, idx])
    for b, r in itertools.product(range(2), range(2)):
        np.testing.assert_array_equal(out[b, r], x[b, idx[b, r, 0] % 3])


@pytest.mark.parametrize("red", [R.NONE, R.ADD, R.MAX])
def test_scatter_nd_matches_a_loop(red: R) -> None:
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    idx = np.array([[1], [3], [1]]) if red is not R.NONE else np.array([[1], [3]])
    upd = RNG.standard_normal((len(idx), 3)).astype(np.float32)
    out = _run(ScatterNd(red), [x, idx, upd])
    want = x.copy()
    for (k,), v in zip(idx, upd, strict=True):
        want[k] = v if red is R.NONE else (want[k] + v if red is R.ADD else np.maximum(want[k], v))
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_out_of_range_index_is_an_input_error() -> None:
    g = rlx.Graph("bad")
    x = g.input("x", [2, 3])
    i = g.input("i", [2, 3], "i64")
    g.set_outputs(g.apply(GatherElements(1), [x, i]))
    with pytest.raises(InputError, match="index 3 out of range"):
        g.evaluate({"x": np.zeros((2, 3), np.float32), "i": np.full((2, 3), 3)})


def test_shape_rules_name_the_problem() -> None:
    g = rlx.Graph("bad")
    x = g.input("x", [2, 3])
    with pytest.raises(ShapeError, match="rank"):
        g.apply(GatherElements(0), [x, g.input("i", [2], "i64")])
    with pytest.raises(ShapeError, match="updates"):
        g.apply(ScatterNd(), [x, g.input("j", [1, 1], "i64"), g.input("u", [2], "f32")])
