"""CPU kernels for linear algebra (``rlx/ops/linalg.py``): matmul, dot_general, the dense
solves, grouped (mixture-of-experts) and LoRA matmuls. In: a node and NumPy views of its
arena slots. Out: a closure writing the output view.

* matmul / dot_general: f32 products run rlx's packed sgemm (``engines.sgemm``: a weight
  packed once, batched activations packed per call) when it beat BLAS on the shape
  class, else BLAS (``np.matmul`` with ``out=``, no allocation); other float dtypes take
  BLAS. bf16/f16 products run the native low-precision GEMMs of ``engines.lowp_gemm``
  (bf16 dot products with f32 accumulation on avx512_bf16 CPUs, else native widening +
  f32 sgemm); without the native library they are widened to f32 by NumPy (``lowp``).
  Integer products (which accumulate in i64 and wrap, as BLAS does not) are tried first
  and run ``engines.intgemm`` (exact f64 BLAS products, or NumPy's integer loop).
* dense_solve / batched_dense_solve: LAPACK ``gesv`` on Fortran-ordered scratch copies
  (SciPy allocates its N-int pivot vector per call, noted in the report).
* grouped_matmul: tokens packed by expert (a counting sort), one BLAS gemm per expert.
* lora_matmul: three BLAS gemms and one scaled add.
Temporaries live in build-time scratch (f16/bf16 through f32 with ``lowp``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind, lowp
from rlx.backends.cpu.engines.blas import as_3d, matmul_into, view_3d
from rlx.backends.cpu.engines.intgemm import int_product
from rlx.backends.cpu.engines.lowp_gemm import lowp_matmul
from rlx.backends.cpu.engines.lowp_lib import is_half
from rlx.backends.cpu.engines.sgemm import batched_matmul, weight_matmul
from rlx.ops.linalg import (
    BatchedDenseSolve,
    DenseSolve,
    DotGeneral,
    GroupedMatMul,
    LoraMatMul,
    MatMul,
    singular_error,
)

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "matmul_kernel",
    "dot_general_kernel",
    "int_matmul_kernel",
    "int_dot_general_kernel",
    "dense_solve_kernel",
    "batched_dense_solve_kernel",
    "grouped_matmul_kernel",
    "lora_matmul_kernel",
]


_F32 = np.dtype(np.float32)


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


@kind(KernelKind.BLAS)
def matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``np.matmul(a, b, out=out)``: rlx's sgemm or BLAS for f32 (by measurement), BLAS
    gemm for f64 (batched, broadcast); the native low-precision GEMM for bf16/f16."""
    a, b = ins
    if is_half(a.dtype):
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


@kind(KernelKind.BLAS)
def dot_general_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """One batched matmul over [batch, free, contract] x [batch, contract, free]; operands
    already in that order are views, others are transposed into scratch first."""
    a, b = ins
    if is_half(a.dtype) and a.dtype == b.dtype == out.dtype:
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


# ---- integer products ------------------------------------------------------------------


@kind(KernelKind.BLAS)
def int_matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Integer matmul (see the module docstring); float nodes are ``matmul_kernel``'s."""
    a, b = ins
    if a.dtype.kind not in "iu":
        return None
    k = a.shape[-1]
    return int_product(a, b, out, k, ctx, 400)


@kind(KernelKind.BLAS)
def int_dot_general_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Integer dot_general as one batched product [batch, free, contract] x [batch,
    contract, free] (operands transposed into scratch when needed); float nodes are
    ``dot_general_kernel``'s."""
    a, b = ins
    if a.dtype.kind not in "iu":
        return None
    lc, rc, lb, rb, lf, rf = node.op._axes(a.ndim, b.ndim)  # type: ignore[attr-defined]
    nb = math.prod(a.shape[i] for i in lb)
    m = math.prod(a.shape[i] for i in lf)
    k = math.prod(a.shape[i] for i in lc)
    n = math.prod(b.shape[j] for j in rf)
    a3, prep_a = as_3d(a, lb + lf + lc, (nb, m, k), ctx, 410)
    b3, prep_b = as_3d(b, rb + rc + rf, (nb, k, n), ctx, 411)
    prod = int_product(a3, b3, out.reshape(nb, m, n), k, ctx, 420)
    preps = [p for p in (prep_a, prep_b) if p is not None]
    if not preps:
        return prod

    def run() -> None:
        for p in preps:
            p()
        prod()

    return run


# ---- dense solves ------------------------------------------------------------------------


