"""Elementwise ATen ops -> rlx unary / binary / compare / where / cast. Arithmetic runs in
the dtype torch's promotion gives the result (read from the node's fake result), so
Python scalars and mixed dtypes follow torch; comparisons run in the promoted input dtype.
Identity-like ops (clone, contiguous, dropout in eval, ``to`` on the CPU) become casts or
nothing; runtime asserts produce no value."""

from __future__ import annotations

import math
from typing import Any

import torch

from rlx.dtype import DType
from rlx.frontends.torch.aten import aten
from rlx.frontends.torch.context import NodeCtx
from rlx.frontends.torch.dims import to_dtype
from rlx.ops.bitwise import Bitwise, BitwiseKind, BitwiseNot
from rlx.ops.elementwise import (
    Binary,
    BinaryKind,
    Compare,
    CompareKind,
    Unary,
    UnaryKind,
    Where,
)
from rlx.ops.trig import Trig, TrigKind

__all__: list[str] = []


def _un(ctx: NodeCtx, fn: UnaryKind, x: int) -> int:
    return ctx.g.apply(Unary(fn), [x])


def _bin(ctx: NodeCtx, fn: BinaryKind, a: int, b: int) -> int:
    return ctx.g.apply(Binary(fn), [a, b])


def _arg_val(ctx: NodeCtx, i: int, name: str | None = None) -> Any:
    """The fake value (tensor) or Python scalar of raw argument ``i``, for promotion."""
    node_args = ctx.node.args
    v = node_args[i] if i < len(node_args) else ctx.node.kwargs.get(name or "", None)
    return v.meta.get("val") if hasattr(v, "meta") else v


def compute_dtype(ctx: NodeCtx, *idx: int) -> DType:
    """torch.result_type of the arguments ``idx`` as an rlx DType."""
    vals = [_arg_val(ctx, i) for i in idx]
    dt = torch.result_type(*vals) if len(vals) == 2 else vals[0].dtype
    return to_dtype(dt, ctx.op)


def _binary(fn: BinaryKind, reverse: bool = False) -> Any:
    def conv(ctx: NodeCtx) -> int:
        dt = ctx.out_dtype
        a, b = ctx.operand(ctx.arg(0), dt), ctx.operand(ctx.arg(1, name="other"), dt)
        alpha = ctx.kw("alpha", ctx.arg(2))
        if alpha is not None and alpha != 1:
            b = _bin(ctx, BinaryKind.MUL, b, ctx.const(alpha, dt))
        return _bin(ctx, fn, b, a) if reverse else _bin(ctx, fn, a, b)

    conv.__name__ = f"convert_{fn.value}"
    return conv


for _names, _fn, _rev in (
    (("add.Tensor", "add.Scalar"), BinaryKind.ADD, False),
    (("sub.Tensor", "sub.Scalar"), BinaryKind.SUB, False),
    (("rsub.Scalar", "rsub.Tensor"), BinaryKind.SUB, True),
    (("mul.Tensor", "mul.Scalar"), BinaryKind.MUL, False),
    (("maximum", "fmax"), BinaryKind.MAX, False),
    (("minimum", "fmin"), BinaryKind.MIN, False),
    (("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar"), BinaryKind.POW, False),
    (("fmod",), BinaryKind.MOD, False),
):
    aten(*_names)(_binary(_fn, _rev))


def _nonzero_and_signs_differ(ctx: NodeCtx, r: int, x: int, y: int) -> int:
    """Bool node ``r != 0 and (x < 0) != (y < 0)``: where a truncated quotient or remainder
    (``r`` the remainder) needs the floor correction."""
    zero = ctx.const(0, ctx.dtype(r))
    nonzero = ctx.g.apply(Compare(CompareKind.NE), [r, zero])
    differ = ctx.g.apply(
        Compare(CompareKind.NE),
        [
            ctx.g.apply(Compare(CompareKind.LT), [x, zero]),
            ctx.g.apply(Compare(CompareKind.LT), [y, zero]),
        ],
    )
    return ctx.g.apply(Binary(BinaryKind.AND), [nonzero, differ])


