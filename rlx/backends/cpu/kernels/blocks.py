"""CPU kernels of the fused transformer blocks (``rlx/ops/blocks.py``):
fused_attention_block and fused_transformer_layer. In: the node and its arena views.
Out: a closure computing the node into its output view.

The kernel is the block's decomposition (``rlx.ops.blocks.expand``) run with rlx's own
fast kernels: when the schedule is built, the decomposition is put through the compile
pipeline's fusion passes (so its linears become sgemm calls with the bias / activation
epilogue, the attention chain the native attention kernel, residual + layer norm one row
kernel), and each of its nodes gets the kernel the dispatch table gives it, reading the
node's own input views (no copy of x or of the weights) and writing scratch buffers this
kernel owns (the last one writes the output view). A weight the parent graph holds as a
constant or as a param stays one to the inner kernels (packed once, or once per
``set_param``, as in the unfused graph); what they keep across shapes is kept under this
node's id, so two blocks never share a packed weight.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.backends.cpu.dispatch import (
    KERNELS,
    Kernel,
    KernelCtx,
    KernelKind,
    kind,
    reference_kernel,
)
from rlx.ir.mir import Graph
from rlx.ops.blocks import FusedAttentionBlock, FusedTransformerLayer, expand
from rlx.ops.core import Constant, Input, Param

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["block_kernel", "decomposition"]


def decomposition(node: Node, graph: Graph) -> Graph:
    """The block's decomposition over Inputs ``in0..`` (shaped as the node's inputs),
    through the fusion passes of the compile pipeline."""
    from rlx.options import CompileOptions, VerifyMode
    from rlx.passes.pipeline import CompilePipeline

    sub = Graph(f"{node.op.mnemonic}.{node.id}")
    ins = [sub.input(f"in{k}", graph.nodes[i].shape) for k, i in enumerate(node.inputs)]
    sub.set_outputs([expand(node.op, sub, ins)])  # type: ignore[arg-type]
    opts = CompileOptions(verify=VerifyMode.OFF, verbose=False)
    return CompilePipeline(opts).run(sub).graph


@dataclasses.dataclass
class _Store:
    """The executor's ParamStore as the inner kernels see it: its version, and objects
    kept under this block's node id."""

    outer: Any
    shared: dict[Hashable, Any]
    once_done: dict[Hashable, int]

    @property
    def version(self) -> int:
        return int(self.outer.version)


@kind(KernelKind.NATIVE)
def block_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """The decomposition's own kernels, run in order on this kernel's scratch."""
    sub = ctx.keep(
        ("blocks.decomposition", node.id, node.op), lambda: decomposition(node, ctx.graph)
    )
    outer_of: dict[int, int] = {}  # inner Input id -> index of the node's input
    nodes = list(sub.nodes)
    for n in sub.nodes:
        if isinstance(n.op, Input):
            k = int(n.op.name[2:])  # type: ignore[attr-defined]
            outer_of[n.id] = k
            src = ctx.graph.nodes[node.inputs[k]]
            if isinstance(src.op, (Constant, Param)):  # inner kernels pack such weights once
                nodes[n.id] = dataclasses.replace(n, op=src.op)
    inner = sub.copy()
    inner.nodes = nodes
    store = None
    if ctx.store is not None:
        own = ctx.keep(("blocks.store", node.id), lambda: ({}, {}))
        store = _Store(ctx.store, own[0], own[1])
    stable = frozenset(i for i, k in outer_of.items() if node.inputs[k] in ctx.stable)
    (result,) = inner.outputs
    arrays: dict[int, np.ndarray] = {}
    steps: list[Kernel] = []
    kinds: set[str] = set()
    for nid in inner.topo_order():
        n = inner.nodes[nid]
        if nid in outer_of:
            arrays[nid] = ins[outer_of[nid]]
            continue
        if isinstance(n.op, Constant):
            arrays[nid] = np.asarray(n.op.value)  # type: ignore[attr-defined]
            continue
        dims = n.shape.concrete(ctx.bindings)
        if n.op.view and nid != result:
            arrays[nid] = arrays[n.inputs[0]].reshape(dims)
            continue
        dst = out if nid == result else np.empty(dims, n.dtype.np)
        arrays[nid] = dst
        sctx = KernelCtx(
            n, inner, ctx.bindings, ctx.params, ctx.inputs, ctx.pool,
            num_threads=ctx.num_threads, native=ctx.native, stable=stable, store=store,
            batch_invariant=ctx.batch_invariant,
        )  # fmt: skip
        src_ins = [arrays[i] for i in n.inputs]
        factory = KERNELS.get(type(n.op))
        fn = factory(n, src_ins, dst, sctx) if factory is not None else None
        if fn is None:
            sctx.kind = KernelKind.REFERENCE
            fn = reference_kernel(n, src_ins, dst, sctx)
        ctx.prologue += sctx.prologue
        kinds.add(f"{n.op.mnemonic}: {sctx.kind.value}")
        steps.append(fn)
    if any(k.endswith(KernelKind.REFERENCE.value) for k in kinds):
        ctx.kind = KernelKind.REFERENCE
    if ctx.native:  # consecutive native kernels: one C call (the executor's native schedule)
        from rlx.backends.cpu.native.schedule import segments

        steps = segments(steps)
    ctx.notes.append(
        f"{node.op.mnemonic} %{node.id} runs "
        + ", ".join(sorted(kinds))
        + f" in {len(steps)} call(s)"
    )

    def run() -> None:
        for f in steps:
            f()

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    FusedAttentionBlock: (block_kernel,),
    FusedTransformerLayer: (block_kernel,),
}
