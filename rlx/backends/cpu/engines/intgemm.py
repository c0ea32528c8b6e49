"""Exact integer products (the integer ``matmul`` and ``dot_general`` kernels of
``kernels/linalg.py``). In: integer operand views, the output view, the contracted length
and the kernel context. Out: a closure writing the wrapped product into the output view.

The reference accumulates integer products in i64 and wraps to the node's dtype (as
``astype``). Here: operands of 16 bits or fewer multiply exactly in f64 BLAS when every
dot product is provably below 2**53 in magnitude (``K * max|a| * max|b|``, from the
dtypes, checked when the schedule is built), then round-trip through an i64 scratch
(exact) and wrap into ``out``; 32-bit operands (``K < 2**20``) split into 16-bit halves
and take four such exact products, recombined with wrapping int64 shifts and adds;
otherwise (64-bit operands) the operands are widened into i64 scratch and
``np.matmul(..., out=)`` (NumPy's integer loop, wrapping like the reference) writes an
i64 scratch that wraps into ``out``. Operands already i64 multiply straight into ``out``.
Float products take the BLAS kernels of ``kernels/linalg.py``.
"""

from __future__ import annotations

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind
from rlx.backends.cpu.engines.blas import matmul_into

__all__ = ["int_product"]

_EXACT = 2**53


def _max_abs(dt: np.dtype) -> int:
    info = np.iinfo(dt)
    return max(abs(int(info.min)), int(info.max))


def int_product(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, k: int, ctx: KernelCtx, tag: int
) -> Kernel:
    """``out = wrap(a @ b)`` (np.matmul broadcasting) for integer ``a``, ``b``; ``k`` is
    the contracted length (for the exactness bound of the f64 path)."""
    dims = out.shape
    if _max_abs(a.dtype) * _max_abs(b.dtype) * max(k, 1) < _EXACT:
        ctx.kind = KernelKind.BLAS
        ctx.notes.append("integer product in f64 BLAS (exact below 2**53)")
        fa = ctx.scratch(a.shape, np.float64, tag)
        fb = ctx.scratch(b.shape, np.float64, tag + 1)
        fo = ctx.scratch(dims, np.float64, tag + 2)
        io = ctx.scratch(dims, np.int64, tag + 3)
        mm = matmul_into(fa, fb, fo)

        def run_blas() -> None:
            np.copyto(fa, a, casting="unsafe")
            np.copyto(fb, b, casting="unsafe")
            mm()
            np.copyto(io, fo, casting="unsafe")
            np.copyto(out, io, casting="unsafe")

        return run_blas
    if a.dtype.itemsize == 4 and b.dtype.itemsize == 4 and k < _SPLIT_K:
        return _split_product(a, b, out, ctx, tag)
    ctx.kind = KernelKind.NUMPY
    i64 = np.dtype(np.int64)
    wa = a if a.dtype == i64 else ctx.scratch(a.shape, i64, tag)
    wb = b if b.dtype == i64 else ctx.scratch(b.shape, i64, tag + 1)
    wo = out if out.dtype == i64 else ctx.scratch(dims, i64, tag + 2)

    def run_int() -> None:
        if wa is not a:
            np.copyto(wa, a, casting="unsafe")
        if wb is not b:
            np.copyto(wb, b, casting="unsafe")
        np.matmul(wa, wb, out=wo)
        if wo is not out:
            np.copyto(out, wo, casting="unsafe")

    return run_int


_SPLIT_K = 2**20  # 16-bit halves: K * 2**32 * 2 < 2**53 keeps every f64 sum exact


def _split_product(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, ctx: KernelCtx, tag: int
) -> Kernel:
    """32-bit operands as 16-bit halves ``x = hi * 2**16 + lo`` (``lo`` in [0, 2**16),
    ``hi`` signed for i32): four exact f64 BLAS products, recombined in int64 as
    ``(hh << 32) + ((hl + lh) << 16) + ll``, which wraps modulo 2**64 exactly as the
    reference's i64 accumulation does; ``out`` takes the low bits (astype)."""
    ctx.kind = KernelKind.BLAS
    ctx.notes.append("32-bit integer product as four exact f64 BLAS products of 16-bit halves")
    dims = out.shape
    wa = ctx.scratch(a.shape, np.int64, tag)
    wb = ctx.scratch(b.shape, np.int64, tag + 1)
    ah, al = ctx.scratch(a.shape, np.float64, tag + 2), ctx.scratch(a.shape, np.float64, tag + 3)
    bh, bl = ctx.scratch(b.shape, np.float64, tag + 4), ctx.scratch(b.shape, np.float64, tag + 5)
    hh, ll = ctx.scratch(dims, np.float64, tag + 6), ctx.scratch(dims, np.float64, tag + 7)
    hl, lh = ctx.scratch(dims, np.float64, tag + 8), ctx.scratch(dims, np.float64, tag + 9)
    acc, part = ctx.scratch(dims, np.int64, tag + 10), ctx.scratch(dims, np.int64, tag + 11)
    products = [matmul_into(ah, bh, hh), matmul_into(ah, bl, hl)]
    products += [matmul_into(al, bh, lh), matmul_into(al, bl, ll)]
    low = np.int64(0xFFFF)

    def run() -> None:
        for x, w, hi, lo in ((a, wa, ah, al), (b, wb, bh, bl)):
            np.copyto(w, x, casting="unsafe")
            np.bitwise_and(w, low, out=w)
            np.copyto(lo, w, casting="unsafe")
            np.copyto(w, x, casting="unsafe")
            np.right_shift(w, 16, out=w)
            np.copyto(hi, w, casting="unsafe")
        for p in products:
            p()
        with np.errstate(all="ignore"):
            np.copyto(acc, hh, casting="unsafe")
            np.left_shift(acc, 32, out=acc)
            np.add(hl, lh, out=hl)
            np.copyto(part, hl, casting="unsafe")
            np.left_shift(part, 16, out=part)
            np.add(acc, part, out=acc)
            np.copyto(part, ll, casting="unsafe")
            np.add(acc, part, out=acc)
        np.copyto(out, acc, casting="unsafe")

    return run
