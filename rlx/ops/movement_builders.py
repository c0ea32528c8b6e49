"""Graph builders for the data-movement ops of ``movement.py``: ``g.reshape`` (one -1
resolved), ``g.transpose``, ``g.concat``, ``g.expand`` (-1 keeps a dim), ``g.narrow``,
``g.slice``, ``g.gather``, ``g.scatter_add``, ``g.pad``, ``g.shape_of`` and the
``squeeze`` / ``unsqueeze`` / ``flatten`` conveniences (which emit reshapes).

In: node ids and Python arguments. Out: the id of the node built; a bad argument is a
ShapeError pointing at the user's line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlx import source
from rlx.errors import ShapeError
from rlx.ops.base import graph_method
from rlx.ops.movement import (
    Concat,
    Expand,
    Gather,
    Narrow,
    Pad,
    Reshape,
    ScatterAdd,
    ShapeOf,
    Slice,
    Transpose,
)
from rlx.ops.movement_checks import dims_txt
from rlx.ops.reduce import canon_axis, norm_axis
from rlx.shape import Dim, Shape, Sym, dims_product

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId


def _fail(msg: str) -> ShapeError:
    """A ShapeError for a builder-side check, pointing at the user's line."""
    return ShapeError(msg, loc=source.capture())


def _axis(op: str, shape: Shape, axis: int) -> int:
    try:
        return norm_axis(op, shape, axis)
    except ShapeError as e:
        raise _fail(e.bare_message) from None


def _user_dims(op: str, dims: Sequence[object]) -> list[Dim]:
    try:
        return list(Shape(dims).dims)
    except ShapeError as e:
        raise _fail(f"{op}: {e.bare_message}") from None


def _resolve_minus_one(x: Shape, dims: Sequence[object]) -> tuple[Dim, ...]:
    """Replace the one -1 in ``dims`` by what makes the element counts of ``x`` match."""
    holes = [i for i, d in enumerate(dims) if isinstance(d, int) and d == -1]
    if not holes:
        return tuple(_user_dims("reshape", dims))
    if len(holes) > 1:
        raise _fail(f"reshape: at most one -1 allowed in dims {dims_txt(dims)}, got {len(holes)}")
    h = holes[0]
    rest = _user_dims("reshape", [d for i, d in enumerate(dims) if i != h])
    known, total = dims_product(rest), x.numel
    missing: Dim | None = None
    if known == 0:
        missing = None
    elif isinstance(total, int) and isinstance(known, int):
        missing = total // known if total % known == 0 else None
    elif isinstance(total, Sym):
        missing = total.divide(known)
    if missing is None:
        raise _fail(
            f"reshape: cannot infer the -1 in {dims_txt(dims)} for input {x}: its "
            f"{total} elements are not a whole multiple of {known}"
        )
    rest.insert(h, missing)
    return tuple(rest)


@graph_method
def reshape(g: Graph, x: NodeId, dims: Sequence[object]) -> NodeId:
    """View ``x`` with new ``dims`` (ints, symbolic dims or their names; one may be -1)."""
    return g.apply(Reshape(_resolve_minus_one(g.node(x).shape, tuple(dims))), [x])


@graph_method
def transpose(g: Graph, x: NodeId, perm: Sequence[int] | None = None) -> NodeId:
    """Permute the axes of ``x`` (default: reverse them)."""
    r = g.node(x).shape.rank
    p = tuple(reversed(range(r))) if perm is None else tuple(perm)
    if all(isinstance(a, int) and -r <= a < r for a in p):
        p = tuple(a % r for a in p)
    return g.apply(Transpose(p), [x])


@graph_method
def concat(g: Graph, xs: Sequence[NodeId], axis: int = 0) -> NodeId:
    """Concatenate the nodes ``xs`` along ``axis``."""
    xs = list(xs)
    ax = canon_axis(g, xs[0], axis) if xs else axis
    return g.apply(Concat(ax), xs)


@graph_method
def expand(g: Graph, x: NodeId, dims: Sequence[object]) -> NodeId:
    """Broadcast ``x`` to ``dims``; a -1 keeps the input dim it is aligned with."""
    shape = g.node(x).shape
    lead = len(dims) - shape.rank
    out: list[object] = []
    for i, d in enumerate(dims):
        if isinstance(d, int) and d == -1:
            if i < lead:
                raise _fail(
                    f"expand: -1 at position {i} of {dims_txt(dims)} has no input dim "
                    f"of {shape} to keep"
                )
            d = shape.dims[i - lead]
        out.append(d)
    return g.apply(Expand(tuple(_user_dims("expand", out))), [x])


@graph_method
def narrow(g: Graph, x: NodeId, axis: int, start: int, length: int) -> NodeId:
    """``length`` elements of ``x`` along ``axis`` from ``start``."""
    return g.apply(Narrow(canon_axis(g, x, axis), int(start), int(length)), [x])


