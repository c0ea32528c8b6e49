"""CPU kernels of the norms (``rlx/ops/norm.py``): layer norm, RMS norm, group norm. In: a
node and NumPy views of its arena slots. Out: a closure writing the output view.

Layer and RMS norm over the last axis try the native row kernel first
(``engines.rows``: one C call per node, rows over an OpenMP team), then NumPy calls with
``out=`` in the reference's order; group norm is NumPy. Temporaries live in build-time
scratch; f16/bf16 go through f32 (``lowp``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.codegen.rows import RowKind
from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind, lowp
from rlx.backends.cpu.engines.rows import norm_factory
from rlx.ops.norm import GroupNorm, LayerNorm, RmsNorm

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "norm_into",
    "native_layer_norm_kernel",
    "native_rms_norm_kernel",
    "layer_norm_kernel",
    "rms_norm_kernel",
    "group_norm_kernel",
]


def norm_into(
    x: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray | None,
    out: np.ndarray,
    eps: float,
    ctx: KernelCtx,
    *,
    center: bool,
) -> Kernel:
    """Layer norm (``center``) or RMS norm of ``x`` over its last axis into ``out``,
    in the reference's order: ``c / sqrt(mean(c*c) + eps) * gamma (+ beta)``."""
    row = ctx.scratch((*x.shape[:-1], 1), x.dtype, 40)
    c = ctx.scratch(x.shape, x.dtype, 41)
    sq = ctx.scratch(x.shape, x.dtype, 42)
    e = x.dtype.type(eps)
    last = (-1,)

    def norm() -> None:
        if center:
            np.mean(x, axis=last, keepdims=True, out=row)
            np.subtract(x, row, out=c)
        else:
            np.copyto(c, x)
        np.multiply(c, c, out=sq)
        np.mean(sq, axis=last, keepdims=True, out=row)
        np.add(row, e, out=row)
        np.sqrt(row, out=row)
        np.divide(c, row, out=c)
        if beta is None:
            np.multiply(c, gamma, out=out)
        else:
            np.multiply(c, gamma, out=c)
            np.add(c, beta, out=out)

    return norm


@lowp
def layer_norm_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """Layer norm over the last axis with ``out=`` calls."""
    beta = ins[2] if len(ins) == 3 else None
    return norm_into(ins[0], ins[1], beta, out, node.op.eps, ctx, center=True)  # type: ignore[attr-defined]


@lowp
def rms_norm_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """RMS norm over the last axis with ``out=`` calls."""
    beta = ins[2] if len(ins) == 3 else None
    return norm_into(ins[0], ins[1], beta, out, node.op.eps, ctx, center=False)  # type: ignore[attr-defined]


native_layer_norm_kernel = kind(KernelKind.NATIVE)(norm_factory(RowKind.LAYER_NORM, False))
native_rms_norm_kernel = kind(KernelKind.NATIVE)(norm_factory(RowKind.RMS_NORM, False))


def _reshaped(a: np.ndarray, dims: tuple[int, ...]) -> np.ndarray | None:
    """A view of ``a`` with ``dims`` (None when that needs a copy: not an arena view)."""
    v = a.view()
    try:
        v.shape = dims
    except AttributeError:
        return None
    return v


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


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    LayerNorm: (native_layer_norm_kernel, layer_norm_kernel),
    RmsNorm: (native_rms_norm_kernel, rms_norm_kernel),
    GroupNorm: (group_norm_kernel,),
}
