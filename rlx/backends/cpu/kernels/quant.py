"""CPU kernels of the quantized ops. In: a Quantize / Dequantize node and its arena views.
Out: closures computing the node into its output view. (The integer GEMMs ``qmatmul`` and
``dynamic_qmatmul`` are in ``kernels.qgemm``.)

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
from rlx.ops.quant import (
    QUANT_RANGES,
    Dequantize,
    Quantize,
)

__all__ = [
    "WeightCache",
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
