"""Derivative and batching rules of the loss, complex and 2-D spatial ops against PyTorch:
``SoftmaxCrossEntropyWithLogits`` (its vjp is ``SoftmaxCrossEntropyBackward``, whose own
vjp / jvp give second derivatives), ``Conjugate``, ``ComplexNormSq`` (its vjp is
``ComplexNormSqBackward``), ``ResizeNearest2x`` and ``AxialRope2d`` (vjp: the inverse
rotation). Oracles: ``torch.autograd`` (first and second order), ``torch.func.jvp``, and
for vmap a loop over the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import rlx
from rlx import DType
from rlx.autodiff import jvp, vjp, vmap
from rlx.autodiff.reverse import grad
from tests.fuzz.test_ops_loss_spatial import torch_axial_rope

RNG = np.random.default_rng(0)


def t64(a: np.ndarray, grad: bool = True) -> torch.Tensor:
    dt = torch.complex128 if np.iscomplexobj(a) else torch.float64
    return torch.tensor(np.asarray(a), dtype=dt, requires_grad=grad)


def _ops(g: rlx.Graph) -> set[str]:
    return {n.op.mnemonic for n in g.nodes}


def test_cross_entropy_gradient_is_the_backward_op_and_matches_torch():
    x = (RNG.standard_normal((6, 5)) * 3).astype(np.float64)
    y = RNG.integers(0, 5, 6)
    g = rlx.Graph("ce")
    xi, yi = g.input("x", x.shape, DType.F64), g.input("y", (6,), DType.I64)
    g.set_outputs([g.mean(g.softmax_cross_entropy(xi, yi))])
    dg = grad(g, ["x"])
    assert "softmax_cross_entropy_backward" in _ops(dg) and "log_softmax_backward" not in _ops(dg)
    tx = t64(x)
    F.cross_entropy(tx, torch.tensor(y)).backward()
    np.testing.assert_allclose(dg.evaluate({"x": x, "y": y})[0], tx.grad.numpy(), rtol=1e-12)


def test_cross_entropy_second_derivatives_match_torch():
    """The backward op's vjp (wrt the cotangent and the logits) against torch's double
    backward of F.cross_entropy."""
    x, ct, w = RNG.standard_normal((4, 3)), RNG.standard_normal(4), RNG.standard_normal((4, 3))
    y = np.array([0, 2, 1, -1])
    g = rlx.Graph("ce2")
    ci, xi = g.input("ct", (4,), DType.F64), g.input("x", (4, 3), DType.F64)
    yi = g.input("y", (4,), DType.I64)
    g.set_outputs([g.softmax_cross_entropy_backward(ci, xi, yi)])
    back = vjp(g, ["ct", "x"]).evaluate({"ct": ct, "x": x, "y": y, "ct0": w})
    tc, tx = t64(ct), t64(x)
    loss = (F.cross_entropy(tx, torch.tensor(y % 3), reduction="none") * tc).sum()
    (gx,) = torch.autograd.grad(loss, tx, create_graph=True)
    dc, dx = torch.autograd.grad((gx * torch.tensor(w)).sum(), (tc, tx))
    np.testing.assert_allclose(back[0], gx.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(back[1], dc.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(back[2], dx.numpy(), rtol=1e-10, atol=1e-12)
    # forward mode of the backward op, against torch.func.jvp of torch's gradient
    tct, txx = RNG.standard_normal(4), RNG.standard_normal((4, 3))
    fwd = jvp(g, ["ct", "x"]).evaluate({"ct": ct, "x": x, "y": y, "t_ct": tct, "t_x": txx})

    def f(c, xx):
        return torch.func.grad(
            lambda v: (F.cross_entropy(v, torch.tensor(y % 3), reduction="none") * c).sum()
        )(xx)

    _, want = torch.func.jvp(
        f, (torch.tensor(ct), torch.tensor(x)), (torch.tensor(tct), torch.tensor(txx))
    )
    np.testing.assert_allclose(fwd[1], want.numpy(), rtol=1e-10, atol=1e-12)


def test_cross_entropy_jvp_matches_torch():
    x, t = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 3, 4))
    y = RNG.integers(0, 4, (2, 3))
    g = rlx.Graph("cej")
    xi, yi = g.input("x", x.shape, DType.F64), g.input("y", y.shape, DType.I64)
    g.set_outputs([g.softmax_cross_entropy(xi, yi)])
    got = jvp(g, ["x"]).evaluate({"x": x, "y": y, "t_x": t})[1]

    def f(v):
        return F.cross_entropy(v.reshape(-1, 4), torch.tensor(y).reshape(-1), reduction="none")

    _, want = torch.func.jvp(f, (torch.tensor(x),), (torch.tensor(t),))
    np.testing.assert_allclose(got, want.numpy().reshape(2, 3), rtol=1e-12, atol=1e-14)


def test_complex_gradients_match_torch_autograd():
    """L = sum(a * |conj(z) * w|^2): rlx's vjp (ComplexNormSqBackward, Conjugate) gives
    torch's gradient (2 z-style, the conjugate Wirtinger derivative times 2)."""
    shape = (3, 4)
    z = (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex64)
    w = (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex64)
    a = RNG.standard_normal(shape).astype(np.float32)
    g = rlx.Graph("cx")
    zi, wi = g.input("z", shape, DType.C64), g.input("w", shape, DType.C64)
    ai = g.input("a", shape)
    g.set_outputs([g.sum(g.mul(ai, g.complex_norm_sq(g.mul(g.conjugate(zi), wi))))])
    dg = grad(g, ["z", "w"])
    assert {"complex_norm_sq_backward", "conjugate"} <= _ops(dg)
    got = dg.evaluate({"z": z, "w": w, "a": a})
    tz, tw = t64(z.astype(np.complex128)), t64(w.astype(np.complex128))
    (torch.tensor(a.astype(np.float64)) * (torch.conj(tz) * tw).abs() ** 2).sum().backward()
    np.testing.assert_allclose(got[0], tz.grad.resolve_conj().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], tw.grad.resolve_conj().numpy(), rtol=1e-4, atol=1e-4)


