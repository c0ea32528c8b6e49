"""Layout ATen ops -> rlx reshape / transpose / expand / slice / concat / pad. Ops whose
result is a pure re-view of the data (view, reshape, flatten, squeeze, unsqueeze,
unflatten) become one Reshape to the result shape torch recorded, symbolic dims
included."""

from __future__ import annotations

from typing import Any

from rlx.dtype import DType
from rlx.frontends.torch.aten import aten
from rlx.frontends.torch.aten.create import filled
from rlx.frontends.torch.context import NodeCtx
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.ops.movement import Concat, Expand, Gather, Pad, Reshape, Slice, Transpose
from rlx.ops.reduce import Cumsum
from rlx.shape import Shape, Sym

__all__: list[str] = []

BIG = 2**62  # torch writes "to the end" as 2**63 - 1


def _ax(ctx: NodeCtx, x: int, axis: int) -> int:
    r = ctx.shape(x).rank
    return axis + r if axis < 0 else axis


@aten(
    "view", "_unsafe_view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze",
    "view_copy", "_reshape_alias", "squeeze_copy", "unsqueeze_copy",
)  # fmt: skip
def reshape(ctx: NodeCtx) -> int:
    return ctx.g.apply(Reshape(ctx.out_shape().dims), [ctx.t(0)])


