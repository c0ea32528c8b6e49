"""CPU kernels of the quantized ops (``rlx/ops/quant.py``): quantize, dequantize,
fake_quantize and the weight-only dequant_matmul. In: the node and its arena views. Out:
closures computing the node into its output view. (The integer GEMMs are in
``kernels/qmatmul.py`` and ``kernels/qconv.py``.)

``Quantize`` of f32 runs natively when per-tensor to 8 bits (and ``native`` is on),
otherwise as a few NumPy calls into a scratch buffer; f64 inputs (computed in f64) and
f16 / bf16 / fp8 inputs (widened to f32) have their own attempt, tried first.
``Dequantize`` and ``FakeQuantize`` are NumPy. They all round exactly as the ops'
reference implementations.

``DequantMatMul`` (weight-only quantized matmul). In: its activation view ``x [..., K]``
and its packed weight views (``(packed,)`` for the GGUF schemes, ``(w_q, scale, zp)``
otherwise). Out: a closure computing ``x @ dequant(w).T`` into the f32 output view.

The native kernel (``native/dqgemm.py``, ``csrc/dqgemm.c``, built for the selected target,
``RLX_ISA``) reads the packed bytes on every run: nothing is decoded ahead of time, so a
param weight needs no cache and a new ``set_param`` is seen at once. Batch < 4 rows run
as a GEMV streaming the weight once (fused decode-dot row kernels for Q8_0, Q5_0, Q4_K,
Q6_K, Int8Block and Int4Block on AVX2 / AVX-512; a block-decode-then-FMA path for the
rest); 2..16 rows (batched decode) decode each weight row once and apply it to every row
(``csrc/dqgemm_small.c``, AVX2 / AVX-512); prompts (17 rows and more) on a GGUF scheme
take the prefill GEMM (``native/dqprefill.py``: weight tiles decoded into f32 panels of a
register-blocked FMA micro-kernel; with ``RLX_DQ_ACT=q8`` int8 activations and integer
dot products, ``PREFILL_KERNEL``), other larger batches decode panels
of the weight into L1-sized f32 tiles for an FMA micro-kernel. With ``RLX_DQ_ACT=auto`` (``dqgemm.Q8_SCHEMES`` at batch < 4) or
``q8`` the activations are quantized to int8 per 32 inputs and the products are
integer dot products (``csrc/dqgemm_q8.c``, VNNI / AVX2 / C), as llama.cpp decodes; the
default ``f32`` keeps them exact. Threads: ``KernelCtx.num_threads``. Non-f32 or strided
``x`` is copied into an f32 scratch first.

GGUF weights read in place from a file mapping are repacked once per compiled graph
(:func:`repacked_weight`, ``RLX_DQ_REPACK=1``, the default): rows interleaved by the
target's R (``dqgemm.repack_rows``: 8 on AVX-512, 4 on AVX2, portable and aarch64;
``csrc/dq_layout.h``), so a decode GEMV reads one sequential stream per group of R rows
sharing each X load; the file's pages are released as the copy is made.

Without gcc, when the build fails, or with ``CompileOptions(native=False)``, the weight
is decoded to f32 once (again only when a param's bytes change) and each run is one BLAS
matmul; the kernel notes say which path was taken.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx import config
from rlx.backends.cpu import native
from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind
from rlx.backends.cpu.engines.weights import WeightCache
from rlx.backends.cpu.memory import safe_to_share
from rlx.backends.cpu.native import dqgemm, dqprefill
from rlx.dtype import DType
from rlx.errors import CompileError, QuantizationError
from rlx.ir.mir import Node
from rlx.ops.core import Constant, Param
from rlx.ops.quant import (
    QUANT_RANGES,
    Dequantize,
    DequantMatMul,
    FakeQuantize,
    Quantize,
    dequantize_weight,
)

__all__ = [
    "quantize_to_int64",
    "fake_quantize_into",
    "wide_quantize_kernel",
    "quantize_kernel",
    "dequantize_kernel",
    "fake_quantize_kernel",
    "dequant_matmul_kernel",
    "repacked_weight",
]


def _all_constant(ctx: KernelCtx, node: Node, idx: range) -> bool:
    return all(isinstance(ctx.graph.nodes[node.inputs[i]].op, Constant) for i in idx)


def _native_or_none() -> native.QGemmLib | None:
    try:
        return native.qgemm_lib()
    except CompileError:
        return None


def _channel(op: Quantize | Dequantize, x: np.ndarray, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """Scales and zero points shaped to broadcast against ``x``."""
    shape = [1] * x.ndim
    if op.axis is not None:
        shape[op.axis % x.ndim] = len(op.scales)
    s = np.asarray(op.scales, dtype=dtype).reshape(shape)
    z = np.asarray(op.zero_points).reshape(shape)
    return s, z


def quantize_to_int64(
    src: np.ndarray,
    s: np.ndarray,
    z: np.ndarray,
    qmin: int,
    qmax: int,
    t: np.ndarray,
    q: np.ndarray,
    nan: np.ndarray,
) -> None:
    """``q = clip(int64(clip(rint(src / s), +-2**40)) + z, qmin, qmax)``, NaN quotients
    to 0, in the steps of ``quantize_array``; called inside a kernel's ``run``. ``t`` (float,
    ``src`` may be ``t`` itself), ``q`` (int64) and ``nan`` (bool) are scratch of ``src``'s
    shape; ``z`` is int64."""
    with np.errstate(all="ignore"):
        np.divide(src, s, out=t)
    np.rint(t, out=t)
    np.isnan(t, out=nan)
    np.copyto(t, 0.0, where=nan)
    np.clip(t, -(2.0**40), 2.0**40, out=t)
    np.copyto(q, t, casting="unsafe")
    np.add(q, z, out=q)
    np.clip(q, qmin, qmax, out=q)


def quantize_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``clip(rint(x / s) + zp)``: native for per-tensor 8-bit, else NumPy in an f32
    scratch (declines f64 and low-precision inputs: the default kernel handles them)."""
    op: Quantize = node.op  # type: ignore[assignment]
    x = ins[0]
    if x.dtype != np.float32:
        return None
    native_ok = op.axis is None and op.dtype in (DType.I8, DType.U8) and x.flags.c_contiguous
    if native_ok and ctx.native:
        lib = _native_or_none()
        if lib is not None:
            ctx.kind = KernelKind.NATIVE
            scale, zp = op.scales[0], op.zero_points[0]
            return lambda: lib.quantize(x, scale, zp, out)
    s, z = _channel(op, x, np.float32)
    zf = z.astype(np.float32)
    qmin, qmax = QUANT_RANGES[op.dtype]
    t = ctx.scratch(x.shape, np.float32, tag=node.id)
    if op.dtype is DType.I32:
        return _quantize_wide(x, s, z, qmin, qmax, t, out, ctx, node.id)

    def run() -> None:
        with np.errstate(all="ignore"):
            np.divide(x, s, out=t)
        np.rint(t, out=t)
        np.nan_to_num(t, copy=False, nan=0.0)
        np.add(t, zf, out=t)
        np.clip(t, qmin, qmax, out=t)
        np.copyto(out, t, casting="unsafe")

    return run


