"""Kernels of the bitwise ops (``Bitwise``, ``BitwiseNot``), ``Trig``, ``CumProd`` and ``Bitcast``: NumPy
ufuncs writing into the arena view (16-bit float trig computed in f32, rounded once)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.kernels import Kernel, KernelCtx, kernel
from rlx.ops.bitcast import Bitcast
from rlx.ops.bitwise import Bitwise, BitwiseKind, BitwiseNot, bitwise
from rlx.ops.cumulative import CumProd, cumprod
from rlx.ops.trig import TRIG_FNS, Trig

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "bitwise_kernel",
    "bitwise_not_kernel",
    "trig_kernel",
    "cumprod_kernel",
    "bitcast_kernel",
]

_UFUNC = {BitwiseKind.AND: np.bitwise_and, BitwiseKind.OR: np.bitwise_or,
          BitwiseKind.XOR: np.bitwise_xor}  # fmt: skip


@kernel(Bitwise)
def bitwise_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """and / or / xor as one ufunc into ``out``; shifts through the op's checked twin."""
    a, b = ins
    fn = node.op.fn  # type: ignore[attr-defined]
    uf = _UFUNC.get(fn)
    if uf is not None:
        return lambda: uf(a, b, out=out)

    def run() -> None:
        np.copyto(out, bitwise(fn, a, b))

    return run


@kernel(BitwiseNot)
def bitwise_not_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    (x,) = ins
    return lambda: np.invert(x, out=out)


@kernel(Trig)
def trig_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    (x,) = ins
    f = TRIG_FNS[node.op.fn]  # type: ignore[attr-defined]
    if out.dtype in (np.float32, np.float64):

        def run() -> None:
            with np.errstate(all="ignore"):
                f(x, out=out)

        return run

    def run_lowp() -> None:
        with np.errstate(all="ignore"):
            np.copyto(out, f(x.astype(np.float32)), casting="unsafe")

    return run_lowp


@kernel(CumProd)
def cumprod_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """``np.cumprod`` into ``out`` (flipped views for ``reverse``); exclusive products and
    16-bit floats go through the op's twin."""
    (x,) = ins
    op: CumProd = node.op  # type: ignore[assignment]
    ax = op.axis % x.ndim
    if not op.exclusive and x.dtype.kind in "iu" or x.dtype in (np.float32, np.float64):
        if not op.exclusive:
            src, dst = (np.flip(x, ax), np.flip(out, ax)) if op.reverse else (x, out)
            return lambda: np.cumprod(src, axis=ax, dtype=x.dtype, out=dst)

    def run() -> None:
        np.copyto(out, cumprod(x, op.axis, op.reverse, op.exclusive), casting="unsafe")

    return run


@kernel(Bitcast)
def bitcast_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """A byte copy: ``out``'s bytes become ``x``'s."""
    (x,) = ins
    src = x.view(out.dtype) if x.flags.c_contiguous else None
    if src is None:
        return lambda: np.copyto(out, np.ascontiguousarray(x).view(out.dtype).reshape(x.shape))
    return lambda: np.copyto(out, src)
