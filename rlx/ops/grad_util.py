"""Helpers the data-movement, indexing and linear-algebra rules share (``vjp`` / ``jvp`` /
``batch`` methods of the ops in movement.py, indexing.py, linalg.py), and the one op
they add: ``gather_backward`` (the adjoint of ``gather``: zeros with the cotangent's
slices added at the indices, without materializing and copying a zeros operand).

In: the graph being extended and node ids. Out: node ids built with the graph builders,
so every backend runs them. The rules' own logic stays beside the ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.errors import AutodiffError
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.elementwise import BinaryKind, _wide
from rlx.ops.movement_checks import check_index_range
from rlx.ops.rules import moveaxis, zeros
from rlx.shape import Dim, Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = [
    "GatherBackward",
    "same_op",
    "front",
    "batch_size",
    "embed",
    "zeros_or",
    "not_static",
    "fold_batch",
    "offset_rows",
]


@register
class GatherBackward(Op):
    """Inputs ``(ct, idx)``: zeros of ``dims`` (the gathered operand's dims) with ``ct``'s
    slices added at ``idx`` along ``axis`` (repeats add): the adjoint of ``gather(x, idx,
    axis)``, ``ct`` shaped like its output. Indices lie in ``[-n, n)`` (an InputError at
    run time otherwise)."""

    mnemonic: ClassVar[str] = "gather_backward"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    axis: int
    dims: tuple[Dim, ...]

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        ct, idx = ins
        r = len(self.dims)
        expect(0 <= self.axis < r, self, f"axis {self.axis} out of range for dims {self.dims}")
        expect(idx.dtype.is_int, self, f"indices must be an integer tensor, got {idx}")
        expect(
            ct.dtype.is_float or ct.dtype.is_complex, self, f"ct must be float or complex, got {ct}"
        )
        ax, d = self.axis, self.dims
        want = (*d[:ax], *idx.dims, *d[ax + 1 :])
        expect(ct.dims == want, self, f"ct must have dims {list(want)} (gather's output), got {ct}")
        return Shape(d, ct.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        ct, idx = xs
        out = np.zeros(ctx.out_dims, _wide(ct).dtype)
        i64 = check_index_range(self, idx, out.shape[self.axis], self.axis)
        np.add.at(out, (slice(None),) * self.axis + (i64,), _wide(ct))
        return out.astype(ctx.out_dtype)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return (g.gather(ct, node.inputs[1], self.axis), None)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        t = tangents[0]
        return None if t is None else g.apply(self, [t, node.inputs[1]])

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        (ct, idx), (bc, bi), ax = ins, bdims, self.axis
        n = batch_size(g, ins, bdims)
        if bi is None:
            return g.apply(GatherBackward(ax + 1, (n, *self.dims)), [front(g, ct, bc), idx]), 0
        rows = self.dims[ax]
        if not (isinstance(n, int) and isinstance(rows, int)):
            raise NotImplementedError  # the vmap driver's generic rule
        ct = front(g, ct, bc) if bc is not None else g.expand(ct, [n, *g.shape(ct).dims])
        folded = (*self.dims[:ax], n * rows, *self.dims[ax + 1 :])
        out = g.apply(
            GatherBackward(ax, folded),
            [moveaxis(g, ct, 0, ax), offset_rows(g, front(g, idx, bi), n, rows)],
        )
        return g.reshape(out, [*self.dims[:ax], n, rows, *self.dims[ax + 1 :]]), ax


@graph_method
def gather_backward(g: Graph, ct: NodeId, idx: NodeId, axis: int, dims: Sequence[Dim]) -> NodeId:
    """The adjoint of ``g.gather(x, idx, axis)`` for ``x`` of ``dims`` (see
    :class:`GatherBackward`)."""
    return g.apply(GatherBackward(axis, tuple(dims)), [ct, idx])


def same_op(g: Graph, op: Op, tangents: Sequence[NodeId | None]) -> NodeId | None:
    """The jvp of a linear one-input op: ``op`` applied to the tangent (None stays None)."""
    (t,) = tangents
    return None if t is None else g.apply(op, [t])


def zeros_or(g: Graph, t: NodeId | None, like: NodeId) -> NodeId:
    """``t``, or zeros shaped like ``like`` when ``t`` is None (a zero tangent)."""
    return zeros(g, like) if t is None else t


def front(g: Graph, x: NodeId, bdim: int | None) -> NodeId:
    """``x`` with its batch axis ``bdim`` moved to axis 0 (``x`` when unbatched)."""
    return x if bdim is None else moveaxis(g, x, bdim, 0)


def batch_size(g: Graph, ins: Sequence[NodeId], bdims: Sequence[int | None]) -> Dim:
    """The size of the batch axis (read off the first batched input)."""
    for x, b in zip(ins, bdims, strict=True):
        if b is not None:
            return g.shape(x).dims[b]
    raise ValueError("batch rule called with no batched input")


def not_static(node: Node, what: str) -> AutodiffError:
    """The error of a rule that needs a static dim where the graph has a symbolic one."""
    return AutodiffError(
        f"{node.label}: the derivative of {what} needs a static dim (got {node.shape})",
        node=node.id,
        loc=node.loc,
    )


def embed(g: Graph, ct: NodeId, axis: int, size: Dim, positions: Sequence[int]) -> NodeId:
    """Zeros with axis ``axis`` of ``ct`` grown to ``size`` and ``ct``'s slices placed at
    ``positions`` along it (repeats add): the adjoint of taking those slices. A contiguous
    run on a static axis pads; others are one gather_backward (symbolic ``size`` allowed)."""
    dims = list(g.shape(ct).dims)
    pos = list(positions)
    if dims[axis] == size and pos == list(range(len(pos))):
        return ct
    if pos and pos == list(range(pos[0], pos[0] + len(pos))) and isinstance(size, int):
        pads = [(0, 0)] * len(dims)
        pads[axis] = (pos[0], size - pos[0] - len(pos))
        return g.pad(ct, pads)
    out = list(dims)
    out[axis] = size
    if not pos:
        return zeros(g, g.shape(ct).with_dims(out))
    return g.gather_backward(ct, g.constant(np.asarray(pos, dtype=np.int64)), axis, out)


def fold_batch(g: Graph, x: NodeId, idx: NodeId, ax: int) -> tuple[NodeId, NodeId]:
    """vmap of a gather along ``ax`` with both operands batched on axis 0: ``x`` with its
    batch folded into axis ``ax`` (``[..., B*n, ...]``) and ``idx`` (batch first, negative
    entries wrapped) offset by ``b*n`` for batch row ``b``, so one gather serves all."""
    x = moveaxis(g, x, 0, ax)
    dims = g.shape(x).dims
    b, n = dims[ax], dims[ax + 1]
    if not (isinstance(b, int) and isinstance(n, int)):
        raise NotImplementedError  # the vmap driver's generic rule handles symbolic dims
    return g.reshape(x, [*dims[:ax], b * n, *dims[ax + 2 :]]), offset_rows(g, idx, b, n)


def offset_rows(g: Graph, idx: NodeId, b: int, n: int) -> NodeId:
    """Indices ``idx`` (batch first, ``b`` rows, each into an axis of ``n``) with negative
    entries wrapped and row ``k`` offset by ``k*n``: indices into the folded axis."""
    it = g.shape(idx).dtype.np
    nn = g.constant(np.asarray(n, dtype=it))
    wrapped = g.binary(BinaryKind.MOD, g.add(g.binary(BinaryKind.MOD, idx, nn), nn), nn)
    off = np.arange(b, dtype=it).reshape(b, *(1,) * (g.shape(idx).rank - 1)) * it.type(n)
    return g.add(wrapped, g.constant(off))
