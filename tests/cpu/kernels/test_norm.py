"""Norm kernels (``kernels/norm.py``) vs the reference interpreter: group norm over
random shapes and dtypes, and its kind in the report."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import rlx
from tests.cpu.kernels.checks import (
    DT,
    FAST,
    FLOATS,
    check_numpy_kernel,
    rand,
)


@FAST
@given(
    n=st.integers(1, 3),
    cg=st.sampled_from([(1, 1), (2, 4), (3, 6), (4, 4)]),
    spatial=st.lists(st.integers(1, 4), max_size=2),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_group_norm(n: int, cg: tuple[int, int], spatial: list[int], dtype: str, seed: int) -> None:
    groups, c = cg
    dims = (n, c, *spatial)
    rng = np.random.default_rng(seed)
    feed = {
        "x": rand(rng, dims, dtype),
        "g": rand(rng, (c,), dtype),
        "b": rand(rng, (c,), dtype),
    }

    def build(g: rlx.Graph) -> object:
        x = g.input("x", dims, DT[dtype])
        return g.group_norm(x, g.input("g", (c,), DT[dtype]), g.input("b", (c,), DT[dtype]), groups)

    check_numpy_kernel(build, feed, "group_norm")
