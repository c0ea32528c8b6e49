"""resize_nearest_2x and axial_rope_2d (rlx/ops/spatial.py): shape rules, the reference
and the compiled CPU kernels against PyTorch (``F.interpolate(scale_factor=2,
mode="nearest")``; the axial rotary embedding written with ``torch.polar`` in
tests/fuzz/test_ops_loss_spatial.py), bit for bit between reference and kernel."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import rlx
from rlx import DType
from rlx.errors import ShapeError
from rlx.options import CompileOptions
from tests.fuzz.test_ops_loss_spatial import torch_axial_rope

RAW = CompileOptions(use_cache=False, optimize=False, fuse=False)
RNG = np.random.default_rng(0)


def _both(g: rlx.Graph, feed: dict[str, np.ndarray]) -> list[list[np.ndarray]]:
    return [g.evaluate(feed), rlx.Session("cpu").compile(g, RAW).run(feed)]


@pytest.mark.parametrize("dt", [DType.F32, DType.F64, DType.I64, DType.BF16, DType.BOOL])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 1), (3, 0, 2)])
def test_resize_nearest_2x_matches_interpolate(shape, dt):
    x = (RNG.standard_normal(shape) * 4).astype(dt.np)
    g = rlx.Graph("up")
    g.set_outputs([g.resize_nearest_2x(g.input("x", shape, dt))])
    out = (*shape[:-2], 2 * shape[-2], 2 * shape[-1])
    want = None
    if x.size:
        t = torch.tensor(x.astype(np.float64)).reshape(-1, 1, *shape[-2:])
        want = F.interpolate(t, scale_factor=2, mode="nearest").reshape(out)
    for (got,) in _both(g, {"x": x}):
        assert got.dtype == dt.np and got.shape == out
        if want is not None:
            np.testing.assert_array_equal(got.astype(np.float64), want.numpy())


@pytest.mark.parametrize(
    ("lead", "gh", "gw", "d", "heads", "interleaved", "theta"),
    [
        ((2,), 3, 4, 8, 2, False, 10000.0),
        ((1, 2), 2, 2, 4, 1, True, 100.0),
        ((), 5, 1, 16, 3, False, 10.0),
    ],
)
def test_axial_rope_matches_torch(lead, gh, gw, d, heads, interleaved, theta):
    shape = (*lead, gh * gw, heads * d)
    x = RNG.standard_normal(shape).astype(np.float32)
    g = rlx.Graph("rope2d")
    xi = g.input("x", shape)
    y = g.axial_rope_2d(xi, gh, gw, d, theta=theta, interleaved=interleaved)
    g.set_outputs([y])
    want = torch_axial_rope(torch.tensor(x, dtype=torch.float64), gh, gw, d, theta, interleaved)
    ref, got = _both(g, {"x": x})
    np.testing.assert_allclose(ref[0], want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ref[0], got[0])


def test_axial_rope_inverse_undoes_it():
    from rlx.ops.spatial import AxialRope2d

    x = RNG.standard_normal((2, 6, 8)).astype(np.float32)
    g = rlx.Graph("inv")
    y = g.axial_rope_2d(g.input("x", x.shape), 2, 3, 8)
    g.set_outputs([g.apply(AxialRope2d(2, 3, 8, inverse=True), [y])])
    for (got,) in _both(g, {"x": x}):
        np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt", [DType.F16, DType.BF16])
def test_axial_rope_low_precision(dt):
    x = RNG.standard_normal((1, 4, 8)).astype(dt.np)
    g = rlx.Graph("lp")
    g.set_outputs([g.axial_rope_2d(g.input("x", x.shape, dt), 2, 2, 8)])
    want = torch_axial_rope(torch.tensor(x.astype(np.float64)), 2, 2, 8).numpy()
    for (got,) in _both(g, {"x": x}):
        assert got.dtype == dt.np
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)


def test_shape_rules():
    g = rlx.Graph("bad")
    with pytest.raises(ShapeError, match=r"resize_nearest_2x: needs an input \[\.\.\., H, W\]"):
        g.resize_nearest_2x(g.input("v", (3,)))
    x = g.input("x", (2, 6, 16))
    with pytest.raises(
        ShapeError, match=r"axial_rope_2d: x has 6 tokens on axis -2; the 2 x 2 grid has 4"
    ):
        g.axial_rope_2d(x, 2, 2, 16)
    with pytest.raises(ShapeError, match=r"head_dim must be a positive multiple of 4, got 6"):
        g.axial_rope_2d(x, 2, 3, 6)
    with pytest.raises(ShapeError, match=r"last dim must be a multiple of head_dim=12"):
        g.axial_rope_2d(x, 2, 3, 12)
    with pytest.raises(ShapeError, match=r"needs a float input"):
        g.axial_rope_2d(g.input("i", (6, 8), DType.I32), 2, 3, 8)
