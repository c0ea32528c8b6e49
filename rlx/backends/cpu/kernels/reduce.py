"""CPU kernels of the reductions (``rlx/ops/reduce.py``): reduce, cumsum, argmax / argmin,
softmax / log-softmax, top-k. In: a node and NumPy views of its arena slots. Out: a
closure writing the output view with NumPy calls taking ``out=`` (temporaries in
build-time scratch); f16/bf16 go through f32 (``lowp``).

Softmax and log-softmax over the last axis try the native row kernel first
(``engines.rows``). Complex sums / products / means, bool max / min and complex cumsums
(inclusive or exclusive) are the dtype corners the float/integer kernels decline: each
has its own attempt, tried first; exclusive cumsums have theirs before the inclusive one.
Nodes no attempt takes (complex max, an exclusive cumsum of bools) keep the reference
kernel.

Top-k. The reference's order (best first, ties by lower index, NaN largest) is a sort by the
pair (value, index). For inputs of 32 bits or fewer the pair fits one int64 key: the
value's bits mapped to an order-preserving int32 (``-0.0`` as ``+0.0``, every NaN as the
positive quiet NaN; complemented for ``largest``) in the high half, the index in the low
half. Each run fills a key scratch (transformed axis last), partitions it in place so the
``k`` smallest keys come first, sorts those ``k`` in place, and decodes the low halves
into indices; values are gathered from the input by flat index (``np.take`` with
``out=``). Nothing is allocated per run. 64-bit inputs (f64, i64, u64) cannot pack a key
and take ``np.argsort`` (stable) of a widened scratch instead, which allocates its index
array (NumPy has no ``out=`` for it): the report notes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.codegen.rows import RowKind
from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind, lowp
from rlx.backends.cpu.engines.rows import softmax_factory
from rlx.ops.reduce import (
    ArgMax,
    ArgMin,
    Cumsum,
    LogSoftmax,
    Reduce,
    ReduceKind,
    Softmax,
    TopK,
)

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "reduce_kernel",
    "corner_reduce_kernel",
    "cumsum_kernel",
    "exclusive_cumsum_kernel",
    "complex_cumsum_kernel",
    "cumsum_into",
    "argmax_kernel",
    "argmin_kernel",
    "softmax_into",
    "native_softmax_kernel",
    "softmax_kernel",
    "native_log_softmax_kernel",
    "log_softmax_kernel",
    "topk_kernel",
]


def _kept(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


@lowp
def reduce_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """sum/mean/max/min/prod with ``out=``; integer sums and products wrap in the input
    dtype and empty max/min give the identity, as the reference."""
    (x,) = ins
    if x.dtype.kind not in "fiu":
        return None
    op = node.op
    axes = tuple(a % x.ndim for a in op.axes) if x.ndim else ()  # type: ignore[attr-defined]
    kd: bool = op.keepdims  # type: ignore[attr-defined]
    fn: ReduceKind = op.fn  # type: ignore[attr-defined]
    acc = x.dtype if x.dtype.kind in "iu" else None
    if fn is ReduceKind.SUM:
        return lambda: np.sum(x, axis=axes, keepdims=kd, dtype=acc, out=out)  # type: ignore[return-value]
    if fn is ReduceKind.PROD:
        return lambda: np.prod(x, axis=axes, keepdims=kd, dtype=acc, out=out)  # type: ignore[return-value]
    if fn is ReduceKind.MEAN:
        return lambda: np.mean(x, axis=axes, keepdims=kd, out=out)  # type: ignore[return-value]
    if x.dtype.kind == "f":
        init = -np.inf if fn is ReduceKind.MAX else np.inf
    else:
        info = np.iinfo(x.dtype)
        init = info.min if fn is ReduceKind.MAX else info.max
    uf = np.maximum if fn is ReduceKind.MAX else np.minimum
    return lambda: uf.reduce(x, axis=axes, keepdims=kd, out=out, initial=init)  # type: ignore[return-value]


@lowp
def cumsum_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``np.cumsum(out=)``; ``reverse`` runs on flipped views of input and output.
    Exclusive sums keep the reference kernel."""
    (x,) = ins
    op = node.op
    if op.exclusive or x.dtype.kind not in "fiu" or x.ndim == 0:  # type: ignore[attr-defined]
        return None
    ax = op.axis % x.ndim  # type: ignore[attr-defined]
    acc = x.dtype if x.dtype.kind in "iu" else None
    src, dst = (np.flip(x, ax), np.flip(out, ax)) if op.reverse else (x, out)  # type: ignore[attr-defined]
    return lambda: np.cumsum(src, axis=ax, dtype=acc, out=dst)  # type: ignore[return-value]


