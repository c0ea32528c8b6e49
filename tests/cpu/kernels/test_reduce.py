"""Reduction kernels (``kernels/reduce.py``) vs the reference interpreter: exclusive /
reverse cumsums, and top-k in the reference's order (ties by index, NaN largest) for
every dtype, without per-run allocation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx import DType
from tests.cpu.kernels.checks import (
    DT,
    FAST,
    check_exact,
    check_numpy_kernel,
    rand,
    schedule_allocations,
)

RNG = np.random.default_rng(11)


@FAST
@given(
    dims=st.lists(st.integers(0, 5), min_size=1, max_size=3),
    axis=st.integers(-3, 2),
    reverse=st.booleans(),
    exclusive=st.booleans(),
    dtype=st.sampled_from(("float32", "float64", "float16", "int32", "int8")),
    seed=st.integers(0, 2**16),
)
def test_cumsum(
    dims: list[int], axis: int, reverse: bool, exclusive: bool, dtype: str, seed: int
) -> None:
    ax = axis % len(dims)
    rng = np.random.default_rng(seed)
    feed = {"x": rand(rng, tuple(dims), dtype)}
    dt = {"int32": "i32", "int8": "i8"}.get(dtype) or DT[dtype]

    def build(g: rlx.Graph) -> object:
        return g.cumsum(g.input("x", tuple(dims), dt), ax, reverse, exclusive)

    check_numpy_kernel(build, feed, "cumsum")


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
    (vals, idx), _, cg = check_exact(lambda g, x: g.topk(x, k, axis, largest), x=x)
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
        assert schedule_allocations(cg, {"x": x}) < 4096


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
    check_exact(lambda g, x: g.topk(x, k, -1, largest), x=x)
