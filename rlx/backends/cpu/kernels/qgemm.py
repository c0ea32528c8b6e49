"""CPU kernels of the integer GEMMs with a fused epilogue: ``qmatmul`` (int8 / uint8
activations, static scale) and ``dynamic_qmatmul`` (f32 / bf16 activations quantized per row
inside the GEMM), ``dynamic_qbatch_matmul`` (two activations, batched) and ``qconv2d``
(im2col of the integer input, then the same GEMM per group). In: the node and its arena
views. Out: a closure writing the f32 result.

Both run ``native.qgemm_lib`` (the best path the selected target holds, ``RLX_ISA``:
AVX-512 VNNI, AVX2 or plain C) on ``KernelCtx.num_threads`` threads, with the whole
epilogue (row scale x channel scale, bias, activation, residual) applied to each tile in
registers. The int8 weight is packed once: at compile time when it is a constant (what the
quantization lowering produces), in a prologue step once per param change when it only
changes with the params (``KernelCtx.stable``), otherwise at the first run and again only
when its bytes change (compared with the copy it was packed from). Without gcc, when the
build fails, or with ``CompileOptions(native=False)``, the kernels compute the same exact
integer accumulator with a float64 BLAS matmul (exact while ``K * 255 * 128 < 2**53``)
and the epilogue in NumPy, and say so in the kernel notes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx.backends.cpu import native
from rlx.backends.cpu.kernels import Kernel, KernelCtx, KernelKind, kernel
from rlx.backends.cpu.kernels.seed import qconv2d_kernel as seed_qconv2d_kernel
from rlx.dtype import DType
from rlx.errors import CompileError
from rlx.ir.mir import Node
from rlx.ops.core import Constant
from rlx.ops.nn import _window_view
from rlx.ops.qconv import QConv2d
from rlx.ops.qmatmul import (
    ActQuant,
    DynamicQBatchMatMul,
    DynamicQMatMul,
    IntEpilogueOp,
    QMatMul,
    dynamic_quantize_rows,
)
from rlx.ops.quant import QUANT_RANGES, quantize_array

__all__ = [
    "qmatmul_kernel",
    "dynamic_qmatmul_kernel",
    "dynamic_qbatch_matmul_kernel",
    "qconv2d_kernel",
    "packed_weight",
]

_F32 = np.dtype(np.float32)


def _lib(ctx: KernelCtx, node: Node) -> native.QGemmLib | None:
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


def packed_weight(
    ctx: KernelCtx, node: Node, i: int, w: np.ndarray, derive: Callable[[np.ndarray], object]
) -> Callable[[], object]:
    """A getter of ``derive(w)`` for input ``i`` of ``node``, derived as rarely as the
    input allows (see the module docstring). Constant and param-only weights are kept once
    per compiled graph (``KernelCtx.keep``), shared by the schedules of every shape."""
    src = ctx.graph.nodes[node.inputs[i]]
    isa = getattr(getattr(derive, "__self__", None), "isa", None)
    key = ("qgemm.pack", node.id, node.inputs[i], w.shape, getattr(derive, "__qualname__", ""), isa)
    if isinstance(src.op, Constant):
        value = ctx.keep(key, lambda: derive(w))
        return lambda: value
    if node.inputs[i] in ctx.stable:
        box: list[object] = ctx.keep(key, lambda: [None])

        def prep() -> None:
            box[0] = derive(w)

        ctx.prologue_once(key, prep)
        return lambda: box[0]
    seen: list[np.ndarray | None] = [None]
    box2: list[object] = [None]

    def get() -> object:
        if seen[0] is None or not np.array_equal(seen[0], w):
            box2[0] = derive(w)
            seen[0] = w.copy()
        return box2[0]

    return get


def _as_f32(a: np.ndarray, shape: tuple[int, ...], ctx: KernelCtx, tag: int) -> tuple:
    """``a`` reshaped to ``shape`` when it is C-contiguous f32, else an f32 scratch filled
    by the returned step (None when no copy is needed)."""
    if a.dtype == _F32 and a.flags.c_contiguous:
        return a.reshape(shape), None
    buf = ctx.scratch(shape, _F32, tag)
    src = a.reshape(shape) if a.size == buf.size else a
    return buf, lambda: np.copyto(buf, src, casting="unsafe")


def _fused(
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
    lib = _lib(ctx, node)
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
        bias, p = _as_f32(ins[j], (n,), ctx, node.id * 8 + 1)
        preps += [p] if p is not None else []
        j += 1
    if op.residual_input:
        residual, p = _as_f32(ins[j], (m, n), ctx, node.id * 8 + 2)
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

    return run


def _fallback(
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


@kernel(QMatMul, KernelKind.NATIVE)
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
            rows, prep = _as_f32(x, (m, k), ctx, node.id * 8 + 3)
    elif x.flags.c_contiguous:
        rows = x.reshape(m, k)
    else:
        buf = ctx.scratch((m, k), x.dtype, node.id * 8 + 3)
        rows, prep = buf, (lambda: np.copyto(buf, x.reshape(m, k)))
    fn = _fused(node, ins, out, ctx, rows, prep, call)
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

    return _fallback(node, ins, out, ctx, quantize)


@kernel(DynamicQMatMul, KernelKind.NATIVE)
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
        rows, prep = _as_f32(x, (m, k), ctx, node.id * 8 + 3)
    call = {"mode": 0 if op.mode is ActQuant.S8 else 1}
    fn = _fused(node, ins, out, ctx, rows, prep, call)
    if fn is not None:
        return fn

    def quantize() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q, rs, zp = dynamic_quantize_rows(x.reshape(m, k), op.mode)
        return (q - zp[:, None]).astype(np.float64), rs, None  # type: ignore[return-value]

    return _fallback(node, ins, out, ctx, quantize)


@kernel(DynamicQBatchMatMul, KernelKind.NATIVE)
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
    lib = _lib(ctx, node)
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


@kernel(QConv2d, KernelKind.NATIVE, supersedes=seed_qconv2d_kernel)
def qconv2d_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """im2col of ``x_q`` (the border holds the zero point, a real 0) into int8 / uint8
    scratch, then one native int8 GEMM per group with the f32 epilogue (scale, bias),
    transposed into NCHW; the seed's exact f64 BLAS kernel without the native library."""
    op: QConv2d = node.op  # type: ignore[assignment]
    lib = _lib(ctx, node)
    if lib is None:
        return seed_qconv2d_kernel(node, ins, out, ctx)
    x, w = ins[:2]
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g, og = op.groups, o // op.groups
    (pt, pb), (pl, pr) = op.padding
    _, _, ho, wo = out.shape
    length, kk = ho * wo, cg * kh * kw
    xp = ctx.scratch((n, c, h + pt + pb, wd + pl + pr), x.dtype, node.id * 8 + 6)
    inner = xp[:, :, pt : pt + h, pl : pl + wd]
    zp = op.x_zero_point
    win = _window_view(xp, (kh, kw), op.stride, op.dilation)  # [N,C,Ho,Wo,kh,kw]
    cols = ctx.scratch((g, n * length, kk), x.dtype, node.id * 8 + 7)
    srcs = [win[:, i * cg : (i + 1) * cg].transpose(0, 2, 3, 1, 4, 5) for i in range(g)]
    dsts = [cols[i].reshape(n, ho, wo, cg, kh, kw) for i in range(g)]
    tmp = ctx.scratch((g, n * length, og), _F32, node.id * 8 + 8)
    ws = op.w_scale_vector(o)

    def pack_all(wa: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        return [lib.pack(wa[i * og : (i + 1) * og].reshape(og, kk).T) for i in range(g)]

    pack_all.__qualname__ = f"qconv2d.pack.{lib.isa.name}"
    packed = packed_weight(ctx, node, 1, w, pack_all)
    bias = None
    preps: list[Callable[[], None]] = []
    if op.has_bias:
        bias, p = _as_f32(ins[2], (o,), ctx, node.id * 8 + 1)
        preps += [p] if p is not None else []
    outv = out.reshape(n, g, og, length)
    threads, run_ = ctx.num_threads, lib.run
    ctx.kind = KernelKind.NATIVE

    def run() -> None:
        for p in preps:
            p()
        xp.fill(zp)  # scratch is shared with other kernels: rewrite the border every run
        np.copyto(inner, x)
        pw = packed()
        for i in range(g):
            np.copyto(dsts[i], srcs[i])
            sl = slice(i * og, (i + 1) * og)
            run_(
                cols[i], pw[i], og, a_zero_point=zp, a_scale=op.x_scale,  # type: ignore[index]
                w_scales=ws[sl], bias=None if bias is None else bias[sl],
                out_f32=tmp[i], num_threads=threads,
            )  # fmt: skip
            np.copyto(outv[:, i], tmp[i].reshape(n, length, og).transpose(0, 2, 1))

    return run
