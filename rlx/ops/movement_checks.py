"""Argument checks the data-movement ops of ``movement.py`` share: dims lists in messages,
valid target dims, index ranges (also read by ``gather_backward``), the size of a
concatenation or a slice along an axis (symbolic dims included), and whether a pad value
fits the dtype.

In: an op (named in the error), shapes, dims or index arrays. Out: the checked value, or a
ShapeError / InputError naming the op and the bad values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError
from rlx.ops.base import Op, expect
from rlx.shape import Dim, Shape, Sym

__all__ = [
    "check_index_range",
    "dims_txt",
    "pad_value_misfit",
    "slice_len",
    "sum_dims",
    "valid_dim",
]


def dims_txt(dims: Sequence[object]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def valid_dim(d: object) -> bool:
    return isinstance(d, Sym) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)


def check_index_range(op: Op, idx: np.ndarray, n: int, ax: int) -> np.ndarray:
    """``idx`` as int64 when every entry is in ``[-n, n)``; InputError naming the first
    offending index otherwise."""
    i64 = np.asarray(idx).astype(np.int64)
    bad = (i64 < -n) | (i64 >= n)
    if bad.any():
        first = int(i64[bad].flat[0])
        raise InputError(
            f"{op.mnemonic}: index {first} out of range for axis {ax} of size {n} "
            f"(expected -{n} <= index < {n}; {int(bad.sum())} such indices)"
        )
    return i64


def sum_dims(op: Op, ax: int, sizes: Sequence[Dim]) -> Dim:
    """Sum of concatenated sizes: ints add; symbolic sizes add when all are multiples of
    one monomial (``seq + 2*seq = 3*seq``); anything else is a ShapeError."""
    ints = [d for d in sizes if isinstance(d, int)]
    syms = [d for d in sizes if isinstance(d, Sym)]
    if not syms:
        return sum(ints)
    expect(
        not any(ints) and all(d.terms == syms[0].terms for d in syms),
        op,
        f"cannot concatenate along axis {ax} with sizes {dims_txt(sizes)}: a sum of "
        "different symbolic (or symbolic and static) dims is not representable; make "
        "these dims static or multiples of one symbol",
    )
    return Sym(syms[0].terms, sum(d.coeff for d in syms))


def slice_len(op: Op, x: Shape, i: int, a: int | None, b: int | None, c: int) -> Dim:
    d = x.dims[i]
    if isinstance(d, int):
        return len(range(*slice(a, b, c).indices(d)))
    if c == 1 and a in (None, 0) and b is None:
        return d
    expect(
        c > 0 and a is not None and a >= 0 and b is not None and b >= 0,
        op,
        f"axis {i} of {x} is symbolic ({d}): slice it whole or with static, non-negative "
        f"start and stop and a positive step, got start={a}, stop={b}, step={c}",
    )
    assert a is not None and b is not None  # checked just above
    return max(0, -(-(b - a) // c))


def pad_value_misfit(value: float, dtype: DType) -> str | None:
    """Why ``value`` cannot fill a tensor of ``dtype`` exactly, or None when it can. A
    float (or complex) dtype takes any value as a cast would (NaN, +-inf, rounding)."""
    if dtype.is_float or dtype.is_complex:
        return None
    v = float(value)
    if dtype.is_bool:
        return None if v in (0.0, 1.0) else "a bool pad value must be 0 or 1"
    if not v.is_integer():
        return "an integer dtype needs an integral pad value"
    info = np.iinfo(dtype.np)
    if not info.min <= int(v) <= info.max:
        return f"outside the range [{info.min}, {info.max}] of {dtype}"
    return None
