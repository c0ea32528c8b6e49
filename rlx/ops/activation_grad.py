"""Backward ops of the activations: what ``Unary.vjp`` emits for relu and the smooth
activations instead of a graph of primitive ops (the seed's ``ReluBackward`` and
``ActivationBackward``).

* ``ReluBackward``: inputs ``(y, ct)`` with ``y = relu(x)`` -> ``ct`` where ``y > 0``,
  else 0 (PyTorch's ``threshold_backward``: ``relu'(0) = 0``; it reads the output, so
  the pre-activation need not be kept for the backward pass).
* ``ActivationBackward(fn)``: inputs ``(v, ct)`` -> ``ct * f'(x)`` in one pass, ``fn`` one
  of :data:`ACTIVATIONS`. ``v`` is the activation's output ``y`` for sigmoid and tanh
  (``f' = y (1 - y)``, ``1 - y^2``, as PyTorch's ``sigmoid_backward`` /
  ``tanh_backward``), its input ``x`` for the others (gelu, gelu_tanh, silu, softplus,
  hardswish, as ``gelu_backward`` / ``silu_backward``).

Both are elementwise in ``(v, ct)`` and linear in ``ct``. Each has ``lower(g, inputs)``:
the same value from primitive ops (the derivative of the kind's row in
``unary_kinds.py``); the CPU kernel runs that lowering as one generated C loop
(``backends/cpu/engines/lowered.py``) and the ops' own derivatives (double backward,
Hessian-vector products) are the lowering's (``rlx/ops/lowered.py``). References compute
in f64 for f64 and f32 otherwise and round once to the node's dtype; real floats only
(complex activations keep the primitive rules).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.lowered import lowered_jvp, lowered_vjp
from rlx.ops.unary_kinds import UNARY, UnaryKind
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["ReluBackward", "ActivationBackward", "ACTIVATIONS", "FROM_OUTPUT", "emits_backward"]

_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _erf(x: np.ndarray) -> np.ndarray:
    return UNARY[UnaryKind.ERF].numpy(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return UNARY[UnaryKind.SIGMOID].numpy(x)


def _d_gelu_tanh(x: np.ndarray) -> np.ndarray:
    th = np.tanh(_SQRT_2_PI * (x + 0.044715 * x**3))
    return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * _SQRT_2_PI * (1 + 3 * 0.044715 * x * x)


#: kind -> f'(v) in NumPy (v: x, or y for the kinds of FROM_OUTPUT)
_NUMPY: dict[UnaryKind, Callable[[np.ndarray], np.ndarray]] = {
    UnaryKind.GELU: lambda x: (
        0.5 * (1 + _erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) * _INV_SQRT_2PI
    ),
    UnaryKind.GELU_TANH: _d_gelu_tanh,
    UnaryKind.SILU: lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x))),
    UnaryKind.SOFTPLUS: _sigmoid,
    UnaryKind.HARDSWISH: lambda x: np.where(x <= -3, 0.0, np.where(x < 3, x / 3 + 0.5, 1.0)),
    UnaryKind.SIGMOID: lambda y: y * (1 - y),
    UnaryKind.TANH: lambda y: 1 - y * y,
}
#: the activation kinds ActivationBackward computes
ACTIVATIONS: frozenset[UnaryKind] = frozenset(_NUMPY)
#: kinds whose ActivationBackward reads the activation's output ``y`` (the rest read ``x``)
FROM_OUTPUT: frozenset[UnaryKind] = frozenset({UnaryKind.SIGMOID, UnaryKind.TANH})


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64 if x.dtype == np.float64 else np.float32)


def _check_pair(op: Op, ins: tuple[Shape, ...], what: str) -> Shape:
    v, ct = ins
    expect(v.dtype.is_float, op, f"{what} must be a real float tensor, got {v}")
    expect(ct == v, op, f"the cotangent must match {what} {v}, got {ct}")
    return v


def _batch_pair(
    op: Op, g: Graph, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
) -> tuple[NodeId, int | None]:
    """vmap of an op elementwise in two same-shape inputs: batch axes to the front, an
    unbatched operand expanded along the batch."""
    from rlx.ops.grad_util import batch_size, front

    n = batch_size(g, ins, bdims)
    moved = []
    for x, b in zip(ins, bdims, strict=True):
        if b is None:
            x = g.expand(g.unsqueeze(x, 0), [n, *g.shape(x).dims])
        moved.append(front(g, x, b))
    return g.apply(op, moved), 0


@register
class ReluBackward(Op):
    """relu's vjp: inputs ``(y, ct)``, ``y = relu(x)`` -> ``ct`` where ``y > 0``, else 0
    (``relu'(0) = 0`` as PyTorch; NaN in ``y`` gives 0)."""

    mnemonic: ClassVar[str] = "relu_backward"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return _check_pair(self, ins, "y")

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        y, ct = xs
        return np.where(y > 0, ct, np.zeros((), ct.dtype)).astype(ctx.out_dtype)

    def lower(self, g: Graph, ins: Sequence[NodeId]) -> NodeId:
        y, ct = ins
        return g.where(g.gt(y, 0.0), ct, 0.0)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        # linear in ct (its own adjoint); y only selects: zero derivative almost everywhere
        return None, g.apply(self, [node.inputs[0], ct])

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        t = tangents[1]
        return None if t is None else g.apply(self, [node.inputs[0], t])

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int | None]:
        return _batch_pair(self, g, ins, bdims)


