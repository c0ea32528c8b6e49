"""GridSample (opset 16+, 2-D and 3-D) -> elementwise coordinate arithmetic and
gather_elements. Per spatial axis: the grid coordinate is denormalised (align_corners),
rounded for ``nearest``, folded back by ``border`` / ``reflection`` when it leaves the
border range, then split into taps (1 nearest, 2 linear, 4 cubic with a = -0.75) whose
indices are fixed by the padding mode (zeros: weight 0 outside; border: clamped;
reflection: reflected). Each combination of per-axis taps is one gather from the
flattened input with the product of the per-axis weights, as the ONNX reference's nested
1-D interpolation computes."""

from __future__ import annotations

import itertools

import numpy as np

from rlx.dtype import DType
from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import bin_, cast, cmp, scalar, un, where
from rlx.ops.elementwise import BinaryKind as B
from rlx.ops.elementwise import CompareKind as C
from rlx.ops.elementwise import UnaryKind as U
from rlx.ops.indexing import GatherElements
from rlx.ops.movement import Expand, Reshape, Slice


class _E:
    """Shorthand for elementwise chains on one graph."""

    def __init__(self, g, like: int):  # noqa: ANN001
        self.g, self.like = g, like

    def c(self, v: float) -> int:
        return scalar(self.g, v, self.like)

    def add(self, a: int, b: int) -> int:
        return bin_(self.g, B.ADD, a, b)

    def sub(self, a: int, b: int) -> int:
        return bin_(self.g, B.SUB, a, b)

    def mul(self, a: int, b: int) -> int:
        return bin_(self.g, B.MUL, a, b)

    def div(self, a: int, b: int) -> int:
        return bin_(self.g, B.DIV, a, b)

    def floor(self, a: int) -> int:
        return un(self.g, U.FLOOR, a)

    def clamp(self, a: int, lo: float, hi: float) -> int:
        return bin_(self.g, B.MIN, bin_(self.g, B.MAX, a, self.c(lo)), self.c(hi))

    def where(self, m: int, a: int, b: int) -> int:
        return where(self.g, m, a, b)

    def lt(self, a: int, b: int) -> int:
        return cmp(self.g, C.LT, a, b)

    def gt(self, a: int, b: int) -> int:
        return cmp(self.g, C.GT, a, b)


def _reflect(e: _E, v: int, lo: float, hi: float) -> int:
    rng = hi - lo

    def fold(dx: int, near: float, far: float) -> int:
        n = e.floor(e.div(dx, e.c(rng)))
        r = e.sub(dx, e.mul(n, e.c(rng)))
        odd = e.gt(e.sub(n, e.mul(e.floor(e.div(n, e.c(2))), e.c(2))), e.c(0.5))
        toward = e.add(e.c(near), r) if near == lo else e.sub(e.c(near), r)
        back = e.sub(e.c(far), r) if far == hi else e.add(e.c(far), r)
        return e.where(odd, back, toward)

    below = fold(e.sub(e.c(lo), v), lo, hi)
    above = fold(e.sub(v, e.c(hi)), hi, lo)
    return e.where(e.lt(v, e.c(lo)), below, e.where(e.gt(v, e.c(hi)), above, v))


def _cubic(e: _E, t: int) -> list[int]:
    a = -0.75

    def k(x: int) -> int:  # x >= 0
        x2 = e.mul(x, x)
        x3 = e.mul(x2, x)
        near = e.add(e.sub(e.mul(e.c(a + 2), x3), e.mul(e.c(a + 3), x2)), e.c(1))
        far = e.sub(
            e.add(e.sub(e.mul(e.c(a), x3), e.mul(e.c(5 * a), x2)), e.mul(e.c(8 * a), x)), e.c(4 * a)
        )
        return e.where(e.gt(x, e.c(1)), far, near)

    one = e.c(1)
    return [k(e.add(t, one)), k(t), k(e.sub(one, t)), k(e.sub(e.c(2), t))]


