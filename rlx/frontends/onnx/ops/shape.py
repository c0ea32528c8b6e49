"""Shape and layout ONNX ops -> rlx reshape / transpose / concat / slice / expand / pad /
gather. Shape-carrying inputs (a Reshape's shape, a Slice's starts, Split's sizes, Pad's
pads) must be known at import: rlx compiles static (or symbolic) shapes. Shape, Size and
ConstantOfShape of static shapes give constants, so shape arithmetic folds."""

from __future__ import annotations

import numpy as np

from rlx.frontends.onnx.context import NodeCtx
from rlx.frontends.onnx.ops import converter
from rlx.frontends.onnx.ops.util import axis_of
from rlx.frontends.onnx.symbolic import SymValue, register_carriers, shape_value, wrap
from rlx.ops.movement import Concat, Expand, Gather, Pad, Reshape, Slice, Transpose
from rlx.shape import Dim, Shape, Sym, broadcast_dims, dims_product


def _static(ctx: NodeCtx, s: Shape, what: str) -> tuple[int, ...]:
    if not s.is_static:
        raise ctx.unsupported(f"{what} of the symbolic shape {s} (needs static dims)")
    return tuple(int(d) for d in s.dims)


@converter("Constant", since=1)
def constant(ctx: NodeCtx) -> np.ndarray:
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if ctx.has_attr(key):
            v = ctx.attr(key)
            if key in ("value_float", "value_floats"):
                return np.asarray(v, dtype=np.float32)
            if key in ("value_int", "value_ints"):
                return np.asarray(v, dtype=np.int64)
            from rlx.frontends.onnx.tensors import to_array

            return to_array(ctx.node.attribute[0].t) if key == "value" else np.asarray(v)
    raise ctx.unsupported("a Constant with a sparse or string value")


@converter("Shape", since=1)
def shape_(ctx: NodeCtx) -> np.ndarray | SymValue:
    """A constant for static dims; symbolic dims give a SymValue (see symbolic.py)."""
    s = ctx.in_shape(0)
    r = s.rank
    start = axis_of(ctx.attr("start", 0), r)
    end = ctx.attr("end", None)
    end = r if end is None else axis_of(end, r)
    start, end = min(max(start, 0), r), min(max(end, 0), r)
    if not s.is_static and ctx.node.input[0] not in ctx.st.syms:
        register_carriers(ctx.st, ctx.x(0), s.dims)
    return shape_value(s.dims, start, end)


@converter("Size", since=1)
def size(ctx: NodeCtx) -> np.ndarray | SymValue:
    n = dims_product(ctx.in_shape(0).dims)
    out = np.empty((), dtype=object)
    out[()] = n
    return wrap(out, np.dtype(np.int64))


@converter("ConstantOfShape", since=9)
def constant_of_shape(ctx: NodeCtx) -> np.ndarray | int:
    dims = ctx.dims(0, "shape")
    v = ctx.attr("value")
    v = np.zeros(1, np.float32) if v is None else np.asarray(v)
    if all(isinstance(d, int) for d in dims):
        return np.full(dims, v.reshape(-1)[0], dtype=v.dtype)
    one = ctx.g.constant(v.reshape((1,) * len(dims)))
    return ctx.g.apply(Expand(tuple(dims)), [one])


def _reshape_dims(ctx: NodeCtx, x: Shape, spec: list[Dim], allowzero: bool) -> tuple:
    dims = [x.dims[i] if (d == 0 and not allowzero) else d for i, d in enumerate(spec)]
    if dims.count(-1) > 1:
        raise ctx.error(f"shape {spec} has more than one -1")
    if -1 in dims:
        rest = dims_product([d for d in dims if d != -1])
        total = x.numel
        if isinstance(total, int) and isinstance(rest, int):
            if rest == 0 or total % rest:
                raise ctx.error(f"cannot reshape {x} to {spec}")
            missing = total // rest
        else:
            missing = total.divide(rest) if hasattr(total, "divide") else None
            if missing is None:
                raise ctx.unsupported(f"reshape of {x} to {spec} (symbolic -1)")
        dims[dims.index(-1)] = missing
    return tuple(dims)


