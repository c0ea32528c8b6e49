"""Derivative rules of the FFTs (Fft: fft / ifft / rfft / irfft with every norm and n),
control flow (If, Scan; While is nondiff), custom ops (Custom with user rules, CustomFn)
and the inference-only ops' nondiff reasons (Sample, CacheAttention, DequantGather).

Oracles: central differences (``check_vjp`` / ``check_jvp``; the FFTs are linear, so a
unit step is exact up to f32 rounding), PyTorch autograd for the FFTs, and closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlx
from rlx.autodiff.check import check_jvp, check_vjp
from rlx.autodiff.reverse import grad, vjp
from rlx.errors import AutodiffError
from rlx.ops.base import registry_scope
from rlx.ops.control import If, Scan, While
from rlx.ops.custom import Custom, CustomFn, register_custom_op
from rlx.ops.fft import Fft
from rlx.ops.kvcache import CacheAttention, DequantGather
from rlx.ops.sample import Sample

LINEAR = {"eps": 1.0, "rtol": 1e-4, "atol": 1e-4}
TORCH_FFT = {
    "fft": torch.fft.fft,
    "ifft": torch.fft.ifft,
    "rfft": torch.fft.rfft,
    "irfft": torch.fft.irfft,
}


def _complex(rng, shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


@pytest.mark.parametrize("fn", sorted(TORCH_FFT))
@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("n", [None, 5, 12])
def test_fft_rules_vs_finite_differences_and_torch(fn, norm, n):
    real_in = fn == "rfft"
    shape = (2, 8)
    g = rlx.Graph(fn)
    x = g.input("x", shape, "f32" if real_in else "c64")
    g.set_outputs(getattr(g, fn)(x, n=n, axis=1, norm=norm))
    rng = np.random.default_rng(0)
    xv = (rng.standard_normal(shape) if real_in else _complex(rng, shape)).astype(
        np.float32 if real_in else np.complex64
    )
    check_vjp(g, {"x": xv}, ["x"], compiled=n == 5, **LINEAR)
    check_jvp(g, {"x": xv}, ["x"], **LINEAR)
    y = g.evaluate({"x": xv})[0]
    ct = _complex(rng, y.shape) if y.dtype.kind == "c" else rng.standard_normal(y.shape)
    (got,) = vjp(g, ["x"]).evaluate({"x": xv, "ct0": ct.astype(y.dtype)})[1:]
    xt = torch.tensor(xv.astype(np.float64 if real_in else np.complex128), requires_grad=True)
    TORCH_FFT[fn](xt, n=n, dim=1, norm=norm).backward(torch.tensor(ct))
    np.testing.assert_allclose(got, xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert Fft


# ---- control flow --------------------------------------------------------------------


def _check(build, shapes, compiled=False):
    g = rlx.Graph("t")
    ids = [g.input(f"x{k}", s, "f64") for k, s in enumerate(shapes)]
    g.set_outputs(build(g, *ids))
    rng = np.random.default_rng(1)
    vals = {f"x{k}": rng.standard_normal(s) for k, s in enumerate(shapes)}
    wrt = list(vals)
    check_vjp(g, vals, wrt, compiled=compiled)
    check_jvp(g, vals, wrt, compiled=compiled)


@pytest.mark.parametrize("pred", [True, False])
@pytest.mark.parametrize("index", [0, 1])
def test_if_differentiates_the_taken_branch(pred, index):
    def then(s, a, b):
        return [s.mul(s.sin(a), b), a]

    def other(s, a, b):
        return [s.exp(b), b]  # ignores a: its gradient there is zero

    _check(
        lambda g, x, y: g.cond(g.constant(np.array(pred)), then, other, [x, y], index),
        [(3,), (3,)],
        compiled=index == 0,
    )
    assert If


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("index", [0, 1, 2])
def test_scan_through_stored_carries(reverse, index):
    """A recurrence with a weight carried unchanged: its gradient accumulates over the
    steps; the stacked ys (index 2) and the final carries (0, 1) each differentiated."""

    def body(s, c, w, x):
        return [s.add(s.mul(s.tanh(c), w), x), w, s.mul(c, x)]

    _check(
        lambda g, c, w, xs: g.scan(body, [c, w], [xs], output_index=index, reverse=reverse),
        [(3,), (3,), (4, 3)],
        compiled=index == 2,
    )
    assert Scan


def test_scan_gradient_closed_form():
    """c_{t+1} = w * c_t: d c_T / d w = T w^(T-1) c_0, d c_T / d c_0 = w^T."""
    g = rlx.Graph("pow")
    c, w = g.input("c", (1,), "f64"), g.input("w", (1,), "f64")
    g.set_outputs(g.sum(g.scan(lambda s, c, w: [s.mul(c, w), w], [c, w], length=5)))
    dc, dw = grad(g, ["c", "w"]).evaluate({"c": np.array([2.0]), "w": np.array([1.5])})
    np.testing.assert_allclose(dw, [5 * 1.5**4 * 2.0])
    np.testing.assert_allclose(dc, [1.5**5])


def test_while_is_nondiff_with_the_reason():
    g = rlx.Graph("w")
    x = g.input("x", (1,), "f64")
    y = g.while_loop(
        lambda s, v: s.lt(s.sum(v), s.constant(np.array(10.0))),
        lambda s, v: s.mul(v, s.constant(np.array(2.0))),
        [x],
    )
    g.set_outputs(g.sum(y))
    with pytest.raises(AutodiffError, match=r"while.*trip count; use scan"):
        grad(g, ["x"])
    assert While.nondiff


# ---- custom ops ----------------------------------------------------------------------


def _sin_mul(s, a, b):
    return s.mul(s.sin(a), b)


def test_custom_fn_differentiates_its_forward_body():
    _check(lambda g, x, y: g.custom_fn([x, y], _sin_mul), [(3,), (3,)], compiled=True)
    _check(lambda g, x: g.custom_fn([x, x], _sin_mul), [(3,)])  # a repeated operand


def test_custom_fn_uses_its_rule_bodies():
    """Rules that differ from the true derivative (scaled by 2) are what the drivers use."""
    g = rlx.Graph("r")
    x = g.input("x", (3,), "f64")
    g.set_outputs(
        g.sum(
            g.custom_fn(
                [x],
                lambda s, a: s.sin(a),
                vjp=lambda s, a, p, d: [s.mul(s.mul(d, s.cos(a)), s.constant(np.array(2.0)))],
                jvp=lambda s, a, t, p: s.mul(s.mul(t, s.cos(a)), s.constant(np.array(2.0))),
            )
        )
    )
    v = np.array([0.1, 0.5, -1.0])
    (dx,) = grad(g, ["x"]).evaluate({"x": v})
    np.testing.assert_allclose(dx, 2 * np.cos(v))
    from rlx.autodiff.forward import jvp

    out = jvp(g, ["x"]).evaluate({"x": v, "t_x": np.ones(3)})
    np.testing.assert_allclose(out[1], 2 * np.cos(v).sum())
    assert CustomFn


def test_custom_op_with_and_without_user_rules():
    def square_vjp(g, node, ct):
        two = g.constant(np.array(2.0))
        return (g.mul(g.mul(ct, node.inputs[0]), two),)

    def square_jvp(g, node, tangents):
        return g.mul(g.mul(tangents[0], node.inputs[0]), g.constant(np.array(2.0)))

    with registry_scope():
        register_custom_op(
            "sq",
            lambda ins, at: ins[0],
            lambda xs, at, ctx: xs[0] ** 2,
            1,
            vjp=square_vjp,
            jvp=square_jvp,
        )
        register_custom_op("sq_plain", lambda ins, at: ins[0], lambda xs, at, ctx: xs[0] ** 2, 1)
        _check(lambda g, x: g.custom("sq", [x]), [(3,)])
        g = rlx.Graph("c")
        x = g.input("x", (3,), "f64")
        g.set_outputs(g.sum(g.custom("sq_plain", [x])))
        with pytest.raises(AutodiffError, match=r"'sq_plain' was registered without a vjp rule"):
            grad(g, ["x"])
    assert Custom


def test_inference_only_ops_say_why():
    assert "integer" in Sample.nondiff
    assert "KV cache" in CacheAttention.nondiff
    assert "quantized" in DequantGather.nondiff


# ---- second order: hvp through these rules -------------------------------------------


def _i64(g, a):
    return g.constant(np.asarray(a, dtype=np.int64))


HVP_CASES = {
    "matmul": ([(2, 3, 4), (4, 5)], lambda g, x, w: g.sum(g.tanh(g.matmul(x, w)))),
    "gather_pad_slice": (
        [(5, 2)],
        lambda g, x: g.sum(
            g.tanh(
                g.gather(
                    g.pad(g.slice(x, [None], [None], [-2]), [(1, 1), (0, 0)]), _i64(g, [0, 1, 1]), 0
                )
            )
        ),
    ),
    "dense_solve": (
        [(3, 3), (3,)],
        lambda g, a, b: g.sum(g.tanh(g.dense_solve(g.add(a, g.constant(4 * np.eye(3))), b))),
    ),
    "scan": (
        [(3,), (4, 3)],
        lambda g, c, xs: g.sum(
            g.scan(lambda s, c, x: [s.tanh(s.mul(c, x)), s.mul(c, x)], [c], [xs], output_index=1)
        ),
    ),
    "if": (
        [(3,), (3,)],
        lambda g, x, y: g.sum(
            g.cond(
                g.constant(np.array(True)),
                lambda s, a, b: s.mul(s.sin(a), b),
                lambda s, a, b: b,
                [x, y],
            )
        ),
    ),
    "custom_fn": ([(3,), (3,)], lambda g, x, y: g.sum(g.tanh(g.custom_fn([x, y], _sin_mul)))),
}


@pytest.mark.parametrize("name", sorted(HVP_CASES))
def test_hvp_through_the_rules(name):
    """H v (forward over reverse) against central differences of the gradient graph."""
    from rlx.autodiff.hvp import hvp

    shapes, build = HVP_CASES[name]
    g = rlx.Graph(name)
    ids = [g.input(f"x{k}", s, "f64") for k, s in enumerate(shapes)]
    g.set_outputs(build(g, *ids))
    wrt = [f"x{k}" for k in range(len(shapes))]
    rng = np.random.default_rng(7)
    vals = {w: rng.standard_normal(s) for w, s in zip(wrt, shapes)}
    dirs = {w: rng.standard_normal(s) for w, s in zip(wrt, shapes)}
    got = hvp(g, wrt).evaluate({**vals, **{f"v_{w}": d for w, d in dirs.items()}})
    gg, eps = grad(g, wrt), 1e-5
    plus = gg.evaluate({w: vals[w] + eps * dirs[w] for w in wrt})
    minus = gg.evaluate({w: vals[w] - eps * dirs[w] for w in wrt})
    for a, p, m in zip(got, plus, minus, strict=True):
        np.testing.assert_allclose(a, (p - m) / (2 * eps), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_vmap_fft_matches_numpy(axis):
    from rlx.autodiff.batching import vmap

    g = rlx.Graph("f")
    g.set_outputs(g.rfft(g.input("x", (2, 8), "f32"), axis=1, norm="ortho"))
    shape = [2, 8]
    shape.insert(axis, 3)
    x = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
    vg = vmap(g, {"x": axis}, size=3)
    assert len(vg.find(Fft)) == 1
    want = np.fft.rfft(np.moveaxis(x, axis, 0), axis=2, norm="ortho")  # batch out at 0
    np.testing.assert_allclose(vg.evaluate({"x": x})[0], want, rtol=1e-5, atol=1e-5)
