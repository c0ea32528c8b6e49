"""CPU kernels for ops that used to run their reference: group norm, scatter-add, fake
quantization, exclusive cumsums, integer division and integer powers. Each writes its output view with
NumPy calls taking ``out=`` (temporaries in build-time scratch); f16/bf16 go through f32
(``lowp``).

Cumsum and Binary already have factories (``kernels.tensor``, ``kernels.elementwise``)
that decline exclusive sums and integer division / power; the factories here supersede
them, handle only those cases and hand every other node back to them. (TopK's kernel is
in ``kernels.select``.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.kernels import Kernel, KernelCtx, kernel, lowp
from rlx.backends.cpu.kernels.elementwise import binary_kernel
from rlx.backends.cpu.kernels.quant import quantize_to_int64
from rlx.backends.cpu.kernels.tensor import cumsum_kernel
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.ops.movement import ScatterAdd
from rlx.ops.norm import GroupNorm
from rlx.ops.quant import FakeQuantize
from rlx.ops.reduce import Cumsum

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "group_norm_kernel",
    "scatter_add_kernel",
    "fake_quantize_kernel",
    "exclusive_cumsum_kernel",
    "cumsum_into",
    "int_div_kernel",
    "int_pow_kernel",
]


def _reshaped(a: np.ndarray, dims: tuple[int, ...]) -> np.ndarray | None:
    """A view of ``a`` with ``dims`` (None when that needs a copy: not an arena view)."""
    v = a.view()
    try:
        v.shape = dims
    except AttributeError:
        return None
    return v


@kernel(GroupNorm)
@lowp
def group_norm_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Group norm in the reference's order: per (sample, group) ``d = x - mean``,
    ``d / sqrt(mean(d*d) + eps)``, then ``* gamma + beta`` per channel."""
    x, gamma, beta = ins
    if x.dtype.kind != "f" or x.size == 0:
        return None
    g: int = node.op.num_groups  # type: ignore[attr-defined]
    n, c = x.shape[:2]
    per_group = x.size // (n * g)
    grouped = _reshaped(x, (n, g, per_group))
    if grouped is None:
        return None
    bshape = (1, c) + (1,) * (x.ndim - 2)
    gam, bet = gamma.reshape(bshape), beta.reshape(bshape)
    row = ctx.scratch((n, g, 1), x.dtype, 50)
    d = ctx.scratch((n, g, per_group), x.dtype, 51)
    sq = ctx.scratch((n, g, per_group), x.dtype, 52)
    y = d.reshape(x.shape)  # scratch is contiguous: a view
    e = x.dtype.type(node.op.eps)  # type: ignore[attr-defined]
    last = (-1,)

    def run() -> None:
        np.mean(grouped, axis=last, keepdims=True, out=row)
        np.subtract(grouped, row, out=d)
        np.multiply(d, d, out=sq)
        np.mean(sq, axis=last, keepdims=True, out=row)
        np.add(row, e, out=row)
        np.sqrt(row, out=row)
        np.divide(d, row, out=d)
        np.multiply(y, gam, out=y)
        np.add(y, bet, out=out)

    return run


@kernel(ScatterAdd)
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


@kernel(FakeQuantize)
def fake_quantize_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``(clip(rint(x / s) + z, qmin, qmax) - z) * s`` in f32 (f64 for f64 inputs): the
    float scratch holds x, the integer step runs in an int64 scratch (exact, as the
    reference); NaN maps to the zero point, +-inf saturate."""
    (x,) = ins
    op = node.op
    ct = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    ax = None if op.axis is None else op.axis % x.ndim  # type: ignore[attr-defined]
    cs: tuple[int, ...] = ()
    if ax is not None:
        cs = tuple(len(op.scales) if i == ax else 1 for i in range(x.ndim))  # type: ignore[attr-defined]
    s = np.asarray(op.scales, dtype=ct).reshape(cs)  # type: ignore[attr-defined]
    z = np.asarray(op.zero_points, dtype=np.int64).reshape(cs)  # type: ignore[attr-defined]
    t = ctx.scratch(x.shape, ct, 60)
    q = ctx.scratch(x.shape, np.int64, 61)
    nan = ctx.scratch(x.shape, np.bool_, 62)
    qmin, qmax = op.qmin, op.qmax  # type: ignore[attr-defined]
    direct = out.dtype == ct

    def run() -> None:
        np.copyto(t, x, casting="unsafe")
        quantize_to_int64(t, s, z, qmin, qmax, t, q, nan)
        np.subtract(q, z, out=q)
        np.copyto(t, q, casting="unsafe")
        if direct:
            np.multiply(t, s, out=out)
        else:
            np.multiply(t, s, out=t)
            np.copyto(out, t, casting="unsafe")

    return run


@kernel(Cumsum, supersedes=cumsum_kernel)
@lowp
def exclusive_cumsum_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Exclusive (optionally reverse) cumsum: a zero, then ``np.cumsum(out=)`` of all but
    the last element into the rest of ``out`` (flipped views for ``reverse``). Inclusive
    sums go to ``cumsum_kernel``."""
    (x,) = ins
    op: Cumsum = node.op  # type: ignore[assignment]
    if not op.exclusive:
        return cumsum_kernel(node, ins, out, ctx)
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


