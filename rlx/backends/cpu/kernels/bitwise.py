"""CPU kernels of the bitwise ops (``rlx/ops/bitwise.py``: ``Bitwise``, ``BitwiseNot``): NumPy
ufuncs writing into the arena view; shifts through the op's checked twin."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx
from rlx.ops.bitwise import Bitwise, BitwiseKind, BitwiseNot, bitwise

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["bitwise_kernel", "bitwise_not_kernel"]

_UFUNC = {BitwiseKind.AND: np.bitwise_and, BitwiseKind.OR: np.bitwise_or,
          BitwiseKind.XOR: np.bitwise_xor}  # fmt: skip


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


def bitwise_not_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    (x,) = ins
    return lambda: np.invert(x, out=out)


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Bitwise: (bitwise_kernel,),
    BitwiseNot: (bitwise_not_kernel,),
}