def _quantize_wide(
    x: np.ndarray,
    s: np.ndarray,
    z: np.ndarray,
    qmin: int,
    qmax: int,
    t: np.ndarray,
    out: np.ndarray,
    ctx: KernelCtx,
    tag: int,
) -> Kernel:
    """Quantize to I32: f32 cannot hold ``qmax`` (2**31 - 1 rounds to 2**31, which wraps to
    -2**31 when cast) nor ``rint(x / s) + zp`` beyond 2**24, so the zero point is added and
    the result saturated in an int64 scratch, after clipping the f32 quotient to +-2**40
    (exactly as ``quantize_array``)."""
    q = ctx.scratch(x.shape, np.int64, tag=tag + 1)
    nan = ctx.scratch(x.shape, np.bool_, tag=tag + 2)
    z64 = z.astype(np.int64)

    def run() -> None:
        quantize_to_int64(x, s, z64, qmin, qmax, t, q, nan)
        np.copyto(out, q, casting="unsafe")

    return run


def dequantize_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """``f32(q - zp) * s`` (the difference is exact in int32 / int64)."""
    op: Dequantize = node.op  # type: ignore[assignment]
    q = ins[0]
    s, z = _channel(op, q, np.float32)
    wide = np.int64 if q.dtype == np.int32 else np.int32
    d = ctx.scratch(q.shape, wide, tag=node.id)
    zw = z.astype(wide)

    def run() -> None:
        np.subtract(q, zw, out=d, dtype=wide)
        np.copyto(out, d, casting="unsafe")
        np.multiply(out, s, out=out)

    return run