@register
class ActivationBackward(Op):
    """The vjp of the activation ``fn`` in one pass: inputs ``(v, ct)`` -> ``ct * f'``,
    ``v`` the activation's output for sigmoid / tanh and its input otherwise (see the
    module docstring)."""

    mnemonic: ClassVar[str] = "activation_backward"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE
    fn: UnaryKind

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        expect(
            self.fn in ACTIVATIONS,
            self,
            f"fn must be one of {sorted(k.value for k in ACTIVATIONS)}, got {self.fn}",
        )
        return _check_pair(self, ins, "y" if self.fn in FROM_OUTPUT else "x")

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        v, ct = (_wide(a) for a in xs)
        with np.errstate(all="ignore"):
            return (ct * _NUMPY[self.fn](v).astype(v.dtype)).astype(ctx.out_dtype)

    def lower(self, g: Graph, ins: Sequence[NodeId]) -> NodeId:
        v, ct = ins
        if self.fn is UnaryKind.TANH:
            d = g.sub(1.0, g.square(v))
        elif self.fn is UnaryKind.SIGMOID:
            d = g.mul(v, g.sub(1.0, v))
        else:  # the row's f'(x, y); y is built for the rows that read it (dead otherwise)
            rule = UNARY[self.fn].derivative
            assert callable(rule)
            d = rule(g, v, g.unary(self.fn, v))
        return g.mul(ct, d)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return lowered_vjp(g, node, ct, self.lower)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        return lowered_jvp(g, node, tangents, self.lower)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int | None]:
        return _batch_pair(self, g, ins, bdims)

    def __str__(self) -> str:
        return f"activation_backward[{self.fn.value}]"


def emits_backward(fn: UnaryKind, x_dtype: object) -> bool:
    """Whether ``Unary.vjp`` of ``fn`` on a value of ``x_dtype`` emits a backward op (a
    real float input, relu or one of :data:`ACTIVATIONS`)."""
    from rlx.dtype import DType

    return (
        isinstance(x_dtype, DType)
        and x_dtype.is_float
        and (fn is UnaryKind.RELU or fn in ACTIVATIONS)
    )


@graph_method
def relu_backward(g: Graph, y: NodeId, ct: NodeId) -> NodeId:
    """``ct`` where ``y = relu(x)`` is positive (see :class:`ReluBackward`)."""
    return g.apply(ReluBackward(), [y, ct])


@graph_method
def activation_backward(g: Graph, fn: UnaryKind, v: NodeId, ct: NodeId) -> NodeId:
    """``ct * f'`` of the activation ``fn`` (see :class:`ActivationBackward`)."""
    return g.apply(ActivationBackward(fn), [v, ct])
