"""Fake quantization for training: ``fake_quantize_lsq``, the fake quantizer whose scale is
an input (a learned parameter, or a value the graph computes), and the straight-through
rules that :class:`~rlx.ops.quant.FakeQuantize` and it share.

In: float ``x`` and a float ``scale`` (``[1]`` or ``[]`` per tensor, ``[C]`` per channel
along ``axis``). Out: ``(clip(rint(x / s) + zp, qmin, qmax) - zp) * s`` in ``x``'s dtype,
with ``s = max(scale, eps)`` (``eps`` = f32 machine epsilon, as PyTorch's
``_LearnableFakeQuantize`` clamps its scale).

Derivatives (as PyTorch's ``fake_quantize_per_{tensor,channel}_affine`` and
``_fake_quantize_learnable_per_{tensor,channel}_affine`` autograd):

* ``x``: the straight-through estimator: the cotangent passes where ``rint(x / s) + zp``
  lies in ``[qmin, qmax]`` and is zero where the value saturates;
* ``scale`` (LSQ, Esser et al. 2020): per element ``rint(x/s) - x/s`` inside the range,
  ``qmin - zp`` below it and ``qmax - zp`` above it, times the cotangent, summed per
  channel and multiplied by ``grad_factor`` (LSQ's ``1 / sqrt(numel * qmax)``, or 1).
  ``learn_scale=False`` gives the scale no gradient (a scale the graph computes from the
  weight, as an observer does: PyTorch detaches it).

Each is one backward op, emitted by the rules (the seed's ``FakeQuantizeBackward``,
``FakeQuantizeLSQBackwardX``, ``FakeQuantizeLSQBackwardScale``): inputs ``(x, ct)`` of a
``FakeQuantize`` ``fwd`` / ``(x, scale, ct)`` of a ``FakeQuantizeLSQ`` ``fwd``; outputs the
cotangent of ``x`` (x's shape) or of the scale (the scale's shape). Each has ``lower``:
the same value from primitive ops (what the rules built before the ops existed), whose
derivatives are the ops' own (``rlx/ops/lowered.py``).

These are not derivatives of the piecewise-constant function (finite differences give 0
wrt ``x``), so their oracle is PyTorch's autograd (tests/autodiff/test_grad_quant.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.lowered import lowered_jvp, lowered_vjp
from rlx.ops.quant import (
    FakeQuantize,
    _channel_shape,
    _compute_dtype,
    _norm_axis,
    _short,
    quantize_array,
)
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = [
    "FakeQuantizeLSQ",
    "FakeQuantizeBackward",
    "FakeQuantizeLSQBackwardX",
    "FakeQuantizeLSQBackwardScale",
    "SCALE_EPS",
    "ste_mask",
    "lsq_scale_factor",
    "ste_inside",
    "lsq_partials",
]

#: Smallest scale the learnable fake quantizer uses (f32 machine epsilon, as PyTorch).
SCALE_EPS = float(np.finfo(np.float32).eps)


def ste_mask(g: Graph, x: NodeId, q: NodeId, qmin: int, qmax: int) -> NodeId:
    """Bool mask of the elements of ``x`` whose quantized value ``q`` (``rint(x / s) + zp``
    before clipping, float or int) lies in ``[qmin, qmax]``."""
    return g.logical_and(g.ge(q, _const(g, qmin, q)), g.le(q, _const(g, qmax, q)))


def _const(g: Graph, value: float, like: NodeId) -> NodeId:
    """A rank-0 constant ``value`` of ``like``'s dtype (a bare int would read as a node id)."""
    return g.constant(np.asarray(value, dtype=g.shape(like).dtype.np))


def _passthrough(g: Graph, mask: NodeId, ct: NodeId) -> NodeId:
    return g.where(mask, ct, _const(g, 0.0, ct))


def fake_quantize_ste(g: Graph, node: Node, ct: NodeId) -> NodeId:
    """The straight-through cotangent of a :class:`~rlx.ops.quant.FakeQuantize` node's
    input: one :class:`FakeQuantizeBackward` node."""
    return g.apply(FakeQuantizeBackward(node.op), [node.inputs[0], ct])  # type: ignore[arg-type]


def _ste_lowered(g: Graph, op: FakeQuantize, x: NodeId, ct: NodeId) -> NodeId:
    """``ct`` where ``rint(x / s) + zp`` is in ``[qmin, qmax]``, else 0, from primitive ops:
    the same ``quantize`` (to i32, wide enough not to saturate first) the forward op
    computes, so the mask agrees with the forward clip bit for bit."""
    q = g.quantize(x, list(op.scales), list(op.zero_points), op.axis, DType.I32)
    return _passthrough(g, ste_mask(g, x, q, op.qmin, op.qmax), ct)


