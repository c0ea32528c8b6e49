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

``barrier`` (:class:`Barrier`): the identity, but not ``pure``, so common-subexpression
elimination never merges what reads it with what reads its input. The training step's
recompute mode reads kept values through barriers so that the recomputed copy of a
forward node stays a separate node (computed late, in the backward pass). A view: no
copy, no kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from rlx.errors import ShapeError
from rlx.ir import source
from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.core import Param
from rlx.shape import Shape

__all__ = ["Assign", "Barrier"]


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
def barrier(g: Graph, x: NodeId) -> NodeId:
    """``x`` through an optimization barrier (the identity, never merged by CSE)."""
    return g.apply(Barrier(), [x])
