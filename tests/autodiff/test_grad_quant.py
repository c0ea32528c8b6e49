"""Derivative rules of the quantization ops.

``fake_quantize`` (straight-through estimator) and ``fake_quantize_lsq`` (learned scale)
are checked against PyTorch's fake-quantize autograd (``fake_quantize_per_tensor_affine``,
``fake_quantize_per_channel_affine``, ``_fake_quantize_learnable_per_{tensor,channel}_affine``)
and a plain NumPy loop of LSQ's formula: finite differences cannot be their oracle (the
function is piecewise constant; the estimator is a chosen surrogate). ``dequant_matmul``,
linear in ``x``, is checked by finite differences. The integer ops refuse a gradient with
their ``nondiff`` reason.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlx
from rlx.autodiff import jvp, vjp
from rlx.autodiff.check import check_jvp, check_vjp
from rlx.errors import AutodiffError
from rlx.formats.schemes import Int8Block
from rlx.ops import OPS
from rlx.runtime.session import Session

QUANT_OPS = (
    "quantize",
    "dequantize",
    "qmatmul",
    "dynamic_qmatmul",
    "dynamic_qbatch_matmul",
    "qconv2d",
)


def _run(g: rlx.Graph, feed: dict[str, np.ndarray]) -> tuple[list, list]:
    """(reference interpreter outputs, compiled CPU outputs)."""
    return list(g.evaluate(feed, {})), list(Session("cpu").compile(g).run(feed))


def _torch_fq(x, ct, scales, zps, axis, qmin, qmax):
    xt = torch.tensor(x, requires_grad=True)
    if axis is None:
        y = torch.fake_quantize_per_tensor_affine(xt, scales[0], zps[0], qmin, qmax)
    else:
        y = torch.fake_quantize_per_channel_affine(
            xt,
            torch.tensor(scales, dtype=torch.float32),
            torch.tensor(zps, dtype=torch.int32),
            axis,
            qmin,
            qmax,
        )
    y.backward(torch.tensor(ct))
    return y.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize(
    "axis,scales,zps,qmin,qmax",
    [
        (None, [0.05], [0], -128, 127),
        (None, [0.11], [3], -20, 20),
        (None, [0.02], [128], 0, 255),
        (1, [0.05, 0.2, 0.01, 0.3, 0.07, 0.5], [0, 1, -2, 0, 4, 0], -128, 127),
        (0, [0.03, 0.1, 0.2, 0.04], [0, 0, 0, 0], -8, 7),
    ],
)
def test_fake_quantize_ste_matches_torch(axis, scales, zps, qmin, qmax):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4, 6)) * 8).astype(np.float32)
    ct = rng.standard_normal((4, 6)).astype(np.float32)
    g = rlx.Graph("fq")
    xi = g.input("x", (4, 6))
    g.set_outputs([g.fake_quantize(xi, scales, zps, axis=axis, qmin=qmin, qmax=qmax)])
    want_y, want_dx = _torch_fq(x, ct, scales, zps, axis, qmin, qmax)
    # both halves of the mask occur: some values saturate, some pass
    assert 0 < np.count_nonzero(want_dx == 0) < x.size
    back = vjp(g, ["x"])
    for res in _run(back, {"x": x, "ct0": ct}):
        np.testing.assert_allclose(res[0], want_y, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(res[1], want_dx)
    # forward mode: the same diagonal mask applied to the tangent
    fwd = jvp(g, ["x"])
    for res in _run(fwd, {"x": x, "t_x": ct}):
        np.testing.assert_array_equal(res[1], want_dx)


def _lsq_numpy(x, s, zps, axis, qmin, qmax, ct, grad_factor):
    """LSQ's gradients by a plain loop over the elements (float64)."""
    dx = np.zeros_like(x, dtype=np.float64)
    ds = np.zeros(len(s), dtype=np.float64)
    for idx in np.ndindex(x.shape):
        c = 0 if axis is None else idx[axis]
        sc = max(float(s[c]), float(np.finfo(np.float32).eps))
        v = float(x[idx]) / sc
        q = np.rint(v) + zps[c]
        if q < qmin:
            d = qmin - zps[c]
        elif q > qmax:
            d = qmax - zps[c]
        else:
            d = np.rint(v) - v
            dx[idx] = ct[idx]
        ds[c] += d * ct[idx] * grad_factor
    return dx, ds


