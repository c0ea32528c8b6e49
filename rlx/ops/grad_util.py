"""Helpers the data-movement, indexing and linear-algebra rules share (``vjp`` / ``jvp`` /
``batch`` methods of the ops in movement.py, indexing.py, linalg.py).

In: the graph being extended and node ids. Out: node ids built with the ordinary graph
builders, so every backend already runs them. The rules' own logic stays beside the ops.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx.autodiff.rules import moveaxis, zeros
from rlx.errors import AutodiffError
from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.base import Op
from rlx.ops.elementwise import BinaryKind
from rlx.shape import Dim

__all__ = [
    "same_op",
    "front",
    "batch_size",
    "embed",
    "zeros_or",
    "not_static",
    "fold_batch",
]


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
    run on a static axis pads; others scatter-add (symbolic ``size`` allowed)."""
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
    base = zeros(g, g.shape(ct).with_dims(out))
    if not pos:
        return base
    idx = g.constant(np.asarray(pos, dtype=np.int64))
    return g.scatter_add(base, idx, ct, axis)


def fold_batch(g: Graph, x: NodeId, idx: NodeId, ax: int) -> tuple[NodeId, NodeId]:
    """vmap of a gather along ``ax`` with both operands batched on axis 0: ``x`` with its
    batch folded into axis ``ax`` (``[..., B*n, ...]``) and ``idx`` (batch first, negative
    entries wrapped) offset by ``b*n`` for batch row ``b``, so one gather serves all."""
    x = moveaxis(g, x, 0, ax)
    dims = g.shape(x).dims
    b, n = dims[ax], dims[ax + 1]
    if not (isinstance(b, int) and isinstance(n, int)):
        raise NotImplementedError  # the vmap driver's generic rule handles symbolic dims
    x = g.reshape(x, [*dims[:ax], b * n, *dims[ax + 2 :]])
    it = g.shape(idx).dtype.np
    nn = g.constant(np.asarray(n, dtype=it))
    wrapped = g.binary(BinaryKind.MOD, g.add(g.binary(BinaryKind.MOD, idx, nn), nn), nn)
    off = np.arange(b, dtype=it).reshape(b, *(1,) * (g.shape(idx).rank - 1)) * it.type(n)
    return x, g.add(wrapped, g.constant(off))