def _arg_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, fn: object) -> Kernel | None:
    (x,) = ins
    if x.dtype.kind not in "fiub" or out.dtype != np.intp or x.shape[node.op.axis % x.ndim] == 0:  # type: ignore[attr-defined]
        return None
    ax = node.op.axis % x.ndim  # type: ignore[attr-defined]
    kd = node.op.keepdims  # type: ignore[attr-defined]
    return lambda: fn(x, axis=ax, out=out, keepdims=kd)  # type: ignore[operator, return-value]


@lowp
def argmax_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``np.argmax(out=)`` into the I64 output (first index on ties and NaN, as NumPy)."""
    return _arg_kernel(node, ins, out, np.argmax)


@lowp
def argmin_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``np.argmin(out=)`` into the I64 output."""
    return _arg_kernel(node, ins, out, np.argmin)


def softmax_into(
    x: np.ndarray, out: np.ndarray, axis: int, ctx: KernelCtx, log: bool = False
) -> Kernel:
    """Stable (log-)softmax of ``x`` along ``axis`` into ``out`` (scratch: the max/sum
    row and one full-size temporary). An empty ``x`` (a 0-size axis) has nothing to
    compute: NumPy's max of an empty axis would raise."""
    if x.size == 0:
        return lambda: None
    ax = axis % x.ndim
    m = ctx.scratch(_kept(x.shape, (ax,)), x.dtype, 30)
    t = ctx.scratch(x.shape, x.dtype, 31)
    if not log:

        def softmax() -> None:
            np.max(x, axis=ax, keepdims=True, out=m)
            np.subtract(x, m, out=t)
            np.exp(t, out=t)
            np.sum(t, axis=ax, keepdims=True, out=m)
            np.divide(t, m, out=out)

        return softmax
    e = ctx.scratch(x.shape, x.dtype, 32)

    def log_softmax() -> None:
        np.max(x, axis=ax, keepdims=True, out=m)
        np.subtract(x, m, out=t)
        np.exp(t, out=e)
        np.sum(e, axis=ax, keepdims=True, out=m)
        np.log(m, out=m)
        np.subtract(t, m, out=out)

    return log_softmax


@lowp
def softmax_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``exp(x - max) / sum`` along the axis, into ``out``."""
    if ins[0].ndim == 0 or ins[0].dtype.kind != "f":
        return None
    return softmax_into(ins[0], out, node.op.axis, ctx)  # type: ignore[attr-defined]


@lowp
def log_softmax_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``s - log(sum(exp(s)))`` with ``s = x - max`` along the axis."""
    if ins[0].ndim == 0 or ins[0].dtype.kind != "f":
        return None
    return softmax_into(ins[0], out, node.op.axis, ctx, log=True)  # type: ignore[attr-defined]


native_softmax_kernel = kind(KernelKind.NATIVE)(softmax_factory(RowKind.SOFTMAX))
native_log_softmax_kernel = kind(KernelKind.NATIVE)(softmax_factory(RowKind.LOG_SOFTMAX))


# ---- dtype corners: complex and bool reductions, complex and exclusive cumsums ----------


def corner_reduce_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Complex sum / prod / mean and bool max / min (``any`` / ``all`` with the identity
    for empty axes) with ``out=``; other nodes are ``reduce_kernel``'s."""
    (x,) = ins
    if x.dtype.kind not in "cb":
        return None
    op: Reduce = node.op  # type: ignore[assignment]
    axes = tuple(a % x.ndim for a in op.axes) if x.ndim else ()
    kd = op.keepdims
    fn = op.fn
    if x.dtype.kind == "b":
        if fn not in (ReduceKind.MAX, ReduceKind.MIN):
            return None
        uf = np.logical_or if fn is ReduceKind.MAX else np.logical_and
        init = fn is ReduceKind.MIN
        return lambda: uf.reduce(x, axis=axes, keepdims=kd, out=out, initial=init)  # type: ignore[return-value]
    if fn is ReduceKind.SUM:
        return lambda: np.sum(x, axis=axes, keepdims=kd, out=out)  # type: ignore[return-value]
    if fn is ReduceKind.PROD:
        return lambda: np.prod(x, axis=axes, keepdims=kd, out=out)  # type: ignore[return-value]
    if fn is ReduceKind.MEAN:
        return lambda: np.mean(x, axis=axes, keepdims=kd, out=out)  # type: ignore[return-value]
    return None