@aten("permute", "permute_copy")
def permute(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    return ctx.g.apply(Transpose(tuple(_ax(ctx, x, int(p)) for p in ctx.arg(1))), [x])


@aten("transpose.int", "transpose_copy.int", "t", "numpy_T", "swapaxes", "swapdims")
def transpose(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    r = ctx.shape(x).rank
    if r < 2:
        return x
    if ctx.op.split(".")[1] in ("t", "numpy_T"):  # every axis reversed
        return ctx.g.apply(Transpose(tuple(reversed(range(r)))), [x])
    perm = list(range(r))
    a, b = _ax(ctx, x, ctx.arg(1)), _ax(ctx, x, ctx.arg(2))
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.g.apply(Transpose(tuple(perm)), [x])


@aten("expand", "expand_copy", "expand_as", "broadcast_to")
def expand(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    out = ctx.out_shape().dims
    if out == ctx.shape(x).dims:
        return x
    return ctx.g.apply(Expand(out), [x])


def _bound(ctx: NodeCtx, v: Any, n: Any, default: int | None) -> int | None:
    """A slice bound as Slice takes it: an int, or None for 'the end'."""
    if v is None:
        return default
    if isinstance(v, Sym):
        if v == n:
            return None
        raise ctx.unsupported(f"slice bound {v} is symbolic (on an axis of size {n})")
    v = int(v)
    if v >= BIG:
        return None
    if isinstance(n, int) and v >= n:
        return None
    return v


@aten("slice.Tensor", "slice_copy.Tensor")
def slice_(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    s = ctx.shape(x)
    ax = _ax(ctx, x, ctx.arg(1, 0))
    n = s.dims[ax]
    if isinstance(ctx.arg(3), Sym) and ctx.arg(3) != n:
        return _slice_to_symbol(ctx, x, ax)
    start = _bound(ctx, ctx.arg(2), n, 0)
    stop = _bound(ctx, ctx.arg(3), n, None)
    step = int(ctx.arg(4, 1))
    if start in (0, None) and stop is None and step == 1:
        return x
    starts: list[int | None] = [0] * s.rank
    stops: list[int | None] = [None] * s.rank
    steps = [1] * s.rank
    starts[ax], stops[ax], steps[ax] = start or 0, stop, step
    return ctx.g.apply(Slice(tuple(starts), tuple(stops), tuple(steps)), [x])


def _slice_to_symbol(ctx: NodeCtx, x: int, ax: int) -> int:
    """``x[..., start:stop:step]`` with a symbolic ``stop`` on a longer axis (positions
    ``[:seq]`` of a table): a gather of ``start + step * arange(len)``, ``len`` symbolic."""
    start, step = ctx.arg(2) or 0, int(ctx.arg(4, 1))
    if not isinstance(start, int) or start < 0 or step < 1:
        raise ctx.unsupported(f"slice [{start}:{ctx.arg(3)}:{step}] with a symbolic stop")
    length = ctx.out_shape().dims[ax]
    idx = ctx.g.apply(Cumsum(0, exclusive=True), [filled(ctx, 1, Shape((length,), DType.I64))])
    if step != 1:
        idx = ctx.g.apply(Binary(BinaryKind.MUL), [idx, ctx.const(step, DType.I64)])
    if start:
        idx = ctx.g.apply(Binary(BinaryKind.ADD), [idx, ctx.const(start, DType.I64)])
    return ctx.g.apply(Gather(ax), [x, idx])


@aten("narrow")
def narrow(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    s = ctx.shape(x)
    ax = _ax(ctx, x, ctx.arg(1))
    start, length = int(ctx.arg(2)), int(ctx.arg(3))
    starts: list[int | None] = [0] * s.rank
    stops: list[int | None] = [None] * s.rank
    starts[ax], stops[ax] = start, start + length if start >= 0 else (start + length or None)
    return ctx.g.apply(Slice(tuple(starts), tuple(stops), (1,) * s.rank), [x])


@aten("select.int", "select_copy.int")
def select(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    s = ctx.shape(x)
    ax = _ax(ctx, x, ctx.arg(1))
    i = int(ctx.arg(2))
    starts: list[int | None] = [0] * s.rank
    stops: list[int | None] = [None] * s.rank
    starts[ax], stops[ax] = i, (i + 1 if i != -1 else None)
    y = ctx.g.apply(Slice(tuple(starts), tuple(stops), (1,) * s.rank), [x])
    return ctx.g.apply(Reshape(ctx.out_shape().dims), [y])


@aten("cat", "concat", "concatenate")
def cat(ctx: NodeCtx) -> int:
    dt = ctx.out_dtype
    xs = [ctx.cast(v.id, dt) for v in ctx.arg(0)]
    xs = [x for x in xs if ctx.shape(x).numel != 0] or xs[:1]
    if len(xs) == 1:
        return xs[0]
    return ctx.g.apply(Concat(_ax(ctx, xs[0], ctx.arg(1, 0, name="dim"))), xs)


@aten("stack")
def stack(ctx: NodeCtx) -> int:
    dt = ctx.out_dtype
    out = ctx.out_shape().dims
    ax = ctx.arg(1, 0, name="dim")
    ax = ax + len(out) if ax < 0 else ax
    xs = []
    for v in ctx.arg(0):
        d = list(ctx.shape(v.id).dims)
        d.insert(ax, 1)
        xs.append(ctx.g.apply(Reshape(tuple(d)), [ctx.cast(v.id, dt)]))
    return xs[0] if len(xs) == 1 else ctx.g.apply(Concat(ax), xs)


def _pieces(ctx: NodeCtx, x: int, ax: int, sizes: list[int]) -> tuple[int, ...]:
    s = ctx.shape(x)
    out, at = [], 0
    for n in sizes:
        starts: list[int | None] = [0] * s.rank
        stops: list[int | None] = [None] * s.rank
        starts[ax], stops[ax] = at, at + n
        out.append(ctx.g.apply(Slice(tuple(starts), tuple(stops), (1,) * s.rank), [x]))
        at += n
    return tuple(out)


@aten("split.Tensor", "split_with_sizes", "chunk", "unbind.int", "tensor_split.sections",
      "split_with_sizes_copy", "split_copy.Tensor")  # fmt: skip
def split(ctx: NodeCtx) -> tuple[int, ...]:
    x = ctx.t(0)
    unbind = "unbind" in ctx.op
    ax = _ax(ctx, x, ctx.arg(1 if unbind else 2, 0, name="dim"))
    n = ctx.shape(x).dims[ax]
    if not isinstance(n, int):
        raise ctx.unsupported(f"splitting the symbolic axis {ax} of {ctx.shape(x)}")
    sizes = [1] * n if unbind else [int(m.shape[ax]) for m in ctx.meta()]
    parts = _pieces(ctx, x, ax, sizes)
    if unbind:
        return tuple(ctx.g.apply(Reshape(ctx.out_shape(k).dims), [p]) for k, p in enumerate(parts))
    return parts


@aten("repeat")
def repeat(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    reps = [int(r) for r in ctx.arg(1)]
    s = ctx.shape(x)
    dims = [1] * (len(reps) - s.rank) + list(s.dims)
    x = ctx.g.apply(Reshape(tuple(dims)), [x])
    # tile each axis: [.., d, ..] -> [.., r, d, ..] broadcast -> [.., r*d, ..]
    inter, big = [], []
    for r, d in zip(reps, dims, strict=True):
        inter += [1, d]
        big += [r, d]
    y = ctx.g.apply(Expand(tuple(big)), [ctx.g.apply(Reshape(tuple(inter)), [x])])
    return ctx.g.apply(Reshape(ctx.out_shape().dims), [y])


@aten("constant_pad_nd", "pad")
def pad(ctx: NodeCtx) -> int:
    x = ctx.t(0)
    mode = ctx.arg(2, "constant", name="mode")
    if mode != "constant":
        raise ctx.unsupported(f"pad mode {mode!r} (rlx pads with a constant)")
    flat = [int(p) for p in ctx.arg(1)]
    r = ctx.shape(x).rank
    pads = [(0, 0)] * r
    for i in range(len(flat) // 2):  # torch lists the last axis first
        pads[r - 1 - i] = (flat[2 * i], flat[2 * i + 1])
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        raise ctx.unsupported(f"negative padding {flat}")
    value = ctx.arg(3 if "constant_pad" not in ctx.op else 2, 0.0, name="value") or 0.0
    return ctx.g.apply(Pad(tuple(pads), float(value)), [x])


@aten("diff")
def diff(ctx: NodeCtx) -> int:
    """``x[1:] - x[:-1]`` along ``dim`` with optional prepend / append (n = 1)."""
    x = ctx.t(0)
    if ctx.arg(1, 1) != 1:
        raise ctx.unsupported("diff with n > 1")
    ax = _ax(ctx, x, ctx.arg(2, -1))
    pre, app = ctx.opt_t(3, "prepend"), ctx.opt_t(4, "append")
    parts = [p for p in (pre, x, app) if p is not None]
    if len(parts) > 1:
        x = ctx.g.apply(Concat(ax), [ctx.cast(p, ctx.dtype(x)) for p in parts])
    r = ctx.shape(x).rank
    hi: list[int | None] = [0] * r
    lo: list[int | None] = [0] * r
    hi[ax] = 1
    stops: list[int | None] = [None] * r
    lo_stops: list[int | None] = [None] * r
    lo_stops[ax] = -1
    a = ctx.g.apply(Slice(tuple(hi), tuple(stops), (1,) * r), [x])
    b = ctx.g.apply(Slice(tuple(lo), tuple(lo_stops), (1,) * r), [x])
    if ctx.dtype(x).is_bool:
        raise ctx.unsupported("diff of a bool tensor")
    return ctx.g.apply(Binary(BinaryKind.SUB), [a, b])
