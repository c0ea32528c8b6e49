"""Quantized ONNX ops (as ONNX Runtime's quantizer writes them) -> rlx quantize /
dequantize (constant scales and zero points, per tensor or per axis), integer matmul
(MatMulInteger, QLinearMatMul: int32 accumulation of zero-point-shifted operands, then a
float rescale and requantization), and DynamicQuantizeLinear (min/max reductions).
FP8 outputs go through a saturating cast; blocked quantization is named unsupported."""

from __future__ import annotations

import numpy as np

from rlx.dtype import DType
from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.dtypes import to_dtype
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.elementwise import _cast
from rlx.frontends.onnx.ops.util import axis_of, bin_, cast, scalar, un
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Expand, Reshape, Slice
from rlx.ops.quant import QUANT_RANGES, Dequantize, Quantize
from rlx.ops.reduce import Reduce, ReduceKind


def _blocked(ctx: NodeCtx, v: int, x: int) -> int:
    """A blocked scale / zero point repeated ``block_size`` times along the axis."""
    g = ctx.g
    xs = ctx.shape(x)
    ax = axis_of(ctx.attr("axis", 1), xs.rank)
    bs = int(ctx.attr("block_size"))
    dims = list(g.shape(v).dims)
    nb = int(dims[ax])
    y = g.apply(Reshape((*dims[: ax + 1], 1, *dims[ax + 1 :])), [v])
    y = g.apply(Expand((*dims[: ax + 1], bs, *dims[ax + 1 :])), [y])
    y = g.apply(Reshape((*dims[:ax], nb * bs, *dims[ax + 1 :])), [y])
    if nb * bs != int(xs.dims[ax]):
        y = g.apply(Slice(*_take(len(dims), ax, int(xs.dims[ax]))), [y])
    return y


def _take(r: int, ax: int, n: int) -> tuple:
    st = (None,) * r
    return st, tuple(n if i == ax else None for i in range(r)), (1,) * r


def _blocked_q(ctx: NodeCtx, quantize: bool) -> int:
    g, x = ctx.g, ctx.x(0)
    s = _blocked(ctx, cast(g, ctx.x(1), DType.F32), x)
    z = _blocked(ctx, cast(g, ctx.x(2), DType.F32), x) if ctx.has(2) else None
    if not quantize:
        y = cast(g, x, DType.F32)
        if z is not None:
            y = bin_(g, B.SUB, y, z)
        return cast(g, bin_(g, B.MUL, y, s), ctx.in_shape(1).dtype)
    if ctx.attr("output_dtype", 0):
        to = to_dtype(ctx.attr("output_dtype"), "QuantizeLinear output_dtype")
    else:
        to = ctx.in_shape(2).dtype if ctx.has(2) else DType.U8
    if to not in QUANT_RANGES:
        raise ctx.unsupported(f"blocked quantization to {to}")
    y = un(g, U.ROUND, bin_(g, B.DIV, cast(g, x, DType.F32), s))
    if z is not None:
        y = bin_(g, B.ADD, y, z)
    lo, hi = QUANT_RANGES[to]
    return cast(g, bin_(g, B.MIN, bin_(g, B.MAX, y, scalar(g, lo, y)), scalar(g, hi, y)), to)


def _params(ctx: NodeCtx, x_rank: int) -> tuple[np.ndarray, np.ndarray | None, int | None]:
    scale = np.asarray(ctx.value(1, "scale"))
    zp = np.asarray(ctx.value(2, "zero_point")) if ctx.has(2) else None
    axis = None if scale.size == 1 and scale.ndim <= 1 else axis_of(ctx.attr("axis", 1), x_rank)
    return scale.reshape(-1), None if zp is None else zp.reshape(-1), axis