def _scale_b(g: Graph, op: FakeQuantizeLSQ, x: NodeId, scale: NodeId) -> NodeId:
    """``max(scale, eps)`` shaped to broadcast against ``x``."""
    rank = g.shape(x).rank
    s = g.maximum(scale, _const(g, SCALE_EPS, scale))
    ax = _norm_axis(op.axis, rank)
    if ax is None:
        return g.reshape(s, [1] * rank) if g.shape(s).rank else s
    return g.reshape(s, list(_channel_shape(rank, ax, g.shape(s).dims[0])))


def _zp_b(g: Graph, op: FakeQuantizeLSQ, x: NodeId) -> NodeId:
    shp = g.shape(x)
    zp = np.asarray(op.zero_points, dtype=shp.dtype.np)
    ax = _norm_axis(op.axis, shp.rank)
    return g.constant(zp.reshape(_channel_shape(shp.rank, ax, len(zp)) if ax is not None else ()))


def lsq_scale_factor(g: Graph, node: Node) -> tuple[NodeId, NodeId]:
    """(inside mask, d out / d s per element) of a :class:`FakeQuantizeLSQ` node: the
    mask of the straight-through estimator and LSQ's ``rint(v) - v`` inside the range,
    ``qmin - zp`` / ``qmax - zp`` outside (``v = x / s``), from primitive ops."""
    return _lsq_factor(g, node.op, *node.inputs)  # type: ignore[arg-type]


def _lsq_factor(g: Graph, op: FakeQuantizeLSQ, x: NodeId, scale: NodeId) -> tuple[NodeId, NodeId]:
    v = g.div(x, _scale_b(g, op, x, scale))
    r = g.round(v)
    zp = _zp_b(g, op, x)
    q = g.add(r, zp)
    lo, hi = g.lt(q, _const(g, op.qmin, x)), g.gt(q, _const(g, op.qmax, x))
    inside = g.logical_not(g.logical_or(lo, hi))
    below = g.sub(_const(g, op.qmin, x), zp)
    above = g.sub(_const(g, op.qmax, x), zp)
    d = g.where(lo, below, g.where(hi, above, g.sub(r, v)))
    if op.grad_factor != 1.0:
        d = g.mul(d, _const(g, op.grad_factor, x))
    return inside, d


def _sum_to_scale(g: Graph, op: FakeQuantizeLSQ, t: NodeId, scale: NodeId) -> NodeId:
    """Sum the per-element scale term ``t`` to the scale's shape (per channel or all)."""
    rank = g.shape(t).rank
    ax = _norm_axis(op.axis, rank)
    axes = [a for a in range(rank) if a != ax]
    out = g.sum(t, axes) if axes else t
    return g.reshape(out, list(g.shape(scale).dims))