@kernel(Binary, supersedes=binary_kernel)
def int_div_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Integer division truncating toward zero (``x / 0 -> 0``), as the reference: floor
    division by a zero-free divisor, a step toward zero where the remainder is non-zero
    and the signs differ, zeros where the divisor is 0. All steps run in out-shaped
    scratch; ``out`` (which may be an input's slot) is written by the last call. Every
    other binary node goes to ``binary_kernel``."""
    a, b = ins
    fn = node.op.fn  # type: ignore[attr-defined]
    if fn is BinaryKind.POW and a.dtype.kind in "iu":
        return int_pow_kernel(node, ins, out, ctx)
    if fn is not BinaryKind.DIV or a.dtype.kind not in "iu":
        return binary_kernel(node, ins, out, ctx)
    if b.dtype != a.dtype or out.dtype != a.dtype:
        return None
    dims, dt = out.shape, out.dtype
    zero = ctx.scratch(dims, np.bool_, 80)
    m1 = ctx.scratch(dims, np.bool_, 81)
    m2 = ctx.scratch(dims, np.bool_, 82)
    safe = ctx.scratch(dims, dt, 83)
    q = ctx.scratch(dims, dt, 84)
    r = ctx.scratch(dims, dt, 85)
    signed = dt.kind == "i"

    def run() -> None:
        with np.errstate(all="ignore"):
            np.equal(b, 0, out=zero)
            np.copyto(safe, b)
            np.copyto(safe, 1, where=zero)
            np.floor_divide(a, safe, out=q)
            if signed:
                np.multiply(q, safe, out=r)
                np.subtract(a, r, out=r)
                np.not_equal(r, 0, out=m1)
                np.less(a, 0, out=m2)
                np.not_equal(m2, np.less(safe, 0, out=zero), out=m2)
                np.logical_and(m1, m2, out=m1)
                np.add(q, m1, out=q, casting="unsafe")
                np.equal(b, 0, out=zero)
            np.copyto(q, 0, where=zero)
        np.copyto(out, q)

    return run


def int_pow_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Integer ``a ** b`` as the reference: ``np.power`` (wrapping, ``0 ** 0 == 1``) with
    negative exponents replaced by 0, then, where ``b < 0``, the truncated reciprocal: 1
    for ``a == 1``, ``-1 if b is odd else 1`` for ``a == -1``, 0 otherwise (also for
    ``a == 0``). Unsigned exponents are a plain ``np.power``. ``out`` (possibly an
    input's slot) is written by the last call."""
    a, b = ins
    if b.dtype != a.dtype or out.dtype != a.dtype:
        return None
    dims, dt = out.shape, out.dtype
    q = ctx.scratch(dims, dt, 90)
    if dt.kind == "u":

        def run_unsigned() -> None:
            np.power(a, b, out=q)
            np.copyto(out, q)

        return run_unsigned
    neg = ctx.scratch(dims, np.bool_, 91)
    m = ctx.scratch(dims, np.bool_, 92)
    e = ctx.scratch(dims, dt, 93)
    r = ctx.scratch(dims, dt, 94)

    def run() -> None:
        with np.errstate(all="ignore"):
            np.less(b, 0, out=neg)
            if not neg.any():  # the common case: one power
                np.power(a, b, out=q)
                np.copyto(out, q)
                return
            np.copyto(e, b)
            np.copyto(e, 0, where=neg)
            np.power(a, e, out=q)
            r.fill(0)
            np.equal(a, 1, out=m)
            np.copyto(r, 1, where=m)
            np.equal(a, -1, out=m)
            np.copyto(r, 1, where=m)
            np.bitwise_and(b, 1, out=e)  # odd exponent (two's complement: -3 & 1 == 1)
            np.logical_and(m, e, out=m)
            np.copyto(r, -1, where=m)
            np.copyto(q, r, where=neg)
        np.copyto(out, q)

    return run
