"""CPU kernel for ``TopK``. In: the node and its arena views. Out: a closure writing the
``k`` best values (or their I64 indices) into the output view.

The reference's order (best first, ties by lower index, NaN largest) is a sort by the
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

from rlx.backends.cpu.kernels import Kernel, KernelCtx, kernel
from rlx.ops.reduce import TopK

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["topk_kernel"]

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


@kernel(TopK)
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