def _runtime(ctx: NodeCtx) -> bool:
    """Scale or zero point known only at run time (a graph input, or computed in the graph
    as DynamicQuantizeLinear's expansion does): the op becomes elementwise arithmetic.
    Constant ones (initializers, the quantizer's output) give rlx's quantize ops."""
    return any(ctx.has(i) and ctx.st.fold(ctx.node.input[i]) is None for i in (1, 2))


def _along(ctx: NodeCtx, v: int, x: int) -> int:
    """A per-axis [C] scale / zero point reshaped to broadcast against ``x``."""
    vs, r = ctx.g.shape(v), ctx.shape(x).rank
    if vs.rank != 1 or vs.dims[0] == 1 and r != 1:
        return v
    ax = axis_of(ctx.attr("axis", 1), r)
    return ctx.g.apply(Reshape(tuple(vs.dims[0] if i == ax else 1 for i in range(r))), [v])


def _q_dtype(ctx: NodeCtx) -> DType:
    if ctx.attr("output_dtype", 0):
        return to_dtype(ctx.attr("output_dtype"), "QuantizeLinear output_dtype")
    return ctx.in_shape(2).dtype if ctx.has(2) else DType.U8


def _runtime_quantize(ctx: NodeCtx, to: DType) -> int:
    """``saturate(rint(x / scale) + zp)`` from run-time scale and zero point."""
    g, x0 = ctx.g, ctx.x(0)
    x = cast(g, x0, DType.F32)
    y = bin_(g, B.DIV, x, _along(ctx, cast(g, ctx.x(1), DType.F32), x0))
    if to.is_fp8:
        return _cast(ctx, y, to)
    y = un(g, U.ROUND, y)
    if ctx.has(2):
        y = bin_(g, B.ADD, y, _along(ctx, cast(g, ctx.x(2), DType.F32), x0))
    lo, hi = QUANT_RANGES[to]
    y = bin_(g, B.MIN, bin_(g, B.MAX, y, scalar(g, lo, y)), scalar(g, hi, y))
    return cast(g, y, to)


