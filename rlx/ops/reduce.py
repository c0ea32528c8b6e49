"""Reductions: sum/mean/max/min/prod over axes, softmax, log-softmax, cumsum, top-k,
argmax/argmin.

Axes given to the builders may be negative; the builders store them normalised (and
sorted, for ``reduce``) so equal ops compare and hash equal. Ops built directly with
``g.apply`` also accept negative axes. f16/bf16 inputs are accumulated in f32 and the
result rounded back to the input dtype, as the CPU kernels do.

Derivative rules (``vjp`` / ``jvp``) are methods of the ops; Reduce's helpers and the
backward ops (SoftmaxBackward, LogSoftmaxBackward) are in ``reduce_grad.py``; the axis
ops share one vmap rule (``axis_batch.batch_axis``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx import source
from rlx.dtype import DType
from rlx.errors import InputError, ShapeError
from rlx.ops.axis_batch import batch_axis, shift_axis
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.elementwise import _wide
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = [
    "ReduceKind",
    "Reduce",
    "Softmax",
    "LogSoftmax",
    "Cumsum",
    "TopK",
    "ArgMax",
    "ArgMin",
    "norm_axis",
    "norm_axes",
    "running",
    "canon_axis",
    "canon_axes",
]


def norm_axis(op: Op | str, shape: Shape, axis: int) -> int:
    """``axis`` in ``[-rank, rank)`` made non-negative; ShapeError naming ``op`` otherwise."""
    r = shape.rank
    expect(
        isinstance(axis, int) and -r <= axis < r,
        op,
        f"axis {axis} out of range for rank-{r} input {shape} (expected -{r} <= axis < {r})",
    )
    return axis % r


def norm_axes(op: Op | str, shape: Shape, axes: Sequence[int]) -> tuple[int, ...]:
    """Normalised axes in the given order; ShapeError on out-of-range or repeated axes."""
    out = tuple(norm_axis(op, shape, a) for a in axes)
    expect(
        len(set(out)) == len(out),
        op,
        f"axes {tuple(axes)} repeat an axis of {shape} (normalised: {out})",
    )
    return out


def _require_float(op: Op, x: Shape, what: str = "input") -> None:
    expect(x.dtype.is_float, op, f"needs a float {what}, got {x}")


def _int_acc(x: np.ndarray) -> np.dtype | None:
    """Accumulator dtype for sums/products: the input's own for ints (wrapping like the
    kernels), None (NumPy's default) for floats."""
    return x.dtype if x.dtype.kind in "iu" else None


class ReduceKind(enum.Enum):
    """What :class:`Reduce` combines: SUM, MEAN, MAX, MIN or PROD."""

    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


def running(
    x: np.ndarray,
    axis: int,
    reverse: bool,
    exclusive: bool,
    identity: int,
    scan: Callable[[np.ndarray, int], np.ndarray],
) -> np.ndarray:
    """A running reduction (cumsum, cumprod) of ``x`` along ``axis``: ``scan(x, ax)`` over
    ``x`` flipped when ``reverse`` (and the result flipped back), shifted by one along the
    axis with ``identity`` coming in when ``exclusive``. Overflow wraps / gives inf quietly."""
    ax = axis % x.ndim
    if reverse:
        x = np.flip(x, ax)
    if exclusive:
        pads = [(0, 0)] * x.ndim
        pads[ax] = (1, 0)
        x = np.take(np.pad(x, pads, constant_values=identity), range(x.shape[ax]), axis=ax)
    with np.errstate(all="ignore"):
        out = scan(x, ax)
    return np.flip(out, ax) if reverse else out


def _extreme_initial(dt: np.dtype, kind: ReduceKind) -> object:
    """Identity of max/min for ``dt`` (so empty reductions give -inf/+inf like JAX)."""
    if dt.kind == "f":
        return -np.inf if kind is ReduceKind.MAX else np.inf
    if dt.kind == "b":
        return kind is ReduceKind.MIN
    info = np.iinfo(dt)
    return info.min if kind is ReduceKind.MAX else info.max


@register
class Reduce(Op):
    """``fn`` over ``axes`` of the input; the reduced axes are dropped, or kept as size 1
    with ``keepdims``. Sum/prod of integers wrap in the input dtype; mean needs floats;
    max/min of an empty axis give the identity (-inf/+inf, or the integer limits)."""

    mnemonic: ClassVar[str] = "reduce"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    fn: ReduceKind
    axes: tuple[int, ...]
    keepdims: bool = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        axes = norm_axes(self, x, self.axes)
        if self.fn is ReduceKind.MEAN:
            expect(
                x.dtype.is_float or x.dtype.is_complex,
                self,
                f"mean needs a float input, got {x} (cast it first)",
            )
        elif self.fn in (ReduceKind.MAX, ReduceKind.MIN):
            expect(not x.dtype.is_complex, self, f"{self.fn.value} of a complex tensor {x}")
        else:
            expect(
                not x.dtype.is_bool,
                self,
                f"{self.fn.value} of a bool tensor {x} (cast it to an integer dtype first)",
            )
        if self.keepdims:
            dims = tuple(1 if i in axes else d for i, d in enumerate(x.dims))
        else:
            dims = tuple(d for i, d in enumerate(x.dims) if i not in axes)
        return Shape(dims, x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = _wide(xs[0])
        axes = tuple(a % x.ndim for a in self.axes) if x.ndim else ()
        kd = self.keepdims
        with np.errstate(all="ignore"):
            if self.fn is ReduceKind.SUM:
                return np.sum(x, axis=axes, keepdims=kd, dtype=_int_acc(x))
            if self.fn is ReduceKind.PROD:
                return np.prod(x, axis=axes, keepdims=kd, dtype=_int_acc(x))
            if self.fn is ReduceKind.MEAN:
                return np.mean(x, axis=axes, keepdims=kd)
            init = _extreme_initial(x.dtype, self.fn)
            f = np.max if self.fn is ReduceKind.MAX else np.min
            return f(x, axis=axes, keepdims=kd, initial=init)

    # max / min: the gradient goes to every position holding the extremum, split evenly
    # among ties (as torch.amax); prod: zero-safe (products of the other elements)
    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops.reduce_grad import reduce_vjp

        return (reduce_vjp(g, self, node, ct),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.reduce_grad import reduce_jvp

        (t,) = tangents
        return None if t is None else reduce_jvp(g, self, node, t)

    def batch(
        self, g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
    ) -> tuple[NodeId, int | None]:
        (x,), (bd,) = ins, bdims
        if bd is None:
            return g.apply(self, [x]), None
        axes = tuple(shift_axis(a % (g.shape(x).rank - 1), bd) for a in self.axes)
        out = g.apply(dataclasses.replace(self, axes=tuple(sorted(axes))), [x])
        return out, bd if self.keepdims else bd - sum(a < bd for a in axes)

    def __str__(self) -> str:
        kd = ", keepdims=True" if self.keepdims else ""
        return f"reduce_{self.fn.value}[axes={self.axes}{kd}]"


def _softmax(x: np.ndarray, axis: int, log: bool = False) -> np.ndarray:
    """Stable (log-)softmax along ``axis``, PyTorch's semantics: a row holding a NaN or a
    +inf, or only -inf, is all NaN (``inf - inf``); a finite row never overflows (its max
    is subtracted first). An empty tensor (a 0-size axis) gives an empty result."""
    if x.size == 0:
        return x.copy()
    s = x - np.max(x, axis=axis, keepdims=True)
    if log:
        return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))
    e = np.exp(s)
    return e / np.sum(e, axis=axis, keepdims=True)


@register
class Softmax(Op):
    """``exp(x) / sum(exp(x))`` along ``axis``, computed stably (the max is subtracted
    first); float inputs only. Rows with a NaN or +inf, and rows of only -inf, give NaN
    (as PyTorch); a 0-size axis gives an empty result."""

    mnemonic: ClassVar[str] = "softmax"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    axis: int = -1

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        norm_axis(self, x, self.axis)
        _require_float(self, x)
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        with np.errstate(all="ignore"):
            return _softmax(_wide(xs[0]), self.axis)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops.reduce_grad import SoftmaxBackward

        return (g.apply(SoftmaxBackward(self.axis), [ct, node.id]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.reduce_grad import SoftmaxBackward

        (t,) = tangents  # the Jacobian diag(y) - y y^T is symmetric: J t = J^T t
        return None if t is None else g.apply(SoftmaxBackward(self.axis), [t, node.id])

    batch = batch_axis


@register
class LogSoftmax(Op):
    """``x - logsumexp(x)`` along ``axis``, computed stably; float inputs only. Non-finite
    rows and empty axes as :class:`Softmax`."""

    mnemonic: ClassVar[str] = "log_softmax"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    axis: int = -1

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        norm_axis(self, x, self.axis)
        _require_float(self, x)
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        with np.errstate(all="ignore"):
            return _softmax(_wide(xs[0]), self.axis, log=True)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops.reduce_grad import LogSoftmaxBackward

        return (g.apply(LogSoftmaxBackward(self.axis), [ct, node.id]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        (t,) = tangents  # J t = t - sum(softmax * t)
        if t is None:
            return None
        s = g.sum(g.mul(g.exp(node.id), t), self.axis, keepdims=True)
        return g.sub(t, s)

    batch = batch_axis


@register
class Cumsum(Op):
    """Running sum along ``axis``. ``reverse`` sums from the end; ``exclusive`` leaves
    each element out of its own sum (the first output is 0). Integers wrap."""

    mnemonic: ClassVar[str] = "cumsum"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    axis: int
    reverse: bool = False
    exclusive: bool = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        norm_axis(self, x, self.axis)
        expect(not x.dtype.is_bool, self, f"cumsum of a bool tensor {x} (cast it first)")
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return running(
            _wide(xs[0]),
            self.axis,
            self.reverse,
            self.exclusive,
            0,
            lambda x, ax: np.cumsum(x, axis=ax, dtype=_int_acc(x)),
        )

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        # y_j sums x_i over i <= j (i < j exclusive): x_i's cotangent sums ct_j over j >= i
        return (g.apply(dataclasses.replace(self, reverse=not self.reverse), [ct]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        (t,) = tangents
        return None if t is None else g.apply(self, [t])

    batch = batch_axis


@register
class TopK(Op):
    """The ``k`` largest (or smallest) elements along ``axis``, best first, ties broken by
    the lower index; NaN counts as the largest value. Returns the values, or their I64
    indices when ``indices`` is set (build both with ``g.topk``)."""

    mnemonic: ClassVar[str] = "topk"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    k: int
    axis: int = -1
    largest: bool = True
    indices: bool = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        ax = norm_axis(self, x, self.axis)
        expect(not x.dtype.is_complex, self, f"topk of a complex tensor {x}")
        expect(self.k >= 0, self, f"k must be >= 0, got {self.k}")
        n = x.dims[ax]
        if isinstance(n, int):
            expect(self.k <= n, self, f"k={self.k} exceeds the size {n} of axis {ax} of {x}")
        dims = x.dims[:ax] + (self.k,) + x.dims[ax + 1 :]
        return Shape(dims, DType.I64 if self.indices else x.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = xs[0]
        ax = self.axis % x.ndim
        n = x.shape[ax]
        if self.k > n:
            raise InputError(f"topk: k={self.k} exceeds the size {n} of axis {ax}")
        key = _wide(x)
        if self.largest:
            # stable ascending sort of the reversed axis, read backwards: descending,
            # equal values in increasing original index
            order = np.argsort(np.flip(key, ax), axis=ax, kind="stable")
            order = n - 1 - np.flip(order, ax)
        else:
            order = np.argsort(key, axis=ax, kind="stable")
        idx = np.take(order, range(self.k), axis=ax)
        if self.indices:
            return idx.astype(np.int64)
        return np.take_along_axis(x, idx, axis=ax)

    # the values' cotangent is scattered back to where they came from; indices: none
    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops.indexing import ScatterElements, ScatterReduction
        from rlx.ops.rules import zeros

        if self.indices:
            return (None,)
        (x,) = node.inputs
        ax = self.axis % g.shape(x).rank
        idx = g.apply(dataclasses.replace(self, indices=True), [x])
        scatter = ScatterElements(ax, ScatterReduction.ADD)
        return (g.apply(scatter, [zeros(g, x), idx, ct]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.indexing import GatherElements

        (t,) = tangents
        if t is None or self.indices:
            return None
        (x,) = node.inputs
        idx = g.apply(dataclasses.replace(self, indices=True), [x])
        return g.apply(GatherElements(self.axis % g.shape(x).rank), [t, idx])

    batch = batch_axis


def _arg_infer(op: ArgMax | ArgMin, x: Shape) -> Shape:
    ax = norm_axis(op, x, op.axis)
    expect(not x.dtype.is_complex, op, f"{op.mnemonic} of a complex tensor {x}")
    expect(x.dims[ax] != 0, op, f"{op.mnemonic} over the empty axis {ax} of {x}")
    if op.keepdims:
        dims = x.dims[:ax] + (1,) + x.dims[ax + 1 :]
    else:
        dims = x.dims[:ax] + x.dims[ax + 1 :]
    return Shape(dims, DType.I64)


def _arg_reference(op: ArgMax | ArgMin, x: np.ndarray) -> np.ndarray:
    ax = op.axis % x.ndim
    if x.shape[ax] == 0:
        raise InputError(f"{op.mnemonic} over the empty axis {ax} of an input of shape {x.shape}")
    f = np.argmax if isinstance(op, ArgMax) else np.argmin
    return f(_wide(x), axis=ax, keepdims=op.keepdims).astype(np.int64)


@register
class ArgMax(Op):
    """I64 index of the largest element along ``axis`` (the first one on ties, the first
    NaN if any)."""

    mnemonic: ClassVar[str] = "argmax"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    nondiff: ClassVar[str] = "argmax: integer index output"
    axis: int = -1
    keepdims: bool = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return _arg_infer(self, ins[0])

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return _arg_reference(self, xs[0])

    batch = batch_axis


@register
class ArgMin(Op):
    """I64 index of the smallest element along ``axis`` (the first one on ties, the first
    NaN if any)."""

    mnemonic: ClassVar[str] = "argmin"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    nondiff: ClassVar[str] = "argmin: integer index output"
    axis: int = -1
    keepdims: bool = False

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return _arg_infer(self, ins[0])

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return _arg_reference(self, xs[0])

    batch = batch_axis


# ---- builder conveniences ---------------------------------------------------------


def canon_axis(g: Graph, x: NodeId, axis: int) -> int:
    """``axis`` made non-negative for ``x``'s rank when in range; otherwise unchanged, so
    the op's shape rule reports it (with the user's line)."""
    r = g.node(x).shape.rank
    return axis % r if isinstance(axis, int) and -r <= axis < r else axis


def canon_axes(g: Graph, x: NodeId, axes: int | Sequence[int] | None) -> tuple[int, ...]:
    """Sorted non-negative axes (None: all of them); unchanged when any is out of range."""
    r = g.node(x).shape.rank
    if axes is None:
        return tuple(range(r))
    if isinstance(axes, int):
        axes = (axes,)
    axes = tuple(axes)
    if all(isinstance(a, int) and -r <= a < r for a in axes):
        return tuple(sorted(a % r for a in axes))
    return axes


@graph_method
def reduce(
    g: Graph,
    fn: ReduceKind | str,
    x: NodeId,
    axes: int | Sequence[int] | None = None,
    keepdims: bool = False,
) -> NodeId:
    """Reduce ``x`` with ``fn`` (a ReduceKind or its name) over ``axes`` (an int, a
    sequence, or None for all axes)."""
    if not isinstance(fn, ReduceKind):
        names = [k.value for k in ReduceKind]
        if fn not in names:
            raise ShapeError(
                f"reduce: fn must be a ReduceKind or one of {names}, got {fn!r}",
                loc=source.capture(),
            )
        fn = ReduceKind(fn)
    return g.apply(Reduce(fn, canon_axes(g, x, axes), bool(keepdims)), [x])


def _reducer(fn: ReduceKind) -> Callable[..., NodeId]:
    def build(
        g: Graph, x: NodeId, axes: int | Sequence[int] | None = None, keepdims: bool = False
    ) -> NodeId:
        return reduce(g, fn, x, axes, keepdims)

    build.__name__ = fn.value
    build.__doc__ = (
        f"``{fn.value}`` of ``x`` over ``axes`` (an int, a sequence, or None for all axes)."
    )
    return build


for _k in ReduceKind:
    graph_method(_reducer(_k))


@graph_method
def softmax(g: Graph, x: NodeId, axis: int = -1) -> NodeId:
    """Numerically stable softmax of ``x`` along ``axis``."""
    return g.apply(Softmax(canon_axis(g, x, axis)), [x])


@graph_method
def log_softmax(g: Graph, x: NodeId, axis: int = -1) -> NodeId:
    """Numerically stable log-softmax of ``x`` along ``axis``."""
    return g.apply(LogSoftmax(canon_axis(g, x, axis)), [x])


@graph_method
def cumsum(
    g: Graph, x: NodeId, axis: int = -1, reverse: bool = False, exclusive: bool = False
) -> NodeId:
    """Running sum of ``x`` along ``axis`` (optionally from the end, or exclusive)."""
    return g.apply(Cumsum(canon_axis(g, x, axis), bool(reverse), bool(exclusive)), [x])


@graph_method
def topk(
    g: Graph, x: NodeId, k: int, axis: int = -1, largest: bool = True
) -> tuple[NodeId, NodeId]:
    """The top ``k`` of ``x`` along ``axis``: returns ``(values_id, indices_id)``."""
    ax = canon_axis(g, x, axis)
    values = g.apply(TopK(int(k), ax, bool(largest), False), [x])
    indices = g.apply(TopK(int(k), ax, bool(largest), True), [x])
    return values, indices


@graph_method
def argmax(g: Graph, x: NodeId, axis: int = -1, keepdims: bool = False) -> NodeId:
    """I64 index of the maximum of ``x`` along ``axis``."""
    return g.apply(ArgMax(canon_axis(g, x, axis), bool(keepdims)), [x])


@graph_method
def argmin(g: Graph, x: NodeId, axis: int = -1, keepdims: bool = False) -> NodeId:
    """I64 index of the minimum of ``x`` along ``axis``."""
    return g.apply(ArgMin(canon_axis(g, x, axis), bool(keepdims)), [x])
