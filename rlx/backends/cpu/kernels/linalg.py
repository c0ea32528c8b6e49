"""CPU kernels for linear algebra: matmul and dot_general. f32 products run rlx's packed
sgemm (``kernels.sgemm``: a weight packed once, batched activations packed per call) when
it beat BLAS on the shape class, else BLAS (``np.matmul`` with ``out=``, no allocation);
other float dtypes take BLAS. Integer products keep the reference kernel (they
accumulate in i64 and wrap, which BLAS does not do). bf16/f16 products run the native
low-precision GEMMs of ``kernels.lowp_lib`` (bf16 dot products with f32 accumulation on
avx512_bf16 CPUs, else native widening + f32 sgemm); without the native library they are
widened to f32 by NumPy (``lowp``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.kernels import Kernel, KernelCtx, KernelKind, kernel, lowp
from rlx.backends.cpu.kernels.lowp_gemm import lowp_matmul
from rlx.backends.cpu.kernels.lowp_lib import BF16, F16
from rlx.backends.cpu.kernels.sgemm import batched_matmul, weight_matmul
from rlx.ops.linalg import DotGeneral, MatMul

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["matmul_kernel", "dot_general_kernel", "as_3d", "view_3d", "matmul_into"]


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Kernel:
    """``np.matmul(a, b, out=out)``, as one 2-D GEMM when ``b`` is a single matrix (all
    its leading dims 1) and ``a`` has rows: NumPy's stacked matmul against a broadcast
    rhs does not call BLAS and is ~100x slower than the equivalent 2-D call."""
    if a.ndim >= 2 and b.ndim >= 2 and all(d == 1 for d in b.shape[:-2]) and out.ndim >= 2:
        lead = out.shape[:-2]
        same_rows = a.shape[:-2] == lead or (not a.shape[:-2] and all(d == 1 for d in lead))
        if same_rows and a.flags.c_contiguous and out.flags.c_contiguous:
            a2 = a.reshape(math.prod(a.shape[:-1]), a.shape[-1])  # not -1: K may be 0
            b2 = b.reshape(b.shape[-2], b.shape[-1])
            o2 = out.reshape(math.prod(out.shape[:-1]), out.shape[-1])
            return lambda: np.matmul(a2, b2, out=o2)  # type: ignore[return-value]
    return lambda: np.matmul(a, b, out=out)  # type: ignore[return-value]


def as_3d(
    x: np.ndarray, perm: tuple[int, ...], shape3: tuple[int, int, int], ctx: KernelCtx, tag: int
) -> tuple[np.ndarray, Kernel | None]:
    """``x`` transposed by ``perm`` and reshaped to ``shape3``: a view when ``perm`` is the
    identity, else a scratch buffer plus the copy that fills it (run before each use)."""
    if perm == tuple(range(x.ndim)):
        return x.reshape(shape3), None
    s = ctx.scratch(shape3, x.dtype, tag)
    src = x.transpose(perm)
    dst = s.reshape(src.shape)
    return s, lambda: np.copyto(dst, src)  # type: ignore[return-value]


_NATIVE_LOWP = (BF16, F16)
_F32 = np.dtype(np.float32)


def view_3d(
    x: np.ndarray, perm: tuple[int, ...], shape3: tuple[int, int, int]
) -> np.ndarray | None:
    """``x`` transposed by ``perm`` and reshaped to ``shape3`` as a view (any strides), or
    None when that needs a copy."""
    try:
        return x.transpose(perm).reshape(shape3, copy=False)
    except ValueError:
        return None


def _native_f32(
    node: Node, a: np.ndarray, b: np.ndarray, out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """An f32 MatMul on the packed sgemm (one weight matrix, or equal batch dims with
    both operands batched), or None for BLAS."""
    if not (a.dtype == b.dtype == out.dtype == _F32) or a.ndim < 2 or b.ndim < 2:
        return None
    if all(d == 1 for d in b.shape[:-2]):
        return weight_matmul(node, a, b, out, ctx)
    lead = out.shape[:-2]
    if a.shape[:-2] != lead or b.shape[:-2] != lead or not out.flags.c_contiguous:
        return None
    nb = math.prod(lead)
    a3 = view_3d(a, tuple(range(a.ndim)), (nb, *a.shape[-2:]))
    b3 = view_3d(b, tuple(range(b.ndim)), (nb, *b.shape[-2:]))
    if a3 is None or b3 is None:
        return None
    return batched_matmul(node, a3, b3, out.reshape(nb, *out.shape[-2:]), ctx)


@kernel(MatMul, KernelKind.BLAS)
def matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``np.matmul(a, b, out=out)``: rlx's sgemm or BLAS for f32 (by measurement), BLAS
    gemm for f64 (batched, broadcast); the native low-precision GEMM for bf16/f16."""
    a, b = ins
    if a.dtype in _NATIVE_LOWP:
        fn = lowp_matmul(node, a, b, out, ctx)
        if fn is not None:
            return fn
    if a.dtype == _F32:
        fn = _native_f32(node, a, b, out, ctx)
        if fn is not None:
            return fn
    return _blas_matmul(node, ins, out, ctx)


