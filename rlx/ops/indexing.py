"""Element-wise indexing: gather_elements / scatter_elements (one index per element along an
axis, ``np.take_along_axis`` / ``np.put_along_axis``) and gather_nd / scatter_nd (index
tuples into the leading dims), each scatter with a reduction (none, add, mul, max, min).

Indices may be negative (counted from the end, ``[-n, n)``); others are an InputError
when the graph runs. A scatter with reduction ``none`` and repeated indices keeps the
last update (NumPy's order), as ONNX leaves that case undefined."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.errors import AutodiffError, InputError
from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.ops.elementwise import _wide
from rlx.ops.grad_util import not_static, zeros_or
from rlx.ops.reduce import norm_axis
from rlx.ops.rules import ones, scalar, zeros
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["ScatterReduction", "GatherElements", "ScatterElements", "GatherNd", "ScatterNd"]


class ScatterReduction(enum.Enum):
    """How a scatter combines an update with the value already there."""

    NONE = "none"
    ADD = "add"
    MUL = "mul"
    MAX = "max"
    MIN = "min"


_UFUNC = {
    ScatterReduction.ADD: np.add,
    ScatterReduction.MUL: np.multiply,
    ScatterReduction.MAX: np.maximum,
    ScatterReduction.MIN: np.minimum,
}


def _in_range(op: Op, idx: np.ndarray, n: int | np.ndarray, what: str) -> np.ndarray:
    i64 = np.asarray(idx).astype(np.int64)
    bad = (i64 < -n) | (i64 >= n)
    if bad.any():
        raise InputError(
            f"{op.mnemonic}: index {int(i64[bad].flat[0])} out of range for {what} "
            f"({int(bad.sum())} such indices)"
        )
    return np.where(i64 < 0, i64 + n, i64)


def _along(idx: np.ndarray, ax: int) -> tuple[np.ndarray, ...]:
    """Full index tuple for ``out[..., idx, ...]`` element by element along ``ax``."""
    grids = list(np.indices(idx.shape, sparse=True))
    grids[ax] = idx
    return tuple(grids)


def _scatter(out: np.ndarray, where: tuple, upd: np.ndarray, red: ScatterReduction) -> None:
    if red is ScatterReduction.NONE:
        out[where] = upd
    else:
        _UFUNC[red].at(out, where, upd)


def gather_elements(op: GatherElements, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``x[idx]`` element by element along the axis (idx may be smaller than x on the
    other axes), negative indices wrapped and range-checked."""
    ax = op.axis % x.ndim
    return x[_along(_in_range(op, idx, x.shape[ax], f"axis {ax}"), ax)]


def scatter_elements(
    op: ScatterElements, x: np.ndarray, idx: np.ndarray, upd: np.ndarray
) -> np.ndarray:
    ax = op.axis % x.ndim
    out = np.array(_wide(x), copy=True)
    i = _in_range(op, idx, x.shape[ax], f"axis {ax}")
    _scatter(out, _along(i, ax), _wide(upd), op.reduction)
    return out


def _nd_index(op: Op, x: np.ndarray, idx: np.ndarray, b: int) -> tuple[np.ndarray, ...]:
    k = idx.shape[-1]
    i = _in_range(op, idx, np.asarray(x.shape[b : b + k]), "the indexed dims")
    lead = np.indices(idx.shape[:b], sparse=False).reshape(b, *idx.shape[:b], *(
        (1,) * (idx.ndim - 1 - b)))  # fmt: skip
    return tuple(
        [np.broadcast_to(lead[j], idx.shape[:-1]) for j in range(b)] + [i[..., j] for j in range(k)]
    )