def test_complex_norm_sq_backward_rules_match_torch():
    """vjp of 2 * ct * z wrt (ct, z) against torch's double backward of |z|^2."""
    shape = (5,)
    z = (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex64)
    ct = RNG.standard_normal(shape).astype(np.float32)
    u = (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex64)
    g = rlx.Graph("cb")
    ci, zi = g.input("ct", shape), g.input("z", shape, DType.C64)
    g.set_outputs([g.complex_norm_sq_backward(ci, zi)])
    got = vjp(g, ["ct", "z"]).evaluate({"ct": ct, "z": z, "ct0": u})
    tc, tz = t64(ct.astype(np.float64)), t64(z.astype(np.complex128))
    (gz,) = torch.autograd.grad((tz.abs() ** 2 * tc).sum(), tz, create_graph=True)
    ut = torch.tensor(u.astype(np.complex128))
    dc, dz = torch.autograd.grad((torch.conj(ut) * gz).real.sum(), (tc, tz))
    np.testing.assert_allclose(got[0], gz.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(got[1], dc.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[2], dz.numpy(), rtol=1e-4, atol=1e-5)


def test_resize_and_axial_rope_gradients_match_torch():
    x = RNG.standard_normal((2, 3, 4, 5))
    r = RNG.standard_normal((2, 6, 16))
    ux, ur = RNG.standard_normal((2, 3, 8, 10)), RNG.standard_normal((2, 6, 16))
    g = rlx.Graph("sp")
    xi, ri = g.input("x", x.shape, DType.F64), g.input("r", r.shape, DType.F64)
    g.set_outputs([g.resize_nearest_2x(xi), g.axial_rope_2d(ri, 2, 3, 8, theta=100.0)])
    got = vjp(g, ["x", "r"]).evaluate({"x": x, "r": r, "ct0": ux, "ct1": ur})
    tx, tr = t64(x), t64(r)
    up = F.interpolate(tx.reshape(6, 1, 4, 5), scale_factor=2, mode="nearest").reshape(ux.shape)
    rot = torch_axial_rope(tr, 2, 3, 8, 100.0)
    ((up * torch.tensor(ux)).sum() + (rot * torch.tensor(ur)).sum()).backward()
    np.testing.assert_allclose(got[2], tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(got[3], tr.grad.numpy(), rtol=1e-10, atol=1e-12)
    tans = {"t_x": RNG.standard_normal(x.shape), "t_r": RNG.standard_normal(r.shape)}
    fwd = jvp(g, ["x", "r"]).evaluate({"x": x, "r": r, **tans})
    np.testing.assert_array_equal(fwd[2], np.repeat(np.repeat(tans["t_x"], 2, -2), 2, -1))
    want = torch_axial_rope(torch.tensor(tans["t_r"]), 2, 3, 8, 100.0).numpy()
    np.testing.assert_allclose(fwd[3], want, rtol=1e-10, atol=1e-12)


def _batched(name: str) -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    g = rlx.Graph(name)
    if name == "loss":
        x, y, c = g.input("x", (3, 4)), g.input("y", (3,), DType.I64), g.input("c", (3,))
        g.set_outputs([g.softmax_cross_entropy(x, y), g.softmax_cross_entropy_backward(c, x, y)])
        feed = {
            "x": RNG.standard_normal((5, 3, 4)),
            "y": RNG.integers(0, 4, (5, 3)),
            "c": RNG.standard_normal((5, 3)),
        }
    elif name == "complex":
        z, c = g.input("z", (3,), DType.C64), g.input("c", (3,))
        g.set_outputs([g.conjugate(z), g.complex_norm_sq(z), g.complex_norm_sq_backward(c, z)])
        feed = {
            "z": RNG.standard_normal((5, 3)) + 1j * RNG.standard_normal((5, 3)),
            "c": RNG.standard_normal((5, 3)),
        }
    else:
        x, r = g.input("x", (2, 3)), g.input("r", (4, 8))
        g.set_outputs([g.resize_nearest_2x(x), g.axial_rope_2d(r, 2, 2, 4, interleaved=True)])
        feed = {"x": RNG.standard_normal((5, 2, 3)), "r": RNG.standard_normal((5, 4, 8))}
    types = {n.op.name: n.dtype.np for n in g.nodes if n.op.mnemonic == "input"}
    return g, {k: v.astype(types[k]) for k, v in feed.items()}


@pytest.mark.parametrize("name", ["loss", "complex", "spatial"])
@pytest.mark.parametrize("axis", [0, -1])
def test_vmap_matches_a_loop(name, axis):
    g, feed = _batched(name)
    moved = {k: np.moveaxis(v, 0, axis) for k, v in feed.items()}
    v = vmap(g, {k: (axis % v.ndim) for k, v in moved.items()}, out_axes=0, size=5)
    got = v.evaluate(moved)
    for i in range(5):
        want = g.evaluate({k: a[i] for k, a in feed.items()})
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a[i], b, rtol=1e-6, atol=1e-6)


def test_cross_entropy_hvp_matches_torch():
    """Forward over reverse through the backward op's jvp: H v of the mean loss."""
    from rlx.autodiff import hvp

    x, v = RNG.standard_normal((5, 4)), RNG.standard_normal((5, 4))
    y = RNG.integers(0, 4, 5)
    g = rlx.Graph("ceh")
    xi, yi = g.input("x", x.shape, DType.F64), g.input("y", (5,), DType.I64)
    g.set_outputs([g.mean(g.softmax_cross_entropy(xi, yi))])
    (got,) = hvp(g, ["x"]).evaluate({"x": x, "y": y, "v_x": v})

    def f(t):
        return F.cross_entropy(t, torch.tensor(y))

    _, want = torch.autograd.functional.hvp(f, torch.tensor(x), torch.tensor(v))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)
