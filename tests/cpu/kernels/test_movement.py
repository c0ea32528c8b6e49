"""Movement kernels (``kernels/movement.py``) vs the reference interpreter: scatter-add
(``np.add.at`` into the output view) and its out-of-range error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.errors import InputError
from rlx.runtime.session import Session
from tests.cpu.kernels.checks import (
    DT,
    FAST,
    RAW,
    check_numpy_kernel,
    rand,
)


@FAST
@given(
    dims=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    m=st.integers(0, 6),
    axis=st.integers(0, 2),
    dtype=st.sampled_from(("float32", "float16", "int32", "int64")),
    seed=st.integers(0, 2**16),
)
def test_scatter_add(dims: list[int], m: int, axis: int, dtype: str, seed: int) -> None:
    ax = axis % len(dims)
    rng = np.random.default_rng(seed)
    n = dims[ax]
    udims = (*dims[:ax], m, *dims[ax + 1 :])
    idx = rng.integers(-n, n, m).astype(np.int64)  # repeats and negatives included
    feed = {"x": rand(rng, tuple(dims), dtype), "i": idx, "u": rand(rng, udims, dtype)}
    dt = {"int32": "i32", "int64": "i64"}.get(dtype) or DT[dtype]

    def build(g: rlx.Graph) -> object:
        x = g.input("x", tuple(dims), dt)
        return g.scatter_add(x, g.input("i", (m,), "i64"), g.input("u", udims, dt), axis=ax)

    check_numpy_kernel(build, feed, "scatter_add")


def test_scatter_add_out_of_range_raises_input_error() -> None:
    g = rlx.Graph("sa")
    x = g.input("x", (3, 2))
    g.set_outputs([g.scatter_add(x, g.input("i", (2,), "i64"), g.input("u", (2, 2)))])
    cg = Session("cpu").compile(g, RAW)
    feed = {
        "x": np.zeros((3, 2), np.float32),
        "i": np.array([0, 3]),
        "u": np.ones((2, 2), np.float32),
    }
    with pytest.raises(InputError, match="index 3 out of range for axis 0 of size 3"):
        cg.run(feed)
