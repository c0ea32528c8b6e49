"""BLAS helpers several kernel families call. In: NumPy views (arena slots or scratch).
Out: closures running ``np.matmul`` with ``out=`` as one 2-D GEMM where NumPy would not
(``matmul_into``), and operands arranged as ``[batch, rows, cols]`` (``as_3d``: a view or a
scratch copy; ``view_3d``: a view or None)."""

from __future__ import annotations

import math

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx

__all__ = ["matmul_into", "as_3d", "view_3d"]


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


def view_3d(
    x: np.ndarray, perm: tuple[int, ...], shape3: tuple[int, int, int]
) -> np.ndarray | None:
    """``x`` transposed by ``perm`` and reshaped to ``shape3`` as a view (any strides), or
    None when that needs a copy."""
    try:
        return x.transpose(perm).reshape(shape3, copy=False)
    except ValueError:
        return None
