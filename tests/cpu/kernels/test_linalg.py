"""Integer matmul / dot_general kernels (``kernels/linalg.py``, ``engines/intgemm.py``):
wrapping like NumPy's integer loop for every integer dtype, the path each takes in the
report (exact f64 BLAS, 16-bit halves, NumPy), without per-run allocation."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.cpu.dispatch import KernelKind
from tests.cpu.kernels.checks import (
    check_exact,
    schedule_allocations,
)

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32])
@pytest.mark.parametrize(
    ("sa", "sb"), [((5, 7), (7, 3)), ((2, 4, 6), (6, 5)), ((3, 2, 4), (3, 4, 2)), ((6,), (6, 2))]
)
def test_int_matmul_wraps_like_numpy(dt, sa, sb):
    info = np.iinfo(dt)
    a = RNG.integers(info.min, info.max, sa, dtype=np.int64, endpoint=True).astype(dt)
    b = RNG.integers(info.min, info.max, sb, dtype=np.int64, endpoint=True).astype(dt)
    a.flat[0], b.flat[0] = info.max, info.max  # overflow in the first dot product
    (got,), _, cg = check_exact(lambda g, a, b: g.matmul(a, b), a=a, b=b)
    # oracle: Python ints, reduced modulo 2**bits into the dtype
    want = np.matmul(a.astype(object), b.astype(object))
    bits = 8 * np.dtype(dt).itemsize
    wrap = np.vectorize(lambda v: ((int(v) - int(info.min)) % (1 << bits)) + int(info.min))
    np.testing.assert_array_equal(got, wrap(want).astype(dt))
    assert schedule_allocations(cg, {"a": a, "b": b}) < 4096


def test_int_matmul_paths_in_the_report():
    """int8: one exact f64 product; int32: four exact products of 16-bit halves; int64:
    NumPy's integer loop."""
    a = RNG.integers(-128, 128, (4, 8)).astype(np.int8)
    for dt, kind, note in (
        (np.int8, KernelKind.BLAS, "exact below 2**53"),
        (np.int32, KernelKind.BLAS, "16-bit halves"),
        (np.int64, KernelKind.NUMPY, ""),
    ):
        x = a.astype(dt) * (70001 if dt != np.int8 else 1)
        _, _, cg = check_exact(lambda g, a, b: g.matmul(a, b), a=x, b=x.T.copy())
        rec = [k for k in cg.report().kernels if k.op == "matmul"][0]
        assert rec.kind is kind and note in " ".join(rec.notes)


@pytest.mark.parametrize("dt", [np.int16, np.int32])
def test_int_dot_general(dt):
    a = RNG.integers(-300, 300, (3, 4, 5)).astype(dt)
    b = RNG.integers(-300, 300, (5, 3, 2)).astype(dt)

    def build(g, a, b):
        return g.dot_general(a, b, ((2,), (0,)), ((0,), (1,)))

    (got,), _, _ = check_exact(build, a=a, b=b)
    want = np.einsum("bik,kbj->bij", a.astype(np.int64), b.astype(np.int64)).astype(dt)
    np.testing.assert_array_equal(got, want)