def gather_nd(op: GatherNd, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return x[_nd_index(op, x, idx, op.batch_dims)]


def scatter_nd(op: ScatterNd, x: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> np.ndarray:
    out = np.array(_wide(x), copy=True)
    _scatter(out, _nd_index(op, x, idx, 0), _wide(upd), op.reduction)
    return out


def _same_rank(op: Op, x: Shape, idx: Shape) -> None:
    expect(idx.dtype.is_int, op, f"indices must be an integer tensor, got {idx}")
    expect(idx.rank == x.rank, op, f"indices {idx} must have the rank of the input {x}")


@register
class GatherElements(Op):
    """Inputs ``(x, idx)`` of equal rank: ``out[i][j][k] = x[i][idx[i][j][k]][k]`` for
    axis 1 (``np.take_along_axis``, idx no larger than x on the other axes); the output
    has idx's dims and x's dtype."""

    mnemonic: ClassVar[str] = "gather_elements"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    axis: int = 0

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, idx = ins
        norm_axis(self, x, self.axis)
        _same_rank(self, x, idx)
        return Shape(idx.dims, x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return gather_elements(self, xs[0], xs[1])

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        x, idx = node.inputs
        add = ScatterElements(self.axis, ScatterReduction.ADD)
        return (g.apply(add, [zeros(g, x), idx, ct]), None)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        t = tangents[0]
        return None if t is None else g.apply(self, [t, node.inputs[1]])


@register
class ScatterElements(Op):
    """Inputs ``(x, idx, updates)``, idx and updates of one shape and x's rank: a copy of
    x with ``out[i][idx[i][j][k]][k] (reduction)= updates[i][j][k]`` for axis 1."""

    mnemonic: ClassVar[str] = "scatter_elements"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    axis: int = 0
    reduction: ScatterReduction = ScatterReduction.NONE

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, idx, upd = ins
        norm_axis(self, x, self.axis)
        _same_rank(self, x, idx)
        expect(upd.dims == idx.dims, self, f"updates {upd} must have the dims of indices {idx}")
        expect(upd.dtype is x.dtype, self, f"updates dtype {upd.dtype} differs from {x}")
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return scatter_elements(self, xs[0], xs[1], xs[2])

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return _scatter_vjp(g, node, ct, GatherElements(self.axis))

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        return _scatter_jvp(g, node, tangents, GatherElements(self.axis))


def _nd_dims(op: Op, x: Shape, idx: Shape, b: int) -> tuple:
    expect(idx.dtype.is_int, op, f"indices must be an integer tensor, got {idx}")
    expect(
        idx.rank >= 1 and isinstance(idx.dims[-1], int), op, f"indices {idx} need a static last dim"
    )
    k = idx.dims[-1]
    expect(
        0 <= b < min(x.rank, idx.rank) and 1 <= k <= x.rank - b,
        op,
        f"indices {idx} index {k} dims of {x} after {b} batch dims",
    )
    expect(idx.dims[:b] == x.dims[:b], op, f"batch dims of {idx} and {x} differ")
    return idx.dims[:-1] + x.dims[b + k :]


@register
class GatherNd(Op):
    """Inputs ``(x, idx[..., k])``: each index tuple picks a slice of x's dims
    ``b..b+k`` (``b = batch_dims`` leading dims shared with idx); out dims
    ``idx.dims[:-1] + x.dims[b+k:]``."""

    mnemonic: ClassVar[str] = "gather_nd"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    batch_dims: int = 0

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, idx = ins
        return Shape(_nd_dims(self, x, idx, self.batch_dims), x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return gather_nd(self, xs[0], xs[1])

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        x, idx = node.inputs
        b = self.batch_dims
        if b:  # prepend each index tuple's batch coordinates: one scatter over x
            dims = g.shape(idx).dims
            if not all(isinstance(d, int) for d in dims[:-1]):
                raise not_static(node, "gather_nd with batch dims")
            grids = np.indices(dims[:-1])[:b].transpose(*range(1, len(dims)), 0)
            lead = g.constant(grids.astype(g.shape(idx).dtype.np))
            idx = g.concat([lead, idx], -1)
        add = ScatterNd(ScatterReduction.ADD)
        return (g.apply(add, [zeros(g, x), idx, ct]), None)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        t = tangents[0]
        return None if t is None else g.apply(self, [t, node.inputs[1]])


@register
class ScatterNd(Op):
    """Inputs ``(x, idx[..., k], updates)``: a copy of x where each index tuple's slice
    (reduction)= its update; updates dims ``idx.dims[:-1] + x.dims[k:]``."""

    mnemonic: ClassVar[str] = "scatter_nd"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    reduction: ScatterReduction = ScatterReduction.NONE

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, idx, upd = ins
        want = _nd_dims(self, x, idx, 0)
        expect(upd.dims == want, self, f"updates must have dims {list(want)}, got {upd}")
        expect(upd.dtype is x.dtype, self, f"updates dtype {upd.dtype} differs from {x}")
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return scatter_nd(self, xs[0], xs[1], xs[2])

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return _scatter_vjp(g, node, ct, GatherNd(0))

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        return _scatter_jvp(g, node, tangents, GatherNd(0))


# ---- derivative rules of the scatters (shared by scatter_elements and scatter_nd) -----


def _with(op: Op, red: ScatterReduction) -> Op:
    return dataclasses.replace(op, reduction=red)  # type: ignore[type-var]


def _masks(g: Graph, node: Node, take: Op) -> tuple[NodeId, NodeId, NodeId | None]:
    """Where the output's value came from: (x kept mask, update used mask, count of
    sources per output element or None). Replace: the last update to a position wins
    (NumPy's order), found by scattering each update's ordinal; max / min: every source
    equal to the result shares the gradient equally (PyTorch's rule)."""
    op = node.op
    x, idx, upd = node.inputs
    red = op.reduction  # type: ignore[attr-defined]
    if red is ScatterReduction.NONE:
        dims = g.shape(upd).dims
        if not all(isinstance(d, int) for d in dims):
            raise not_static(node, "a replace-scatter")
        ords = g.constant(np.arange(1, 1 + int(np.prod(dims)), dtype=np.float64).reshape(dims))
        won = g.apply(op, [zeros(g, g.shape(x).with_dtype(DType.F64)), idx, ords])
        return (g.eq(won, scalar(g, 0.0, won)), g.eq(g.apply(take, [won, idx]), ords), None)
    if red in (ScatterReduction.MAX, ScatterReduction.MIN):
        kept = g.eq(x, node.id)
        used = g.eq(upd, g.apply(take, [node.id, idx]))
        add = _with(op, ScatterReduction.ADD)
        one, zero = ones(g, x), zeros(g, x)
        hits = g.apply(
            add, [g.where(kept, one, zero), idx, g.where(used, ones(g, upd), zeros(g, upd))]
        )
        return kept, used, hits
    raise AutodiffError(
        f"{node.label}: scatter with reduction {red.value} has no derivative rule here "
        f"(add, none, max and min have one)",
        node=node.id,
        loc=node.loc,
    )


def _scatter_vjp(g: Graph, node: Node, ct: NodeId, take: Op) -> tuple[NodeId | None, ...]:
    x, idx, upd = node.inputs
    if node.op.reduction is ScatterReduction.ADD:  # type: ignore[attr-defined]
        return (ct, None, g.apply(take, [ct, idx]))
    kept, used, hits = _masks(g, node, take)
    share = ct if hits is None else g.div(ct, hits)
    dx = g.where(kept, share, zeros(g, x))
    return (dx, None, g.where(used, g.apply(take, [share, idx]), zeros(g, upd)))


def _scatter_jvp(g: Graph, node: Node, tangents: tuple, take: Op) -> NodeId | None:
    (x, idx, upd), (tx, _, tu) = node.inputs, tangents
    op = node.op
    red = op.reduction  # type: ignore[attr-defined]
    if red in (ScatterReduction.ADD, ScatterReduction.NONE):  # linear in (x, updates)
        return g.apply(op, [zeros_or(g, tx, x), idx, zeros_or(g, tu, upd)])
    kept, used, hits = _masks(g, node, take)
    tx = g.where(kept, zeros_or(g, tx, x), zeros(g, x))
    tu = g.where(used, zeros_or(g, tu, upd), zeros(g, upd))
    return g.div(g.apply(_with(op, ScatterReduction.ADD), [tx, idx, tu]), hits)