def complex_cumsum_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Complex (inclusive or exclusive, optionally reverse) cumsums: ``np.cumsum(out=)``
    over flipped views for ``reverse``, a zero first for ``exclusive``; through a scratch
    when ``out`` shares the input's bytes. Other nodes are the integer/float kernels'."""
    (x,) = ins
    if x.dtype.kind != "c" or x.ndim == 0:
        return None
    return cumsum_into(x, out, node.op, ctx, 701)  # type: ignore[arg-type]


@lowp
def exclusive_cumsum_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Exclusive (optionally reverse) cumsum: a zero, then ``np.cumsum(out=)`` of all but
    the last element into the rest of ``out`` (flipped views for ``reverse``). Inclusive
    sums are ``cumsum_kernel``'s."""
    (x,) = ins
    op: Cumsum = node.op  # type: ignore[assignment]
    if not op.exclusive:
        return None
    if x.dtype.kind not in "fiu" or x.ndim == 0:
        return None
    return cumsum_into(x, out, op, ctx, 70)


def cumsum_into(x: np.ndarray, out: np.ndarray, op: Cumsum, ctx: KernelCtx, tag: int) -> Kernel:
    """``op``'s cumsum of ``x`` (rank >= 1) into ``out``: ``np.cumsum(out=)`` over flipped
    views for ``reverse``, a zero first and all but the last element for ``exclusive``
    (integers accumulate in their own dtype, wrapping); through a scratch (``tag``) when
    ``out`` shares ``x``'s bytes."""
    ax = op.axis % x.ndim
    acc = x.dtype if x.dtype.kind in "iu" else None
    tmp = ctx.scratch(out.shape, out.dtype, tag) if np.may_share_memory(x, out) else None
    target = out if tmp is None else tmp
    src, dst = (np.flip(x, ax), np.flip(target, ax)) if op.reverse else (x, target)
    n = x.shape[ax]
    lead = (slice(None),) * ax
    if op.exclusive:
        head = dst[(*lead, slice(0, 1))]
        rest = dst[(*lead, slice(1, n))]
        body = src[(*lead, slice(0, max(n - 1, 0)))]
    else:
        head, rest, body = None, dst, src

    def run() -> None:
        if head is not None:
            head.fill(0)
        with np.errstate(all="ignore"):
            np.cumsum(body, axis=ax, dtype=acc, out=rest)
        if tmp is not None:
            np.copyto(out, tmp)

    return run


# ---- top-k --------------------------------------------------------------------------------


_LOW = np.int64(0xFFFFFFFF)


def _flat_base(shape: tuple[int, ...], ax: int) -> tuple[np.ndarray, int]:
    """For a C-contiguous array of ``shape``: the flat offset of element 0 along ``ax``
    for every other position (dims in moved-axis-last order, ``ax`` as size 1) and the
    stride of ``ax`` in elements."""
    strides = np.cumprod((1, *shape[::-1]))[:-1][::-1]
    grids = np.indices(shape[:ax] + shape[ax + 1 :], sparse=True) if len(shape) > 1 else ()
    base = np.zeros(shape[:ax] + shape[ax + 1 :], np.int64)
    others = [s for i, s in enumerate(strides) if i != ax]
    for gi, st in zip(grids, others, strict=True):
        base += gi * np.int64(st)
    return base[..., None], int(strides[ax])


