"""NumPy indexing of traced values. In: a traced value and a key (ints, slices, ``None``,
``...``, one integer array or traced integer tensor). Out: the value built from the IR's
``slice``, ``gather`` and ``reshape`` ops.

Basic indices become one ``slice`` (an int ``i`` is ``i:i+1`` whose axis is then
dropped); ``None`` inserts a unit axis (a ``reshape``); one integer array index becomes a
``gather`` along its axis, its dims taking the axis's place as NumPy puts them. Boolean
masks (data-dependent shapes) and NumPy's rules for several array indices are rejected
with a TraceError that names the alternative.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx import source
from rlx.errors import TraceError
from rlx.frontends.trace.tracer import lift
from rlx.frontends.trace.values import Traced
from rlx.ops.movement import Gather, Reshape, Slice

__all__ = ["getitem"]


def _err(msg: str) -> TraceError:
    return TraceError(msg, loc=source.capture())


def _is_array_index(k: Any) -> bool:
    if isinstance(k, Traced):
        return True
    if isinstance(k, np.ndarray):
        return k.ndim > 0 or k.dtype == bool
    return isinstance(k, list)


def _expand(key: tuple[Any, ...], rank: int) -> list[Any]:
    """``key`` with the Ellipsis replaced by full slices (one entry per consumed axis,
    ``None`` entries kept)."""
    n_ell = sum(k is Ellipsis for k in key)
    if n_ell > 1:
        raise _err(f"an index can only have one ellipsis ('...'), got {key!r}")
    used = sum(k is not None and k is not Ellipsis for k in key)
    if used > rank:
        raise _err(f"too many indices for a rank-{rank} value: {key!r} uses {used} axes")
    out: list[Any] = []
    for k in key:
        if k is Ellipsis:
            out.extend([slice(None)] * (rank - used))
        else:
            out.append(k)
    if not n_ell:
        out.extend([slice(None)] * (rank - used))
    return out


def _int_index(k: Any, n: Any, axis: int) -> int:
    i = int(k)
    if not isinstance(n, int):
        if i < 0:
            raise _err(
                f"index {i} on axis {axis} counts from the end of a dynamic dim ({n}); "
                "use a non-negative index or make the dim static"
            )
        return i
    if not -n <= i < n:
        raise _err(f"index {i} is out of bounds for axis {axis} with size {n}")
    return i % n


def getitem(x: Traced, key: Any) -> Traced:
    """``x[key]`` (see the module docstring)."""
    t = x.trace
    if not isinstance(key, tuple):
        key = (key,)
    dims = x.shape
    entries = _expand(key, len(dims))
    starts: list[int | None] = []
    stops: list[int | None] = []
    steps: list[int] = []
    out_axes: list[Any] = []  # per output axis before gather: "keep", "drop" or "new"
    arrays: list[tuple[int, Any]] = []  # (axis in the sliced value, index)
    ints: list[int] = []  # sliced-value axes indexed by an int
    ax = 0
    for k in entries:
        if k is None:
            out_axes.append("new")
            continue
        n = dims[ax]
        if isinstance(k, slice):
            for v in (k.start, k.stop, k.step):
                if isinstance(v, Traced):
                    raise _err(
                        "slice bounds must be static Python ints, got a traced value; use "
                        "rlx.numpy.take with computed indices"
                    )
            starts.append(None if k.start is None else int(k.start))
            stops.append(None if k.stop is None else int(k.stop))
            steps.append(1 if k.step is None else int(k.step))
            out_axes.append("keep")
        elif isinstance(k, bool) or (isinstance(k, np.ndarray) and k.dtype == bool):
            raise _err(
                "boolean mask indexing gives a data-dependent shape; use rlx.numpy.where("
                "mask, x, fill) instead"
            )
        elif isinstance(k, int | np.integer) or (isinstance(k, np.ndarray) and k.ndim == 0):
            i = _int_index(k, n, ax)
            starts.append(i)
            stops.append(i + 1)
            steps.append(1)
            ints.append(ax)
            out_axes.append("drop")
        elif _is_array_index(k):
            if isinstance(k, Traced) and k.aval.dtype.is_bool:
                raise _err(
                    "boolean mask indexing gives a data-dependent shape; use "
                    "rlx.numpy.where(mask, x, fill) instead"
                )
            starts.append(None)
            stops.append(None)
            steps.append(1)
            arrays.append((ax, k))
            out_axes.append("keep")
        else:
            raise _err(f"unsupported index {k!r} ({type(k).__name__}) on axis {ax}")
        ax += 1
    if len(arrays) > 1:
        raise _err(
            f"{len(arrays)} array indices in one subscript; index with one array at a time "
            "(x[a][:, b]) or use rlx.numpy.take"
        )
    if arrays and ints:
        lo, hi = min(ints + [arrays[0][0]]), max(ints + [arrays[0][0]])
        between = [a for a in range(lo, hi + 1) if a not in ints and a != arrays[0][0]]
        if between:
            raise _err(
                "an int index and an array index separated by a slice move the indexed "
                "axes to the front in NumPy; index in two steps (x[i][..., idx])"
            )
    y = x
    if any(
        s not in (None, 0) or e is not None or st != 1 for s, e, st in zip(starts, stops, steps)
    ):
        y = t.wrap(t.g.apply(Slice(tuple(starts), tuple(stops), tuple(steps)), [y.id]), x.weak)
    gathered = 0
    if arrays:
        axis, idx = arrays[0]
        iv = lift(t, np.asarray(idx) if isinstance(idx, list) else idx)
        if not iv.aval.dtype.is_int:
            raise _err(f"array indices must be integers, got {iv.aval}")
        y = t.wrap(t.g.apply(Gather(axis), [y.id, iv.id]), x.weak)
        gathered = iv.ndim - 1  # the index adds its rank minus the axis it replaces
    # the final dims: drop int-indexed axes, insert the new ones; consumed axis c sits at
    # c (+ the extra dims of the index past the gathered axis) in the gathered value
    ydims = list(y.shape)
    arr_axis = arrays[0][0] if arrays else -1
    out: list[Any] = []
    c = 0
    for a in out_axes:
        if a == "new":
            out.append(1)
            continue
        p = c + (gathered if c > arr_axis >= 0 else 0)
        if a == "keep":
            out.extend(ydims[p : p + gathered + 1] if c == arr_axis else [ydims[p]])
        c += 1
    if tuple(out) != tuple(ydims):
        y = t.wrap(t.g.apply(Reshape(tuple(out)), [y.id]), x.weak)
    return y
