"""Elementwise ONNX ops -> rlx unary / binary / compare / where / cast, and activations as
chains of those (LeakyRelu, Elu, Selu, HardSigmoid, ...). In: NodeCtx. Out: node ids."""

from __future__ import annotations

import functools
from collections.abc import Callable
from functools import reduce

import ml_dtypes
import numpy as np

from rlx.dtype import DType
from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.dtypes import to_dtype
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import bin_, cast, cmp, dtype_of, scalar, un, where
from rlx.ops.bitcast import Bitcast
from rlx.ops.bitwise import Bitwise, BitwiseKind, BitwiseNot
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import CompareKind as C
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.trig import Trig, TrigKind

_UNARY = {
    "Abs": U.ABS, "Neg": U.NEG, "Exp": U.EXP, "Log": U.LOG, "Sqrt": U.SQRT, "Relu": U.RELU,
    "Sigmoid": U.SIGMOID, "Tanh": U.TANH, "Sin": U.SIN, "Cos": U.COS, "Floor": U.FLOOR,
    "Ceil": U.CEIL, "Round": U.ROUND, "Reciprocal": U.RECIP, "Erf": U.ERF, "Sign": U.SIGN,
    "Not": U.NOT, "Softplus": U.SOFTPLUS,
}  # fmt: skip
_BINARY = {"Add": B.ADD, "Sub": B.SUB, "Mul": B.MUL, "Div": B.DIV, "And": B.AND, "Or": B.OR}
_COMPARE = {
    "Equal": C.EQ, "Less": C.LT, "Greater": C.GT, "LessOrEqual": C.LE, "GreaterOrEqual": C.GE,
}  # fmt: skip


def _b(ctx: NodeCtx) -> int:
    """Input 1, aligned at ``axis`` under opset < 7's ``broadcast=1`` (see legacy.py)."""
    from rlx.frontends.onnx.ops.legacy import operand_b

    return operand_b(ctx)


