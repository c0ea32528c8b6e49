"""CPU kernel of DequantMatMul (weight-only quantized matmul). In: a DequantMatMul node,
its activation view ``x [..., K]`` and its packed weight views (``(packed,)`` for the GGUF
schemes, ``(w_q, scale, zp)`` otherwise). Out: a closure computing ``x @ dequant(w).T``
into the f32 output view.

The native kernel (``native/dqgemm.py``, ``csrc/dqgemm.c``, built for the selected target,
``RLX_ISA``) reads the packed bytes on every run: nothing is decoded ahead of time, so a
param weight needs no cache and a new ``set_param`` is seen at once. Batch < 4 rows run
as a GEMV streaming the weight once (fused decode-dot row kernels for Q8_0, Q5_0, Q4_K,
Q6_K, Int8Block and Int4Block on AVX2 / AVX-512; a block-decode-then-FMA path for the
rest); larger batches decode panels of the weight into L1-sized f32 tiles for an FMA
micro-kernel. With ``RLX_DQ_ACT=auto`` (Q8_0, Q5_0, Q4_K and Q6_K at batch < 4) or
``q8`` the activations are quantized to int8 per 32 inputs and the products are
integer dot products (``csrc/dqgemm_q8.c``, VNNI / AVX2 / C), as llama.cpp decodes; the
default ``f32`` keeps them exact. Threads: ``KernelCtx.num_threads``. Non-f32 or strided ``x`` is copied
into an f32 scratch first.

Without gcc, when the build fails, or with ``CompileOptions(native=False)``, the weight
is decoded to f32 once (again only when a param's bytes change) and each run is one BLAS
matmul; the kernel notes say which path was taken.
"""

from __future__ import annotations

import numpy as np

from rlx import config
from rlx.backends.cpu.kernels import Kernel, KernelCtx, KernelKind, kernel
from rlx.backends.cpu.kernels.quant import WeightCache
from rlx.backends.cpu.native import dqgemm
from rlx.errors import CompileError, QuantizationError
from rlx.ir.mir import Node
from rlx.ops.core import Constant, Param
from rlx.ops.quant import DequantMatMul, dequantize_weight

__all__ = ["dequant_matmul_kernel"]


def _input_name(ctx: KernelCtx, node: Node, i: int) -> str:
    op = ctx.graph.nodes[node.inputs[i]].op
    return op.name if isinstance(op, Param) else f"%{node.inputs[i]}"  # type: ignore[attr-defined]


def _native_lib(ctx: KernelCtx, node: Node, op: DequantMatMul):  # noqa: ANN202
    """The native library when it can run this node, else None (with a note saying why)."""
    if not ctx.native:
        ctx.notes.append(
            f"dequant_matmul %{node.id}: native kernels off (CompileOptions.native=False), "
            "weight decoded once + BLAS"
        )
        return None
    if type(op.scheme) not in dqgemm.SUPPORTED:
        ctx.notes.append(f"dequant_matmul %{node.id}: no native kernel for {op.scheme}, BLAS")
        return None
    try:
        return dqgemm.dqgemm_lib()
    except CompileError as e:
        first = e.bare_message.splitlines()[0]
        ctx.notes.append(
            f"dequant_matmul %{node.id}: native kernel unavailable, decode + BLAS ({first})"
        )
        return None


@kernel(DequantMatMul, KernelKind.NATIVE)
def dequant_matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Native: GEMV / tiled GEMM on the packed bytes. Fallback: decode once + BLAS."""
    op: DequantMatMul = node.op  # type: ignore[assignment]
    x = ins[0]
    k = x.shape[-1]
    n = out.shape[-1]
    weights = tuple(ins[1:])
    m = int(np.prod(x.shape[:-1], dtype=np.int64))
    y = out.reshape(m, n)
    needs_copy = x.dtype != np.float32 or not x.flags.c_contiguous
    x_f32 = ctx.scratch(x.shape, np.float32, tag=node.id) if needs_copy else None
    lib = _native_lib(ctx, node, op) if out.flags.c_contiguous else None
    if lib is not None:
        names = tuple(_input_name(ctx, node, i) for i in range(1, len(node.inputs)))
        threads = ctx.num_threads
        act = config.dq_act()
        path = "GEMV" if m < 4 else "tiled GEMM"
        if dqgemm.uses_q8(op.scheme, m, act):
            path = "int8-activation GEMV" if m < 4 else "int8-activation GEMM"
        try:
            xa = (x if x_f32 is None else x_f32).reshape(m, k)
            call = lib.bind(op.scheme, xa, weights, y, num_threads=threads, names=names, act=act)
        except QuantizationError as e:
            raise QuantizationError(f"dequant_matmul %{node.id}: {e.bare_message}") from None
        ctx.notes.append(
            f"dequant_matmul %{node.id}: native {op.scheme} {path} on the packed bytes "
            f"({lib.target.value}, {threads} thread(s))"
        )
        if x_f32 is None:
            return call

        def run() -> None:
            np.copyto(x_f32, x, casting="unsafe")
            call()

        return run

    ctx.kind = KernelKind.BLAS
    const = all(
        isinstance(ctx.graph.nodes[node.inputs[i]].op, Constant) for i in range(1, len(node.inputs))
    )
    decoded = WeightCache(
        list(weights),
        const,
        lambda *ws: np.ascontiguousarray(dequantize_weight(op.scheme, *ws).T),
    )

    def run_blas() -> None:
        xa = x
        if x_f32 is not None:
            np.copyto(x_f32, x, casting="unsafe")
            xa = x_f32
        np.matmul(xa.reshape(-1, k), decoded.get(), out=y)

    return run_blas