@register
class FakeQuantizeLSQ(Op):
    """Fake quantization with the scale as an input (see the module docstring):
    ``(x, scale) -> (clip(rint(x / s) + zp, qmin, qmax) - zp) * s``, ``s = max(scale,
    eps)``; per tensor (``axis=None``, scale ``[1]`` or ``[]``) or per channel along
    ``axis`` (scale ``[C]``). ``zero_points``: one per scale. ``learn_scale``: whether the
    scale gets LSQ's gradient (scaled by ``grad_factor``)."""

    mnemonic: ClassVar[str] = "fake_quantize_lsq"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE  # the seed's class (FakeQuantizeLSQ)
    axis: int | None
    zero_points: tuple[int, ...]
    qmin: int = -128
    qmax: int = 127
    grad_factor: float = 1.0
    learn_scale: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "zero_points", tuple(int(z) for z in self.zero_points))
        object.__setattr__(self, "grad_factor", float(self.grad_factor))
        object.__setattr__(self, "learn_scale", bool(self.learn_scale))

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, s = ins
        expect(self.qmin < self.qmax, self, f"qmin {self.qmin} must be < qmax {self.qmax}")
        expect(x.dtype.is_float, self, f"input must be float, got {x}")
        expect(s.dtype is x.dtype, self, f"scale must be {x.dtype} like the input, got {s}")
        expect(
            all(self.qmin <= z <= self.qmax for z in self.zero_points),
            self,
            f"zero points must lie in [{self.qmin}, {self.qmax}], got {_short(self.zero_points)}",
        )
        expect(
            math.isfinite(self.grad_factor),
            self,
            f"grad_factor must be finite, got {self.grad_factor}",
        )
        if self.axis is None:
            expect(s.dims in ((), (1,)), self, f"per-tensor scale must be [1] or [], got {s}")
            expect(
                len(self.zero_points) == 1,
                self,
                f"per-tensor needs 1 zero point, got {len(self.zero_points)}",
            )
            return x
        expect(-x.rank <= self.axis < x.rank, self, f"axis {self.axis} out of range for {x}")
        d = x.dims[self.axis % x.rank]
        expect(isinstance(d, int), self, f"per-channel axis {self.axis} of {x} must be static")
        expect(
            s.dims == (d,),
            self,
            f"per-channel scale along axis {self.axis} of {x} must be [{d}], got {s}",
        )
        expect(
            len(self.zero_points) == d,
            self,
            f"per-channel along axis {self.axis} of {x} needs {d} zero points, got {len(self.zero_points)}",
        )
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, scale = xs
        ct = _compute_dtype(x)
        s = np.maximum(np.asarray(scale, dtype=ct).reshape(-1), ct.type(SCALE_EPS))
        ax = _norm_axis(self.axis, x.ndim)
        q = quantize_array(x, s.tolist(), self.zero_points, ax, self.qmin, self.qmax)
        cs = _channel_shape(x.ndim, ax, len(self.zero_points))
        z = np.asarray(self.zero_points, dtype=np.int64).reshape(cs)
        return ((q - z).astype(ct) * s.reshape(cs)).astype(x.dtype)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        ins = [*node.inputs, ct]
        dx = g.apply(FakeQuantizeLSQBackwardX(self), ins)
        if not self.learn_scale:
            return dx, None
        return dx, g.apply(FakeQuantizeLSQBackwardScale(self), ins)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        tx, ts = tangents
        if not self.learn_scale:
            ts = None
        if tx is None and ts is None:
            return None
        x, scale = node.inputs
        out = None if tx is None else g.apply(FakeQuantizeLSQBackwardX(self), [x, scale, tx])
        if ts is not None:
            _, d = lsq_scale_factor(g, node)
            rank = g.shape(x).rank
            ax = _norm_axis(self.axis, rank)
            tb = g.reshape(
                ts,
                [1] * rank if ax is None else list(_channel_shape(rank, ax, g.shape(ts).dims[0])),
            )
            term = g.mul(d, tb)
            out = term if out is None else g.add(out, term)
        return out

    def attrs_str(self) -> str:
        return (
            f"axis={self.axis}, zero_points={_short(self.zero_points)}, qmin={self.qmin}, "
            f"qmax={self.qmax}, grad_factor={self.grad_factor:g}, learn_scale={self.learn_scale}"
        )


@graph_method
def fake_quantize_lsq(
    g: Graph,
    x: NodeId,
    scale: NodeId,
    zero_points: Sequence[int] | None = None,
    axis: int | None = None,
    qmin: int = -128,
    qmax: int = 127,
    grad_factor: float = 1.0,
    learn_scale: bool = True,
) -> NodeId:
    """Fake-quantize ``x`` with the scale node ``scale`` (see :class:`FakeQuantizeLSQ`);
    zero points default to 0."""
    n = g.shape(scale).dims[0] if g.shape(scale).rank else 1
    zps = tuple(zero_points) if zero_points is not None else (0,) * int(n)
    return g.apply(FakeQuantizeLSQ(axis, zps, qmin, qmax, grad_factor, learn_scale), [x, scale])


# ---- the backward ops ------------------------------------------------------------------


def ste_inside(x: np.ndarray, s: np.ndarray, z: np.ndarray, qmin: int, qmax: int) -> np.ndarray:
    """Where ``rint(x / s) + z`` lies in ``[qmin, qmax]`` (``s``, ``z`` shaped to broadcast,
    in the compute dtype); NaN counts as inside (quantize maps it to the zero point)."""
    with np.errstate(all="ignore"):
        q = np.rint(x.astype(s.dtype) / s) + z
    return np.isnan(q) | ((q >= qmin) & (q <= qmax))


