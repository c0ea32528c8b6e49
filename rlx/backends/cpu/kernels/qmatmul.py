"""CPU kernels of the integer GEMMs (``rlx/ops/qmatmul.py``): ``qmatmul`` (int8 / uint8
activations, static scale), ``dynamic_qmatmul`` (f32 / bf16 activations quantized per row
inside the GEMM) and ``dynamic_qbatch_matmul`` (two activations, batched). In: the node
and its arena views. Out: a closure writing the f32 result.

Each runs the native int8 GEMM with its fused epilogue (``engines.qgemm``: the weight
packed once, row scale x channel scale, bias, activation and residual applied to each
tile), or, without the native library, the exact f64 BLAS accumulator with the epilogue
in NumPy (noted in the report).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind
from rlx.backends.cpu.engines.qgemm import as_f32, blas_fallback, fused_gemm, lib_or_note
from rlx.dtype import DType
from rlx.ir.mir import Node
from rlx.ops.qmatmul import (
    ActQuant,
    DynamicQBatchMatMul,
    DynamicQMatMul,
    QMatMul,
    dynamic_quantize_rows,
)
from rlx.ops.quant import QUANT_RANGES, quantize_array

__all__ = ["qmatmul_kernel", "dynamic_qmatmul_kernel", "dynamic_qbatch_matmul_kernel"]

_F32 = np.dtype(np.float32)


@kind(KernelKind.NATIVE)
def qmatmul_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """int8 / uint8 x int8 -> int32 -> fused f32 epilogue; with ``x_dtype`` the float rows
    are quantized (one scale and zero point) inside the kernel."""
    op: QMatMul = node.op  # type: ignore[assignment]
    x = ins[0]
    k = x.shape[-1]
    m = out.size // max(out.shape[-1], 1) if out.ndim else 1
    call = {"a_zero_point": op.x_zero_point, "a_scale": op.x_scale}
    prep = None
    if op.x_dtype is not None:
        call["mode"] = 2 if op.x_dtype is DType.I8 else 3
        if x.dtype.name in ("float32", "bfloat16") and x.flags.c_contiguous:
            rows = x.reshape(m, k)
        else:
            rows, prep = as_f32(x, (m, k), ctx, node.id * 8 + 3)
    elif x.flags.c_contiguous:
        rows = x.reshape(m, k)
    else:
        buf = ctx.scratch((m, k), x.dtype, node.id * 8 + 3)
        rows, prep = buf, (lambda: np.copyto(buf, x.reshape(m, k)))
    fn = fused_gemm(node, ins, out, ctx, rows, prep, call)
    if fn is not None:
        return fn
    rs = np.asarray([op.x_scale], np.float32)

    def quantize() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        xq = x.reshape(m, k)
        if op.x_dtype is not None:
            lo, hi = QUANT_RANGES[op.x_dtype]
            xq = quantize_array(xq, (op.x_scale,), (op.x_zero_point,), None, lo, hi)
        q = xq.astype(np.float64) - float(op.x_zero_point)
        return q, np.broadcast_to(rs, (m,)), None  # type: ignore[return-value]

    return blas_fallback(node, ins, out, ctx, quantize)


@kind(KernelKind.NATIVE)
def dynamic_qmatmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Float rows quantized per row inside the int8 GEMM, fused f32 epilogue."""
    op: DynamicQMatMul = node.op  # type: ignore[assignment]
    x = ins[0]
    k = x.shape[-1]
    m = out.size // max(out.shape[-1], 1) if out.ndim else 1
    if x.dtype.name in ("float32", "bfloat16") and x.flags.c_contiguous:
        rows, prep = x.reshape(m, k), None
    else:
        rows, prep = as_f32(x, (m, k), ctx, node.id * 8 + 3)
    call = {"mode": 0 if op.mode is ActQuant.S8 else 1}
    fn = fused_gemm(node, ins, out, ctx, rows, prep, call)
    if fn is not None:
        return fn

    def quantize() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q, rs, zp = dynamic_quantize_rows(x.reshape(m, k), op.mode)
        return (q - zp[:, None]).astype(np.float64), rs, None  # type: ignore[return-value]

    return blas_fallback(node, ins, out, ctx, quantize)


@kind(KernelKind.NATIVE)
def dynamic_qbatch_matmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Both operands quantized per row inside the native batched int8 GEMM (batches in
    parallel); b's columns are copied to rows first unless ``transpose_b``."""
    op: DynamicQBatchMatMul = node.op  # type: ignore[assignment]
    a, b = ins
    m, k = a.shape[-2:]
    n = out.shape[-1]
    nb = out.size // max(m * n, 1)
    lib = lib_or_note(ctx, node)
    if lib is None or nb == 0:
        ctx.kind = KernelKind.NUMPY
        rctx = ctx.ref_ctx(out)
        return lambda: np.copyto(out, op.reference(ins, rctx))
    preps: list[Callable[[], None]] = []
    if a.dtype.name in ("float32", "bfloat16") and a.flags.c_contiguous:
        a3 = a.reshape(nb, m, k)
    else:
        a3 = ctx.scratch((nb, m, k), _F32, node.id * 8 + 4)
        preps.append(lambda: np.copyto(a3, a.reshape(nb, m, k), casting="unsafe"))
    if op.transpose_b and b.dtype == _F32 and b.flags.c_contiguous:
        bt = b.reshape(nb, n, k)
    else:
        bt = ctx.scratch((nb, n, k), _F32, node.id * 8 + 5)
        src = b.reshape(nb, n, k) if op.transpose_b else np.swapaxes(b.reshape(nb, k, n), 1, 2)
        preps.append(lambda: np.copyto(bt, src, casting="unsafe"))
    y = out.reshape(nb, m, n)
    mode = 0 if op.a_mode is ActQuant.S8 else 1
    threads, alpha, run_ = ctx.num_threads, op.alpha, lib.batch_run

    def run() -> None:
        for p in preps:
            p()
        run_(a3, bt, y, a_mode=mode, alpha=alpha, num_threads=threads)

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    QMatMul: (qmatmul_kernel,),
    DynamicQMatMul: (dynamic_qmatmul_kernel,),
    DynamicQBatchMatMul: (dynamic_qbatch_matmul_kernel,),
}
