"""vmap rules shared by the ops that work along one ``axis`` (softmax, log-softmax, cumsum,
cumprod, top-k, argmax / argmin, the softmax backward ops) and by ``Reduce``, and by the
elementwise ops outside the driver's generic rule (trig, bitwise, bitwise_not, bitcast).

In: the graph being extended, the op, its batched inputs and each input's batch axis
(None: unbatched). Out: the op applied once to the whole batch and the output's batch
axis: the batch axis is an extra leading-or-inner axis the op's own axes step over.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId
    from rlx.ops.base import Op

__all__ = ["shift_axis", "align_batch", "batch_axis", "batch_same", "batch_broadcast"]


def shift_axis(axis: int, bd: int) -> int:
    """Where axis ``axis`` (>= 0) of an unbatched value sits once a batch axis is at ``bd``."""
    return axis + (axis >= bd)


def align_batch(
    g: Graph, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
) -> tuple[tuple[NodeId, ...], int | None]:
    """Inputs with one common batch axis: the batched inputs' own when they agree, else
    axis 0 (moved there by a transpose); unbatched inputs are broadcast along it."""
    have = [(x, b) for x, b in zip(ins, bdims, strict=True) if b is not None]
    if not have:
        return ins, None
    bd = have[0][1] if all(b == have[0][1] for _, b in have) else 0
    size = g.shape(have[0][0]).dims[have[0][1]]
    out = []
    for x, b in zip(ins, bdims, strict=True):
        if b is None:
            x = g.unsqueeze(x, [bd])
            dims = list(g.shape(x).dims)
            dims[bd] = size
            x = g.expand(x, dims)
        elif b != bd:
            perm = list(range(g.shape(x).rank))
            perm.insert(bd, perm.pop(b))
            x = g.transpose(x, perm)
        out.append(x)
    return tuple(out), bd


def batch_axis(
    op: Op, g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
) -> tuple[NodeId, int | None]:
    """``Op.batch`` of an op with one ``axis`` attribute: the inputs aligned on one batch
    axis, ``axis`` shifted past it. The output keeps the batch axis where it is, one
    place lower when the op drops its axis before it (argmax without keepdims)."""
    ins, bd = align_batch(g, ins, bdims)
    if bd is None:
        return g.apply(op, list(ins)), None
    ax = shift_axis(op.axis % (g.shape(ins[0]).rank - 1), bd)  # type: ignore[attr-defined]
    out = g.apply(dataclasses.replace(op, axis=ax), list(ins))  # type: ignore[type-var]
    drops = getattr(op, "keepdims", True) is False
    return out, bd - 1 if drops and ax < bd else bd


def batch_same(
    op: Op, g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
) -> tuple[NodeId, int | None]:
    """``Op.batch`` of a one-input op that keeps its input's dims (trig, bitwise_not,
    bitcast): the op on the batched input, the batch axis where it was."""
    return g.apply(op, list(ins)), bdims[0]


def batch_broadcast(
    op: Op, g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
) -> tuple[NodeId, int | None]:
    """``Op.batch`` of a broadcasting elementwise op (bitwise): every operand at the
    output's rank + 1 with the batch axis first (unbatched ones with a leading 1), then
    the op broadcasts as it does unbatched."""
    rank = node.shape.rank
    size = next(g.shape(x).dims[b] for x, b in zip(ins, bdims, strict=True) if b is not None)
    xs = []
    for x, bd in zip(ins, bdims, strict=True):
        dims = list(g.shape(x).dims)
        if bd is None:
            xs.append(g.reshape(x, [1] * (rank + 1 - len(dims)) + dims))
            continue
        if bd != 0:
            perm = list(range(len(dims)))
            perm.insert(0, perm.pop(bd))
            x = g.transpose(x, perm)
        rest = dims[:bd] + dims[bd + 1 :]
        if len(rest) < rank:
            x = g.reshape(x, [size] + [1] * (rank - len(rest)) + rest)
        xs.append(x)
    return g.apply(op, xs), 0
