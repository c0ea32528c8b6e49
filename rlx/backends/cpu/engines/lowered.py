"""Kernels of the elementwise backward ops through their lowering (``op.lower``, see
:mod:`rlx.ops.lowered`): the primitive elementwise graph the op stands for becomes the
body of an :class:`~rlx.ops.fused.ElementwiseRegion`, run as one generated C loop (the
region engine, bit for bit what the fused primitive graph computed) or, where that
cannot be built, the NumPy region kernel.

In: the node (its op has ``lower(g, inputs) -> node`` of elementwise ops), its input
views and output view. Out: a closure, or None (noted) when the path does not apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind
from rlx.ir.mir import Node
from rlx.ops.control import build_subgraph
from rlx.ops.fused import ElementwiseRegion

if TYPE_CHECKING:
    from rlx.ir.mir import Graph

__all__ = ["lowered_region_kernel", "lowered_numpy_kernel", "region_body"]


def region_body(node: Node, graph: Graph) -> Graph:
    """The op's lowering as a region body: Inputs ``in0..inN`` of the node's input shapes."""
    shapes = [graph.nodes[i].shape for i in node.inputs]
    lower = node.op.lower  # type: ignore[attr-defined]
    return build_subgraph(f"{node.op.mnemonic}.lowered", shapes, lambda s, *ins: lower(s, ins))


def _region(node: Node, ctx: KernelCtx) -> Node:
    body = region_body(node, ctx.graph)
    return Node(node.id, ElementwiseRegion(body), node.inputs, node.shape, node.loc)


@kind(KernelKind.NATIVE)
def lowered_region_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The lowering as one generated C loop (None, noted, when it cannot be built)."""
    from rlx.backends.cpu.kernels.fused import native_region_kernel

    return native_region_kernel(_region(node, ctx), ins, out, ctx)


def lowered_numpy_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The lowering's elementwise kernels in turn over scratch (the NumPy region kernel)."""
    from rlx.backends.cpu.kernels.fused import region_kernel

    ctx.kind = KernelKind.NUMPY
    return region_kernel(_region(node, ctx), ins, out, ctx)