@aten(
    "div.Tensor", "div.Scalar", "true_divide", "div.Tensor_mode", "div.Scalar_mode", "floor_divide"
)
def div(ctx: NodeCtx) -> int:
    mode = "floor" if ctx.op.startswith("aten.floor_divide") else ctx.kw("rounding_mode")
    dt = ctx.out_dtype
    a, b = ctx.operand(ctx.arg(0), dt), ctx.operand(ctx.arg(1), dt)
    q = _bin(ctx, BinaryKind.DIV, a, b)
    if mode is None or (mode == "trunc" and dt.is_int):
        return q
    if dt.is_float:
        if mode == "floor":
            return _un(ctx, UnaryKind.FLOOR, q)
        return _bin(ctx, BinaryKind.MUL, _un(ctx, UnaryKind.SIGN, q),
                    _un(ctx, UnaryKind.FLOOR, _un(ctx, UnaryKind.ABS, q)))  # fmt: skip
    # integer floor division: the truncated quotient minus one where signs differ and the
    # division is inexact
    r = _bin(ctx, BinaryKind.SUB, a, _bin(ctx, BinaryKind.MUL, q, b))
    fix = _nonzero_and_signs_differ(ctx, r, a, b)
    return ctx.g.apply(Where(), [fix, _bin(ctx, BinaryKind.SUB, q, ctx.const(1, dt)), q])


@aten("remainder.Tensor", "remainder.Scalar")
def remainder(ctx: NodeCtx) -> int:
    """Python's modulo: the result takes the divisor's sign."""
    dt = ctx.out_dtype
    a, b = ctx.operand(ctx.arg(0), dt), ctx.operand(ctx.arg(1), dt)
    r = _bin(ctx, BinaryKind.MOD, a, b)
    fix = _nonzero_and_signs_differ(ctx, r, r, b)
    return ctx.g.apply(Where(), [fix, _bin(ctx, BinaryKind.ADD, r, b), r])


_CMP = {"eq": CompareKind.EQ, "ne": CompareKind.NE, "lt": CompareKind.LT,
        "le": CompareKind.LE, "gt": CompareKind.GT, "ge": CompareKind.GE}  # fmt: skip


@aten(*(f"{n}.{o}" for n in _CMP for o in ("Tensor", "Scalar")))
def compare(ctx: NodeCtx) -> int:
    dt = compute_dtype(ctx, 0, 1)
    a, b = ctx.operand(ctx.arg(0), dt), ctx.operand(ctx.arg(1), dt)
    name = ctx.op.removeprefix("aten.").split(".")[0]
    return ctx.g.apply(Compare(_CMP[name]), [a, b])


_LOGIC = {"and": (BinaryKind.AND, BitwiseKind.AND), "or": (BinaryKind.OR, BitwiseKind.OR),
          "xor": (None, BitwiseKind.XOR)}  # fmt: skip


@aten(
    "bitwise_and", "bitwise_or", "bitwise_xor", "__and__", "__or__", "__xor__",
    "logical_and", "logical_or", "logical_xor",
)  # fmt: skip
def logic(ctx: NodeCtx) -> int:
    name = ctx.op.removeprefix("aten.").split(".")[0].strip("_")
    kind = name.split("_")[-1]
    logical = name.startswith("logical")
    dt = DType.BOOL if logical else ctx.out_dtype
    a, b = ctx.operand(ctx.arg(0), dt), ctx.operand(ctx.arg(1), dt)
    bool_fn, bit_fn = _LOGIC[kind]
    if dt is DType.BOOL:
        if bool_fn is None:
            return ctx.g.apply(Compare(CompareKind.NE), [a, b])
        return _bin(ctx, bool_fn, a, b)
    return ctx.g.apply(Bitwise(bit_fn), [a, b])


