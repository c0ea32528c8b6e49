"""CPU kernels of the mixture-of-experts ops (``rlx/ops/moe.py``): dequant_grouped_matmul
and dequant_moe_weights. In: the node and its arena views. Out: closures computing the
node into its output view.

``DequantGroupedMatMul``: each run sorts the token rows by expert (a stable argsort of
the ids), gathers each selected expert's rows into one contiguous f32 block and runs the
native dequant GEMM (``native/dqgemm.py``, the ``dequant_matmul`` kernel's library) on
that expert's packed slab ``packed[e]``: a GEMV streaming the slab once for a few rows,
the tiled GEMM for more (a file-mapped GGUF stack is repacked once, every expert's rows
interleaved: ``kernels/quant.py``'s ``repacked_weight``). Experts no token picked are never read. The results are
scattered back to the tokens' rows. Without the native library (no gcc,
``CompileOptions(native=False)``, a scheme it lacks) the selected experts are decoded
(``rlx.formats.gguf``) and multiplied with BLAS, still only the selected ones.

``DequantMoEWeights``: the stack decoded once per change of its bytes (a constant stack
at compile time) by the native decoder, or by ``rlx.formats.gguf`` without it, then
transposed into the ``[E, K, N]`` output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind
from rlx.backends.cpu.engines.weights import WeightCache
from rlx.errors import CompileError
from rlx.formats.schemes import dequantize_weight
from rlx.ops.core import Constant
from rlx.ops.moe import DequantGroupedMatMul, DequantMoEWeights

if TYPE_CHECKING:
    from rlx.backends.cpu.native.dqgemm import DqGemmLib
    from rlx.ir.mir import Node

__all__ = ["dequant_grouped_matmul_kernel", "dequant_moe_weights_kernel"]


def _lib(ctx: KernelCtx, node: Node) -> DqGemmLib | None:
    """The native dequant GEMM when it can run this node, else None (with a note)."""
    from rlx.backends.cpu.native import dqgemm

    op = node.op
    name = op.mnemonic
    if not ctx.native:
        ctx.notes.append(f"{name} %{node.id}: native kernels off, selected experts decoded")
        return None
    if type(op.scheme) not in dqgemm.SUPPORTED:  # type: ignore[attr-defined]
        ctx.notes.append(f"{name} %{node.id}: no native kernel for {op.scheme}")  # type: ignore[attr-defined]
        return None
    try:
        return dqgemm.dqgemm_lib()
    except CompileError as e:
        first = e.bare_message.splitlines()[0]
        ctx.notes.append(f"{name} %{node.id}: native kernel unavailable ({first})")
        return None


@kind(KernelKind.NATIVE)
def dequant_grouped_matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Rows grouped by expert; one native dequant GEMM (or decode + BLAS) per selected
    expert on its packed slab."""
    op: DequantGroupedMatMul = node.op  # type: ignore[assignment]
    x, w, idx = ins
    m, k = x.shape
    e_count, n = w.shape[0], w.shape[1]
    if m == 0:
        return lambda: None
    lib = _lib(ctx, node)
    if lib is None:
        ctx.kind = KernelKind.BLAS
    threads = ctx.num_threads
    xs = ctx.scratch((m, k), np.float32, 80)  # x's rows sorted by expert
    ys = ctx.scratch((m, n), np.float32, 81)  # their results
    ids = ctx.scratch((m,), np.int64, 82)
    scheme = op.scheme
    rows = 1
    if lib is not None:
        from rlx.backends.cpu.kernels.quant import repacked_weight

        w, rows = repacked_weight(ctx, node, 1, scheme, w, lib)  # every expert interleaved
    slabs = [w[e] for e in range(e_count)]  # views: no copy, no decode
    ctx.notes.append(
        f"dequant_grouped_matmul %{node.id}: rows grouped by expert, "
        + (f"native {scheme} dequant GEMM per selected expert" if lib else "decode + BLAS")
    )

    def run() -> None:
        np.copyto(ids, idx, casting="unsafe")
        if ids.min() < 0 or ids.max() >= e_count:
            op.check_ids(ids, e_count)
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        if x.dtype == np.float32:
            np.take(x, order, axis=0, out=xs)
        else:
            xs[...] = x[order]
        cuts = np.flatnonzero(np.diff(sorted_ids)) + 1
        starts = [0, *cuts.tolist()]
        ends = [*cuts.tolist(), m]
        for lo, hi in zip(starts, ends, strict=True):
            e = int(sorted_ids[lo])
            if lib is not None:
                lib.gemm(
                    scheme,
                    xs[lo:hi],
                    (slabs[e],),
                    ys[lo:hi],
                    num_threads=threads,
                    check=False,
                    rows=rows,
                )
            else:
                np.matmul(xs[lo:hi], dequantize_weight(scheme, slabs[e]).T, out=ys[lo:hi])
        out[order] = ys

    return run


@kind(KernelKind.NATIVE)
def dequant_moe_weights_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """The stack decoded (native decoder, or ``rlx.formats.gguf``) when its bytes change,
    then written transposed into the ``[E, K, N]`` output."""
    op: DequantMoEWeights = node.op  # type: ignore[assignment]
    (w,) = ins
    e_count, n = w.shape[0], w.shape[1]
    k = out.shape[1]
    lib = _lib(ctx, node)
    if lib is None:
        ctx.kind = KernelKind.NUMPY

    def decode(stack: np.ndarray) -> np.ndarray:
        if lib is not None:
            return np.stack([lib.decode(op.scheme, (stack[e],), n, k) for e in range(e_count)])
        return np.stack([dequantize_weight(op.scheme, stack[e]) for e in range(e_count)])

    const = isinstance(ctx.graph.nodes[node.inputs[0]].op, Constant)
    decoded = WeightCache([w], const, decode)

    def run() -> None:
        np.copyto(out, decoded.get().transpose(0, 2, 1), casting="unsafe")

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    DequantGroupedMatMul: (dequant_grouped_matmul_kernel,),
    DequantMoEWeights: (dequant_moe_weights_kernel,),
}
