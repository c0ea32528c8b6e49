"""Tensor factories -> rlx constants (static sizes) or a broadcast scalar (symbolic sizes):
full / zeros / ones / empty and their ``_like`` / ``new_`` forms, scalar_tensor, arange
(over a symbolic length: an exclusive running sum of ones, so it stays symbolic)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx.frontends.torch.aten import aten
from rlx.frontends.torch.context import NodeCtx
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.ops.movement import Expand
from rlx.ops.reduce import Cumsum
from rlx.shape import Shape, Sym

__all__: list[str] = []


def filled(ctx: NodeCtx, value: Any, shape: Shape) -> int:
    """A tensor of ``shape`` holding ``value`` everywhere."""
    if shape.is_static:
        return ctx.g.constant(
            np.full(tuple(int(d) for d in shape.dims), value, dtype=shape.dtype.np)
        )
    c = ctx.const(value, shape.dtype)
    return ctx.g.apply(Expand(shape.dims), [c])


@aten("full", "full_like", "new_full", "fill.Scalar")
def full(ctx: NodeCtx) -> int:
    name = ctx.op.removeprefix("aten.").split(".")[0]
    value = ctx.arg(2 if name == "new_full" else 1, name="fill_value")
    if not isinstance(value, bool | int | float):
        raise ctx.unsupported(f"fill value {value!r} is not a number known at export")
    return filled(ctx, value, ctx.out_shape())


@aten("zeros", "zeros_like", "new_zeros", "empty.memory_format", "empty_like", "new_empty",
      "empty_strided", "new_empty_strided")  # fmt: skip
def zeros(ctx: NodeCtx) -> int:
    return filled(ctx, 0, ctx.out_shape())


@aten("ones", "ones_like", "new_ones")
def ones(ctx: NodeCtx) -> int:
    return filled(ctx, 1, ctx.out_shape())


@aten("scalar_tensor")
def scalar_tensor(ctx: NodeCtx) -> int:
    return filled(ctx, ctx.arg(0), ctx.out_shape())


@aten("arange")
def arange(ctx: NodeCtx) -> int:
    out = ctx.out_shape()
    nums = [a for a in ctx.args if not isinstance(a, str)]
    if ctx.op.endswith(".default"):
        start, end, step = 0, nums[0], 1
    else:
        start, end = nums[0], nums[1]
        step = nums[2] if len(nums) > 2 else ctx.kw("step", 1)
    n = out.dims[0]
    if not isinstance(n, Sym):
        return ctx.g.constant(np.arange(start, end, step).astype(out.dtype.np))
    if isinstance(start, Sym) or isinstance(step, Sym):
        raise ctx.unsupported(f"arange({start}, {end}, {step}) with a symbolic start or step")
    ones = filled(ctx, 1, out)
    idx = ctx.g.apply(Cumsum(0, exclusive=True), [ones])
    if step != 1:
        idx = ctx.g.apply(Binary(BinaryKind.MUL), [idx, ctx.const(step, out.dtype)])
    if start != 0:
        idx = ctx.g.apply(Binary(BinaryKind.ADD), [idx, ctx.const(start, out.dtype)])
    return idx
