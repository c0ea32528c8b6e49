"""CPU kernel of ``fake_quantize_lsq`` (fake quantization with the scale as an input, see
:mod:`rlx.ops.fake_quant`): the scale clamped into a scratch, then the steps of
``fake_quantize`` (``kernels/quant.py``: ``fake_quantize_into``), NumPy calls writing into
build-time scratch and the output view; and of the three backward ops (the
straight-through mask and LSQ's scale gradient), the same steps in the compute dtype
(f32, f64 for f64)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx
from rlx.backends.cpu.kernels.quant import fake_quantize_into
from rlx.ops.fake_quant import (
    SCALE_EPS,
    FakeQuantizeBackward,
    FakeQuantizeLSQ,
    FakeQuantizeLSQBackwardScale,
    FakeQuantizeLSQBackwardX,
)

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "fake_quantize_lsq_kernel",
    "fake_quantize_backward_kernel",
    "lsq_backward_x_kernel",
    "lsq_backward_scale_kernel",
]


def fake_quantize_lsq_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``(clip(rint(x / s) + z, qmin, qmax) - z) * s`` with ``s = max(scale, eps)`` read
    from the scale input at run time, in f32 (f64 for f64 inputs)."""
    x, scale = ins
    op: FakeQuantizeLSQ = node.op  # type: ignore[assignment]
    ct = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    ax = None if op.axis is None else op.axis % x.ndim
    cs: tuple[int, ...] = (1,) * x.ndim
    if ax is not None:
        cs = tuple(len(op.zero_points) if i == ax else 1 for i in range(x.ndim))
    z = np.asarray(op.zero_points, dtype=np.int64).reshape(cs)
    s = ctx.scratch(cs, ct, 63)
    eps = ct.type(SCALE_EPS)
    step = fake_quantize_into(x, s, z, op.qmin, op.qmax, out, ctx)

    def run() -> None:
        np.copyto(s, scale.reshape(cs), casting="unsafe")
        np.maximum(s, eps, out=s)
        step()

    return run


def _channels(x: np.ndarray, axis: int | None, n: int) -> tuple[int, ...]:
    if axis is None:
        return (1,) * x.ndim
    ax = axis % x.ndim
    return tuple(n if i == ax else 1 for i in range(x.ndim))


class _Steps:
    """Scratch of one backward node: ``v = x / s`` (compute dtype), masks ``m``, ``m2``."""

    def __init__(self, x: np.ndarray, cs: tuple[int, ...], ctx: KernelCtx):
        self.cd = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
        self.s = ctx.scratch(cs, self.cd, 70)
        self.v = ctx.scratch(x.shape, self.cd, 71)
        self.r = ctx.scratch(x.shape, self.cd, 72)
        self.m = ctx.scratch(x.shape, np.dtype(bool), 73)
        self.m2 = ctx.scratch(x.shape, np.dtype(bool), 74)

    def quantized(self, x: np.ndarray, z: np.ndarray) -> None:
        """``v = x / s``, ``r = rint(v) + z`` (``s`` already set)."""
        np.copyto(self.v, x, casting="unsafe")
        np.divide(self.v, self.s, out=self.v)
        np.rint(self.v, out=self.r)
        np.add(self.r, z, out=self.r)

    def inside(self, qmin: int, qmax: int) -> np.ndarray:
        """``m``: ``r`` in ``[qmin, qmax]`` or NaN (quantize maps NaN to the zero point)."""
        np.greater_equal(self.r, qmin, out=self.m)
        np.less_equal(self.r, qmax, out=self.m2)
        np.logical_and(self.m, self.m2, out=self.m)
        np.isnan(self.r, out=self.m2)
        return np.logical_or(self.m, self.m2, out=self.m)


def _passthrough(out: np.ndarray, ct: np.ndarray, mask: np.ndarray) -> None:
    out[...] = 0
    np.copyto(out, ct, where=mask, casting="unsafe")


def fake_quantize_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``ct`` where ``rint(x / s) + z`` is in ``[qmin, qmax]``, else 0."""
    x, ct = ins
    f = node.op.fwd  # type: ignore[attr-defined]
    cs = _channels(x, f.axis, len(f.scales))
    st = _Steps(x, cs, ctx)
    st.s[...] = np.asarray(f.scales, st.cd).reshape(cs)
    z = np.asarray(f.zero_points, st.cd).reshape(cs)

    def run() -> None:
        st.quantized(x, z)
        _passthrough(out, ct, st.inside(f.qmin, f.qmax))

    return run


def _lsq_steps(
    node: Node, x: np.ndarray, scale: np.ndarray, ctx: KernelCtx
) -> tuple[_Steps, np.ndarray, Kernel]:
    op = node.op.fwd  # type: ignore[attr-defined]
    cs = _channels(x, op.axis, len(op.zero_points))
    st = _Steps(x, cs, ctx)
    z = np.asarray(op.zero_points, st.cd).reshape(cs)
    eps = st.cd.type(SCALE_EPS)

    def prepare() -> None:
        np.copyto(st.s, scale.reshape(cs), casting="unsafe")
        np.maximum(st.s, eps, out=st.s)
        st.quantized(x, z)

    return st, z, prepare


def lsq_backward_x_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``ct`` where ``rint(x / s) + z`` is in ``[qmin, qmax]`` (``s = max(scale, eps)``)."""
    x, scale, ct = ins
    op = node.op.fwd  # type: ignore[attr-defined]
    st, _, prepare = _lsq_steps(node, x, scale, ctx)

    def run() -> None:
        prepare()
        _passthrough(out, ct, st.inside(op.qmin, op.qmax))

    return run


def lsq_backward_scale_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``grad_factor * sum(ct * d)`` per channel: ``d`` overwrites ``v`` (``r - v`` inside,
    ``qmin - z`` / ``qmax - z`` where ``r`` falls below / above the range)."""
    x, scale, ct = ins
    op = node.op.fwd  # type: ignore[attr-defined]
    st, z, prepare = _lsq_steps(node, x, scale, ctx)
    below, above = op.qmin - z, op.qmax - z
    ax = None if op.axis is None else op.axis % x.ndim
    axes = tuple(a for a in range(x.ndim) if a != ax)
    gf = st.cd.type(op.grad_factor)
    acc = ctx.scratch(() if ax is None else (x.shape[ax],), st.cd, 75)

    def run() -> None:
        prepare()
        v, r = st.v, st.r
        np.subtract(r, z, out=r)  # rint(v)
        np.subtract(r, v, out=v)  # rint(v) - v
        np.add(r, z, out=r)
        np.less(r, op.qmin, out=st.m)
        np.copyto(v, below, where=st.m)
        np.greater(r, op.qmax, out=st.m)
        np.copyto(v, above, where=st.m)
        if op.grad_factor != 1.0:
            np.multiply(v, gf, out=v)
        np.multiply(v, ct, out=v)
        np.sum(v, axis=axes, out=acc)
        np.copyto(out, acc.reshape(out.shape), casting="unsafe")

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    FakeQuantizeLSQ: (fake_quantize_lsq_kernel,),
    FakeQuantizeBackward: (fake_quantize_backward_kernel,),
    FakeQuantizeLSQBackwardX: (lsq_backward_x_kernel,),
    FakeQuantizeLSQBackwardScale: (lsq_backward_scale_kernel,),
}
