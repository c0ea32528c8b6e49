"""Differential fuzzing of the backward ops autodiff emits in place of primitive graphs
(the seed's ReluBackward, ActivationBackward, LayerNormBackwardGamma, MaxPool2dBackward,
FakeQuantize*Backward*, ScanBackward / ScanBackwardXs) against PyTorch in float64
(harness.py: rlx's reference interpreter and the compiled graph under every precision
policy and native target).

Each op is built directly (``g.apply``) on hypothesis-drawn shapes and attributes. Oracles:

* ``relu_backward`` / ``activation_backward``: torch's own backward kernels
  (``aten.threshold_backward``, ``gelu_backward``, ``silu_backward``, ``tanh_backward``
  and ``sigmoid_backward`` from the output, ``softplus_backward``, ``hardswish_backward``);
* ``layer_norm_backward_gamma``: ``torch.autograd`` of ``F.layer_norm`` wrt its weight;
* ``max_pool2d_backward``: ``torch.autograd`` of ``F.max_pool2d`` (values on a grid, so
  ties occur and the first maximum must win);
* ``fake_quantize_backward``: ``torch.autograd`` of
  ``torch.fake_quantize_per_{tensor,channel}_affine``;
* ``fake_quantize_lsq_backward_x`` / ``_scale``: ``torch.autograd`` of
  ``torch._fake_quantize_learnable_per_{tensor,channel}_affine``;
* ``scan_backward`` / ``scan_backward_xs``: ``torch.autograd`` of the RNN step, written
  in PyTorch, run step by step in reverse from the saved carries.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.ops.activation_grad import FROM_OUTPUT, ActivationBackward, ReluBackward
from rlx.ops.base import OpKind
from rlx.ops.control import Scan, build_subgraph
from rlx.ops.control_grad import ScanBackward, ScanBackwardXs, scan_vjp_body
from rlx.ops.fake_quant import (
    FakeQuantizeBackward,
    FakeQuantizeLSQ,
    FakeQuantizeLSQBackwardScale,
    FakeQuantizeLSQBackwardX,
)
from rlx.ops.nn import Pool, PoolKind
from rlx.ops.nn_grad import LayerNormBackwardGamma, MaxPool2dBackward
from rlx.ops.quant import FakeQuantize
from rlx.ops.unary_kinds import UnaryKind

from . import torch_oracles as T
from .harness import EXACT, SEEDS, Tol, check, exact_values, examples

GRAD_TOL = Tol(2e-5, 8e-3, 6e-2)
# an elementwise region rounds every node to f16 / bf16: a few roundings of the derivative
ACT_TOL = Tol(2e-5, 1.6e-2, 8e-2)
SHAPES = st.sampled_from([(5,), (3, 4), (2, 3, 17)])
A = torch.ops.aten

#: activation kind -> f'(v) * ct by torch's backward kernel (v: the output for FROM_OUTPUT)
TORCH_BACKWARD = {
    UnaryKind.GELU: lambda ct, v: A.gelu_backward(ct, v),
    UnaryKind.GELU_TANH: lambda ct, v: A.gelu_backward(ct, v, approximate="tanh"),
    UnaryKind.SILU: lambda ct, v: A.silu_backward(ct, v),
    UnaryKind.SOFTPLUS: lambda ct, v: A.softplus_backward(ct, v, 1.0, 20.0),
    UnaryKind.HARDSWISH: lambda ct, v: A.hardswish_backward(ct, v),
    UnaryKind.SIGMOID: lambda ct, v: A.sigmoid_backward(ct, v),
    UnaryKind.TANH: lambda ct, v: A.tanh_backward(ct, v),
}


@examples(12)
@given(kind=st.sampled_from(["relu", *sorted(k.value for k in TORCH_BACKWARD)]), shape=SHAPES,
       seed=SEEDS)  # fmt: skip
def test_relu_and_activation_backward_match_torch(kind, shape, seed) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    ct = rng.standard_normal(shape).astype(np.float32)
    fn = UnaryKind(kind)
    if fn is UnaryKind.RELU:
        op, v = ReluBackward(), np.maximum(x, 0)
    else:
        op = ActivationBackward(fn)
        v = {UnaryKind.TANH: np.tanh, UnaryKind.SIGMOID: lambda a: 1 / (1 + np.exp(-a))}.get(
            fn, lambda a: a
        )(x).astype(np.float32)
        assert (fn in FROM_OUTPUT) == (fn in (UnaryKind.TANH, UnaryKind.SIGMOID))
    g = rlx.Graph("act_bwd")
    g.set_outputs([g.apply(op, [g.input("v", shape), g.input("ct", shape)])])

    def oracle(rnd):
        vt, ctt = T.t64(rnd(v)), T.t64(rnd(ct))
        if fn is UnaryKind.RELU:
            return [A.threshold_backward(ctt, vt, 0.0).numpy()]
        return [TORCH_BACKWARD[fn](ctt, vt).numpy()]

    tol = EXACT if fn is UnaryKind.RELU else ACT_TOL
    check(g, {"v": v, "ct": ct}, {}, oracle, [OpKind.ELEMENTWISE], tol, "max")


@examples(6)
@given(rows=st.sampled_from([(1,), (3,), (2, 2)]), d=st.sampled_from([1, 3, 17, 64]),
       eps=st.sampled_from([1e-5, 0.1]), seed=SEEDS)  # fmt: skip
def test_layer_norm_backward_gamma_matches_autograd(rows, d, eps, seed) -> None:
    rng = np.random.default_rng(seed)
    shape = (*rows, d)
    x = (rng.standard_normal(shape) * 2 + rng.standard_normal((*rows, 1))).astype(np.float32)
    ct = rng.standard_normal(shape).astype(np.float32)
    g = rlx.Graph("ln_gamma")
    g.set_outputs(
        [g.apply(LayerNormBackwardGamma(eps), [g.input("x", shape), g.input("ct", shape)])]
    )

    def oracle(rnd):
        xt, wt = T.t64(rnd(x)), T.t64(np.ones(d), True)
        y = F.layer_norm(xt, (d,), weight=wt, eps=eps)
        (dw,) = torch.autograd.grad(y, [wt], T.t64(rnd(ct)))
        return [dw.numpy()]

    check(g, {"x": x, "ct": ct}, {}, oracle, [OpKind.REDUCTION], GRAD_TOL, "max")


@examples(8)
@given(window=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)), pad=st.booleans(),
       extra=st.tuples(st.sampled_from([0, 1, 4]), st.sampled_from([0, 2, 9])), seed=SEEDS)  # fmt: skip
def test_max_pool2d_backward_matches_torch(window, stride, pad, extra, seed) -> None:
    rng = np.random.default_rng(seed)
    pads = tuple((w // 2, w // 2) if pad else (0, 0) for w in window)
    sp = tuple(w + e for w, e in zip(window, extra, strict=True))
    x = exact_values(rng, (2, 3, *sp), lim=6)  # few values: ties, the first maximum wins
    out = tuple((s + 2 * p[0] - w) // st_ + 1 for s, p, w, st_ in zip(sp, pads, window, stride))
    ct = exact_values(rng, (2, 3, *out))
    g = rlx.Graph("mp2_bwd")
    fwd = Pool(PoolKind.MAX, window, stride, pads)
    g.set_outputs(
        [g.apply(MaxPool2dBackward(fwd), [g.input("x", x.shape), g.input("ct", ct.shape)])]
    )

    def oracle(rnd):
        xt = T.t64(x, True)
        y = F.max_pool2d(xt, window, stride, tuple(p[0] for p in pads))
        (dx,) = torch.autograd.grad(y, [xt], T.t64(rnd(ct)))
        return [dx.numpy()]

    check(g, {"x": x, "ct": ct}, {}, oracle, [OpKind.DATA_MOVEMENT], EXACT)


def _quant_values(rng, shape, scale, qmin, qmax, zp):
    """``x`` whose ``x / scale`` sits 0.2 or more from every rounding boundary, inside the
    range and (a few) beyond it, so rounding the operands never moves an element across."""
    k = rng.integers(qmin - zp - 3, qmax - zp + 4, shape)
    return ((k + rng.uniform(-0.3, 0.3, shape)) * scale).astype(np.float32)


@examples(8)
@given(per_channel=st.booleans(), qrange=st.sampled_from([(-8, 7), (0, 15)]), seed=SEEDS)
def test_fake_quantize_backward_matches_autograd(per_channel, qrange, seed) -> None:
    rng = np.random.default_rng(seed)
    qmin, qmax = qrange
    shape = (3, 4)
    scales = [0.25, 0.5, 0.125, 1.0] if per_channel else [0.25]
    zps = [0, 1, -1, 2] if per_channel and qmin < 0 else [0] * len(scales)
    col = np.asarray(scales, np.float32) if per_channel else np.float32(scales[0])
    x = _quant_values(rng, shape, col, qmin, qmax, 0)
    ct = exact_values(rng, shape)
    fwd = FakeQuantize(1 if per_channel else None, tuple(scales), tuple(zps), qmin, qmax)
    g = rlx.Graph("fq_bwd")
    g.set_outputs([g.apply(FakeQuantizeBackward(fwd), [g.input("x", shape), g.input("ct", shape)])])

    def oracle(rnd):
        xt = T.t64(rnd(x), True).float().detach().requires_grad_(True)
        if per_channel:
            s = torch.tensor(scales, dtype=torch.float32)
            z = torch.tensor(zps, dtype=torch.int32)
            y = torch.fake_quantize_per_channel_affine(xt, s, z, 1, qmin, qmax)
        else:
            y = torch.fake_quantize_per_tensor_affine(xt, scales[0], zps[0], qmin, qmax)
        (dx,) = torch.autograd.grad(y, [xt], torch.tensor(rnd(ct), dtype=torch.float32))
        return [dx.double().numpy()]

    check(g, {"x": x, "ct": ct}, {}, oracle, [OpKind.ELEMENTWISE], EXACT)


@examples(8)
@given(per_channel=st.booleans(), gf=st.sampled_from([1.0, 0.5]), scale_grad=st.booleans(),
       seed=SEEDS)  # fmt: skip
def test_fake_quantize_lsq_backward_matches_autograd(per_channel, gf, scale_grad, seed) -> None:
    rng = np.random.default_rng(seed)
    qmin, qmax, shape = -8, 7, (3, 4)
    s = np.asarray([0.25, 0.5, 0.125, 1.0] if per_channel else [0.25], np.float32)
    zps = (0, 1, -1, 2) if per_channel else (0,)
    x = _quant_values(rng, shape, s if per_channel else s[0], qmin, qmax, 0)
    ct = rng.standard_normal(shape).astype(np.float32)
    fwd = FakeQuantizeLSQ(1 if per_channel else None, zps, qmin, qmax, gf)
    op = (FakeQuantizeLSQBackwardScale if scale_grad else FakeQuantizeLSQBackwardX)(fwd)
    g = rlx.Graph("lsq_bwd")
    ins = [g.input("x", shape), g.input("s", s.shape), g.input("ct", shape)]
    g.set_outputs([g.apply(op, ins)])

    def oracle(rnd):
        # torch's learnable fake quantizer runs in float32 only
        xt = torch.tensor(rnd(x), dtype=torch.float32, requires_grad=True)
        st_ = torch.tensor(rnd(s), dtype=torch.float32, requires_grad=True)
        z = torch.tensor(zps, dtype=torch.float32)
        if per_channel:
            y = torch._fake_quantize_learnable_per_channel_affine(xt, st_, z, 1, qmin, qmax, gf)
        else:
            y = torch._fake_quantize_learnable_per_tensor_affine(xt, st_, z, qmin, qmax, gf)
        dx, ds = torch.autograd.grad(y, [xt, st_], torch.tensor(rnd(ct), dtype=torch.float32))
        return [(ds if scale_grad else dx).double().numpy()]

    tol = GRAD_TOL if scale_grad else EXACT
    check(g, {"x": x, "s": s, "ct": ct}, {}, oracle, [OpKind.ELEMENTWISE], tol, "max")


def _rnn_step(h, w, x):
    """The scanned body in PyTorch: ``h' = tanh(h @ w + x)``, ``y = h' * x``."""
    hn = torch.tanh(h @ w + x)
    return hn, hn * x


@examples(6)
@given(length=st.integers(1, 4), hidden=st.integers(1, 3), out=st.sampled_from([0, 2]),
       wrt=st.sampled_from(["h", "w", "xs"]), reverse=st.booleans(), seed=SEEDS)  # fmt: skip
def test_scan_backward_matches_autograd(length, hidden, out, wrt, reverse, seed) -> None:
    """An RNN scan (carries h and the pass-through weight w, xs scanned; output the final
    h or the stacked ys): its saved carries from a NumPy loop, the gradients of h0, w and
    xs from torch.autograd of each step in reverse."""
    rng = np.random.default_rng(seed)
    b = 2
    h0 = rng.uniform(-1, 1, (b, hidden)).astype(np.float32)
    w = rng.uniform(-1, 1, (hidden, hidden)).astype(np.float32)
    xs = rng.uniform(-1, 1, (length, b, hidden)).astype(np.float32)
    order = range(length - 1, -1, -1) if reverse else range(length)
    saved = np.zeros((length, b, hidden), np.float32)
    h = h0
    for t in order:
        saved[t] = h
        h = np.tanh(h @ w + xs[t]).astype(np.float32)
    ct = rng.standard_normal((b, hidden) if out == 0 else (length, b, hidden)).astype(np.float32)

    cs, xsh = [rlx.Shape((b, hidden)), rlx.Shape((hidden, hidden))], [rlx.Shape((b, hidden))]
    body = build_subgraph("rnn", [*cs, *xsh], lambda s, h, w, x: _rlx_step(s, h, w, x))
    fwd = Scan(body, length, 2, out, reverse)
    vb = scan_vjp_body(fwd, cs, xsh)
    op = (
        ScanBackwardXs(fwd, vb, 0, (True, False))
        if wrt == "xs"
        else ScanBackward(fwd, vb, 0 if wrt == "h" else 1, (True, False))
    )
    g = rlx.Graph("scan_bwd")
    ins = [g.input("saved", saved.shape), g.input("w", w.shape), g.input("xs", xs.shape),
           g.input("ct", ct.shape)]  # fmt: skip
    g.set_outputs([g.apply(op, ins)])

    def oracle(rnd):
        sv, wv, xv, cv = (T.t64(rnd(a)) for a in (saved, w, xs, ct))
        dh = cv if out == 0 else torch.zeros(b, hidden, dtype=torch.float64)
        dw = torch.zeros_like(wv)
        dxs = torch.zeros_like(xv)
        for t in reversed(order):
            ht, wt, xt = (a.clone().requires_grad_(True) for a in (sv[t], wv, xv[t]))
            hn, y = _rnn_step(ht, wt, xt)
            cts = (dh, cv[t] if out == 2 else torch.zeros_like(y))
            dh, gw, dxs[t] = torch.autograd.grad((hn, y), (ht, wt, xt), cts)
            dw = dw + gw
        return [{"h": dh, "w": dw, "xs": dxs}[wrt].numpy()]

    feeds = {"saved": saved, "w": w, "xs": xs, "ct": ct}
    check(g, feeds, {}, oracle, [OpKind.COMPUTE], GRAD_TOL, "max")


def _rlx_step(s, h, w, x):
    hn = s.tanh(s.add(s.matmul(h, w), x))
    return [hn, w, s.mul(hn, x)]


@pytest.mark.parametrize("op", [ScanBackward, ScanBackwardXs])
def test_scan_backward_rejects_a_wrt_that_is_not_a_float_input(op) -> None:
    cs, xsh = [rlx.Shape((2, 3)), rlx.Shape((3, 3))], [rlx.Shape((2, 3))]
    body = build_subgraph("rnn", [*cs, *xsh], lambda s, h, w, x: _rlx_step(s, h, w, x))
    fwd = Scan(body, 4, 2, 0)
    vb = scan_vjp_body(fwd, cs, xsh)
    g = rlx.Graph("bad")
    ins = [g.input("saved", (4, 2, 3)), g.input("w", (3, 3)), g.input("xs", (4, 2, 3)),
           g.input("ct", (2, 3))]  # fmt: skip
    with pytest.raises(rlx.errors.ShapeError, match="wrt 5 is not one of the float"):
        g.apply(op(fwd, vb, 5, (True, False)), ins)
    with pytest.raises(rlx.errors.ShapeError, match="saved carry 1 .* stacked"):
        g.apply(op(fwd, vb, 0, (True, True)), ins)