@aten("logical_not", "bitwise_not")
def logical_not(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    if ctx.op.startswith("aten.logical") or ctx.dtype(x) is DType.BOOL:
        return _un(ctx, UnaryKind.NOT, ctx.cast(x, DType.BOOL))
    return ctx.g.apply(BitwiseNot(), [x])


_UNARY = {
    "relu": UnaryKind.RELU, "sigmoid": UnaryKind.SIGMOID, "tanh": UnaryKind.TANH,
    "exp": UnaryKind.EXP, "log": UnaryKind.LOG, "sqrt": UnaryKind.SQRT,
    "rsqrt": UnaryKind.RSQRT, "neg": UnaryKind.NEG, "abs": UnaryKind.ABS,
    "sin": UnaryKind.SIN, "cos": UnaryKind.COS, "floor": UnaryKind.FLOOR,
    "ceil": UnaryKind.CEIL, "reciprocal": UnaryKind.RECIP, "erf": UnaryKind.ERF,
    "sign": UnaryKind.SIGN, "silu": UnaryKind.SILU, "square": UnaryKind.SQUARE,
}  # fmt: skip
_TRIG = {"tan": TrigKind.TAN, "asin": TrigKind.ASIN, "acos": TrigKind.ACOS,
         "atan": TrigKind.ATAN, "sinh": TrigKind.SINH, "cosh": TrigKind.COSH,
         "asinh": TrigKind.ASINH, "acosh": TrigKind.ACOSH, "atanh": TrigKind.ATANH}  # fmt: skip


@aten(*_UNARY, *_TRIG, "round.default")
def unary(ctx: NodeCtx) -> int:
    name = ctx.op.removeprefix("aten.").split(".")[0]
    x = ctx.operand(ctx.arg(0), ctx.out_dtype)
    if name in _TRIG:
        return ctx.g.apply(Trig(_TRIG[name]), [x])
    return _un(ctx, UnaryKind.ROUND if name == "round" else _UNARY[name], x)


@aten("trunc", "fix")
def trunc(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    return _bin(ctx, BinaryKind.MUL, _un(ctx, UnaryKind.SIGN, x),
                _un(ctx, UnaryKind.FLOOR, _un(ctx, UnaryKind.ABS, x)))  # fmt: skip


def _scaled(ctx: NodeCtx, fn: UnaryKind, x: int, scale: float, pre: bool) -> int:
    c = ctx.const(scale, ctx.dtype(x))
    if pre:
        return _un(ctx, fn, _bin(ctx, BinaryKind.MUL, x, c))
    return _bin(ctx, BinaryKind.MUL, _un(ctx, fn, x), c)


@aten("exp2", "log2", "log10", "log1p", "expm1")
def exp_log(ctx: NodeCtx) -> int:
    name = ctx.op.removeprefix("aten.").split(".")[0]
    x = ctx.operand(ctx.arg(0), ctx.out_dtype)
    dt = ctx.dtype(x)
    if name == "exp2":
        return _scaled(ctx, UnaryKind.EXP, x, math.log(2.0), True)
    if name in ("log2", "log10"):
        return _scaled(
            ctx, UnaryKind.LOG, x, 1.0 / math.log(2.0 if name == "log2" else 10.0), False
        )
    one = ctx.const(1, dt)
    if name == "log1p":
        return _un(ctx, UnaryKind.LOG, _bin(ctx, BinaryKind.ADD, x, one))
    return _bin(ctx, BinaryKind.SUB, _un(ctx, UnaryKind.EXP, x), one)


@aten("gelu")
def gelu(ctx: NodeCtx) -> int:
    approx = ctx.kw("approximate", ctx.arg(1, "none"))
    return _un(ctx, UnaryKind.GELU_TANH if approx == "tanh" else UnaryKind.GELU, ctx.t(0))


def _clamp(ctx: NodeCtx, x: int, lo: Any, hi: Any) -> int:
    dt = ctx.out_dtype
    x = ctx.cast(x, dt)
    if lo is not None:
        x = _bin(ctx, BinaryKind.MAX, x, ctx.operand(lo, dt))
    if hi is not None:
        x = _bin(ctx, BinaryKind.MIN, x, ctx.operand(hi, dt))
    return x


@aten("clamp", "clip", "clamp_min", "clamp_max", "hardtanh", "relu6")
def clamp(ctx: NodeCtx) -> int:
    name = ctx.op.removeprefix("aten.").split(".")[0]
    x = ctx.t(0)
    if name == "clamp_max":
        return _clamp(ctx, x, None, ctx.arg(1))
    if name == "relu6":
        return _clamp(ctx, x, 0.0, 6.0)
    if name == "hardtanh":
        return _clamp(ctx, x, ctx.arg(1, -1.0), ctx.arg(2, 1.0))
    return _clamp(ctx, x, ctx.arg(1, name="min"), ctx.arg(2, name="max"))


@aten("leaky_relu", "elu", "hardsigmoid", "hardswish", "mish", "softplus")
def activation(ctx: NodeCtx) -> int:
    name = ctx.op.removeprefix("aten.").split(".")[0]
    x = ctx.t(0)
    dt = ctx.dtype(x)
    zero = ctx.const(0, dt)
    if name == "leaky_relu":
        pos = ctx.g.apply(Compare(CompareKind.GT), [x, zero])
        return ctx.g.apply(
            Where(), [pos, x, _bin(ctx, BinaryKind.MUL, x, ctx.const(ctx.arg(1, 0.01), dt))]
        )
    if name == "elu":
        alpha = ctx.arg(1, 1.0)
        if ctx.arg(2, 1) != 1 or ctx.arg(3, 1) != 1:
            raise ctx.unsupported("elu with scale or input_scale other than 1")
        em1 = _bin(ctx, BinaryKind.SUB, _un(ctx, UnaryKind.EXP, x), ctx.const(1, dt))
        pos = ctx.g.apply(Compare(CompareKind.GT), [x, zero])
        return ctx.g.apply(Where(), [pos, x, _bin(ctx, BinaryKind.MUL, em1, ctx.const(alpha, dt))])
    if name in ("hardsigmoid", "hardswish"):
        h = _bin(
            ctx,
            BinaryKind.ADD,
            _bin(ctx, BinaryKind.MUL, x, ctx.const(1 / 6, dt)),
            ctx.const(0.5, dt),
        )
        h = _bin(ctx, BinaryKind.MIN, _bin(ctx, BinaryKind.MAX, h, zero), ctx.const(1, dt))
        return h if name == "hardsigmoid" else _bin(ctx, BinaryKind.MUL, x, h)
    if name == "mish":
        return _bin(
            ctx, BinaryKind.MUL, x, _un(ctx, UnaryKind.TANH, _un(ctx, UnaryKind.SOFTPLUS, x))
        )
    beta, thr = ctx.arg(1, 1.0), ctx.arg(2, 20.0)
    bx = _bin(ctx, BinaryKind.MUL, x, ctx.const(beta, dt))
    sp = _bin(ctx, BinaryKind.DIV, _un(ctx, UnaryKind.SOFTPLUS, bx), ctx.const(beta, dt))
    big = ctx.g.apply(Compare(CompareKind.GT), [bx, ctx.const(thr, dt)])
    return ctx.g.apply(Where(), [big, x, sp])


@aten("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def where(ctx: NodeCtx) -> int:
    dt = ctx.out_dtype
    c = ctx.cast(ctx.t(0), DType.BOOL)
    return ctx.g.apply(Where(), [c, ctx.operand(ctx.arg(1), dt), ctx.operand(ctx.arg(2), dt)])


@aten("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(ctx: NodeCtx) -> int:
    dt = ctx.out_dtype
    c = ctx.cast(ctx.t(1), DType.BOOL)
    return ctx.g.apply(Where(), [c, ctx.operand(ctx.arg(2), dt), ctx.cast(ctx.t(0), dt)])


@aten(
    "clone", "contiguous", "alias", "detach", "lift_fresh_copy", "_to_copy", "to",
    "type_as", "_conj", "resolve_conj", "resolve_neg", "view_as",
)  # fmt: skip
def identity(ctx: NodeCtx) -> int:
    """Copies and CPU moves: the value, cast to the result's dtype."""
    return ctx.cast(ctx.t(0), ctx.out_dtype)


@aten("dropout", "feature_dropout", "alpha_dropout", "native_dropout")
def dropout(ctx: NodeCtx) -> Any:
    train = ctx.arg(2, False, name="train")
    if train:
        raise ctx.unsupported("dropout in training mode; call module.eval() before from_torch")
    x = ctx.t(0)
    if ctx.op.startswith("aten.native_dropout"):
        return x, ctx.g.apply(Compare(CompareKind.EQ), [x, x])
    return x


@aten("_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range_for_size",
      "sym_constrain_range", "_functional_assert_async")  # fmt: skip
def no_value(ctx: NodeCtx) -> None:
    """Runtime checks torch inserted: rlx checks its own inputs."""
    return None
