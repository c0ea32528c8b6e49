"""Differential fuzzing of the loss, complex and 2-D spatial ops (rlx/ops/loss.py,
complex.py, spatial.py) against PyTorch in float64 (harness.py: rlx's reference
interpreter and the compiled graph under every precision policy and native target):

* ``softmax_cross_entropy`` / ``softmax_cross_entropy_backward``: ``F.cross_entropy``
  (``reduction="none"``) and its ``torch.autograd`` gradient weighted by the cotangent,
  labels counted from either end (``OutOfRange.ERROR``) or out of range (``ZERO``: torch's
  ``ignore_index`` rows);
* ``conjugate`` / ``complex_norm_sq`` / ``complex_norm_sq_backward``: ``torch.conj``,
  ``z.abs() ** 2`` and its autograd gradient on complex128;
* ``resize_nearest_2x``: ``F.interpolate(scale_factor=2, mode="nearest")`` (exact values:
  data movement is exact under every policy);
* ``axial_rope_2d``: :func:`torch_axial_rope`, the axial rotary embedding written here
  with ``torch.polar`` from its definition, and its inverse.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.dtype import DType
from rlx.ops.base import OpKind
from rlx.ops.loss import OutOfRange
from rlx.ops.spatial import AxialRope2d

from .harness import EXACT, SEEDS, Tol, check, exact_values, examples

TOL = Tol(2e-5, 8e-3, 6e-2)


def torch_axial_rope(
    x: torch.Tensor, gh: int, gw: int, d: int, theta: float = 10000.0, interleaved: bool = False,
    sign: float = 1.0,
) -> torch.Tensor:  # fmt: skip
    """``x [..., gh*gw, heads*d]`` (float64): per head, the first half rotated by the row
    positions and the second half by the columns, frequencies ``theta ** (-4i / d)``,
    pairs ``(i, i + d/4)`` per half or ``(2i, 2i+1)`` when interleaved; ``sign=-1``
    rotates back."""
    q = d // 4
    freqs = 1.0 / theta ** (torch.arange(0, d, 4, dtype=torch.float64)[:q] / d)
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    xh = x.reshape(*x.shape[:-1], -1, d)
    halves = []
    for half, pos in ((0, ys.reshape(-1)), (1, xs.reshape(-1))):
        part = xh[..., half * d // 2 : (half + 1) * d // 2]
        if interleaved:
            zc = torch.view_as_complex(part.reshape(*part.shape[:-1], q, 2).contiguous())
        else:
            zc = torch.complex(part[..., :q], part[..., q:])
        ang = sign * torch.outer(pos.double(), freqs)
        zr = zc * torch.polar(torch.ones_like(ang), ang)[:, None, :]
        if interleaved:
            halves.append(torch.view_as_real(zr).reshape(part.shape))
        else:
            halves.append(torch.cat([zr.real, zr.imag], -1))
    return torch.cat(halves, -1).reshape(x.shape)


@examples(8)
@given(
    lead=st.sampled_from([(1,), (3,), (2, 2), (5,)]),
    c=st.sampled_from([1, 2, 5, 17, 100]),
    scale=st.sampled_from([1.0, 8.0]),
    mode=st.sampled_from(list(OutOfRange)),
    seed=SEEDS,
)
def test_softmax_cross_entropy_matches_torch(lead, c, scale, mode, seed) -> None:
    rng = np.random.default_rng(seed)
    zero = mode is OutOfRange.ZERO
    feeds = {
        "x": (rng.standard_normal((*lead, c)) * scale).astype(np.float32),
        "y": rng.integers(-c - 2, c + 2, lead) if zero else rng.integers(-c, c, lead),
        "ct": rng.standard_normal(lead).astype(np.float32),
    }
    g = rlx.Graph("ce")
    x, y, ct = (g.input(n, a.shape, DType.from_numpy(a.dtype)) for n, a in feeds.items())
    outs = [g.softmax_cross_entropy(x, y, mode), g.softmax_cross_entropy_backward(ct, x, y, mode)]
    g.set_outputs(outs)

    def oracle(rnd):
        tx = torch.tensor(rnd(feeds["x"]).reshape(-1, c), requires_grad=True)
        lab = feeds["y"]
        lab = np.where((lab < 0) | (lab >= c), -100, lab) if zero else lab % c
        ty = torch.tensor(lab).reshape(-1)
        loss = F.cross_entropy(tx, ty, reduction="none", ignore_index=-100)
        (loss * torch.tensor(rnd(feeds["ct"]).reshape(-1))).sum().backward()
        return [loss.detach().numpy().reshape(lead), tx.grad.numpy().reshape(*lead, c)]

    check(g, feeds, {}, oracle, [OpKind.REDUCTION], TOL, "max")


@examples(4)
@given(shape=st.sampled_from([(3,), (2, 5), (1, 3, 4)]), seed=SEEDS)
def test_complex_ops_match_torch(shape, seed) -> None:
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    ct = rng.standard_normal(shape).astype(np.float32)
    g = rlx.Graph("cx")
    zi, ci = g.input("z", shape, DType.C64), g.input("ct", shape)
    g.set_outputs([g.conjugate(zi), g.complex_norm_sq(zi), g.complex_norm_sq_backward(ci, zi)])

    def oracle(rnd):
        tz = torch.tensor(z.astype(np.complex128), requires_grad=True)
        n = tz.abs() ** 2
        (n * torch.tensor(rnd(ct))).sum().backward()
        return [torch.conj(tz).detach().resolve_conj().numpy(), n.detach().numpy(), tz.grad.numpy()]

    check(g, {"z": z, "ct": ct}, {}, oracle, [OpKind.ELEMENTWISE], TOL, "max")


@examples(4)
@given(shape=st.sampled_from([(1, 1, 1, 1), (2, 3, 4, 5), (3, 2, 7)]), seed=SEEDS)
def test_resize_nearest_2x_matches_interpolate(shape, seed) -> None:
    x = exact_values(np.random.default_rng(seed), shape)
    g = rlx.Graph("up")
    g.set_outputs([g.resize_nearest_2x(g.input("x", shape))])
    t = torch.tensor(x.astype(np.float64)).reshape(-1, 1, *shape[-2:])
    out = (*shape[:-2], 2 * shape[-2], 2 * shape[-1])
    want = [F.interpolate(t, scale_factor=2, mode="nearest").reshape(out).numpy()]
    check(g, {"x": x}, {}, want, [OpKind.DATA_MOVEMENT], EXACT)


@examples(6)
@given(
    grid=st.sampled_from([(1, 1), (2, 3), (4, 4), (5, 2)]),
    d=st.sampled_from([4, 8, 16]),
    heads=st.integers(1, 3),
    lead=st.sampled_from([(), (2,), (1, 2)]),
    interleaved=st.booleans(),
    inverse=st.booleans(),
    theta=st.sampled_from([100.0, 10000.0]),
    seed=SEEDS,
)
def test_axial_rope_2d_matches_torch(grid, d, heads, lead, interleaved, inverse, theta, seed):
    gh, gw = grid
    shape = (*lead, gh * gw, heads * d)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    g = rlx.Graph("rope2d")
    op = AxialRope2d(gh, gw, d, theta, interleaved, inverse)
    g.set_outputs([g.apply(op, [g.input("x", shape)])])

    def oracle(rnd):
        sign = -1.0 if inverse else 1.0
        t = torch.tensor(rnd(x))
        return [torch_axial_rope(t, gh, gw, d, theta, interleaved, sign).numpy()]

    check(g, {"x": x}, {}, oracle, [OpKind.DATA_MOVEMENT], TOL, "max")
