"""The int8 GEMM with its fused f32 epilogue, as the integer kernels call it
(``kernels/qmatmul.py``: qmatmul, dynamic_qmatmul, dynamic_qbatch_matmul;
``kernels/qconv.py``: qconv2d). In: the node, its arena views and the kernel context.
Out: a closure writing the f32 result (``fused_gemm``), or the exact f64 BLAS fallback
(``blas_fallback``).

They run ``native.qgemm_lib`` (the best path the selected target holds, ``RLX_ISA``:
AVX-512 VNNI, AVX2, on aarch64 SMMLA, SDOT or NEON, or plain C) on ``KernelCtx.num_threads`` threads, with the whole
epilogue (row scale x channel scale, bias, activation, residual) applied to each tile in
registers. The int8 weight is packed once (``engines.weights.packed_weight``): at compile
time when it is a constant (what the quantization lowering produces), in a prologue step
once per param change when it only changes with the params (``KernelCtx.stable``),
otherwise at the first run and again only when its bytes change (compared with the copy
it was packed from). Without gcc, when the build fails, or with
``CompileOptions(native=False)``, the kernels compute the same exact integer accumulator
with a float64 BLAS matmul (exact while ``K * 255 * 128 < 2**53``) and the epilogue in
NumPy, and say so in the kernel notes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx.backends.cpu import native
from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind
from rlx.backends.cpu.engines.weights import packed_weight
from rlx.errors import CompileError
from rlx.ir.mir import Node
from rlx.ops.core import Constant
from rlx.ops.qmatmul import IntEpilogueOp

__all__ = ["lib_or_note", "as_f32", "fused_gemm", "blas_fallback"]

_F32 = np.dtype(np.float32)


def lib_or_note(ctx: KernelCtx, node: Node) -> native.QGemmLib | None:
    """The native library, or None (with a note saying why)."""
    name = f"{node.op.mnemonic} %{node.id}"
    if not ctx.native:
        ctx.notes.append(f"{name}: native kernels off (CompileOptions.native=False), f64 BLAS")
        return None
    try:
        return native.qgemm_lib()
    except CompileError as e:
        first = e.bare_message.splitlines()[0]
        ctx.notes.append(f"{name}: native int8 GEMM unavailable, exact f64 BLAS fallback ({first})")
        return None


def as_f32(a: np.ndarray, shape: tuple[int, ...], ctx: KernelCtx, tag: int) -> tuple:
    """``a`` reshaped to ``shape`` when it is C-contiguous f32, else an f32 scratch filled
    by the returned step (None when no copy is needed)."""
    if a.dtype == _F32 and a.flags.c_contiguous:
        return a.reshape(shape), None
    buf = ctx.scratch(shape, _F32, tag)
    src = a.reshape(shape) if a.size == buf.size else a
    return buf, lambda: np.copyto(buf, src, casting="unsafe")


def fused_gemm(
    node: Node,
    ins: list[np.ndarray],
    out: np.ndarray,
    ctx: KernelCtx,
    x_rows: np.ndarray,
    x_prep: Callable[[], None] | None,
    call: dict,
) -> Kernel | None:
    """The native kernel: ``lib.run`` on ``x_rows`` [M, K] with the epilogue of ``node``;
    None without the native library."""
    op: IntEpilogueOp = node.op  # type: ignore[assignment]
    lib = lib_or_note(ctx, node)
    if lib is None:
        return None
    w = ins[1]
    k, n = w.shape
    m = x_rows.shape[0]
    packed = packed_weight(ctx, node, 1, w, lib.pack)
    preps = [x_prep] if x_prep is not None else []
    j = 2
    bias = residual = None
    if op.has_bias:
        bias, p = as_f32(ins[j], (n,), ctx, node.id * 8 + 1)
        preps += [p] if p is not None else []
        j += 1
    if op.residual_input:
        residual, p = as_f32(ins[j], (m, n), ctx, node.id * 8 + 2)
        preps += [p] if p is not None else []
    act = op.epilogue_act
    ws = op.w_scale_vector(n)
    y = out.reshape(m, n)
    ctx.kind = KernelKind.NATIVE
    kw = dict(call, w_scales=ws, bias=bias, residual=residual, out_f32=y)
    kw["act"] = act.value if act is not None else None
    bound = lib.bind(x_rows, n, num_threads=ctx.num_threads, **kw)  # type: ignore[arg-type]

    def run() -> None:
        for p in preps:
            p()
        bound(packed())  # type: ignore[arg-type]

    if not preps and isinstance(ctx.graph.nodes[node.inputs[1]].op, Constant):
        # a constant weight, packed at compile time, and nothing to copy first: the run is
        # one C call, which the native schedule makes from its descriptor loop
        run.native_call = bound.fixed(packed())  # type: ignore[attr-defined]
    return run


def blas_fallback(
    node: Node,
    ins: list[np.ndarray],
    out: np.ndarray,
    ctx: KernelCtx,
    quantize: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> Kernel:
    """The exact f64 BLAS path: ``quantize()`` gives ``(q - zp as f64 [M, K], row
    scales f32 [M] or [1], None)``; the epilogue in NumPy."""
    op: IntEpilogueOp = node.op  # type: ignore[assignment]
    w = ins[1]
    n = w.shape[1]
    w64 = packed_weight(ctx, node, 1, w, lambda a: a.astype(np.float64))
    ctx.kind = KernelKind.BLAS
    ws = op.w_scale_vector(n)
    y = out.reshape(-1, n)

    def run() -> None:
        xq, rs, _ = quantize()
        acc = xq @ w64()
        with np.errstate(all="ignore"):
            v = acc.astype(np.float32) * (rs[:, None] * ws[None, :])
        y[...] = op.epilogue(v.reshape(out.shape), ins).reshape(y.shape)

    return run
