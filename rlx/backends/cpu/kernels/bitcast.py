"""CPU kernel of ``bitcast`` (``rlx/ops/bitcast.py``): a byte copy, the output's bytes
become the input's."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx
from rlx.ops.bitcast import Bitcast

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["bitcast_kernel"]


def bitcast_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """A byte copy: ``out``'s bytes become ``x``'s."""
    (x,) = ins
    src = x.view(out.dtype) if x.flags.c_contiguous else None
    if src is None:
        return lambda: np.copyto(out, np.ascontiguousarray(x).view(out.dtype).reshape(x.shape))
    return lambda: np.copyto(out, src)


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Bitcast: (bitcast_kernel,),
}
