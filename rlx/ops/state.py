"""Ops of the compiled training step beyond the math: writing state, and keeping
recomputed values apart.

``assign`` (:class:`Assign`): in ``param`` (a Param node) and ``value`` (same shape and
dtype); out a zero-size token ``[0]`` of the param's dtype. When the compiled graph runs,
the CPU kernel copies ``value`` into the param's storage (in place: views and packed
weights stay valid, the store's ``version`` moves so that param-derived values are
recomputed before the next run). The op is an ``effect``: it runs after every other node
(so every reader of the param in the same run sees the old value), survives dead-code
elimination and is never merged. The reference interpreter changes nothing (it returns
the token): state lives in a compiled graph's param store, not in the caller's arrays.
Nothing reads the token; it is an output only to be printed.

``adam_update`` (:class:`AdamUpdate`): in ``p, g, m, v`` (params ``p``, ``m``, ``v`` and
the gradient, one shape and float dtype), ``lr`` and ``step`` (f64 rank 0: the learning
rate and the 1-based step number); attributes ``beta1, beta2, eps, weight_decay,
decoupled``; out a zero-size token like ``assign``. When the compiled graph runs, the CPU
kernel writes ``torch.optim.Adam`` / ``AdamW``'s new ``p, m, v`` into the three params'
storage in place in one pass (``csrc/adam_update.c``); an ``effect``, like ``assign``.
:func:`adam_formula` is the same update in NumPy (what the kernel computes, used as its
fallback).

``barrier`` (:class:`Barrier`): the identity, but not ``pure``, so common-subexpression
elimination never merges what reads it with what reads its input. The training step's
recompute mode reads kept values through barriers so that the recomputed copy of a
forward node stays a separate node (computed late, in the backward pass). A view: no
copy, no kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx import source
from rlx.dtype import DType
from rlx.errors import ShapeError
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.core import Param
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["Assign", "AdamUpdate", "Barrier", "adam_formula"]


@register
class Assign(Op):
    """``param <- value`` when the compiled graph runs (module docstring); inputs
    ``(param, value)``, output a zero-size token."""

    mnemonic: ClassVar[str] = "assign"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.BOUNDARY
    pure: ClassVar[bool] = False
    effect: ClassVar[bool] = True
    keep_dtype_inputs: ClassVar[tuple[int, ...]] = (0, 1)
    nondiff: ClassVar[str] = "assign writes state; its output is a token"

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        p, v = ins
        expect(
            p.dims == v.dims and p.dtype is v.dtype,
            self,
            f"the value {v} must have the param's shape and dtype {p}",
        )
        return Shape((0,), p.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return np.zeros((0,), dtype=ctx.out_dtype)


@register
class AdamUpdate(Op):
    """Adam / AdamW step of one param in place (module docstring); inputs ``(p, g, m, v,
    lr, step)``, output a zero-size token."""

    mnemonic: ClassVar[str] = "adam_update"
    arity: ClassVar[int] = 6
    kind: ClassVar[OpKind] = OpKind.BOUNDARY
    pure: ClassVar[bool] = False
    effect: ClassVar[bool] = True
    keep_dtype_inputs: ClassVar[tuple[int, ...]] = (0, 1, 2, 3, 4, 5)
    nondiff: ClassVar[str] = "optimizer state update"

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        p, g, m, v, lr, step = ins
        for what, s in (("gradient", g), ("m", m), ("v", v)):
            expect(
                s.dims == p.dims and s.dtype is p.dtype,
                self,
                f"the {what} {s} must have the param's shape and dtype {p}",
            )
        expect(p.dtype.is_float, self, f"the param {p} must be a float tensor")
        for what, s in (("lr", lr), ("step", step)):
            expect(
                s.dims == () and s.dtype is DType.F64,
                self,
                f"{what} must be an f64 scalar, given {s}",
            )
        return Shape((0,), p.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return np.zeros((0,), dtype=ctx.out_dtype)


def adam_scalars(op: AdamUpdate, lr: float, step: float, dt: np.dtype) -> tuple:
    """The step's scalars of ``csrc/adam_update.c`` (f64, then rounded once to ``dt``):
    keep, wd, 1 - beta1, beta2, 1 - beta2, sqrt(1 - beta2**t), eps, lr / (1 - beta1**t)."""
    t = dt.type
    bc1 = 1.0 - np.power(np.float64(op.beta1), np.float64(step))
    bc2 = 1.0 - np.power(np.float64(op.beta2), np.float64(step))
    keep = 1.0 - lr * op.weight_decay if op.decoupled else 1.0
    wd = 0.0 if op.decoupled else op.weight_decay
    vals = (keep, wd, 1.0 - op.beta1, op.beta2, 1.0 - op.beta2, np.sqrt(bc2), op.eps, lr / bc1)
    return tuple(t(x) for x in vals)


def adam_formula(
    op: AdamUpdate,
    p: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    lr: float,
    step: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The new ``(p, m, v)`` of one Adam / AdamW step in NumPy, in ``p``'s dtype."""
    keep, wd, omb1, b2, omb2, bc2s, eps, step_size = adam_scalars(op, lr, step, p.dtype)
    if op.decoupled:
        p = p * keep
    elif op.weight_decay:
        g = g + p * wd
    m = m + (g - m) * omb1
    v = v * b2 + (g * g) * omb2
    return p - (m / (np.sqrt(v) / bc2s + eps)) * step_size, m, v


@register
class Barrier(Op):
    """The identity that common-subexpression elimination does not look through."""

    mnemonic: ClassVar[str] = "barrier"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    pure: ClassVar[bool] = False
    view: ClassVar[bool] = True

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return ins[0]

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return xs[0]

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return (ct,)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        return tangents[0]


@graph_method
def assign(g: Graph, param: NodeId, value: NodeId) -> NodeId:
    """Write ``value`` into param node ``param`` when the compiled graph runs (after every
    other node); returns the token."""
    node = g.node(param)
    if not isinstance(node.op, Param):
        raise ShapeError(
            f"assign: the target %{param} must be a param node (g.param), "
            f"got {node.op.mnemonic} {node.shape}",
            loc=source.capture(),
        )
    return g.apply(Assign(), [param, value])


@graph_method
def adam_update(
    g: Graph,
    p: NodeId,
    grad: NodeId,
    m: NodeId,
    v: NodeId,
    lr: NodeId,
    step: NodeId,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled: bool = False,
) -> NodeId:
    """Update params ``p, m, v`` in place by one Adam (``decoupled``: AdamW) step when the
    compiled graph runs (after every other node); returns the token."""
    for what, nid in (("p", p), ("m", m), ("v", v)):
        node = g.node(nid)
        if not isinstance(node.op, Param):
            raise ShapeError(
                f"adam_update: {what} %{nid} must be a param node (g.param), "
                f"got {node.op.mnemonic} {node.shape}",
                loc=source.capture(),
            )
    op = AdamUpdate(float(beta1), float(beta2), float(eps), float(weight_decay), bool(decoupled))
    return g.apply(op, [p, grad, m, v, lr, step])


@graph_method
def barrier(g: Graph, x: NodeId) -> NodeId:
    """``x`` through an optimization barrier (the identity, never merged by CSE)."""
    return g.apply(Barrier(), [x])