@converter("GridSample", since=16)
def grid_sample(ctx: NodeCtx) -> int:
    g, x, grid = ctx.g, ctx.x(0), ctx.x(1)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(
        ctx.attr("mode", "linear"), ctx.attr("mode", "linear")
    )
    pad = ctx.attr("padding_mode", "zeros")
    align = bool(ctx.attr("align_corners", 0))
    xs, gs = ctx.shape(x), ctx.shape(grid)
    if not (xs.is_static and gs.is_static) or xs.rank not in (4, 5):
        raise ctx.unsupported(f"GridSample of {xs} (static 2-D or 3-D inputs)")
    dt = xs.dtype
    ct = DType.F64 if dt is DType.F64 else DType.F32
    n, ch = (int(v) for v in xs.dims[:2])
    dims = [int(v) for v in xs.dims[2:]]
    nd = len(dims)
    out = [int(v) for v in gs.dims[1:-1]]
    p = int(np.prod(out))
    gf = cast(g, grid, ct)
    e = _E(g, gf)
    per_axis = []  # per axis: list of (index node (i64), weight node or None)
    for i, d in enumerate(dims):
        comp = nd - 1 - i
        st = (None,) * (nd + 1) + (comp,)
        en = (None,) * (nd + 1) + (comp + 1,)
        gi = g.apply(Reshape((n, p)), [g.apply(Slice(st, en, (1,) * (nd + 2)), [gf])])
        if align:
            v = e.mul(e.div(e.add(gi, e.c(1)), e.c(2)), e.c(d - 1))
        else:
            v = e.div(e.sub(e.mul(e.add(gi, e.c(1)), e.c(d)), e.c(1)), e.c(2))
        if mode == "nearest":
            v = un(g, U.ROUND, v)
        lo, hi = (0.0, d - 1.0) if align else (-0.5, d - 0.5)
        if pad == "border":
            outside = bin_(g, B.OR, e.lt(v, e.c(lo)), e.gt(v, e.c(hi)))
            v = e.where(outside, e.clamp(v, 0, d - 1), v)
        elif pad == "reflection":
            v = _reflect(e, v, lo, hi)
        if mode == "nearest":
            taps = [(v, None)]
        else:
            x0 = e.floor(v)
            t = e.sub(v, x0)
            if mode == "linear":
                taps = [(x0, e.sub(e.c(1), t)), (e.add(x0, e.c(1)), t)]
            else:
                w = _cubic(e, t)
                taps = [(e.add(x0, e.c(off)), w[j]) for j, off in enumerate((-1, 0, 1, 2))]
        fixed = []
        for idx, w in taps:
            valid = None
            if pad == "zeros":
                valid = bin_(g, B.AND, cmp(g, C.GE, idx, e.c(0)), cmp(g, C.LE, idx, e.c(d - 1)))
                idx = e.clamp(idx, 0, d - 1)
            elif pad == "border":
                idx = e.clamp(idx, 0, d - 1)
            else:
                idx = e.clamp(cast(g, cast(g, _reflect(e, idx, lo, hi), DType.I64), ct), 0, d - 1)
            if valid is not None:
                vw = cast(g, valid, ct)
                w = vw if w is None else e.mul(w, vw)
            fixed.append((cast(g, idx, DType.I64), w))
        per_axis.append(fixed)
    flat_x = g.apply(Reshape((n, ch, int(np.prod(dims)))), [x])
    strides = [int(np.prod(dims[i + 1 :])) for i in range(nd)]
    total = None
    for combo in itertools.product(*per_axis):
        flat = None
        weight = None
        for (idx, w), s in zip(combo, strides, strict=True):
            term = bin_(g, B.MUL, idx, scalar(g, s, idx)) if s != 1 else idx
            flat = term if flat is None else bin_(g, B.ADD, flat, term)
            if w is not None:
                weight = w if weight is None else e.mul(weight, w)
        fi = g.apply(Expand((n, ch, p)), [g.apply(Reshape((n, 1, p)), [flat])])
        val = cast(g, g.apply(GatherElements(2), [flat_x, fi]), ct)
        if weight is not None:
            val = e.mul(val, g.apply(Reshape((n, 1, p)), [weight]))
        total = val if total is None else e.add(total, val)
    return cast(g, g.apply(Reshape((n, ch, *out)), [total]), dt)