def wide_quantize_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """Quantize from f64 (computed in f64) or f16 / bf16 / fp8 (widened to f32), in the
    reference's steps: ``rint(x / s)``, NaN to 0, clip to +-2**40, int64, ``+ zp``,
    clip to the dtype's range. f32 inputs are ``quantize_kernel``'s."""
    (x,) = ins
    if x.dtype == np.float32:
        return None
    op: Quantize = node.op  # type: ignore[assignment]
    ct = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    cs: tuple[int, ...] = ()
    if op.axis is not None:
        ax = op.axis % x.ndim
        cs = tuple(len(op.scales) if i == ax else 1 for i in range(x.ndim))
    s = np.asarray(op.scales, dtype=ct).reshape(cs)
    z = np.asarray(op.zero_points, dtype=np.int64).reshape(cs)
    qmin, qmax = QUANT_RANGES[op.dtype]
    t = ctx.scratch(x.shape, ct, 703)
    q = ctx.scratch(x.shape, np.int64, 704)
    nan = ctx.scratch(x.shape, np.bool_, 705)

    def run() -> None:
        np.copyto(t, x, casting="unsafe")
        quantize_to_int64(t, s, z, qmin, qmax, t, q, nan)
        np.copyto(out, q, casting="unsafe")

    return run


def fake_quantize_into(
    x: np.ndarray,
    s: np.ndarray,
    z: np.ndarray,
    qmin: int,
    qmax: int,
    out: np.ndarray,
    ctx: KernelCtx,
) -> Kernel:
    """A step writing ``(clip(rint(x / s) + z, qmin, qmax) - z) * s`` into ``out``,
    computed in ``s``'s float dtype: a float scratch holds x, the integer step runs in an
    int64 scratch (exact, as the reference); NaN maps to the zero point, +-inf saturate.
    ``z``: int64 zero points; ``s`` may be a scratch its caller refills before each run."""
    ct = s.dtype
    t = ctx.scratch(x.shape, ct, 60)
    q = ctx.scratch(x.shape, np.int64, 61)
    nan = ctx.scratch(x.shape, np.bool_, 62)
    direct = out.dtype == ct

    def run() -> None:
        np.copyto(t, x, casting="unsafe")
        quantize_to_int64(t, s, z, qmin, qmax, t, q, nan)
        np.subtract(q, z, out=q)
        np.copyto(t, q, casting="unsafe")
        if direct:
            np.multiply(t, s, out=out)
        else:
            np.multiply(t, s, out=t)
            np.copyto(out, t, casting="unsafe")

    return run