@pytest.mark.parametrize(
    "axis,n,zps,qmin,qmax,gf",
    [
        (None, 1, [0], -128, 127, 1.0),
        (None, 1, [5], 0, 15, 0.25),
        (1, 6, [0] * 6, -8, 7, 1.0),
        (0, 4, [1, 0, -1, 2], -8, 7, 0.5),
    ],
)
def test_fake_quantize_lsq_matches_torch_learnable(axis, n, zps, qmin, qmax, gf):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 6)) * 2).astype(np.float32)
    ct = rng.standard_normal((4, 6)).astype(np.float32)
    s = (np.abs(rng.standard_normal(n)) * 0.2 + 0.05).astype(np.float32)
    g = rlx.Graph("lsq")
    xi, si = g.input("x", (4, 6)), g.input("s", (n,))
    g.set_outputs([g.fake_quantize_lsq(xi, si, zps, axis, qmin, qmax, grad_factor=gf)])
    xt, st = torch.tensor(x, requires_grad=True), torch.tensor(s, requires_grad=True)
    zt = torch.tensor(zps, dtype=torch.float32)
    if axis is None:
        y = torch._fake_quantize_learnable_per_tensor_affine(xt, st, zt, qmin, qmax, gf)
    else:
        y = torch._fake_quantize_learnable_per_channel_affine(xt, st, zt, axis, qmin, qmax, gf)
    y.backward(torch.tensor(ct))
    np_dx, np_ds = _lsq_numpy(x, s, zps, axis, qmin, qmax, ct, gf)
    back = vjp(g, ["x", "s"])
    for out, dx, ds in _run(back, {"x": x, "s": s, "ct0": ct}):
        np.testing.assert_allclose(out, y.detach().numpy(), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(dx, xt.grad.numpy())
        np.testing.assert_allclose(ds, st.grad.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(dx, np_dx)
        np.testing.assert_allclose(ds, np_ds, rtol=1e-5, atol=1e-5)
    # forward mode is the transpose: <u, J v> == <J^T u, v> for tangents of x and s
    tx = rng.standard_normal(x.shape).astype(np.float32)
    ts = rng.standard_normal(n).astype(np.float32)
    fwd = jvp(g, ["x", "s"])
    for res in _run(fwd, {"x": x, "s": s, "t_x": tx, "t_s": ts}):
        lhs = float(np.vdot(ct, res[1]))
        rhs = float(np.vdot(np_dx, tx) + np.vdot(np_ds, ts))
        assert abs(lhs - rhs) <= 1e-4 * max(1.0, abs(rhs))


def test_fake_quantize_lsq_without_learn_scale_passes_no_scale_gradient():
    g = rlx.Graph("track")
    w = g.input("w", (3, 5))
    s = g.div(g.max(g.abs(w), 0), g.constant(np.float32(127.0)))  # an observer's scale
    g.set_outputs([g.sum(g.fake_quantize_lsq(w, s, axis=1, learn_scale=False))])
    wv = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    (dw,) = rlx.grad(g, ["w"]).evaluate({"w": wv}, {})
    # nothing saturates (the scale covers max |w|), so the estimator passes all ones, and
    # no gradient flows back through the max
    np.testing.assert_array_equal(dw, np.ones_like(wv))


def test_fake_quantize_lsq_rejects_bad_scale_shapes():
    g = rlx.Graph("bad")
    x = g.input("x", (4, 6))
    with pytest.raises(rlx.errors.ShapeError, match=r"per-channel scale along axis 1 .* \[6\]"):
        g.fake_quantize_lsq(x, g.input("s", (4,)), axis=1)
    with pytest.raises(rlx.errors.ShapeError, match="scale must be f32"):
        g.fake_quantize_lsq(x, g.input("s2", (1,), "f64"))


def test_straight_through_rules_with_a_symbolic_batch():
    g = rlx.Graph("sym")
    x = g.input("x", ("B", 6))
    s = g.input("s", (1,))
    y = g.fake_quantize_lsq(g.fake_quantize(x, [0.1] * 6, axis=1, qmin=-8, qmax=7), s)
    g.set_outputs([g.sum(y)])
    back = rlx.grad(g, ["x", "s"])
    compiled = Session("cpu").compile(back)
    for b in (2, 5):
        xv = np.linspace(-1.5, 1.5, b * 6, dtype=np.float32).reshape(b, 6)
        sv = np.array([0.3], np.float32)
        want = back.evaluate({"x": xv, "s": sv}, {})
        got = compiled.run({"x": xv, "s": sv})
        for a, w in zip(got, want, strict=True):
            np.testing.assert_allclose(a, w, rtol=1e-6, atol=1e-6)
        inside = (np.rint(xv / 0.1) >= -8) & (np.rint(xv / 0.1) <= 7)
        fq = np.clip(np.rint(xv / 0.1), -8, 7) * np.float32(0.1)
        inside &= np.abs(np.rint(fq / 0.3)) <= 127
        np.testing.assert_array_equal(got[0], inside.astype(np.float32))


def test_dequant_matmul_rules_by_finite_differences():
    rng = np.random.default_rng(4)
    w_q = rng.integers(-127, 128, (5, 8)).astype(np.int8)
    scale = (rng.random((5, 2)) * 0.1 + 0.01).astype(np.float32)
    zp = np.zeros((5, 2), np.int32)
    g = rlx.Graph("dqmm")
    x = g.input("x", (3, 8))
    ws = [g.constant(w_q), g.constant(scale), g.constant(zp)]
    g.set_outputs([g.dequant_matmul(x, Int8Block(4), *ws)])
    feed = {"x": rng.standard_normal((3, 8)).astype(np.float32)}
    # linear in x: central differences are exact up to f32 rounding for any step
    check_vjp(g, feed, ["x"], eps=0.5, rtol=1e-4, atol=1e-4, compiled=True)
    check_jvp(g, feed, ["x"], eps=0.5, rtol=1e-4, atol=1e-4, compiled=True)


def test_integer_quant_ops_refuse_gradients_with_their_reason():
    for name in QUANT_OPS:
        assert OPS[name].nondiff, name
    assert OPS["fake_quantize"].nondiff == "" and OPS["fake_quantize_lsq"].nondiff == ""
    assert OPS["dequant_matmul"].nondiff == ""
    # an explicit quantize -> dequantize: integers carry no cotangent, so x gets none
    g = rlx.Graph("q")
    x = g.input("x", (2, 4))
    g.set_outputs([g.sum(g.dequantize(g.quantize(x, 0.1), 0.1))])
    (dx,) = rlx.grad(g, ["x"]).evaluate({"x": np.ones((2, 4), np.float32)}, {})
    np.testing.assert_array_equal(dx, np.zeros((2, 4), np.float32))
    g2 = rlx.Graph("dq")
    x2 = g2.input("x", (2, 4))
    w = g2.constant(np.ones((4, 3), np.int8))
    g2.set_outputs([g2.sum(g2.dynamic_qmatmul(x2, w, 0.1))])
    with pytest.raises(AutodiffError, match="dynamic_qmatmul.*train with fake_quantize"):
        rlx.grad(g2, ["x"])
    g3 = rlx.Graph("qb")
    a, b = g3.input("a", (2, 3, 4)), g3.input("b", (2, 4, 5))
    g3.set_outputs([g3.sum(g3.dynamic_qbatch_matmul(a, b))])
    with pytest.raises(AutodiffError, match="dynamic_qbatch_matmul.*piecewise constant"):
        rlx.grad(g3, ["b"])


def test_vmap_and_hvp_through_the_fake_quantizers():
    g = rlx.Graph("f")
    x, s = g.input("x", (6,)), g.input("s", (1,))
    g.set_outputs([g.fake_quantize_lsq(g.fake_quantize(x, 0.1, qmin=-8, qmax=7), s)])
    xs = np.linspace(-1.2, 1.2, 18, dtype=np.float32).reshape(3, 6)
    sv = np.array([0.3], np.float32)
    (got,) = rlx.vmap(g, {"x": 0, "s": None}, size=3).evaluate({"x": xs, "s": sv}, {})
    want = np.clip(np.rint(np.clip(np.rint(xs / 0.1), -8, 7) * np.float32(0.1) / 0.3), -128, 127)
    np.testing.assert_allclose(got, want * np.float32(0.3), rtol=1e-6, atol=1e-7)
    # f(x) = sum(fq(x) * x): under the estimator the gradient is mask * x + fq(x), and its
    # derivative along v is 2 * mask * v
    h = rlx.Graph("h")
    xh = h.input("x", (6,), "f64")
    h.set_outputs([h.sum(h.mul(h.fake_quantize(xh, 0.1, qmin=-5, qmax=5), xh))])
    xv = np.linspace(-1.0, 1.0, 6)
    v = np.arange(1.0, 7.0)
    (hv,) = rlx.hvp(h, ["x"]).evaluate({"x": xv, "v_x": v}, {})
    mask = np.abs(np.rint(xv / 0.1)) <= 5
    np.testing.assert_allclose(hv, 2 * mask * v)
