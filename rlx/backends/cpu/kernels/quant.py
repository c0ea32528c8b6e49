"""CPU kernels of the quantized ops. In: a QMatMul / Quantize / Dequantize
node and its arena views. Out: closures computing the node into its output view.

``QMatMul`` runs the native int8 GEMM (``native.qgemm_lib``: the best path the selected
native target holds, ``RLX_ISA``: AVX-512 VNNI, AVX2 or plain C) with the f32 rescale and bias fused into its
epilogue, on ``KernelCtx.num_threads`` threads (``CompileOptions.num_threads``). The weight is packed once: at compile time for a constant weight (what the
quantization lowering produces); a param weight at its first run and again only when its
bytes change (``set_param``): each run compares the param with the copy it packed from
(one read of K*N bytes). Without gcc, when the build fails, or with ``CompileOptions(native=False)``
(``KernelCtx.native``), the kernel computes the same exact integer result with a float64
BLAS matmul (exact while ``K * 255 * 128 < 2**53``) and says so in the kernel notes.

``DequantMatMul``'s kernel is in ``kernels.dequant``. ``Quantize`` of f32 runs natively when per-tensor to 8 bits (and
``native`` is on), otherwise as a few NumPy calls into a scratch buffer; ``Dequantize`` is NumPy. They all round
exactly as the ops' reference implementations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlx.backends.cpu import native
from rlx.backends.cpu.kernels import Kernel, KernelCtx, KernelKind, kernel
from rlx.dtype import DType
from rlx.errors import CompileError
from rlx.ir.mir import Node
from rlx.ops.core import Constant
from rlx.ops.qmatmul import apply_epilogue
from rlx.ops.quant import (
    QUANT_RANGES,
    Dequantize,
    DynamicQMatMul,
    QMatMul,
    Quantize,
)

__all__ = [
    "WeightCache",
    "qmatmul_kernel",
    "quantize_kernel",
    "dequantize_kernel",
]


class WeightCache:
    """A value derived from some input arrays (a packed or decoded weight), rebuilt only
    when those inputs change. Constant inputs (already in the arena when the kernels are
    built) are derived right away, at compile time, and never re-checked."""

    def __init__(self, ins: list[np.ndarray], constant: bool, derive: Callable[..., Any]):
        self.ins = ins
        self.constant = constant
        self.derive = derive
        self.value: Any = None
        self.seen: list[np.ndarray] | None = None
        if constant:
            self.value = derive(*ins)

    def get(self) -> Any:
        if self.value is not None and (
            self.constant or all(np.array_equal(a, b) for a, b in zip(self.ins, self.seen or []))
        ):
            return self.value
        self.value = self.derive(*self.ins)
        if not self.constant:
            self.seen = [a.copy() for a in self.ins]
        return self.value


def _all_constant(ctx: KernelCtx, node: Node, idx: range) -> bool:
    return all(isinstance(ctx.graph.nodes[node.inputs[i]].op, Constant) for i in idx)


def _native_or_none() -> native.QGemmLib | None:
    try:
        return native.qgemm_lib()
    except CompileError:
        return None


def _rows(a: np.ndarray, k: int) -> np.ndarray:
    """[..., K] -> [M, K] without a copy when ``a`` is contiguous."""
    return a.reshape(-1, k)


@kernel(QMatMul, KernelKind.NATIVE)
def qmatmul_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """int8 x int8 -> int32 -> f32 (native GEMM, or the exact f64 BLAS fallback)."""
    op: QMatMul = node.op  # type: ignore[assignment]
    x, w = ins[0], ins[1]
    k, n = w.shape
    scale = op.combined_scales(n)
    unsigned = x.dtype == np.uint8
    zp = op.x_zero_point - 128 if unsigned else op.x_zero_point
    const_w = _all_constant(ctx, node, range(1, 2))
    bias_f32 = ctx.scratch((n,), np.float32, tag=node.id) if op.has_bias else None
    m = int(np.prod(x.shape[:-1], dtype=np.int64))
    y = out.reshape(m, n)
    post = _numpy_epilogue(op, ins, y)
    lib: native.QGemmLib | None = None
    if not ctx.native:
        ctx.notes.append(
            f"qmatmul %{node.id}: native kernels off (CompileOptions.native=False), exact f64 BLAS"
        )
    else:
        try:
            lib = native.qgemm_lib()
        except CompileError as e:
            ctx.notes.append(
                f"qmatmul %{node.id}: native int8 GEMM unavailable, exact f64 BLAS fallback ({e.bare_message.splitlines()[0]})"
            )
    if lib is None:
        ctx.kind = KernelKind.BLAS
    else:
        threads, gemm = ctx.num_threads, lib.gemm
        packed = WeightCache([w], const_w, lib.pack)
        x_s8 = ctx.scratch((m, k), np.int8, tag=node.id) if unsigned else None

        def run() -> None:
            xa = _rows(x, k)
            if x_s8 is not None:  # u8 - zp == (u8 ^ 0x80 as i8) - (zp - 128)
                np.bitwise_xor(xa.view(np.uint8), np.uint8(0x80), out=x_s8.view(np.uint8))
                xa = x_s8
            elif not xa.flags.c_contiguous:
                xa = np.ascontiguousarray(xa)
            if bias_f32 is not None:
                np.copyto(bias_f32, ins[2], casting="unsafe")
            gemm(
                xa,
                packed.get(),
                n,
                a_zero_point=zp,
                out_f32=y,
                scale=scale,
                bias=bias_f32,
                num_threads=threads,
            )
            post()

        return run

    w64 = WeightCache([w], const_w, lambda a: a.astype(np.float64))

    def run_fallback() -> None:
        xa = _rows(x, k).astype(np.float64) - float(op.x_zero_point)
        acc = xa @ w64.get()
        np.multiply(acc.astype(np.float32), scale, out=y)
        if op.has_bias:
            np.add(y, ins[2].astype(np.float32), out=y)
        post()

    return run_fallback


def _numpy_epilogue(op: QMatMul, ins: list[np.ndarray], y: np.ndarray) -> Kernel:
    """The activation and residual of ``op``'s epilogue on the biased product ``y``."""
    act = op.epilogue_act
    res = ins[-1] if op.residual_input else None
    n = y.shape[-1]

    def post() -> None:
        if act is not None:
            y[...] = apply_epilogue(y, act, None, None)
        if res is not None:
            np.add(y, res.reshape(-1, n), out=y, casting="unsafe")

    return post


@kernel(DynamicQMatMul, KernelKind.NUMPY)
def dynamic_qmatmul_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """Per-row quantization and the integer product in NumPy (exact int64)."""
    op: DynamicQMatMul = node.op  # type: ignore[assignment]

    def run() -> None:
        out[...] = op.reference(ins, None)  # type: ignore[arg-type]

    return run


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


@kernel(Quantize, KernelKind.NUMPY)
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


@kernel(Dequantize, KernelKind.NUMPY)
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