def fake_quantize_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``(clip(rint(x / s) + z, qmin, qmax) - z) * s`` in f32 (f64 for f64 inputs), the
    scales and zero points the op's (``fake_quantize_into``)."""
    (x,) = ins
    op = node.op
    ct = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    ax = None if op.axis is None else op.axis % x.ndim  # type: ignore[attr-defined]
    cs: tuple[int, ...] = ()
    if ax is not None:
        cs = tuple(len(op.scales) if i == ax else 1 for i in range(x.ndim))  # type: ignore[attr-defined]
    s = np.asarray(op.scales, dtype=ct).reshape(cs)  # type: ignore[attr-defined]
    z = np.asarray(op.zero_points, dtype=np.int64).reshape(cs)  # type: ignore[attr-defined]
    return fake_quantize_into(x, s, z, op.qmin, op.qmax, out, ctx)  # type: ignore[attr-defined]


# ---- dequant_matmul (weight-only quantization) ----------------------------------------------


def _input_name(ctx: KernelCtx, node: Node, i: int) -> str:
    op = ctx.graph.nodes[node.inputs[i]].op
    return op.name if isinstance(op, Param) else f"%{node.inputs[i]}"  # type: ignore[attr-defined]


#: whether prompts (``dqprefill.PREFILL_MIN_M`` rows and more, GGUF schemes, f32
#: activations) take the prefill kernel (``native/dqprefill.py``); False: the tiled GEMM
#: of ``native/dqgemm.py`` (kept for comparison)
PREFILL_KERNEL = True


def _prefill_call(
    ctx: KernelCtx, node: Node, op: DequantMatMul, xa: np.ndarray, weights: tuple, y: np.ndarray
) -> Any:
    """The prefill kernel's bound call for a prompt-sized product (``xa`` [M, K], f32),
    or None when it does not take this node (then ``native/dqgemm.py`` does)."""
    m = xa.shape[0]
    if not (PREFILL_KERNEL and ctx.native and dqprefill.runs_prefill(op.scheme, m)):
        return None
    act = "q8" if dqgemm.uses_q8(op.scheme, m, config.dq_act()) else "f32"
    if act == "q8" and type(op.scheme) not in dqprefill.Q8_PREFILL_SCHEMES:
        return None
    try:
        lib = dqprefill.dqprefill_lib()
    except CompileError:
        return None
    # the weight's row interleave (csrc/dq_layout.h): the copy the decode GEMVs read
    # (repacked once per compiled graph, shared through ctx.keep), so one copy is resident
    w, rows = weights[0], 1
    if op.scheme.is_gguf:
        try:
            dlib = dqgemm.dqgemm_lib()
        except CompileError:
            dlib = None
        if dlib is not None and dlib.target == lib.target:
            w, rows = repacked_weight(ctx, node, 1, op.scheme, w, dlib)
    try:
        call = lib.bind(
            op.scheme, xa, w, y, rows=rows, num_threads=ctx.num_threads,
            name=_input_name(ctx, node, 1), act=act,
        )  # fmt: skip
    except QuantizationError as e:
        raise QuantizationError(f"dequant_matmul %{node.id}: {e.bare_message}") from None
    ctx.notes.append(
        f"dequant_matmul %{node.id}: native {op.scheme} prefill GEMM "
        f"({'int8 activations' if act == 'q8' else 'f32 panels'}) on the packed bytes"
        f" ({lib.target.value}, {ctx.num_threads} thread(s))"
    )
    return call


def _dequant_lib(ctx: KernelCtx, node: Node, op: DequantMatMul):  # noqa: ANN202
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


