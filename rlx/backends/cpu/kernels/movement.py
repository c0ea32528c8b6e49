"""CPU kernels of data movement (``rlx/ops/movement.py``): transpose, expand, shape_of,
narrow, slice, concat, gather, pad, scatter_add. In: a node and NumPy views of its arena
slots. Out: a closure writing the output view with NumPy copies (``out=``, ``np.take``,
``np.add.at``); no allocation per run. (``reshape`` is a view: it has no kernel.) Nodes a
kernel has no fast path for (out-of-range bounds found when the schedule is built) keep
the reference kernel; an out-of-range index found at run time re-runs the reference,
which raises the InputError naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, lowp
from rlx.ops.movement import (
    Concat,
    Expand,
    Gather,
    Narrow,
    Pad,
    ScatterAdd,
    ShapeOf,
    Slice,
    Transpose,
)

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "transpose_kernel",
    "expand_kernel",
    "shape_of_kernel",
    "narrow_kernel",
    "slice_kernel",
    "concat_kernel",
    "gather_kernel",
    "pad_kernel",
    "scatter_add_kernel",
]


def _copy_from(src: np.ndarray, out: np.ndarray) -> Kernel:
    return lambda: np.copyto(out, src)  # type: ignore[return-value]


def transpose_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """A strided copy of the permuted view of the input."""
    return _copy_from(ins[0].transpose(node.op.perm), out)  # type: ignore[attr-defined]


def expand_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """A broadcasting copy into the output."""
    return _copy_from(ins[0], out)


def shape_of_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """Writes the input view's dims (fixed for the schedule of one binding)."""
    return _copy_from(np.asarray(ins[0].shape, dtype=np.int64), out)


def narrow_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """A copy of the narrowed view (out-of-range bounds keep the reference's error)."""
    x = ins[0]
    op = node.op
    ax = op.axis % x.ndim  # type: ignore[attr-defined]
    if op.start + op.length > x.shape[ax]:  # type: ignore[attr-defined]
        return None
    key = (slice(None),) * ax + (slice(op.start, op.start + op.length),)  # type: ignore[attr-defined]
    return _copy_from(x[key], out)


def slice_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """A copy of the basic-slicing view (a size mismatch keeps the reference's error)."""
    op = node.op
    key = tuple(slice(a, b, c) for a, b, c in zip(op.starts, op.stops, op.steps, strict=True))  # type: ignore[attr-defined]
    src = ins[0][key]
    if src.shape != out.shape:
        return None
    return _copy_from(src, out)


def concat_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """One copy per input into its slice of the output."""
    ax = node.op.axis % out.ndim  # type: ignore[attr-defined]
    pairs = []
    start = 0
    for x in ins:
        n = x.shape[ax]
        key = (slice(None),) * ax + (slice(start, start + n),)
        pairs.append((out[key], x))
        start += n

    def run() -> None:
        for dst, src in pairs:
            np.copyto(dst, src)

    return run


def gather_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``np.take(x, idx, axis, out=out)``; an out-of-range index re-runs the reference,
    which raises the InputError naming it."""
    x, idx = ins
    if idx.dtype.kind not in "iu":
        return None
    ax = node.op.axis % x.ndim  # type: ignore[attr-defined]
    op = node.op
    rctx = ctx.ref_ctx(out)

    def run() -> None:
        try:
            np.take(x, idx, axis=ax, out=out)
        except IndexError:
            op.reference([x, idx], rctx)
            raise

    return run


def pad_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """Fill the output with the pad value, then copy the input into its interior (the
    output slot is shared over time, so the border is rewritten every run)."""
    (x,) = ins
    op = node.op
    fill = op.value if x.dtype.kind in "fcV" else int(op.value)  # type: ignore[attr-defined]
    with np.errstate(over="ignore"):  # a float beyond the dtype becomes +-inf, as a cast
        wide = np.asarray(fill, dtype=np.float64 if x.dtype.kind != "c" else np.complex128)
        value = wide.astype(out.dtype)
    key = tuple(slice(lo, lo + n) for n, (lo, _) in zip(x.shape, op.pads, strict=True))  # type: ignore[attr-defined]
    inner = out[key]

    def run() -> None:
        np.copyto(out, value)
        np.copyto(inner, x)

    return run


@lowp
def scatter_add_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``out[...] = x`` then ``np.add.at(out, idx, updates)`` along the axis. The planner
    never gives a non-elementwise node an input's slot, so ``out`` aliases no input (a
    node where it would keeps the reference kernel). An out-of-range index re-runs the
    reference, which raises the InputError naming it."""
    x, idx, upd = ins
    if x.dtype.kind not in "fiubc" or idx.dtype.kind not in "iu" or x.ndim == 0:
        return None
    if any(np.may_share_memory(out, a) for a in ins):
        return None
    op = node.op
    ax = op.axis % x.ndim  # type: ignore[attr-defined]
    where = (slice(None),) * ax + (idx,)
    rctx = ctx.ref_ctx(out)

    def run() -> None:
        np.copyto(out, x)
        try:
            np.add.at(out, where, upd)
        except IndexError:
            op.reference([x, idx, upd], rctx)
            raise

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Transpose: (transpose_kernel,),
    Expand: (expand_kernel,),
    ShapeOf: (shape_of_kernel,),
    Narrow: (narrow_kernel,),
    Slice: (slice_kernel,),
    Concat: (concat_kernel,),
    Gather: (gather_kernel,),
    Pad: (pad_kernel,),
    ScatterAdd: (scatter_add_kernel,),
}
