"""CPU kernels for the dtype corners the family kernels decline: complex unary functions,
complex sums / products / means and cumsums, bool max / min, a ``where`` computed in
place of its condition, and ``quantize`` from f64, f16, bf16 and fp8. In: the node and
its arena views. Out: a closure writing the output view with NumPy ``out=`` calls
(temporaries in build-time scratch).

Each factory supersedes the family's factory, handles only its corner and hands every
other node back. Complex ``floor`` / ``ceil`` / ``softplus`` have no definition (the
reference's NumPy call raises TypeError when the graph runs): the factory makes that an
UnsupportedOpError at compile time. Complex gelu / gelu_tanh / silu / sigmoid / erf keep
the reference kernel: their only definition is the reference's NumPy expression applied
to complex numbers (listed in ``tests/cpu/test_kernel_coverage.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.kernels import Kernel, KernelCtx, kernel
from rlx.backends.cpu.kernels.elementwise import unary_kernel, where_kernel
from rlx.backends.cpu.kernels.misc import cumsum_into, exclusive_cumsum_kernel
from rlx.backends.cpu.kernels.quant import quantize_kernel, quantize_to_int64
from rlx.backends.cpu.kernels.tensor import reduce_kernel
from rlx.errors import UnsupportedOpError
from rlx.ops.elementwise import Unary, UnaryKind, Where
from rlx.ops.quant import QUANT_RANGES, Quantize
from rlx.ops.reduce import Cumsum, Reduce, ReduceKind

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "complex_unary_kernel",
    "corner_reduce_kernel",
    "complex_cumsum_kernel",
    "where_over_cond_kernel",
    "wide_quantize_kernel",
]

_COMPLEX_UNARY: dict[UnaryKind, np.ufunc] = {
    UnaryKind.TANH: np.tanh,
    UnaryKind.EXP: np.exp,
    UnaryKind.LOG: np.log,
    UnaryKind.SQRT: np.sqrt,
    UnaryKind.NEG: np.negative,
    UnaryKind.ABS: np.absolute,  # f32 magnitudes stored as complex, as the reference
    UnaryKind.SIN: np.sin,
    UnaryKind.COS: np.cos,
    UnaryKind.ROUND: np.rint,
    UnaryKind.SQUARE: np.square,
    UnaryKind.SIGN: np.sign,
}
_UNDEFINED = (UnaryKind.FLOOR, UnaryKind.CEIL, UnaryKind.SOFTPLUS)


@kernel(Unary, supersedes=unary_kernel)
def complex_unary_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Complex inputs: one complex ufunc with ``out=`` (``rsqrt`` and ``recip`` as a
    divide, ``relu`` as ``maximum(x, 0)`` in NumPy's lexicographic complex order)."""
    (x,) = ins
    if x.dtype.kind != "c":
        return unary_kernel(node, ins, out, ctx)
    fn: UnaryKind = node.op.fn  # type: ignore[attr-defined]
    if fn in _UNDEFINED:
        raise UnsupportedOpError(f"{fn.value} is not defined for the complex input {x.dtype}")
    one, zero = x.dtype.type(1), x.dtype.type(0)
    uf = _COMPLEX_UNARY.get(fn)
    if uf is not None:
        return lambda: uf(x, out=out)  # type: ignore[return-value]
    if fn is UnaryKind.RELU:
        return lambda: np.maximum(x, zero, out=out)  # type: ignore[return-value]
    if fn is UnaryKind.RECIP:
        return lambda: np.divide(one, x, out=out)  # type: ignore[return-value]
    if fn is UnaryKind.RSQRT:
        s = ctx.scratch(x.shape, x.dtype, 700)

        def rsqrt() -> None:
            np.sqrt(x, out=s)
            np.divide(one, s, out=out)

        return rsqrt
    return None  # gelu, gelu_tanh, silu, sigmoid, erf: see the module docstring


@kernel(Reduce, supersedes=reduce_kernel)
def corner_reduce_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Complex sum / prod / mean and bool max / min (``any`` / ``all`` with the identity
    for empty axes) with ``out=``; other nodes go to ``reduce_kernel``."""
    (x,) = ins
    if x.dtype.kind not in "cb":
        return reduce_kernel(node, ins, out, ctx)
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


@kernel(Cumsum, supersedes=exclusive_cumsum_kernel)
def complex_cumsum_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Complex (inclusive or exclusive, optionally reverse) cumsums: ``np.cumsum(out=)``
    over flipped views for ``reverse``, a zero first for ``exclusive``; through a scratch
    when ``out`` shares the input's bytes. Other nodes go to the integer/float kernels."""
    (x,) = ins
    if x.dtype.kind != "c" or x.ndim == 0:
        return exclusive_cumsum_kernel(node, ins, out, ctx)
    return cumsum_into(x, out, node.op, ctx, 701)  # type: ignore[arg-type]


@kernel(Where, supersedes=where_kernel)
def where_over_cond_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``where`` whose output took its (1-byte) condition's slot: the masked copies go to
    a scratch that is copied into ``out`` last. Other nodes go to ``where_kernel``."""
    c, a, b = ins
    if not np.may_share_memory(out, c):
        return where_kernel(node, ins, out, ctx)
    tmp = ctx.scratch(out.shape, out.dtype, 702)

    def run() -> None:
        np.copyto(tmp, b)
        np.copyto(tmp, a, where=c)
        np.copyto(out, tmp)

    return run


@kernel(Quantize, supersedes=quantize_kernel)
def wide_quantize_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Quantize from f64 (computed in f64) or f16 / bf16 / fp8 (widened to f32), in the
    reference's steps: ``rint(x / s)``, NaN to 0, clip to +-2**40, int64, ``+ zp``,
    clip to the dtype's range. f32 inputs go to ``quantize_kernel``."""
    (x,) = ins
    if x.dtype == np.float32:
        return quantize_kernel(node, ins, out, ctx)
    op: Quantize = node.op  # type: ignore[assignment]
    ct = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    cs: tuple[int, ...] = ()
    if op.axis is not None:
        ax = op.axis % x.ndim
        cs = tuple(len(op.scales) if i == ax else 1 for i in range(x.ndim))
    s = np.asarray(op.scales, dtype=ct).reshape(cs)
    z = np.asarray(op.zero_points, dtype=np.int64).reshape(cs)
    qmin, qmax = QUANT_RANGES[op.dtype]
    t = ctx.scratch(x.shape, ct, 703)
    q = ctx.scratch(x.shape, np.int64, 704)
    nan = ctx.scratch(x.shape, np.bool_, 705)

    def run() -> None:
        np.copyto(t, x, casting="unsafe")
        quantize_to_int64(t, s, z, qmin, qmax, t, q, nan)
        np.copyto(out, q, casting="unsafe")

    return run
