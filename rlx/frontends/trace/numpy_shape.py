"""``rlx.numpy`` shapes and constructors: reshape, transpose, concatenate, take, ...

In: traced values (or NumPy arrays, lifted to constants) and static shape arguments.
Out: traced values built from the IR's movement ops (``reshape``, ``transpose``,
``concat``, ``expand``, ``gather``, ``cast``). ``zeros`` / ``ones`` / ``full`` /
``arange`` / ``eye`` are static: inside a trace they are constants of the graph (a
scalar constant expanded for ``zeros``, ``ones``, ``full``); outside one, NumPy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlx import source
from rlx.dtype import DType
from rlx.errors import TraceError
from rlx.frontends.trace.tracer import current, find_trace, lift, to_dtype
from rlx.frontends.trace.values import Traced, cast, promote_args
from rlx.ops.movement import Concat, Expand, Gather, Transpose

__all__ = [
    "asarray", "array", "astype", "reshape", "transpose", "swapaxes", "moveaxis",
    "expand_dims", "squeeze", "ravel", "concatenate", "stack", "take", "broadcast_to",
    "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "arange", "eye",
    "shape", "ndim", "split",
]  # fmt: skip


def _lift1(x: Any) -> Traced:
    return lift(find_trace(x), x)


def asarray(x: Any, dtype: Any = None) -> Traced:
    """``x`` as a traced value (a constant for arrays and lists), cast to ``dtype``."""
    v = _lift1(x)
    return v if dtype is None else cast(v, to_dtype(dtype))


array = asarray


def astype(x: Any, dtype: Any) -> Traced:
    """``x`` converted to ``dtype`` (floats to ints truncate toward zero)."""
    return cast(_lift1(x), to_dtype(dtype))


def shape(x: Any) -> tuple[Any, ...]:
    """The dims of ``x``."""
    return _lift1(x).shape if isinstance(x, Traced) else np.shape(x)


def ndim(x: Any) -> int:
    """The rank of ``x``."""
    return x.ndim if isinstance(x, Traced) else np.ndim(x)


def reshape(x: Any, newshape: Any) -> Traced:
    """``x`` with dims ``newshape`` (one may be -1)."""
    v = _lift1(x)
    dims = (newshape,) if isinstance(newshape, int) else tuple(newshape)
    t = v.trace
    return t.wrap(t.g.reshape(v.id, dims), v.weak)


def ravel(x: Any) -> Traced:
    """``x`` flattened (row-major)."""
    return reshape(x, (-1,))


def transpose(x: Any, axes: Sequence[int] | None = None) -> Traced:
    """Permute the axes (default: reverse them)."""
    v = _lift1(x)
    r = v.ndim
    perm = tuple(reversed(range(r))) if axes is None else tuple(int(a) for a in axes)
    if r < 2 and axes is None:
        return v
    t = v.trace
    return t.wrap(
        t.g.apply(Transpose(tuple(a % r if -r <= a < r else a for a in perm)), [v.id]), v.weak
    )


def swapaxes(x: Any, a: int, b: int) -> Traced:
    """``x`` with axes ``a`` and ``b`` exchanged."""
    v = _lift1(x)
    perm = list(range(v.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(v, perm)


def moveaxis(x: Any, source_: int, destination: int) -> Traced:
    """``x`` with axis ``source_`` moved to ``destination``."""
    v = _lift1(x)
    r = v.ndim
    perm = [a for a in range(r) if a != source_ % r]
    perm.insert(destination % r, source_ % r)
    return transpose(v, perm)


def expand_dims(x: Any, axis: int | Sequence[int]) -> Traced:
    """``x`` with unit axes inserted at ``axis`` (positions in the output)."""
    v = _lift1(x)
    t = v.trace
    return t.wrap(t.g.unsqueeze(v.id, axis), v.weak)


def squeeze(x: Any, axis: int | Sequence[int] | None = None) -> Traced:
    """``x`` without its unit axes (or only those in ``axis``)."""
    v = _lift1(x)
    t = v.trace
    return t.wrap(t.g.squeeze(v.id, axis), v.weak)


def concatenate(xs: Sequence[Any], axis: int = 0) -> Traced:
    """Join ``xs`` along an existing ``axis``; dtypes promoted."""
    vals, weak = promote_args(*xs)
    t = vals[0].trace
    r = vals[0].ndim
    ax = axis % r if -r <= axis < r else axis
    return t.wrap(t.g.apply(Concat(ax), [v.id for v in vals]), weak)


def stack(xs: Sequence[Any], axis: int = 0) -> Traced:
    """Join ``xs`` along a new ``axis``."""
    vals, _ = promote_args(*xs)
    return concatenate([expand_dims(v, axis) for v in vals], axis)


def split(x: Any, indices_or_sections: int | Sequence[int], axis: int = 0) -> list[Traced]:
    """``x`` cut along ``axis`` into equal sections, or at the given indices."""
    v = _lift1(x)
    n = v.shape[axis]
    if not isinstance(n, int):
        raise TraceError(f"split: axis {axis} of {v.aval} is dynamic", loc=source.capture())
    if isinstance(indices_or_sections, int):
        k = indices_or_sections
        if n % k:
            raise TraceError(
                f"split: {n} elements of axis {axis} do not divide into {k} equal sections",
                loc=source.capture(),
            )
        cuts = [n // k * i for i in range(1, k)]
    else:
        cuts = list(indices_or_sections)
    bounds = [0, *cuts, n]
    key = [slice(None)] * v.ndim
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        key[axis] = slice(lo, hi)
        out.append(v[tuple(key)])
    return out


def take(x: Any, indices: Any, axis: int | None = None) -> Traced:
    """Elements of ``x`` at integer ``indices`` along ``axis`` (None: of the flattened
    value); the result replaces that axis by the dims of ``indices`` (``gather``)."""
    v = _lift1(x)
    if axis is None:
        v, axis = reshape(v, (-1,)), 0
    t = v.trace
    idx = lift(t, np.asarray(indices) if isinstance(indices, list) else indices)
    if not idx.aval.dtype.is_int:
        raise TraceError(f"take: indices must be integers, got {idx.aval}", loc=source.capture())
    r = v.ndim
    return t.wrap(t.g.apply(Gather(axis % r if -r <= axis < r else axis), [v.id, idx.id]), v.weak)


def broadcast_to(x: Any, shape: Sequence[Any]) -> Traced:
    """``x`` broadcast to ``shape`` (``expand``)."""
    v = _lift1(x)
    if tuple(v.shape) == tuple(shape):
        return v
    t = v.trace
    return t.wrap(t.g.apply(Expand(tuple(shape)), [v.id]), v.weak)


# ---- constructors ---------------------------------------------------------------------


def _dims(shape: Any) -> tuple[Any, ...]:
    return (shape,) if isinstance(shape, int) else tuple(shape)


def full(shape: Any, fill_value: Any, dtype: Any = None) -> Any:
    """An array of ``fill_value`` (inside a trace: a scalar constant expanded)."""
    dims = _dims(shape)
    if dtype is not None:
        d = to_dtype(dtype)
    elif isinstance(fill_value, Traced):
        d = fill_value.rlx_dtype
    else:
        d = {bool: DType.BOOL, int: DType.I32, float: DType.F32}.get(
            type(fill_value), None
        ) or DType.from_numpy(np.asarray(fill_value).dtype)
    t = current()
    if t is None:
        if not all(isinstance(n, int) for n in dims):
            raise TraceError(f"full: symbolic dims {dims} outside a trace", loc=source.capture())
        return np.full(dims, fill_value, dtype=d.np)
    v = cast(lift(t, fill_value, d), d)
    if v.ndim:
        return broadcast_to(v, dims)
    return t.wrap(t.g.apply(Expand(dims), [v.id])) if dims else v


def zeros(shape: Any, dtype: Any = DType.F32) -> Any:
    """An array of zeros (f32 by default)."""
    return full(shape, 0, dtype)


def ones(shape: Any, dtype: Any = DType.F32) -> Any:
    """An array of ones (f32 by default)."""
    return full(shape, 1, dtype)


def full_like(x: Any, fill_value: Any, dtype: Any = None) -> Any:
    """``full`` with ``x``'s shape (and dtype unless given)."""
    v = _lift1(x)
    return full(v.shape, fill_value, v.rlx_dtype if dtype is None else dtype)