def repacked_weight(
    ctx: KernelCtx,
    node: Node,
    i: int,
    scheme: Any,
    w: np.ndarray,
    lib: dqgemm.DqGemmLib,
) -> tuple[np.ndarray, int]:
    """``(weight, rows)`` for input ``i`` of ``node``, a packed ``[..., N, row_bytes]``
    weight read by ``lib``: a GGUF param read in place from a read-only file mapping (a
    GGUF file; it never changes) is repacked once per compiled graph into the interleaved
    layout of ``lib``'s target (``dqgemm.repack``, R = ``dqgemm.repack_rows``; every
    leading index, e.g. an expert, separately), the mapping's pages released slab by slab;
    anything else, or with ``RLX_DQ_REPACK=0``, is returned as is with rows = 1."""
    if (
        not getattr(scheme, "is_gguf", False)
        or type(scheme) not in dqgemm.Q8_SCHEMES
        or not dqgemm.repack_enabled()
        or w.ndim < 2
    ):
        return w, 1
    src = ctx.graph.nodes[node.inputs[i]].op
    # only a param read in place from a file mapping: its pages are released as it is
    # repacked, so the resident peak stays one copy (an array in memory would double)
    if not (isinstance(src, Param) and safe_to_share(w) and dqgemm.file_mapped(w)):
        return w, 1
    rows = dqgemm.repack_rows(lib.target)
    n, rb = w.shape[-2], w.shape[-1]
    lay = dqgemm.layout(scheme, 256)
    k = rb // lay.bb * lay.qk

    def make() -> tuple[np.ndarray, np.ndarray]:
        out = np.empty(w.shape, np.uint8)
        flat, res = w.reshape(-1, n, rb), out.reshape(-1, n, rb)
        # ~4 MB of rows (whole groups) at a time, each slab's mapped pages released once
        # copied: the resident peak stays one weight plus a slab, not two weights
        step = max(rows, (4 << 20) // max(rb, 1) // rows * rows)
        for e in range(flat.shape[0]):
            for a in range(0, n, step):
                b = n if n - a < step + rows else a + step  # the tail rows join the last slab
                dqgemm.repack(scheme, flat[e, a:b], b - a, k, rows, out=res[e, a:b])
                dqgemm.release_mapped(flat[e, a:b])
                if b == n:
                    break
        out.flags.writeable = False
        return w, out  # w kept: its mapping (so its address, the key) stays taken

    key = ("dqgemm.repack", w.ctypes.data, w.shape, type(scheme), rows)
    return ctx.keep(key, make)[1], rows


@kind(KernelKind.NATIVE)
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
    pre = None
    if out.flags.c_contiguous:
        xa = (x if x_f32 is None else x_f32).reshape(m, k)
        pre = _prefill_call(ctx, node, op, xa, weights, y)
    if pre is not None:
        if x_f32 is None:
            return pre  # type: ignore[no-any-return]

        def run_prefill() -> None:
            np.copyto(x_f32, x, casting="unsafe")
            pre()

        return run_prefill
    lib = _dequant_lib(ctx, node, op) if out.flags.c_contiguous else None
    if lib is not None:
        names = tuple(_input_name(ctx, node, i) for i in range(1, len(node.inputs)))
        threads = ctx.num_threads
        act = config.dq_act()
        path = "GEMV" if m < 4 else "tiled GEMM"
        if dqgemm.small_batch(lib, op.scheme, m):
            path = "small-batch GEMV"
        if dqgemm.uses_q8(op.scheme, m, act):
            path = "int8-activation GEMV" if m < 4 else "int8-activation GEMM"
        elif lib.uses_bf16(op.scheme, m, act):
            path = "GEMV (csrc/dqgemm_bf16dot.c)"
        try:
            xa = (x if x_f32 is None else x_f32).reshape(m, k)
            rows = 1
            if op.scheme.is_gguf:
                packed, rows = repacked_weight(ctx, node, 1, op.scheme, weights[0], lib)
                weights = (packed,)
            call = lib.bind(
                op.scheme, xa, weights, y, num_threads=threads, names=names, act=act, rows=rows
            )
        except QuantizationError as e:
            raise QuantizationError(f"dequant_matmul %{node.id}: {e.bare_message}") from None
        inter = f", rows interleaved by {rows}" if rows > 1 else ""
        ctx.notes.append(
            f"dequant_matmul %{node.id}: native {op.scheme} {path} on the packed bytes "
            f"({lib.target.value}, {threads} thread(s){inter})"
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


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Quantize: (wide_quantize_kernel, quantize_kernel),
    Dequantize: (dequantize_kernel,),
    FakeQuantize: (fake_quantize_kernel,),
    DequantMatMul: (dequant_matmul_kernel,),
}
