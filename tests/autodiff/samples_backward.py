"""Samples (see samples.py) of the backward ops autodiff emits in place of primitive
graphs: their own derivatives (double backward, Hessian-vector products) are checked
against finite differences like every other op's. Values stay away from the kinks:
``y = 0`` for relu, hardswish's -3 and 3, the rounding boundaries and the clip range of
the fake quantizers."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import rlx
from rlx.ops.activation_grad import ACTIVATIONS, ActivationBackward, ReluBackward
from rlx.ops.control import Scan, build_subgraph
from rlx.ops.control_grad import ScanBackward, ScanBackwardXs, scan_vjp_body
from rlx.ops.fake_quant import (
    FakeQuantizeBackward,
    FakeQuantizeLSQ,
    FakeQuantizeLSQBackwardScale,
    FakeQuantizeLSQBackwardX,
)
from rlx.ops.nn_grad import MaxPool2dBackward
from rlx.ops.quant import FakeQuantize
from rlx.ops.unary_kinds import UnaryKind

from .samples import B, Case, _away_from_zero, _pool_op, sample


@sample("relu_backward")
def _relu_backward(b: B) -> Case:
    d = b.dims()
    y = b.inp(_away_from_zero(b, d))  # (an input of the op: negative values select 0 too)
    return b.done(b.g.apply(ReluBackward(), [y, b.inp(b.normal(d))]))


@sample("activation_backward")
def _activation_backward(b: B) -> Case:
    fn = b.data.draw(st.sampled_from(sorted(ACTIVATIONS, key=lambda k: k.value)), "fn")
    d = b.dims()
    lo, hi = {UnaryKind.SIGMOID: (0.1, 0.9), UnaryKind.TANH: (-0.9, 0.9)}.get(fn, (-2.5, 2.5))
    v = b.inp(b.uniform(d, lo, hi))
    return b.done(b.g.apply(ActivationBackward(fn), [v, b.inp(b.normal(d))]))


@sample("max_pool2d_backward")
def _max_pool2d_backward(b: B) -> Case:
    x = b.inp(b.distinct([1, 2, 4, 4]), diff=False)
    ct = b.inp(b.normal([1, 2, 2, 2]))
    return b.done(b.g.apply(MaxPool2dBackward(_pool_op("max")), [x, ct]))


def _grid(b: B, d: list[int], scale: float) -> np.ndarray:
    """Values 0.2 or more (in units of ``scale``) from every rounding boundary, a few of
    them beyond the [-8, 7] range."""
    k = b.rng.integers(-10, 10, d)
    return (k + b.uniform(d, -0.3, 0.3)) * scale


@sample("fake_quantize_backward")
def _fake_quantize_backward(b: B) -> Case:
    fwd = FakeQuantize(None, (0.1,), (0,), -8, 7)
    x = b.inp(_grid(b, [2, 3], 0.1))
    return b.done(b.g.apply(FakeQuantizeBackward(fwd), [x, b.inp(b.normal([2, 3]))]))


def _lsq(b: B, op: type) -> Case:
    per_channel = b.data.draw(st.booleans(), "per_channel")
    s = np.array([0.1, 0.2, 0.3]) if per_channel else np.array([0.1])
    x = b.inp(_grid(b, [2, 3], 0.1) * (s if per_channel else 1.0))
    fwd = FakeQuantizeLSQ(1 if per_channel else None, (0,) * len(s), -8, 7, 0.5)
    return b.done(b.g.apply(op(fwd), [x, b.inp(s), b.inp(b.normal([2, 3]))]))


@sample("fake_quantize_lsq_backward_x")
def _lsq_backward_x(b: B) -> Case:
    return _lsq(b, FakeQuantizeLSQBackwardX)


@sample("fake_quantize_lsq_backward_scale")
def _lsq_backward_scale(b: B) -> Case:
    return _lsq(b, FakeQuantizeLSQBackwardScale)


def _scan_grad(b: B, xs_grad: bool) -> Case:
    """The reverse pass of ``c -> tanh(c * x_t + w)`` over 3 steps (w passed through)."""
    f64 = rlx.DType.F64
    cs, xsh = [rlx.Shape((2,), f64), rlx.Shape((2,), f64)], [rlx.Shape((2,), f64)]

    def step(s: rlx.Graph, c: int, w: int, x: int) -> list[int]:
        n = s.tanh(s.add(s.mul(c, x), w))
        return [n, w, s.mul(n, n)]

    out = b.data.draw(st.sampled_from([0, 2]), "output")
    fwd = Scan(build_subgraph("step", [*cs, *xsh], step), 3, 2, out)
    vb = scan_vjp_body(fwd, cs, xsh)
    saved, w, xs = b.inp(b.normal([3, 2])), b.inp(b.normal([2])), b.inp(b.normal([3, 2]))
    ct = b.inp(b.normal([2] if out == 0 else [3, 2]))
    if xs_grad:
        op = ScanBackwardXs(fwd, vb, 0, (True, False))
    else:
        op = ScanBackward(fwd, vb, b.data.draw(st.sampled_from([0, 1]), "wrt"), (True, False))
    return b.done(b.g.apply(op, [saved, w, xs, ct]))


@sample("scan_backward")
def _scan_backward(b: B) -> Case:
    return _scan_grad(b, False)


@sample("scan_backward_xs")
def _scan_backward_xs(b: B) -> Case:
    return _scan_grad(b, True)