@lowp
def _blas_matmul(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    a, b = ins
    if a.dtype.kind not in "fc":
        return None
    return matmul_into(a, b, out)


@kernel(DotGeneral, KernelKind.BLAS)
def dot_general_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """One batched matmul over [batch, free, contract] x [batch, contract, free]; operands
    already in that order are views, others are transposed into scratch first."""
    a, b = ins
    if a.dtype in _NATIVE_LOWP and a.dtype == b.dtype == out.dtype:
        lc, rc, lb, rb, lf, rf = node.op._axes(a.ndim, b.ndim)  # type: ignore[attr-defined]
        nb, m, k, n = _dims(a, b, lc, lb, lf, rf)
        a3, prep_a = as_3d(a, lb + lf + lc, (nb, m, k), ctx, 1)
        b3, prep_b = as_3d(b, rb + rc + rf, (nb, k, n), ctx, 2)
        fn = lowp_matmul(
            node,
            a3,
            b3,
            out.reshape(nb, m, n),
            ctx,
            preps=() if prep_a is None else (prep_a,),
            b_prep=prep_b,
        )
        if fn is not None:
            return fn
    if a.dtype == b.dtype == out.dtype == _F32 and out.flags.c_contiguous:
        lc, rc, lb, rb, lf, rf = node.op._axes(a.ndim, b.ndim)  # type: ignore[attr-defined]
        nb, m, k, n = _dims(a, b, lc, lb, lf, rf)
        a3 = view_3d(a, lb + lf + lc, (nb, m, k))
        b3 = view_3d(b, rb + rc + rf, (nb, k, n))
        if a3 is not None and b3 is not None and 0 not in (nb, m, n):
            o3 = out.reshape(nb, m, n)
            if nb == 1:
                fn = weight_matmul(node, a3[0], b3[0], o3[0], ctx)
            else:
                fn = batched_matmul(node, a3, b3, o3, ctx)
            if fn is not None:
                return fn
    return _blas_dot_general(node, ins, out, ctx)


def _dims(
    a: np.ndarray,
    b: np.ndarray,
    lc: tuple[int, ...],
    lb: tuple[int, ...],
    lf: tuple[int, ...],
    rf: tuple[int, ...],
) -> tuple[int, int, int, int]:
    return (
        math.prod(a.shape[i] for i in lb),
        math.prod(a.shape[i] for i in lf),
        math.prod(a.shape[i] for i in lc),
        math.prod(b.shape[j] for j in rf),
    )


@lowp
def _blas_dot_general(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    a, b = ins
    if a.dtype.kind not in "fc":
        return None
    lc, rc, lb, rb, lf, rf = node.op._axes(a.ndim, b.ndim)  # type: ignore[attr-defined]
    nb, m, k, n = _dims(a, b, lc, lb, lf, rf)
    a3, prep_a = as_3d(a, lb + lf + lc, (nb, m, k), ctx, 1)
    b3, prep_b = as_3d(b, rb + rc + rf, (nb, k, n), ctx, 2)
    o3 = out.reshape(nb, m, n)
    preps = [p for p in (prep_a, prep_b) if p is not None]
    mm = matmul_into(a3, b3, o3) if nb != 1 else matmul_into(a3[0], b3[0], o3[0])
    if not preps:
        return mm

    def run() -> None:
        for p in preps:
            p()
        mm()

    return run
