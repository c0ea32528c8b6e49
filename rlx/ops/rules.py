"""Helpers the ops' derivative and batching rules share (``Op.vjp`` / ``jvp`` / ``batch``).

In: the graph being extended and node ids. Out: node ids. Only the graph builders are
used, so a rule's nodes are ordinary ops that every pass and backend already handles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from rlx.dtype import DType
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = [
    "unbroadcast",
    "zeros",
    "ones",
    "scalar",
    "add_any",
    "is_diff_dtype",
    "stamp",
    "moveaxis",
]


def is_diff_dtype(dtype: DType) -> bool:
    """Whether values of ``dtype`` carry gradients (float and complex dtypes)."""
    return dtype.is_float or dtype.is_complex


def scalar(g: Graph, value: float, like: NodeId) -> NodeId:
    """A rank-0 constant ``value`` with ``like``'s dtype (broadcasts against it)."""
    return g.constant(np.asarray(value, dtype=g.node(like).dtype.np))


def zeros(g: Graph, like: NodeId | Shape) -> NodeId:
    """Zeros of ``like``'s shape and dtype (a node id or a Shape; symbolic dims allowed)."""
    shape = g.shape(like) if isinstance(like, int) else like
    z = g.constant(np.zeros((), dtype=shape.dtype.np))
    return z if shape.rank == 0 else g.expand(z, list(shape.dims))


def ones(g: Graph, like: NodeId | Shape) -> NodeId:
    """Ones of ``like``'s shape and dtype."""
    shape = g.shape(like) if isinstance(like, int) else like
    o = g.constant(np.ones((), dtype=shape.dtype.np))
    return o if shape.rank == 0 else g.expand(o, list(shape.dims))


def unbroadcast(g: Graph, ct: NodeId, target: NodeId | Shape) -> NodeId:
    """``ct`` summed over the axes broadcasting added or stretched, so that it has the
    shape (and dtype) of ``target`` (a node id or a Shape): the cotangent of an operand
    of a broadcasting op."""
    want = g.shape(target) if isinstance(target, int) else target
    have = g.shape(ct)
    lead = have.rank - want.rank
    if lead < 0:
        raise ValueError(f"unbroadcast: cotangent {have} has lower rank than {want}")
    out = ct
    if lead:
        out = g.sum(out, list(range(lead)))
    stretched = [
        a
        for a, (d, w) in enumerate(zip(have.dims[lead:], want.dims, strict=True))
        if _is_one(w) and not _is_one(d)
    ]
    if stretched:
        out = g.sum(out, stretched, keepdims=True)
    if g.shape(out).dtype is not want.dtype:
        out = g.cast(out, want.dtype)
    return out


def _is_one(d: object) -> bool:
    return isinstance(d, int) and d == 1


def add_any(g: Graph, terms: Sequence[NodeId | None]) -> NodeId | None:
    """The sum of the terms that are not None (None when all are): tangents and cotangents
    where None means zero."""
    out: NodeId | None = None
    for t in terms:
        if t is not None:
            out = t if out is None else g.add(out, t)
    return out


def stamp(g: Graph, start: int, node: Node) -> None:
    """Give the nodes ``g.nodes[start:]`` (what a rule added for ``node``) ``node``'s source
    location, so reports name derivative nodes by the user's line."""
    for k in range(start, len(g.nodes)):
        g.nodes[k] = dataclasses.replace(g.nodes[k], loc=node.loc)


def moveaxis(g: Graph, x: NodeId, src: int, dst: int) -> NodeId:
    """``x`` with axis ``src`` moved to position ``dst`` (``np.moveaxis``; ``x`` itself
    when they are equal): batching rules move a batch axis where an op wants it."""
    r = g.shape(x).rank
    src, dst = src % r, dst % r
    if src == dst:
        return x
    perm = [a for a in range(r) if a != src]
    perm.insert(dst, src)
    return g.transpose(x, perm)
