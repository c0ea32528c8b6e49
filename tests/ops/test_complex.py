"""conjugate, complex_norm_sq and complex_norm_sq_backward (rlx/ops/complex.py): shape
rules, the reference and the compiled CPU kernels against PyTorch (``torch.conj``,
``z.abs() ** 2`` and its autograd), bit for bit between reference and kernel, on c64
(the dtype rlx's FFTs produce) and on real floats."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlx
from rlx import DType
from rlx.errors import ShapeError
from rlx.options import CompileOptions

RAW = CompileOptions(use_cache=False, optimize=False, fuse=False)
RNG = np.random.default_rng(0)


def _complex(shape: tuple[int, ...]) -> np.ndarray:
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex64)


def _both(g: rlx.Graph, feed: dict[str, np.ndarray]) -> list[list[np.ndarray]]:
    return [g.evaluate(feed), rlx.Session("cpu").compile(g, RAW).run(feed)]


@pytest.mark.parametrize("shape", [(7,), (2, 3, 5), (0, 4)])
def test_complex_ops_match_torch(shape):
    z, ct = _complex(shape), RNG.standard_normal(shape).astype(np.float32)
    g = rlx.Graph("cx")
    zi, ci = g.input("z", shape, DType.C64), g.input("ct", shape)
    g.set_outputs([g.conjugate(zi), g.complex_norm_sq(zi), g.complex_norm_sq_backward(ci, zi)])
    tz = torch.tensor(z.astype(np.complex128), requires_grad=True)
    n = tz.abs() ** 2
    (n * torch.tensor(ct.astype(np.float64))).sum().backward()
    want = [np.conj(z.astype(np.complex128)), n.detach().numpy(), tz.grad.numpy()]
    ref, got = _both(g, {"z": z, "ct": ct})
    for a, b, w in zip(ref, got, want, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(a, b)
    assert [a.dtype for a in ref] == [np.complex64, np.float32, np.complex64]


@pytest.mark.parametrize("dt", [DType.F32, DType.F64, DType.BF16])
def test_real_inputs(dt):
    x = RNG.standard_normal((3, 4)).astype(dt.np)
    g = rlx.Graph("re")
    xi = g.input("x", (3, 4), dt)
    g.set_outputs([g.conjugate(xi), g.complex_norm_sq(xi), g.complex_norm_sq_backward(xi, xi)])
    wide = x.astype(np.float64)
    want = [wide, wide * wide, 2 * wide * wide]
    tol = 1e-2 if dt is DType.BF16 else 1e-6
    for outs in _both(g, {"x": x}):
        for a, w in zip(outs, want, strict=True):
            assert a.dtype == dt.np
            np.testing.assert_allclose(a.astype(np.float64), w, rtol=tol, atol=tol)


def test_power_spectrum_of_an_rfft():
    """The op's use: |rfft(x)|^2, against NumPy."""
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    g = rlx.Graph("psd")
    xi = g.input("x", (2, 16))
    g.set_outputs([g.complex_norm_sq(g.rfft(xi))])
    want = np.abs(np.fft.rfft(x.astype(np.float64))) ** 2
    for (got,) in _both(g, {"x": x}):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_shape_rules():
    g = rlx.Graph("bad")
    z = g.input("z", (3,), DType.C64)
    with pytest.raises(ShapeError, match=r"complex_norm_sq: needs a complex \(c64\) or float"):
        g.complex_norm_sq(g.input("i", (3,), DType.I32))
    with pytest.raises(ShapeError, match=r"conjugate: needs a complex"):
        g.conjugate(g.input("b", (3,), DType.BOOL))
    with pytest.raises(
        ShapeError, match=r"the cotangent .* must have z's dims \[3\] and dtype f32"
    ):
        g.complex_norm_sq_backward(g.input("c", (3,), DType.C64), z)
    with pytest.raises(ShapeError, match=r"must have z's dims"):
        g.complex_norm_sq_backward(g.input("c2", (4,)), z)
