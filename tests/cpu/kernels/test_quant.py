"""Quantization kernels (``kernels/quant.py``) vs the reference interpreter: fake
quantization per tensor and per channel."""

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
    np_dtype,
    rand,
)


@FAST
@given(
    dims=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    per_channel=st.booleans(),
    axis=st.integers(0, 2),
    qrange=st.sampled_from([(-128, 127), (0, 255), (-8, 7)]),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_fake_quantize(
    dims: list[int],
    per_channel: bool,
    axis: int,
    qrange: tuple[int, int],
    dtype: str,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    ax = axis % len(dims) if per_channel else None
    k = dims[ax] if ax is not None else 1
    scales = [float(s) for s in rng.uniform(0.01, 0.5, k)]
    zps = [int(z) for z in rng.integers(qrange[0], qrange[1] + 1, k)]
    x = (rand(rng, tuple(dims), "float64") * 20).astype(np_dtype(dtype))
    x.flat[0] = np.nan
    if x.size > 1:
        x.flat[1] = np.inf
    feed = {"x": x}

    def build(g: rlx.Graph) -> object:
        xi = g.input("x", tuple(dims), DT[dtype])
        return g.fake_quantize(xi, scales, zps, axis=ax, qmin=qrange[0], qmax=qrange[1])

    check_numpy_kernel(build, feed, "fake_quantize")