@converter(*_UNARY, since=1)
def unary(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    kind = _UNARY[ctx.node.op_type]
    if kind is U.SIGN and dtype_of(ctx.g, x) in (DType.U8, DType.U32):
        return cast(ctx.g, cmp(ctx.g, C.NE, x, scalar(ctx.g, 0, x)), dtype_of(ctx.g, x))
    if kind is U.ABS and dtype_of(ctx.g, x) in (DType.U8, DType.U32):
        return x
    return un(ctx.g, kind, x)


@converter(*_BINARY, since=1)
def binary(ctx: NodeCtx) -> int:
    return bin_(ctx.g, _BINARY[ctx.node.op_type], ctx.x(0), _b(ctx))


@converter(*_COMPARE, since=1)
def compare(ctx: NodeCtx) -> int:
    return cmp(ctx.g, _COMPARE[ctx.node.op_type], ctx.x(0), _b(ctx))


@converter("Xor", since=1)
def xor(ctx: NodeCtx) -> int:
    return cmp(ctx.g, C.NE, ctx.x(0), _b(ctx))


@converter("Max", "Min", "Sum", "Mean", since=1)
def variadic(ctx: NodeCtx) -> int:
    kind = {"Max": B.MAX, "Min": B.MIN, "Sum": B.ADD, "Mean": B.ADD}[ctx.node.op_type]
    xs = ctx.xs()
    if len(xs) == 1 and ctx.node.op_type != "Mean":
        return xs[0]
    out = reduce(lambda a, b: bin_(ctx.g, kind, a, b), xs)
    if ctx.node.op_type == "Mean":
        out = bin_(ctx.g, B.DIV, out, scalar(ctx.g, len(xs), out))
    return out


@converter("Pow", since=1)
def pow_(ctx: NodeCtx) -> int:
    a, b = ctx.x(0), _b(ctx)
    return bin_(ctx.g, B.POW, a, cast(ctx.g, b, dtype_of(ctx.g, a)))


@converter("Mod", since=10)
def mod(ctx: NodeCtx) -> int:
    g, a, b = ctx.g, ctx.x(0), ctx.x(1)
    r = bin_(g, B.MOD, a, b)  # fmod: the dividend's sign
    if ctx.attr("fmod", 0) == 1:
        return r
    if not dtype_of(g, a).is_float and not dtype_of(g, a).is_signed:
        return r
    zero = scalar(g, 0, r)
    fix = cmp(g, C.NE, cmp(g, C.LT, r, zero), cmp(g, C.LT, b, zero))
    fix = bin_(g, B.AND, fix, cmp(g, C.NE, r, zero))
    return where(g, fix, bin_(g, B.ADD, r, b), r)


@converter("Where", since=9)
def where_(ctx: NodeCtx) -> int:
    return where(ctx.g, ctx.x(0), ctx.x(1), ctx.x(2))


@converter("Clip", since=6, until=11)
def clip_attr(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    lo, hi = ctx.attr("min", -3.4028234663852886e38), ctx.attr("max", 3.4028234663852886e38)
    x = bin_(g, B.MAX, x, scalar(g, lo, x))
    return bin_(g, B.MIN, x, scalar(g, hi, x))


@converter("Clip", since=11)
def clip(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    if ctx.has(1):
        x = bin_(g, B.MAX, x, ctx.x(1))
    if ctx.has(2):
        x = bin_(g, B.MIN, x, ctx.x(2))
    return x


@converter("Cast", since=6)
def cast_(ctx: NodeCtx) -> int:
    to = to_dtype(ctx.attr("to"), f"Cast target of {ctx.node.name!r}")
    return _cast(ctx, ctx.x(0), to)


def _cast(ctx: NodeCtx, x: int, to: DType) -> int:
    """Cast; to an FP8 type with ``saturate`` (the default) out-of-range values and
    infinities clamp to the largest finite value (NaN stays NaN)."""
    g = ctx.g
    if to.is_fp8 and ctx.attr("saturate", 1) and dtype_of(g, x).is_float:
        m = float(ml_dtypes.finfo(to.np).max)
        x = bin_(g, B.MIN, bin_(g, B.MAX, x, scalar(g, -m, x)), scalar(g, m, x))
    return cast(g, x, to)


@converter("CastLike", since=15)
def cast_like(ctx: NodeCtx) -> int:
    return _cast(ctx, ctx.x(0), ctx.in_shape(1).dtype)


@converter("Identity", since=1)
def identity(ctx: NodeCtx) -> int:
    c = ctx.st.const(ctx.node.input[0])
    if c is not None:
        return c
    return ctx.x(0)


@converter("Dropout", since=7)
def dropout(ctx: NodeCtx) -> list[int | None]:
    if ctx.has(2) and bool(np.asarray(ctx.value(2, "training_mode")).item()):
        ratio = float(np.asarray(ctx.value(1)).item()) if ctx.has(1) else 0.5
        if ratio != 0.0:
            raise ctx.unsupported("training_mode=True (random dropout) is not imported")
    x = ctx.x(0)
    mask = None
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        mask = np.ones(tuple(ctx.shape(x).concrete()), dtype=bool)
    return [x, mask]


# ---- activations as chains ------------------------------------------------------------
# A chain over a bf16 / f16 input runs in f32 and rounds once, as the op's definition does.


def in_f32(fn: Callable[[NodeCtx], int]) -> Callable[[NodeCtx], int]:
    """Run the chain ``fn`` builds in f32 when input 0 is a 16-bit float, then cast back."""

    @functools.wraps(fn)
    def wrapped(ctx: NodeCtx) -> int:
        dt = ctx.in_shape(0).dtype
        if dt not in (DType.BF16, DType.F16):
            return fn(ctx)
        for i in range(ctx.n_in):
            if ctx.has(i) and ctx.in_shape(i).dtype is dt:
                ctx.override[i] = cast(ctx.g, ctx.x(i), DType.F32)
        return cast(ctx.g, fn(ctx), dt)

    return wrapped


@converter("LeakyRelu", since=6)
@in_f32
def leaky_relu(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    neg = bin_(g, B.MUL, x, scalar(g, ctx.attr("alpha", 0.01), x))
    return where(g, cmp(g, C.LT, x, scalar(g, 0, x)), neg, x)


@converter("PRelu", since=7)
@in_f32
def prelu(ctx: NodeCtx) -> int:
    g, x, s = ctx.g, ctx.x(0), ctx.x(1)
    return where(g, cmp(g, C.LT, x, scalar(g, 0, x)), bin_(g, B.MUL, x, s), x)


@converter("ThresholdedRelu", since=10)
@in_f32
def thresholded_relu(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    keep = cmp(g, C.GT, x, scalar(g, ctx.attr("alpha", 1.0), x))
    return where(g, keep, x, scalar(g, 0, x))


def _elu(g, x: int, alpha: float) -> int:  # noqa: ANN001
    em1 = bin_(g, B.SUB, un(g, U.EXP, x), scalar(g, 1, x))
    return where(g, cmp(g, C.LT, x, scalar(g, 0, x)), bin_(g, B.MUL, em1, scalar(g, alpha, x)), x)


@converter("Elu", since=6)
@in_f32
def elu(ctx: NodeCtx) -> int:
    return _elu(ctx.g, ctx.x(0), ctx.attr("alpha", 1.0))


@converter("Celu", since=12)
@in_f32
def celu(ctx: NodeCtx) -> int:
    g, x, a = ctx.g, ctx.x(0), ctx.attr("alpha", 1.0)
    e = _elu(g, bin_(g, B.DIV, x, scalar(g, a, x)), 1.0)
    neg = bin_(g, B.MUL, e, scalar(g, a, x))
    return where(g, cmp(g, C.LT, x, scalar(g, 0, x)), neg, x)


@converter("Selu", since=6)
@in_f32
def selu(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    a, gamma = (
        ctx.attr("alpha", 1.67326319217681884765625),
        ctx.attr("gamma", 1.05070102214813232421875),
    )
    return bin_(g, B.MUL, _elu(g, x, a), scalar(g, gamma, x))


def _hard_sigmoid(g, x: int, alpha: float, beta: float) -> int:  # noqa: ANN001
    y = bin_(g, B.ADD, bin_(g, B.MUL, x, scalar(g, alpha, x)), scalar(g, beta, x))
    return bin_(g, B.MIN, bin_(g, B.MAX, y, scalar(g, 0, x)), scalar(g, 1, x))


@converter("HardSigmoid", since=6)
@in_f32
def hard_sigmoid(ctx: NodeCtx) -> int:
    return _hard_sigmoid(ctx.g, ctx.x(0), ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5))


@converter("HardSwish", since=14)
@in_f32
def hard_swish(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    return bin_(ctx.g, B.MUL, x, _hard_sigmoid(ctx.g, x, 1 / 6, 0.5))


@converter("Softsign", since=1)
@in_f32
def softsign(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    return bin_(g, B.DIV, x, bin_(g, B.ADD, un(g, U.ABS, x), scalar(g, 1, x)))


@converter("Mish", since=18)
@in_f32
def mish(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    return bin_(g, B.MUL, x, un(g, U.TANH, un(g, U.SOFTPLUS, x)))


@converter("Swish", since=24)
@in_f32
def swish(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    ax = bin_(g, B.MUL, x, scalar(g, ctx.attr("alpha", 1.0), x))
    return bin_(g, B.MUL, x, un(g, U.SIGMOID, ax))


@converter("Gelu", since=20)
def gelu(ctx: NodeCtx) -> int:
    approx = ctx.attr("approximate", "none")
    return un(ctx.g, U.GELU_TANH if approx == "tanh" else U.GELU, ctx.x(0))


@converter("Shrink", since=9)
@in_f32
def shrink(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    lo = cmp(g, C.LT, x, scalar(g, -lambd, x))
    hi = cmp(g, C.GT, x, scalar(g, lambd, x))
    return where(
        g, lo, bin_(g, B.ADD, x, scalar(g, bias, x)),
        where(g, hi, bin_(g, B.SUB, x, scalar(g, bias, x)), scalar(g, 0, x)),
    )  # fmt: skip


_BITWISE = {"BitwiseAnd": BitwiseKind.AND, "BitwiseOr": BitwiseKind.OR,
            "BitwiseXor": BitwiseKind.XOR}  # fmt: skip


@converter(*_BITWISE, since=18)
def bitwise_binary(ctx: NodeCtx) -> int:
    return ctx.g.apply(Bitwise(_BITWISE[ctx.node.op_type]), [ctx.x(0), ctx.x(1)])


@converter("BitwiseNot", since=18)
def bitwise_not(ctx: NodeCtx) -> int:
    return ctx.g.apply(BitwiseNot(), [ctx.x(0)])


@converter("BitShift", since=11)
def bit_shift(ctx: NodeCtx) -> int:
    d = ctx.attr("direction")
    kind = BitwiseKind.SHL if d == "LEFT" else BitwiseKind.SHR
    return ctx.g.apply(Bitwise(kind), [ctx.x(0), ctx.x(1)])


_TRIG = {"Tan": TrigKind.TAN, "Asin": TrigKind.ASIN, "Acos": TrigKind.ACOS,
         "Atan": TrigKind.ATAN, "Sinh": TrigKind.SINH, "Cosh": TrigKind.COSH,
         "Asinh": TrigKind.ASINH, "Acosh": TrigKind.ACOSH, "Atanh": TrigKind.ATANH}  # fmt: skip


@converter(*_TRIG, since=7)
def trig(ctx: NodeCtx) -> int:
    return ctx.g.apply(Trig(_TRIG[ctx.node.op_type]), [ctx.x(0)])


@converter("IsNaN", since=9)
def is_nan(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    return cmp(ctx.g, C.NE, x, x)


@converter("IsInf", since=10)
def is_inf(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    pos = cmp(g, C.EQ, x, scalar(g, np.inf, x))
    neg = cmp(g, C.EQ, x, scalar(g, -np.inf, x))
    if not ctx.attr("detect_negative", 1):
        return pos
    if not ctx.attr("detect_positive", 1):
        return neg
    return bin_(g, B.OR, pos, neg)


@converter("BitCast", since=26)
def bit_cast(ctx: NodeCtx) -> int:
    to = to_dtype(ctx.attr("to"), f"BitCast target of {ctx.node.name!r}")
    return ctx.g.apply(Bitcast(to), [ctx.x(0)])