def lsq_partials(
    op: FakeQuantizeLSQ, x: np.ndarray, scale: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(inside mask, d out / d s per element times ``grad_factor``) of LSQ in NumPy, in the
    compute dtype (see the module docstring)."""
    cd = _compute_dtype(x)
    ax = _norm_axis(op.axis, x.ndim)
    cs = _channel_shape(x.ndim, ax, len(op.zero_points))
    s = np.maximum(np.asarray(scale, cd).reshape(cs), cd.type(SCALE_EPS))
    z = np.asarray(op.zero_points, cd).reshape(cs)
    with np.errstate(all="ignore"):
        v = x.astype(cd) / s
        r = np.rint(v)
        q = r + z
        lo, hi = q < op.qmin, q > op.qmax
        d = np.where(lo, op.qmin - z, np.where(hi, op.qmax - z, r - v))
    if op.grad_factor != 1.0:
        d = d * cd.type(op.grad_factor)
    return ~(lo | hi), d.astype(cd)


def _x_like(op: Op, ins: tuple[Shape, ...], fwd: Op) -> Shape:
    x, ct = ins[0], ins[-1]
    out = fwd.infer(ins[:-1])
    expect(ct == out, op, f"the cotangent must match the output {out}, got {ct}")
    return x


@register
class FakeQuantizeBackward(Op):
    """The straight-through estimator of the fake quantizer ``fwd``: inputs ``(x, ct)``
    -> ``ct`` where ``rint(x / s) + zp`` is in ``[qmin, qmax]``, else 0."""

    mnemonic: ClassVar[str] = "fake_quantize_backward"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE  # the seed's class
    fwd: FakeQuantize

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return _x_like(self, ins, self.fwd)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, ct = xs
        f = self.fwd
        cd = _compute_dtype(x)
        cs = _channel_shape(x.ndim, _norm_axis(f.axis, x.ndim), len(f.scales))
        s = np.asarray(f.scales, cd).reshape(cs)
        z = np.asarray(f.zero_points, cd).reshape(cs)
        inside = ste_inside(x, s, z, f.qmin, f.qmax)
        return np.where(inside, ct, np.zeros((), ct.dtype)).astype(ctx.out_dtype)

    def lower(self, g: Graph, ins: Sequence[NodeId]) -> NodeId:
        return _ste_lowered(g, self.fwd, ins[0], ins[1])

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        # linear in ct (its own adjoint); x only selects: zero derivative almost everywhere
        return None, g.apply(self, [node.inputs[0], ct])

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        t = tangents[1]
        return None if t is None else g.apply(self, [node.inputs[0], t])

    def attrs_str(self) -> str:
        return self.fwd.attrs_str()


@register
class FakeQuantizeLSQBackwardX(Op):
    """The straight-through cotangent of ``x`` of the learnable fake quantizer ``fwd``:
    inputs ``(x, scale, ct)`` -> ``ct`` where ``rint(x / s) + zp`` is in ``[qmin, qmax]``
    (``s = max(scale, eps)``), else 0."""

    mnemonic: ClassVar[str] = "fake_quantize_lsq_backward_x"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE  # the seed's class
    fwd: FakeQuantizeLSQ

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return _x_like(self, ins, self.fwd)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, scale, ct = xs
        inside, _ = lsq_partials(self.fwd, x, scale)
        return np.where(inside, ct, np.zeros((), ct.dtype)).astype(ctx.out_dtype)

    def lower(self, g: Graph, ins: Sequence[NodeId]) -> NodeId:
        x, scale, ct = ins
        inside, _ = _lsq_factor(g, self.fwd, x, scale)
        return _passthrough(g, inside, ct)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return lowered_vjp(g, node, ct, self.lower)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        return lowered_jvp(g, node, tangents, self.lower)

    def attrs_str(self) -> str:
        return self.fwd.attrs_str()


@register
class FakeQuantizeLSQBackwardScale(Op):
    """LSQ's cotangent of the scale of the learnable fake quantizer ``fwd``: inputs ``(x,
    scale, ct)`` -> ``grad_factor * sum(ct * d)`` per channel (over everything per
    tensor), ``d = rint(v) - v`` inside the range, ``qmin - zp`` below, ``qmax - zp``
    above (``v = x / max(scale, eps)``); the scale's shape."""

    mnemonic: ClassVar[str] = "fake_quantize_lsq_backward_scale"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE  # the seed's class
    fwd: FakeQuantizeLSQ

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        _x_like(self, ins, self.fwd)
        return ins[1]

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, scale, ct = xs
        _, d = lsq_partials(self.fwd, x, scale)
        t = d * ct.astype(d.dtype)
        ax = _norm_axis(self.fwd.axis, x.ndim)
        axes = tuple(a for a in range(x.ndim) if a != ax)
        return np.sum(t, axis=axes).reshape(ctx.out_dims).astype(ctx.out_dtype)

    def lower(self, g: Graph, ins: Sequence[NodeId]) -> NodeId:
        x, scale, ct = ins
        _, d = _lsq_factor(g, self.fwd, x, scale)
        return _sum_to_scale(g, self.fwd, g.mul(d, ct), scale)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return lowered_vjp(g, node, ct, self.lower)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        return lowered_jvp(g, node, tangents, self.lower)

    def attrs_str(self) -> str:
        return self.fwd.attrs_str()
