"""CPU kernel of ``cumprod`` (``rlx/ops/cumulative.py``): ``np.cumprod`` into the output view
(flipped views for ``reverse``); exclusive products and 16-bit floats through the op's
NumPy twin."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx
from rlx.ops.cumulative import CumProd, cumprod

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["cumprod_kernel"]


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


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    CumProd: (cumprod_kernel,),
}