def _solver(node: Node, a: np.ndarray, b: np.ndarray, ctx: KernelCtx, tag: int):
    """A function solving one [N, N] system from arena views into ``x`` (in place in
    Fortran-ordered scratch, so LAPACK's ``gesv`` copies nothing)."""
    n = a.shape[-1]
    k = 1 if b.ndim == a.ndim - 1 else b.shape[-1]
    af = ctx.scratch((n, n), a.dtype, tag).T  # Fortran order
    bf = ctx.scratch((k, n), a.dtype, tag + 1).T
    import scipy.linalg.lapack  # (on first use: ~0.05-1 s to import)

    gesv = scipy.linalg.lapack.get_lapack_funcs("gesv", dtype=a.dtype)
    ctx.notes.append("LAPACK gesv (allocates its N-int pivot vector)")

    def solve(ai: np.ndarray, bi: np.ndarray, xi: np.ndarray, where: str) -> None:
        np.copyto(af, ai)
        np.copyto(bf, bi.reshape(n, k))
        _, _, x, info = gesv(af, bf, overwrite_a=1, overwrite_b=1)
        if info > 0:
            raise singular_error(where)
        if info < 0:  # pragma: no cover - the shape rule rules this out
            raise AssertionError(f"gesv: argument {-info} is invalid")
        np.copyto(xi, x.reshape(xi.shape))

    return solve


@kind(KernelKind.BLAS)
@lowp
def dense_solve_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """LAPACK ``gesv`` on copies of ``A`` and ``b`` in scratch."""
    a, b = ins
    if a.dtype not in (np.float32, np.float64) or a.shape[0] == 0:
        return None
    solve = _solver(node, a, b, ctx, 66)
    return lambda: solve(a, b, out, "")


@kind(KernelKind.BLAS)
@lowp
def batched_dense_solve_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """One ``gesv`` per batch index, reusing the same scratch."""
    a, b = ins
    if a.dtype not in (np.float32, np.float64) or a.size == 0:
        return None
    batch = a.shape[:-2]
    solve = _solver(node, a[(0,) * len(batch)], b[(0,) * len(batch)], ctx, 66)
    idx = list(np.ndindex(*batch))
    names = ["[" + ", ".join(map(str, i)) + "]" for i in idx]

    def run() -> None:
        for i, where in zip(idx, names, strict=True):
            solve(a[i], b[i], out[i], where)

    return run


@kind(KernelKind.BLAS)
@lowp
def grouped_matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Tokens packed by expert (a counting sort done with a one-hot [M, E] cumsum), one
    BLAS gemm per expert over its rows, then unpacked into ``out``."""
    op: GroupedMatMul = node.op  # type: ignore[assignment]
    x, w, idx = ins
    if x.dtype not in (np.float32, np.float64):
        return None
    m, e = x.shape[0], w.shape[0]
    if m == 0:
        return lambda: None
    ids = ctx.scratch((m,), np.int64, 70)
    onehot = ctx.scratch((m, e), np.bool_, 71)
    cum = ctx.scratch((m, e), np.int64, 72)
    offs = ctx.scratch((e + 1,), np.int64, 73)
    rank = ctx.scratch((m,), np.int64, 74)
    pos = ctx.scratch((m,), np.int64, 75)
    packed = ctx.scratch(x.shape, x.dtype, 76)
    pout = ctx.scratch(out.shape, out.dtype, 77)
    experts = np.arange(e, dtype=np.int64)
    rowbase = np.arange(m, dtype=np.int64) * e

    def run() -> None:
        np.copyto(ids, idx, casting="unsafe")
        if ids.min() < 0 or ids.max() >= e:
            op.check_ids(idx, e)
        np.equal(ids[:, None], experts, out=onehot)
        np.copyto(cum, onehot)
        np.cumsum(cum, axis=0, out=cum)  # in place: a bool input would need a temporary
        offs[0] = 0
        np.cumsum(cum[-1], out=offs[1:])
        np.add(rowbase, ids, out=rank)
        np.take(cum.reshape(-1), rank, out=rank)  # 1-based rank within the expert
        np.take(offs, ids, out=pos)
        np.add(pos, rank, out=pos)
        np.subtract(pos, 1, out=pos)
        packed[pos] = x
        bounds = offs.tolist()
        for k in range(e):
            lo, hi = bounds[k], bounds[k + 1]
            if hi > lo:
                np.matmul(packed[lo:hi], w[k], out=pout[lo:hi])
        np.take(pout, pos, axis=0, out=out)

    return run


@kind(KernelKind.BLAS)
@lowp
def lora_matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Three BLAS gemms into ``out`` and two scratch buffers, then one scaled add."""
    x, w, a, b = ins
    if x.dtype not in (np.float32, np.float64):
        return None
    r = a.shape[1]
    t = ctx.scratch((*x.shape[:-1], r), x.dtype, 78)
    u = ctx.scratch(out.shape, x.dtype, 79)
    scale = x.dtype.type(node.op.scale)  # type: ignore[attr-defined]

    def run() -> None:
        np.matmul(x, a, out=t)
        np.matmul(t, b, out=u)
        np.multiply(u, scale, out=u)
        np.matmul(x, w, out=out)
        np.add(out, u, out=out)

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    MatMul: (int_matmul_kernel, matmul_kernel),
    DotGeneral: (int_dot_general_kernel, dot_general_kernel),
    DenseSolve: (dense_solve_kernel,),
    BatchedDenseSolve: (batched_dense_solve_kernel,),
    GroupedMatMul: (grouped_matmul_kernel,),
    LoraMatMul: (lora_matmul_kernel,),
}
