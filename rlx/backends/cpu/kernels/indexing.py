"""Kernels of the indexing ops (gather_elements, scatter_elements, gather_nd, scatter_nd):
the NumPy fancy-indexing calls of the ops' own functions, written into the arena view."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx
from rlx.ops import indexing as ix

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["indexing_kernel"]

_FNS = {
    ix.GatherElements: ix.gather_elements,
    ix.ScatterElements: ix.scatter_elements,
    ix.GatherNd: ix.gather_nd,
    ix.ScatterNd: ix.scatter_nd,
}


def indexing_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """``out[...] = fn(op, *ins)``: one fancy-indexing pass (a scatter copies x first)."""
    fn, op = _FNS[type(node.op)], node.op

    def run() -> None:
        np.copyto(out, fn(op, *ins), casting="unsafe")

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {cls: (indexing_kernel,) for cls in _FNS}
