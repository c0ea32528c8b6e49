"""Data movement: reshape, transpose, concat, expand, narrow, slice, gather, scatter-add,
pad, shape_of; each with its derivative (vjp, jvp) and vmap (batch) rules. Their graph
builders (``g.reshape``, ``g.squeeze``...) are in ``movement_builders.py``.

Symbolic dims: reshape keeps monomials (``[batch, seq, 384] <-> [batch*seq, 384]``).
Concatenating along a symbolic axis works only when every piece is a multiple of the same
monomial (``seq + seq = 2*seq``); other sums (``batch + 4``) are not representable and
raise a ShapeError asking for static dims. Padding a symbolic axis likewise needs a
static dim; slicing one only keeps it whole or takes a static-length window.

Only :class:`Reshape` is a view (its output is input 0's bytes); the others copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.errors import DTypeError, InputError
from rlx.ops.base import Op, OpKind, RefCtx, expect, register
from rlx.ops.elementwise import _wide
from rlx.ops.grad_util import batch_size, embed, fold_batch, front, same_op, zeros_or
from rlx.ops.movement_checks import (
    check_index_range,
    dims_txt,
    pad_value_misfit,
    slice_len,
    sum_dims,
    valid_dim,
)
from rlx.ops.reduce import norm_axis
from rlx.ops.rules import moveaxis, unbroadcast
from rlx.shape import Dim, Shape, Sym, dims_product

__all__ = [
    "Reshape",
    "Transpose",
    "Concat",
    "Expand",
    "Narrow",
    "Slice",
    "Gather",
    "ScatterAdd",
    "Pad",
    "ShapeOf",
]


@register
class Reshape(Op):
    """The same elements in row-major order with new ``dims`` (static or symbolic, no -1:
    ``g.reshape`` resolves one). A view: the output is the input's bytes."""

    mnemonic: ClassVar[str] = "reshape"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    view: ClassVar[bool] = True
    dims: tuple[Dim, ...]

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        expect(
            all(valid_dim(d) for d in self.dims),
            self,
            f"dims must be ints >= 0 or symbolic dims, got {dims_txt(self.dims)} "
            "(g.reshape resolves a -1)",
        )
        src, dst = x.numel, dims_product(self.dims)
        expect(
            src == dst,
            self,
            f"cannot reshape {x} ({src} elements) to {dims_txt(self.dims)} ({dst} elements)",
        )
        return Shape(self.dims, x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return np.reshape(xs[0], ctx.out_dims)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return (g.apply(Reshape(g.shape(node.inputs[0]).dims), [ct]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        return same_op(g, self, tangents)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        n = batch_size(g, ins, bdims)
        return g.apply(Reshape((n, *self.dims)), [front(g, ins[0], bdims[0])]), 0

    def attrs_str(self) -> str:
        return f"dims={dims_txt(self.dims)}"


@register
class Transpose(Op):
    """Permute the axes: output axis ``i`` is input axis ``perm[i]`` (``np.transpose``)."""

    mnemonic: ClassVar[str] = "transpose"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    perm: tuple[int, ...]

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        r = x.rank
        ok = len(self.perm) == r and all(isinstance(p, int) and -r <= p < r for p in self.perm)
        perm = tuple(p % r for p in self.perm) if ok else ()
        expect(
            ok and sorted(perm) == list(range(r)),
            self,
            f"perm {self.perm} is not a permutation of the {r} axes of {x} "
            f"(expected an ordering of {tuple(range(r))})",
        )
        return Shape(tuple(x.dims[p] for p in perm), x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return np.transpose(xs[0], self.perm)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return (g.apply(Transpose(tuple(np.argsort(self.perm).tolist())), [ct]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        return same_op(g, self, tangents)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        bd = bdims[0]  # one transpose: the batch axis to the front, the others permuted
        perm = (bd, *(p + (p >= bd) for p in (q % len(self.perm) for q in self.perm)))
        return g.apply(Transpose(perm), [ins[0]]), 0


@register
class Concat(Op):
    """Join any number (>= 1) of inputs along ``axis``; all other dims and the dtype must
    match. On a symbolic axis every size must be a multiple of one monomial (``seq`` and
    ``2*seq`` give ``3*seq``); other mixes are a ShapeError asking for static dims."""

    mnemonic: ClassVar[str] = "concat"
    arity: ClassVar[int | None] = None
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    axis: int

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        expect(len(ins) >= 1, self, "needs at least one input, got none")
        x0 = ins[0]
        ax = norm_axis(self, x0, self.axis)
        for k, s in enumerate(ins[1:], 1):
            expect(
                s.dtype is x0.dtype,
                self,
                f"input {k} {s} has dtype {s.dtype}, expected {x0.dtype} like input 0 {x0}",
            )
            expect(
                s.rank == x0.rank,
                self,
                f"input {k} {s} has rank {s.rank}, expected {x0.rank} like input 0 {x0}",
            )
            for i, (a, b) in enumerate(zip(x0.dims, s.dims)):
                expect(
                    i == ax or a == b,
                    self,
                    f"input {k} {s} has dim {i} = {b}, expected {a} like input 0 {x0} "
                    f"(only axis {ax} may differ)",
                )
        total = sum_dims(self, ax, [s.dims[ax] for s in ins])
        return Shape(x0.dims[:ax] + (total,) + x0.dims[ax + 1 :], x0.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return np.concatenate(list(xs), axis=self.axis)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        ax = self.axis % node.shape.rank
        sizes = [g.shape(i).dims[ax] for i in node.inputs]
        if all(isinstance(d, int) for d in sizes):
            starts = np.cumsum([0, *sizes[:-1]]).tolist()
            return tuple(g.narrow(ct, ax, s, d) for s, d in zip(starts, sizes, strict=True))
        # symbolic: every size is k_i * s for one monomial s: split the axis as [sum k, s]
        unit = next(d for d in sizes if isinstance(d, Sym))
        unit = Sym(unit.terms, 1)
        ks = [0 if isinstance(d, int) else d.coeff for d in sizes]
        dims = node.shape.dims
        split = g.reshape(ct, [*dims[:ax], sum(ks), unit, *dims[ax + 1 :]])
        starts = np.cumsum([0, *ks[:-1]]).tolist()
        return tuple(
            g.reshape(g.narrow(split, ax, s, k), list(g.shape(i).dims))
            for s, k, i in zip(starts, ks, node.inputs, strict=True)
        )

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        ts = [zeros_or(g, t, i) for t, i in zip(tangents, node.inputs, strict=True)]
        return g.apply(self, ts)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        n = batch_size(g, ins, bdims)
        xs = [
            front(g, x, b) if b is not None else g.expand(x, [n, *g.shape(x).dims])
            for x, b in zip(ins, bdims, strict=True)
        ]
        return g.apply(Concat(self.axis % node.shape.rank + 1), xs), 0


@register
class Expand(Op):
    """Broadcast to ``dims`` (``np.broadcast_to``): dims are aligned at the end and each
    input dim must be 1 or equal to its target; new leading dims may be added."""

    mnemonic: ClassVar[str] = "expand"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    dims: tuple[Dim, ...]

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        dims = self.dims
        expect(
            all(valid_dim(d) for d in dims),
            self,
            f"dims must be ints >= 0 or symbolic dims, got {dims_txt(dims)}",
        )
        expect(
            len(dims) >= x.rank,
            self,
            f"cannot broadcast {x} to {dims_txt(dims)}: target rank {len(dims)} is below "
            f"the input rank {x.rank}",
        )
        lead = len(dims) - x.rank
        for i, d in enumerate(x.dims):
            expect(
                d == 1 or d == dims[lead + i],
                self,
                f"cannot broadcast {x} to {dims_txt(dims)}: input dim {i} is {d}, expected "
                f"1 or {dims[lead + i]}",
            )
        return Shape(dims, x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return np.broadcast_to(xs[0], ctx.out_dims)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return (unbroadcast(g, ct, node.inputs[0]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        return same_op(g, self, tangents)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        n, x = batch_size(g, ins, bdims), front(g, ins[0], bdims[0])
        lead = len(self.dims) - g.shape(x).rank + 1
        x = g.reshape(x, [n, *(1,) * lead, *g.shape(x).dims[1:]]) if lead else x
        return g.apply(Expand((n, *self.dims)), [x]), 0

    def attrs_str(self) -> str:
        return f"dims={dims_txt(self.dims)}"


@register
class Narrow(Op):
    """``length`` elements of ``axis`` starting at ``start`` (``torch.narrow``). On a
    symbolic axis the bounds are checked when the graph runs."""

    mnemonic: ClassVar[str] = "narrow"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    axis: int
    start: int
    length: int

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        ax = norm_axis(self, x, self.axis)
        expect(
            self.start >= 0 and self.length >= 0,
            self,
            f"start and length must be >= 0, got start={self.start}, length={self.length}",
        )
        n = x.dims[ax]
        if isinstance(n, int):
            expect(
                self.start + self.length <= n,
                self,
                f"start {self.start} + length {self.length} exceeds the size {n} of axis "
                f"{ax} of {x}",
            )
        return Shape(x.dims[:ax] + (self.length,) + x.dims[ax + 1 :], x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = xs[0]
        ax = self.axis % x.ndim
        if self.start + self.length > x.shape[ax]:
            raise InputError(
                f"narrow: start {self.start} + length {self.length} exceeds the size "
                f"{x.shape[ax]} of axis {ax}"
            )
        key = (slice(None),) * ax + (slice(self.start, self.start + self.length),)
        return x[key]

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        n = g.shape(node.inputs[0]).dims[self.axis]
        pos = range(self.start, self.start + self.length)
        return (embed(g, ct, self.axis, n, pos),)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        return same_op(g, self, tangents)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        op = Narrow(self.axis % node.shape.rank + 1, self.start, self.length)
        return g.apply(op, [front(g, ins[0], bdims[0])]), 0


@register
class Slice(Op):
    """Python/NumPy basic slicing, one ``(start, stop, step)`` per axis (``None`` start or
    stop as in Python; negative values count from the end; step != 0)."""

    mnemonic: ClassVar[str] = "slice"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    starts: tuple[int | None, ...]
    stops: tuple[int | None, ...]
    steps: tuple[int, ...]

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        r = x.rank
        for name, t in (("starts", self.starts), ("stops", self.stops), ("steps", self.steps)):
            expect(len(t) == r, self, f"{name} {t} must have one entry per axis of {x} ({r})")
        for i, c in enumerate(self.steps):
            expect(
                isinstance(c, int) and c != 0,
                self,
                f"step {c!r} on axis {i} must be a non-zero int",
            )
        dims = tuple(
            slice_len(self, x, i, a, b, c)
            for i, (a, b, c) in enumerate(zip(self.starts, self.stops, self.steps))
        )
        return Shape(dims, x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        key = tuple(slice(a, b, c) for a, b, c in zip(self.starts, self.stops, self.steps))
        out = xs[0][key]
        if tuple(out.shape) != ctx.out_dims:
            raise InputError(
                f"slice: input of shape {xs[0].shape} gives {out.shape}, but the graph "
                f"expects {ctx.out_dims} (a static stop lies beyond a symbolic dim)"
            )
        return out

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        x = g.shape(node.inputs[0])
        for i, (a, b, c) in enumerate(zip(self.starts, self.stops, self.steps)):
            d = x.dims[i]
            if isinstance(d, int):
                pos = range(*slice(a, b, c).indices(d))
            elif c == 1 and a in (None, 0) and b is None:
                continue  # a symbolic axis kept whole
            else:  # infer allows only static start/stop >= 0 and step > 0 here
                pos = range(a or 0, a + node.shape.dims[i] * c, c)  # type: ignore[operator]
            ct = embed(g, ct, i, d, pos)
        return (ct,)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        return same_op(g, self, tangents)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        op = Slice((0, *self.starts), (None, *self.stops), (1, *self.steps))
        return g.apply(op, [front(g, ins[0], bdims[0])]), 0


@register
class Gather(Op):
    """``jnp.take(x, idx, axis)``: the output replaces ``axis`` of ``x`` by the dims of the
    integer tensor ``idx``. Indices must lie in ``[-n, n)`` (negative count from the end);
    others are an InputError when the graph runs."""

    mnemonic: ClassVar[str] = "gather"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    axis: int = 0

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, idx = ins
        ax = norm_axis(self, x, self.axis)
        expect(idx.dtype.is_int, self, f"indices must be an integer tensor, got {idx}")
        return Shape(x.dims[:ax] + idx.dims + x.dims[ax + 1 :], x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, idx = xs
        ax = self.axis % x.ndim
        return np.take(x, check_index_range(self, idx, x.shape[ax], ax), axis=ax)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        x, idx = node.inputs
        dims = g.shape(x).dims
        return (g.gather_backward(ct, idx, self.axis % len(dims), dims), None)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        t = tangents[0]
        return None if t is None else g.apply(self, [t, node.inputs[1]])

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        (x, idx), (bx, bi) = ins, bdims
        ax = self.axis % g.shape(x).rank
        if bi is None:
            return g.apply(Gather(ax + 1 if bx is not None else ax), [front(g, x, bx), idx]), 0
        idx = front(g, idx, bi)
        if bx is None:
            return g.apply(self, [x, idx]), ax
        x, idx = fold_batch(g, front(g, x, bx), idx, ax)
        return g.apply(self, [x, idx]), ax


@register
class ScatterAdd(Op):
    """Inputs ``(x, idx[m], updates)``: a copy of ``x`` with ``updates`` added at ``idx``
    along ``axis`` (``torch.index_add``; repeated indices accumulate). ``updates`` has
    ``x``'s dims with ``axis`` replaced by m. Indices must lie in ``[-n, n)``."""

    mnemonic: ClassVar[str] = "scatter_add"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    axis: int = 0

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, idx, upd = ins
        ax = norm_axis(self, x, self.axis)
        expect(
            idx.dtype.is_int and idx.rank == 1,
            self,
            f"indices must be a 1-D integer tensor, got {idx}",
        )
        expect(
            upd.dtype is x.dtype,
            self,
            f"updates dtype {upd.dtype} differs from the input's {x.dtype} (cast one first)",
        )
        want = x.dims[:ax] + idx.dims + x.dims[ax + 1 :]
        expect(
            upd.dims == want,
            self,
            f"updates must have dims {dims_txt(want)} (input {x} with axis {ax} sized like "
            f"indices {idx}), got {upd}",
        )
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, idx, upd = xs
        ax = self.axis % x.ndim
        out = np.array(_wide(x), copy=True)
        i64 = check_index_range(self, idx, x.shape[ax], ax)
        np.add.at(out, (slice(None),) * ax + (i64,), _wide(upd))
        return out

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return (ct, None, g.gather(ct, node.inputs[1], self.axis))

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        x, idx, upd = node.inputs
        tx, _, tu = tangents
        return g.apply(self, [zeros_or(g, tx, x), idx, zeros_or(g, tu, upd)])

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        n, ax = batch_size(g, ins, bdims), self.axis % node.shape.rank
        x, idx, upd = (
            front(g, v, b) if b is not None or k == 1 else g.expand(v, [n, *g.shape(v).dims])
            for k, (v, b) in enumerate(zip(ins, bdims, strict=True))
        )
        if bdims[1] is None:
            return g.apply(ScatterAdd(ax + 1), [x, idx, upd]), 0
        # batched indices: fold the batch into the axis (x and updates), offset the indices
        dims = g.shape(x).dims
        x, idx = fold_batch(g, x, idx, ax)
        u = moveaxis(g, upd, 0, ax)
        ud = g.shape(u).dims
        u = g.reshape(u, [*ud[:ax], ud[ax] * ud[ax + 1], *ud[ax + 2 :]])
        out = g.apply(self, [x, g.reshape(idx, [-1]), u])
        return g.reshape(out, [*dims[1 : ax + 1], n, dims[ax + 1], *dims[ax + 2 :]]), ax


@register
class Pad(Op):
    """Constant padding: ``pads[i] = (before, after)`` elements of ``value`` around axis
    ``i`` (both >= 0; one pair per axis). A symbolic axis can only get (0, 0).

    An integer or bool input needs a ``value`` its dtype holds exactly (integral and in
    range; 0 or 1 for bool), else the shape rule raises DTypeError when the node is built:
    300 into i8 is an error, never a wrapped 44. Float inputs take ``value`` as a cast
    would (NaN and +-inf included)."""

    mnemonic: ClassVar[str] = "pad"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    pads: tuple[tuple[int, int], ...]
    value: float = 0.0

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        expect(
            len(self.pads) == x.rank and all(len(p) == 2 and min(p) >= 0 for p in self.pads),
            self,
            f"pads must be one (before, after) pair of ints >= 0 per axis of {x} "
            f"({x.rank} pairs), got {self.pads}",
        )
        why = pad_value_misfit(self.value, x.dtype)
        if why is not None:
            raise DTypeError(f"pad: pad value {self.value!r} is not representable in {x}: {why}")
        dims: list[Dim] = []
        for i, (d, (lo, hi)) in enumerate(zip(x.dims, self.pads)):
            if isinstance(d, int):
                dims.append(d + lo + hi)
            else:
                expect(
                    lo + hi == 0,
                    self,
                    f"axis {i} of {x} is symbolic ({d}): padding it by {(lo, hi)} needs a "
                    "static dim",
                )
                dims.append(d)
        return Shape(dims, x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = _wide(xs[0])
        fill = self.value if x.dtype.kind in "fc" else int(self.value)
        return np.pad(x, self.pads, mode="constant", constant_values=fill)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        dims = g.shape(node.inputs[0]).dims
        stops = tuple(lo + d if isinstance(d, int) else None for (lo, _), d in zip(self.pads, dims))
        op = Slice(tuple(lo for lo, _ in self.pads), stops, (1,) * len(dims))
        return (g.apply(op, [ct]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        return same_op(g, Pad(self.pads, 0.0), tangents)

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        return g.apply(Pad(((0, 0), *self.pads), self.value), [front(g, ins[0], bdims[0])]), 0


@register
class ShapeOf(Op):
    """The dims of the input as an i64 vector ``[rank]`` (ONNX ``Shape``): symbolic dims
    become their values when the graph runs, so imported shape arithmetic can use them."""

    mnemonic: ClassVar[str] = "shape_of"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    nondiff: ClassVar[str] = "integer output (the input's dims)"

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return Shape((ins[0].rank,), DType.I64)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return np.asarray(xs[0].shape, dtype=np.int64)


# the graph builders (g.reshape, g.slice, g.squeeze...) register with their module
from rlx.ops import movement_builders as _builders  # noqa: E402,F401

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId
