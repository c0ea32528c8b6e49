"""The fft kernel (``kernels/fft.py``) against NumPy's pocketfft: every transform kind,
cropped and padded lengths, axes and norms, without per-run allocation."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cpu.kernels.checks import (
    check_exact,
    schedule_allocations,
)

RNG = np.random.default_rng(11)


@pytest.mark.parametrize(
    ("fn", "shape", "n", "axis", "norm"),
    [
        ("fft", (4, 16), None, -1, "backward"),
        ("ifft", (6, 5), 8, 0, "ortho"),
        ("rfft", (3, 20), 15, -1, "forward"),
        ("rfft", (7, 3, 2), 12, 0, "backward"),
        ("irfft", (2, 9), None, -1, "backward"),
        ("irfft", (5, 4), 11, 0, "ortho"),
        ("irfft", (2, 3), 12, 1, "backward"),
    ],
)
def test_fft_kernel_matches_numpy(fn, shape, n, axis, norm):
    if fn in ("rfft",):
        x = RNG.standard_normal(shape).astype(np.float32)
    else:
        x = (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex64)
    _, (got,), cg = check_exact(lambda g, x: getattr(g, fn)(x, n=n, axis=axis, norm=norm), x=x)
    want = getattr(np.fft, fn)(
        x.astype(np.complex128 if x.dtype.kind == "c" else np.float64), n=n, axis=axis, norm=norm
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    if fn != "irfft":
        assert schedule_allocations(cg, {"x": x}) < 4096