def _slice(
    g: Graph,
    x: NodeId,
    starts: Sequence[int | None],
    stops: Sequence[int | None],
    steps: Sequence[int] | None = None,
) -> NodeId:
    """Basic slicing; entries apply to the leading axes, the other axes are kept whole
    (``steps`` defaults to 1)."""
    r = g.node(x).shape.rank
    steps = [1] * len(starts) if steps is None else list(steps)
    if not len(starts) == len(stops) == len(steps) or len(starts) > r:
        raise _fail(
            f"slice: starts {tuple(starts)}, stops {tuple(stops)} and steps {tuple(steps)} "
            f"must have equal lengths <= the rank {r} of {g.node(x).shape}"
        )
    pad = r - len(starts)
    return g.apply(
        Slice(
            tuple(starts) + (0,) * pad,
            tuple(stops) + (None,) * pad,
            tuple(steps) + (1,) * pad,
        ),
        [x],
    )


_slice.__name__ = "slice"  # g.slice; the module keeps the builtin ``slice``
graph_method(_slice)


@graph_method
def gather(g: Graph, x: NodeId, idx: NodeId, axis: int = 0) -> NodeId:
    """``take(x, idx, axis)``: rows (or slices along ``axis``) of ``x`` picked by ``idx``."""
    return g.apply(Gather(canon_axis(g, x, axis)), [x, idx])


@graph_method
def scatter_add(g: Graph, x: NodeId, idx: NodeId, updates: NodeId, axis: int = 0) -> NodeId:
    """``x`` with ``updates`` added at the 1-D indices ``idx`` along ``axis``."""
    return g.apply(ScatterAdd(canon_axis(g, x, axis)), [x, idx, updates])


@graph_method
def pad(g: Graph, x: NodeId, pads: int | Sequence[tuple[int, int]], value: float = 0.0) -> NodeId:
    """Pad ``x`` with ``value``: ``pads`` is one (before, after) pair per axis, or an int
    for the same amount on both sides of every axis."""
    r = g.node(x).shape.rank
    if isinstance(pads, int):
        pp = ((pads, pads),) * r
    else:
        try:
            pp = tuple((int(lo), int(hi)) for lo, hi in pads)
        except (TypeError, ValueError):
            raise _fail(
                f"pad: pads must be an int or one (before, after) pair per axis of "
                f"{g.node(x).shape}, got {pads!r}"
            ) from None
    return g.apply(Pad(pp, float(value)), [x])


@graph_method
def squeeze(g: Graph, x: NodeId, axes: int | Sequence[int] | None = None) -> NodeId:
    """Drop size-1 axes (all static size-1 axes when ``axes`` is None)."""
    shape = g.node(x).shape
    if axes is None:
        drop = {i for i, d in enumerate(shape.dims) if d == 1}
    else:
        axes = (axes,) if isinstance(axes, int) else tuple(axes)
        r = shape.rank
        for a in axes:
            if not (isinstance(a, int) and -r <= a < r):
                raise _fail(f"squeeze: axis {a} out of range for rank-{r} input {shape}")
            if shape.dims[a] != 1:
                raise _fail(
                    f"squeeze: axis {a % r} of {shape} has size {shape.dims[a]}, expected 1"
                )
        drop = {a % r for a in axes}
    return g.apply(Reshape(tuple(d for i, d in enumerate(shape.dims) if i not in drop)), [x])


@graph_method
def shape_of(g: Graph, x: NodeId) -> NodeId:
    """``x``'s dims as an i64 vector, read when the graph runs."""
    return g.apply(ShapeOf(), [x])


@graph_method
def unsqueeze(g: Graph, x: NodeId, axes: int | Sequence[int]) -> NodeId:
    """Insert size-1 axes at ``axes``, positions in the output (``np.expand_dims``)."""
    shape = g.node(x).shape
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    r = shape.rank + len(axes)
    if not all(isinstance(a, int) and -r <= a < r for a in axes) or len(
        {a % r for a in axes}
    ) != len(axes):
        raise _fail(
            f"unsqueeze: axes {axes} must be distinct and in [-{r}, {r}) for the rank-{r} "
            f"output of {shape}"
        )
    new = {a % r for a in axes}
    it = iter(shape.dims)
    dims = tuple(1 if i in new else next(it) for i in range(r))
    return g.apply(Reshape(dims), [x])


@graph_method
def flatten(g: Graph, x: NodeId, start: int = 0, end: int = -1) -> NodeId:
    """Merge axes ``start..end`` (inclusive, like ``torch.flatten``) into one."""
    shape = g.node(x).shape
    if shape.rank == 0:
        return g.apply(Reshape((1,)), [x])
    s, e = _axis("flatten", shape, start), _axis("flatten", shape, end)
    if s > e:
        raise _fail(f"flatten: start axis {start} comes after end axis {end} of {shape}")
    d = shape.dims
    return g.apply(Reshape(d[:s] + (dims_product(d[s : e + 1]),) + d[e + 1 :]), [x])