def topk_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Packed-key partial sort (<= 32-bit inputs) or a stable argsort (64-bit inputs)."""
    (x,) = ins
    op: TopK = node.op  # type: ignore[assignment]
    ax = op.axis % x.ndim
    n, k = x.shape[ax], op.k
    if k == 0 or x.size == 0:
        return lambda: None
    if not (x.flags.c_contiguous and out.flags.c_contiguous):
        return None
    dt = x.dtype
    src = np.moveaxis(x, ax, -1)
    lead = src.shape[:-1]
    dst = np.moveaxis(out, ax, -1)
    base, stride = _flat_base(x.shape, ax)
    flat_x = x.reshape(-1)
    idx = ctx.scratch((*lead, k), np.int64, 300)
    flat = ctx.scratch((*lead, k), np.int64, 301)
    want_idx = op.indices

    def emit() -> None:
        if want_idx:
            np.copyto(dst, idx)
        else:
            np.multiply(idx, stride, out=flat)
            np.add(flat, base, out=flat)
            np.take(flat_x, flat, out=dst, mode="wrap")

    if dt.itemsize > 4 or dt.kind == "c":
        return _argsort_path(op, src, lead, n, k, idx, emit, ctx)
    keys = ctx.scratch((*lead, n), np.int64, 302)
    head = keys[..., :k]
    fill = _key_filler(dt, src, (*lead, n), op.largest, ctx)
    pos = np.broadcast_to(np.arange(n, dtype=np.int64), (*lead, n)).copy()
    full = k == n

    def run() -> None:
        fill(keys)
        np.left_shift(keys, 32, out=keys)
        np.bitwise_or(keys, pos, out=keys)
        if not full:
            keys.partition(k - 1, axis=-1)
        head.sort(axis=-1)
        np.bitwise_and(head, _LOW, out=idx)
        emit()

    return run


def _key_filler(
    dt: np.dtype, src: np.ndarray, dims: tuple[int, ...], largest: bool, ctx: KernelCtx
) -> Kernel:
    """A step writing the order-preserving value of each element (as int64, < 2**31 in
    magnitude; complemented for ``largest``) into the key array it is given."""
    if dt.kind == "f" or dt.kind == "V" or dt.name == "bfloat16" or dt.name.startswith("float8"):
        f = ctx.scratch(dims, np.float32, 303)
        nan = ctx.scratch(dims, np.bool_, 304)
        bits = f.view(np.int32)
        sign = ctx.scratch(dims, np.int32, 305)

        def fill_float(keys: np.ndarray) -> None:
            np.copyto(f, src, casting="unsafe")
            np.add(f, np.float32(0), out=f)  # -0.0 -> +0.0
            np.isnan(f, out=nan)
            np.copyto(f, np.float32(np.nan), where=nan)  # every NaN the same, positive
            np.right_shift(bits, 31, out=sign)
            np.bitwise_and(sign, np.int32(0x7FFFFFFF), out=sign)
            np.bitwise_xor(bits, sign, out=sign)  # order-preserving int32
            if largest:
                np.invert(sign, out=sign)
            np.copyto(keys, sign)

        return fill_float
    offset = np.int64(2**31) if dt == np.uint32 else np.int64(0)

    def fill_int(keys: np.ndarray) -> None:
        np.copyto(keys, src, casting="unsafe")
        if offset:
            np.subtract(keys, offset, out=keys)
        if largest:
            np.invert(keys, out=keys)

    return fill_int


def _argsort_path(
    op: TopK,
    src: np.ndarray,
    lead: tuple[int, ...],
    n: int,
    k: int,
    idx: np.ndarray,
    emit: Kernel,
    ctx: KernelCtx,
) -> Kernel:
    """64-bit inputs: a stable argsort of the (reversed, for ``largest``) values, as the
    reference; its index array is NumPy's allocation."""
    ctx.notes.append("np.argsort allocates its index array (64-bit input: no packed key)")
    key = ctx.scratch((*lead, n), src.dtype, 306)
    rev = key[..., ::-1]
    largest = op.largest

    def run() -> None:
        if largest:
            np.copyto(rev, src)
            order = np.argsort(key, axis=-1, kind="stable")
            np.subtract(n - 1, order[..., ::-1][..., :k], out=idx)
        else:
            np.copyto(key, src)
            order = np.argsort(key, axis=-1, kind="stable")
            np.copyto(idx, order[..., :k])
        emit()

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Reduce: (corner_reduce_kernel, reduce_kernel),
    Cumsum: (complex_cumsum_kernel, exclusive_cumsum_kernel, cumsum_kernel),
    ArgMax: (argmax_kernel,),
    ArgMin: (argmin_kernel,),
    Softmax: (native_softmax_kernel, softmax_kernel),
    LogSoftmax: (native_log_softmax_kernel, log_softmax_kernel),
    TopK: (topk_kernel,),
}