@converter("QuantizeLinear", since=10)
def quantize_linear(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    if ctx.attr("block_size", 0):
        return _blocked_q(ctx, True)
    if _runtime(ctx) and (_q_dtype(ctx) in QUANT_RANGES or _q_dtype(ctx).is_fp8):
        return _runtime_quantize(ctx, _q_dtype(ctx))
    scale, zp, axis = _params(ctx, ctx.shape(x).rank)
    if ctx.has_attr("output_dtype") and ctx.attr("output_dtype"):
        to = to_dtype(ctx.attr("output_dtype"), "QuantizeLinear output_dtype")
    elif ctx.has(2):
        to = ctx.in_shape(2).dtype
    else:
        to = DType.U8
    if to.is_fp8:  # x / scale, saturated into the FP8 type (zero point must be 0)
        s = g.constant(scale.astype(np.float32).reshape(_bshape(axis, ctx.shape(x).rank, scale)))
        y = bin_(g, B.DIV, cast(g, x, DType.F32), s)
        return _cast(ctx, y, to)
    if to not in QUANT_RANGES:
        raise ctx.unsupported(f"quantizing to {to}")
    zps = np.zeros_like(scale, dtype=np.int64) if zp is None else zp.astype(np.int64)
    if len(zps) == 1 and len(scale) > 1:
        zps = np.repeat(zps, len(scale))
    q = Quantize(axis, tuple(scale.astype(np.float64)), tuple(zps), to)
    return g.apply(q, [x])


def _bshape(axis: int | None, rank: int, v: np.ndarray) -> tuple[int, ...]:
    if axis is None:
        return ()
    return tuple(v.size if i == axis else 1 for i in range(rank))


@converter("DequantizeLinear", since=10)
def dequantize_linear(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    if ctx.attr("block_size", 0):
        return _blocked_q(ctx, False)
    if _runtime(ctx):  # (q - zp) * scale with run-time scale / zero point
        y = cast(g, x, DType.F32)
        if ctx.has(2):
            y = bin_(g, B.SUB, y, _along(ctx, cast(g, ctx.x(2), DType.F32), x))
        y = bin_(g, B.MUL, y, _along(ctx, cast(g, ctx.x(1), DType.F32), x))
        return cast(g, y, ctx.in_shape(1).dtype)
    scale, zp, axis = _params(ctx, ctx.shape(x).rank)
    out_dt = ctx.in_shape(1).dtype
    src = ctx.dtype(x)
    if src.is_fp8 or src is DType.I32 and zp is None:
        s = g.constant(scale.astype(np.float32).reshape(_bshape(axis, ctx.shape(x).rank, scale)))
        y = bin_(g, B.MUL, cast(g, x, DType.F32), s)
        return cast(g, y, out_dt)
    if src not in QUANT_RANGES:
        raise ctx.unsupported(f"dequantizing {src}")
    zps = np.zeros_like(scale, dtype=np.int64) if zp is None else zp.astype(np.int64)
    if len(zps) == 1 and len(scale) > 1:
        zps = np.repeat(zps, len(scale))
    y = g.apply(Dequantize(axis, tuple(scale.astype(np.float64)), tuple(zps)), [x])
    return cast(g, y, out_dt)


def _shifted(ctx: NodeCtx, x: int, zp: int | None) -> int:
    g = ctx.g
    x32 = cast(g, x, DType.I32)
    return x32 if zp is None else bin_(g, B.SUB, x32, cast(g, zp, DType.I32))


def _zp_for(ctx: NodeCtx, zp: int | None, x: int, side: str) -> int | None:
    """A zero point shaped to broadcast against ``x`` (a per-row a-zp [M] -> [M, 1])."""
    if zp is None:
        return None
    zs, xs = ctx.shape(zp), ctx.shape(x)
    if side == "a" and zs.rank == 1 and zs.dims[0] != 1 and xs.rank >= 2:
        return ctx.g.apply(Reshape((zs.dims[0], 1)), [zp])
    return zp


@converter("MatMulInteger", since=10)
def matmul_integer(ctx: NodeCtx) -> int:
    a, b = ctx.x(0), ctx.x(1)
    za, zb = _zp_for(ctx, ctx.opt(2), a, "a"), _zp_for(ctx, ctx.opt(3), b, "b")
    return ctx.g.apply(MatMul(), [_shifted(ctx, a, za), _shifted(ctx, b, zb)])


@converter("QLinearMatMul", since=10)
def qlinear_matmul(ctx: NodeCtx) -> int:
    g = ctx.g
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = (ctx.x(i) for i in range(8))
    acc = g.apply(MatMul(), [_shifted(ctx, a, _zp_for(ctx, a_z, a, "a")),
                             _shifted(ctx, b, _zp_for(ctx, b_z, b, "b"))])  # fmt: skip
    f = cast(g, acc, DType.F32)
    rescale = bin_(g, B.DIV, bin_(g, B.MUL, cast(g, a_s, DType.F32), cast(g, b_s, DType.F32)),
                   cast(g, y_s, DType.F32))  # fmt: skip
    y = bin_(g, B.ADD, un(g, U.ROUND, bin_(g, B.MUL, f, rescale)), cast(g, y_z, DType.F32))
    out = ctx.dtype(y_z)
    lo, hi = QUANT_RANGES[out] if out in QUANT_RANGES else (None, None)
    if lo is None:
        raise ctx.unsupported(f"QLinearMatMul output {out}")
    y = bin_(g, B.MIN, bin_(g, B.MAX, y, scalar(g, lo, y)), scalar(g, hi, y))
    return cast(g, y, out)


@converter("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(ctx: NodeCtx) -> list[int]:
    g, x = ctx.g, ctx.x(0)
    axes = tuple(range(ctx.shape(x).rank))
    zero = scalar(g, 0.0, x)
    hi = bin_(g, B.MAX, g.apply(Reduce(ReduceKind.MAX, axes, False), [x]), zero)
    lo = bin_(g, B.MIN, g.apply(Reduce(ReduceKind.MIN, axes, False), [x]), zero)
    scale = bin_(g, B.DIV, bin_(g, B.SUB, hi, lo), scalar(g, 255.0, x))
    clip = lambda v: bin_(g, B.MIN, bin_(g, B.MAX, v, scalar(g, 0.0, x)), scalar(g, 255.0, x))  # noqa: E731
    zp = clip(un(g, U.ROUND, bin_(g, B.SUB, zero, bin_(g, B.DIV, lo, scale))))
    y = clip(bin_(g, B.ADD, un(g, U.ROUND, bin_(g, B.DIV, x, scale)), zp))
    return [cast(g, y, DType.U8), scale, cast(g, zp, DType.U8)]


def _int_conv(ctx: NodeCtx, x: int, xz: int | None, w: int, wz: int | None) -> int:
    """The integer convolution of zero-point-shifted operands, exact (f64 accumulation:
    products of 8-bit values summed stay far below 2**53), as int32."""
    from rlx.frontends.onnx.ops.nn import _spatial
    from rlx.ops.nn import Conv

    g = ctx.g
    ws = ctx.shape(w)
    k = [int(d) for d in ws.dims[2:]]
    if len(k) not in (1, 2):
        raise ctx.unsupported(f"a {len(k)}-D integer convolution")
    xf = cast(g, x, DType.F64)
    if xz is not None:
        xf = bin_(g, B.SUB, xf, cast(g, xz, DType.F64))
    wf = cast(g, w, DType.F64)
    if wz is not None:
        z = cast(g, wz, DType.F64)
        if ctx.shape(wz).rank == 1 and ctx.shape(wz).dims[0] != 1:
            z = g.apply(Reshape((ctx.shape(wz).dims[0],) + (1,) * (ws.rank - 1)), [z])
        wf = bin_(g, B.SUB, wf, z)
    strides, dil, pads = _spatial(ctx, ctx.shape(x).dims, k)
    op = Conv(tuple(strides), tuple(pads), tuple(dil), int(ctx.attr("group", 1)), False)
    return g.apply(op, [xf, wf])


@converter("ConvInteger", since=10)
def conv_integer(ctx: NodeCtx) -> int:
    acc = _int_conv(ctx, ctx.x(0), ctx.opt(2), ctx.x(1), ctx.opt(3))
    return cast(ctx.g, acc, DType.I32)


@converter("QLinearConv", since=10)
def qlinear_conv(ctx: NodeCtx) -> int:
    g = ctx.g
    x, xs, xz, w, ws, wz, ys, yz = (ctx.x(i) for i in range(8))
    acc = _int_conv(ctx, x, xz, w, wz)
    spatial = (1,) * (g.shape(acc).rank - 2)
    if ctx.has(8):  # int32 bias, one per output channel
        bias = cast(g, ctx.x(8), DType.F64)
        acc = bin_(
            g, B.ADD, acc, g.apply(Reshape((1, ctx.shape(ctx.x(8)).dims[0], *spatial)), [bias])
        )
    wsc = cast(g, ws, DType.F64)
    if ctx.shape(ws).rank == 1 and ctx.shape(ws).dims[0] != 1:  # per output channel
        wsc = g.apply(Reshape((1, ctx.shape(ws).dims[0], *spatial)), [wsc])
    m = bin_(g, B.DIV, bin_(g, B.MUL, cast(g, xs, DType.F64), wsc), cast(g, ys, DType.F64))
    y = bin_(g, B.ADD, un(g, U.ROUND, bin_(g, B.MUL, acc, m)), cast(g, yz, DType.F64))
    out = ctx.dtype(yz)
    lo, hi = QUANT_RANGES[out]
    y = bin_(g, B.MIN, bin_(g, B.MAX, y, scalar(g, lo, y)), scalar(g, hi, y))
    return cast(g, y, out)
