"""Standalone composite transcendental unaries (gelu, gelu_tanh, erf, sigmoid, silu,
softplus: what the backward rules keep as their own nodes) run as one native C loop, not the NumPy ufunc chain, and
match an independent float64 NumPy/SciPy oracle. ``CompileOptions(native=False)`` keeps
the NumPy kernel."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from scipy.special import erf as sp_erf

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.kernels import KernelKind
from rlx.dtype import DType
from rlx.ops.elementwise import Unary, UnaryKind
from rlx.options import CompileOptions
from rlx.runtime.session import Session

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)
C = np.sqrt(2.0 / np.pi)
ORACLE: dict[UnaryKind, Callable[[np.ndarray], np.ndarray]] = {
    UnaryKind.GELU: lambda v: 0.5 * v * (1.0 + sp_erf(v / np.sqrt(2.0))),
    UnaryKind.GELU_TANH: lambda v: 0.5 * v * (1.0 + np.tanh(C * (v + 0.044715 * v**3))),
    UnaryKind.ERF: sp_erf,
    UnaryKind.SIGMOID: lambda v: 1.0 / (1.0 + np.exp(-v)),
    UnaryKind.SILU: lambda v: v / (1.0 + np.exp(-v)),
    UnaryKind.SOFTPLUS: lambda v: np.logaddexp(0.0, v),
}
TOL = {DType.F32: (3e-6, 2e-6), DType.F64: (1e-12, 1e-13)}


def _graph(fn: UnaryKind, dims: tuple[object, ...], dt: DType) -> rlx.Graph:
    g = rlx.Graph(f"u_{fn.value}")
    if any(isinstance(d, str) for d in dims):
        g.sym("batch", max=64)
    x = g.input("x", dims, dt)
    g.set_outputs([g.apply(Unary(fn), [x])])
    return g


def _feed(fn: UnaryKind, shape: tuple[int, ...], dt: DType) -> np.ndarray:
    v = np.random.default_rng(3).normal(0.0, 3.0, shape)
    v.flat[:6] = [0.0, -0.0, 8.0, -8.0, 40.0, -40.0]
    return v.astype(dt.np)


@pytest.mark.parametrize("dt", [DType.F32, DType.F64], ids=str)
@pytest.mark.parametrize("fn", list(ORACLE), ids=lambda k: k.value)
def test_standalone_unary_is_native_and_matches(fn: UnaryKind, dt: DType) -> None:
    shape = (4, 33, 17)
    g = _graph(fn, shape, dt)
    cg = Session("cpu").compile(g, RAW)
    (entry,) = [e for e in cg._executor_any().entries if e.op == "unary"]
    assert entry.kind is KernelKind.NATIVE, entry.notes
    x = _feed(fn, shape, dt)
    got = cg.run({"x": x})[0]
    assert got.dtype == dt.np and got.shape == shape
    rtol, atol = TOL[dt]
    np.testing.assert_allclose(got, ORACLE[fn](x.astype(np.float64)), rtol, atol)


def test_symbolic_batch_gelu_native() -> None:
    g = _graph(UnaryKind.GELU, ("batch", 24), DType.F32)
    cg = Session("cpu").compile(g, RAW)
    for batch in (1, 9, 40):
        x = _feed(UnaryKind.GELU, (batch, 24), DType.F32)
        got = cg.run({"x": x})[0]
        want = ORACLE[UnaryKind.GELU](x.astype(np.float64))
        np.testing.assert_allclose(got, want, 3e-6, 2e-6)


def test_native_off_keeps_numpy_kernel() -> None:
    g = _graph(UnaryKind.GELU, (8, 16), DType.F32)
    opts = CompileOptions(optimize=False, fuse=False, use_cache=False, native=False)
    cg = Session("cpu").compile(g, opts)
    (entry,) = [e for e in cg._executor_any().entries if e.op == "unary"]
    assert entry.kind is KernelKind.NUMPY
    x = _feed(UnaryKind.GELU, (8, 16), DType.F32)
    want = ORACLE[UnaryKind.GELU](x.astype(np.float64))
    np.testing.assert_allclose(cg.run({"x": x})[0], want, 3e-6, 2e-6)