def zeros_like(x: Any, dtype: Any = None) -> Any:
    """Zeros shaped like ``x``."""
    return full_like(x, 0, dtype)


def ones_like(x: Any, dtype: Any = None) -> Any:
    """Ones shaped like ``x``."""
    return full_like(x, 1, dtype)


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None) -> Any:
    """``np.arange`` as a constant (ints i32, floats f32 unless ``dtype``)."""
    if stop is None:
        start, stop = 0, start
    vals = (start, stop, step)
    if any(isinstance(v, Traced) for v in vals):
        raise TraceError(
            "arange: start, stop and step must be static Python numbers (the length of "
            "the result is its shape)",
            loc=source.capture(),
        )
    if dtype is not None:
        d = to_dtype(dtype)
    else:
        d = DType.F32 if any(isinstance(v, float) for v in vals) else DType.I32
    arr = np.arange(start, stop, step).astype(d.np)
    t = current()
    return arr if t is None else t.wrap(t.g.constant(arr))


def eye(n: int, m: int | None = None, k: int = 0, dtype: Any = DType.F32) -> Any:
    """The identity matrix (a constant)."""
    arr = np.eye(n, m, k, dtype=to_dtype(dtype).np)
    t = current()
    return arr if t is None else t.wrap(t.g.constant(arr))
