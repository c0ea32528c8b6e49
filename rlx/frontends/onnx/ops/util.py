"""Small builders the converters share: op application, scalars of a node's dtype, axis
normalisation. In: node ids of the graph being built. Out: node ids."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx.dtype import DType
from rlx.ir.mir import Graph
from rlx.ops.elementwise import Binary, BinaryKind, Cast, Compare, CompareKind, Unary, UnaryKind
from rlx.ops.elementwise import Where as WhereOp

__all__ = ["un", "bin_", "cmp", "where", "cast", "scalar", "axis_of", "dtype_of"]


def dtype_of(g: Graph, x: int) -> DType:
    return g.shape(x).dtype


def un(g: Graph, fn: UnaryKind, x: int) -> int:
    return g.apply(Unary(fn), [x])


def bin_(g: Graph, fn: BinaryKind, a: int, b: int) -> int:
    return g.apply(Binary(fn), [a, b])


def cmp(g: Graph, fn: CompareKind, a: int, b: int) -> int:
    return g.apply(Compare(fn), [a, b])


def where(g: Graph, c: int, a: int, b: int) -> int:
    return g.apply(WhereOp(), [c, a, b])


def cast(g: Graph, x: int, to: DType) -> int:
    return x if dtype_of(g, x) is to else g.apply(Cast(to), [x])


def scalar(g: Graph, value: float | int | bool, like: int | DType) -> int:
    """A rank-0 constant of ``like``'s dtype."""
    dt = like if isinstance(like, DType) else dtype_of(g, like)
    return g.constant(np.asarray(value, dtype=dt.np))


def axis_of(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def axes_of(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    return tuple(sorted(axis_of(int(a), rank) for a in axes))