@converter("Reshape", since=5)
def reshape(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    dims = _reshape_dims(ctx, ctx.shape(x), ctx.dims(1, "shape"), bool(ctx.attr("allowzero", 0)))
    return ctx.g.apply(Reshape(dims), [x])


@converter("Flatten", since=1)
def flatten(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    s = ctx.shape(x)
    ax = axis_of(ctx.attr("axis", 1), s.rank)
    return ctx.g.apply(Reshape((dims_product(s.dims[:ax]), dims_product(s.dims[ax:]))), [x])


def _axes_in(ctx: NodeCtx, idx: int, since: int) -> list[int] | None:
    if ctx.opset >= since:
        return ctx.ints(idx, "axes") if ctx.has(idx) else None
    a = ctx.attr("axes")
    return None if a is None else [int(v) for v in a]


@converter("Squeeze", since=1)
def squeeze(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    s = ctx.shape(x)
    axes = _axes_in(ctx, 1, 13)
    drop = (
        {i for i, d in enumerate(s.dims) if d == 1}
        if axes is None
        else {axis_of(a, s.rank) for a in axes}
    )
    return ctx.g.apply(Reshape(tuple(d for i, d in enumerate(s.dims) if i not in drop)), [x])


@converter("Unsqueeze", since=1)
def unsqueeze(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    s = ctx.shape(x)
    axes = _axes_in(ctx, 1, 13) or []
    r = s.rank + len(axes)
    new = {axis_of(a, r) for a in axes}
    it = iter(s.dims)
    return ctx.g.apply(Reshape(tuple(1 if i in new else next(it) for i in range(r))), [x])


@converter("Transpose", since=1)
def transpose(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    r = ctx.shape(x).rank
    perm = ctx.attr("perm") or list(reversed(range(r)))
    return ctx.g.apply(Transpose(tuple(int(p) for p in perm)), [x])


@converter("Concat", since=4)
def concat(ctx: NodeCtx) -> int:
    xs = ctx.xs()
    r = ctx.shape(xs[0]).rank
    xs = [x for x in xs if ctx.shape(x).dims[axis_of(ctx.attr("axis"), r)] != 0] or xs[:1]
    if len(xs) == 1:
        return ctx.g.apply(Reshape(ctx.shape(xs[0]).dims), [xs[0]])
    return ctx.g.apply(Concat(axis_of(ctx.attr("axis"), r)), xs)


def _slice_norm(n: int, s: int, e: int, st: int) -> tuple[int | None, int | None, int]:
    big = 2**62
    s, e = max(min(s, big), -big), max(min(e, big), -big)
    r = range(n)[slice(s, e, st)]
    if len(r) == 0:
        return 0, 0, 1
    stop = r.stop if r.stop >= 0 else None
    return r.start, stop, r.step


def _slice(ctx: NodeCtx, x: int, starts, ends, axes, steps) -> int:  # noqa: ANN001
    s = ctx.shape(x)
    r = s.rank
    axes = list(range(len(starts))) if axes is None else [axis_of(a, r) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    st: list[int | None] = [None] * r
    en: list[int | None] = [None] * r
    sp = [1] * r
    sym_ends = []
    for a, b, e, c in zip(axes, starts, ends, steps, strict=True):
        n = s.dims[a]
        if isinstance(b, Sym):
            raise ctx.unsupported(f"slice of axis {a} of {s} from the symbolic start {b}")
        if isinstance(e, Sym) and e != n:
            if c != 1 or b != 0 or not isinstance(n, int):
                raise ctx.unsupported(f"slice of axis {a} of {s} to the symbolic end {e}")
            sym_ends.append((a, e))  # x[..., :e] on a static axis
            _at_most(ctx, e, n)
            continue
        if not isinstance(n, int):
            if c != 1 or b < 0 or (e != n and e < 2**62):
                raise ctx.unsupported(f"slice of the symbolic axis {a} of {s}")
            st[a] = b
            continue
        st[a], en[a], sp[a] = _slice_norm(n, int(b), int(e), int(c))
    y = ctx.g.apply(Slice(tuple(st), tuple(en), tuple(sp)), [x])
    for a, e in sym_ends:  # a gather of positions 0..e-1, built from the run-time e
        y = ctx.g.apply(Gather(a), [y, arange(ctx, e)])
    return y


def _at_most(ctx: NodeCtx, d: Sym, n: int) -> None:
    """Bound the symbol of ``d`` (``c*s``) so that ``d <= n``: a model that slices a static
    axis (a position table) to a dynamic length runs only up to that length, and a longer
    input is then an InputError naming the bound rather than a wrong result."""
    if len(d.terms) != 1 or d.terms[0][1] != 1:
        return
    name = d.terms[0][0]
    lo, hi = ctx.g.sym_bounds.get(name, (1, None))
    top = n // d.coeff
    ctx.g.sym_bounds[name] = (lo, top if hi is None else min(hi, top))


def arange(ctx: NodeCtx, n: Dim) -> int:
    """An i64 node ``[0, 1, ..., n-1]`` of the symbolic length ``n`` (a running sum of
    ones, as rlx.models.hf builds position ids)."""
    g = ctx.g
    ones = g.apply(Expand((n,)), [g.constant(np.ones(1, np.int64))])
    return g.sub(g.cumsum(ones, 0), g.constant(np.asarray(1, np.int64)))


@converter("Slice", since=1, until=10)
def slice_attr(ctx: NodeCtx) -> int:
    axes = ctx.attr("axes")
    return _slice(ctx, ctx.x(0), ctx.attr("starts"), ctx.attr("ends"), axes, None)


@converter("Slice", since=10)
def slice_(ctx: NodeCtx) -> int:
    starts, ends = ctx.dims(1, "starts"), ctx.dims(2, "ends")
    axes = ctx.ints(3, "axes") if ctx.has(3) else None
    steps = ctx.ints(4, "steps") if ctx.has(4) else None
    return _slice(ctx, ctx.x(0), starts, ends, axes, steps)


@converter("Split", since=1)
def split(ctx: NodeCtx) -> list[int]:
    x = ctx.x(0)
    s = ctx.shape(x)
    ax = axis_of(ctx.attr("axis", 0), s.rank)
    n = s.dims[ax]
    if not isinstance(n, int):
        raise ctx.unsupported(f"Split along the symbolic axis {ax} of {s}")
    if ctx.opset >= 13 and ctx.has(1):
        sizes = ctx.ints(1, "split")
    elif ctx.opset < 13 and ctx.attr("split"):
        sizes = [int(v) for v in ctx.attr("split")]
    else:
        k = ctx.attr("num_outputs", len(ctx.node.output))
        chunk = -(-n // k)
        sizes = [min(chunk, n - i * chunk) for i in range(k)]
    if sum(sizes) != n:
        raise ctx.error(f"split sizes {sizes} do not add up to axis {ax} of {s}")
    outs, at = [], 0
    for sz in sizes:
        st = [None] * s.rank
        en: list[int | None] = [None] * s.rank
        st[ax], en[ax] = at, at + sz
        outs.append(ctx.g.apply(Slice(tuple(st), tuple(en), (1,) * s.rank), [x]))
        at += sz
    return outs


@converter("Expand", since=8)
def expand(ctx: NodeCtx) -> int:
    x = ctx.x(0)
    want = ctx.dims(1, "shape")
    s = ctx.shape(x)
    dims = broadcast_dims(s.dims, tuple(want))
    if len(dims) > s.rank:
        x = ctx.g.apply(Reshape((1,) * (len(dims) - s.rank) + s.dims), [x])
    return ctx.g.apply(Expand(dims), [x])


@converter("Tile", since=6)
def tile(ctx: NodeCtx) -> int:
    g, x = ctx.g, ctx.x(0)
    reps = ctx.ints(1, "repeats")
    dims = _static(ctx, ctx.shape(x), "Tile")
    inter = tuple(v for d in dims for v in (1, d))
    big = tuple(v for d, r in zip(dims, reps, strict=True) for v in (r, d))
    y = g.apply(Expand(big), [g.apply(Reshape(inter), [x])])
    return g.apply(Reshape(tuple(d * r for d, r in zip(dims, reps, strict=True))), [y])


def _pad_index(mode: str, n: int, lo: int, hi: int) -> np.ndarray:
    i = np.arange(-lo, n + hi)
    if mode == "edge":
        return np.clip(i, 0, n - 1)
    if mode == "wrap":
        return i % n
    period = 2 * (n - 1) if n > 1 else 1  # reflect: mirror without repeating the edge
    j = np.abs(i) % period
    return np.where(j >= n, period - j, j)


def _pad(ctx: NodeCtx, pads: list[int], value: float, mode: str, axes: list[int] | None) -> int:
    g, x = ctx.g, ctx.x(0)
    s = ctx.shape(x)
    r = s.rank
    axes = list(range(r)) if axes is None else [axis_of(a, r) for a in axes]
    k = len(axes)
    lo, hi = [0] * r, [0] * r
    for j, a in enumerate(axes):
        lo[a], hi[a] = pads[j], pads[j + k]
    if any(v < 0 for v in lo + hi):  # negative pads crop
        st = tuple(-v if v < 0 else None for v in lo)
        en = tuple((int(d) + v) if v < 0 else None for d, v in zip(s.dims, hi, strict=True))
        x = g.apply(Slice(st, en, (1,) * r), [x])
        lo, hi = [max(v, 0) for v in lo], [max(v, 0) for v in hi]
    if mode == "constant":
        if not any(lo + hi):
            return g.apply(Reshape(g.shape(x).dims), [x])
        return g.apply(Pad(tuple(zip(lo, hi, strict=True)), float(value)), [x])
    if mode not in ("reflect", "edge", "wrap"):
        raise ctx.unsupported(f"Pad mode {mode!r}")
    for a in range(r):
        if lo[a] or hi[a]:
            n = g.shape(x).dims[a]
            if not isinstance(n, int):
                raise ctx.unsupported(f"{mode} padding of the symbolic axis {a}")
            idx = g.constant(_pad_index(mode, n, lo[a], hi[a]).astype(np.int64))
            x = g.apply(Gather(a), [x, idx])
    return x


@converter("Pad", since=2, until=11)
def pad_attr(ctx: NodeCtx) -> int:
    return _pad(ctx, ctx.attr("pads"), ctx.attr("value", 0.0), ctx.attr("mode", "constant"), None)


@converter("Pad", since=11)
def pad(ctx: NodeCtx) -> int:
    pads = ctx.ints(1, "pads")
    value = 0.0
    if ctx.has(2):
        v = np.asarray(ctx.value(2, "constant_value")).reshape(-1)
        value = float(v[0]) if v.size else 0.0
    axes = ctx.ints(3, "axes") if ctx.has(3) else None
    return _pad(ctx, pads, value, ctx.attr("mode", "constant"), axes)
