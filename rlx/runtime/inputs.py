"""Checking and converting what a user feeds a CompiledGraph. In: values given for named
inputs and params (NumPy arrays, NumPy scalars, Python lists and scalars) and the graph's
declared shapes. Out: C-ready NumPy arrays of exactly the declared dtype, plus the symbol
bindings, or an InputError naming the tensor, expected vs given, and the user line that
built its node.

Dtype conversion policy (lossless only):

* A NumPy array or scalar of the declared dtype is used as is (never modified).
* A NumPy array of another dtype is converted when NumPy calls the cast ``safe`` (every
  value is exactly representable): i8 -> f32, i32 -> f64, f32 -> f64, u8 -> i32, bool ->
  anything. ``f64 -> f32``, ``i32 -> f32``, ``i64 -> i32`` and ``f32 -> bf16`` are
  rejected: they can round or overflow, so the caller casts explicitly.
* Python scalars and (nested) lists carry no dtype of their own (like JAX's weak types):
  they are converted to the declared dtype when the kind fits (bool -> any, int -> int or
  float, float -> float) and round to a float dtype as a literal in the graph would; ints
  must fit the declared integer range; a float for an integer tensor is rejected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx.errors import InputError
from rlx.ir.mir import Node
from rlx.shape import Shape, Sym

__all__ = ["to_array", "check_dims", "bind_inputs", "check_finite"]

_KIND_ORDER = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _err(msg: str, node: Node | None) -> InputError:
    return InputError(msg, node=node.id if node else None, loc=node.loc if node else None)


def to_array(
    what: str, name: str, value: Any, shape: Shape, node: Node | None = None
) -> np.ndarray:
    """Convert ``value`` to an array of ``shape.dtype`` under the lossless policy."""
    want = shape.dtype.np
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        if arr.dtype == want:
            return arr
        if np.can_cast(arr.dtype, want, casting="safe"):
            return arr.astype(want)
        raise _err(
            f"{what} {name!r}: expected dtype {shape.dtype} ({shape}), given {arr.dtype} "
            f"array of shape {tuple(arr.shape)}; converting would lose precision or range, "
            f"cast it first (e.g. .astype(np.{want.name}))",
            node,
        )
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise _err(
            f"{what} {name!r}: cannot make an array of {type(value).__name__}: {e}", node
        ) from None
    if arr.dtype.kind not in _KIND_ORDER:
        raise _err(f"{what} {name!r}: expected {shape}, given a value of dtype {arr.dtype}", node)
    want_kind = "f" if want.kind == "V" or want.name.startswith(("bfloat", "float8")) else want.kind
    ok = _KIND_ORDER[arr.dtype.kind] <= _KIND_ORDER.get(want_kind, -1) or arr.dtype.kind == "b"
    if not ok:
        raise _err(
            f"{what} {name!r}: expected dtype {shape.dtype}, given Python {arr.dtype.kind!s}-kind values {value!r:.60}",
            node,
        )
    if arr.dtype.kind in "iu" and want.kind in "iu" and arr.size:
        info = np.iinfo(want)
        if arr.min() < info.min or arr.max() > info.max:
            raise _err(
                f"{what} {name!r}: values in [{arr.min()}, {arr.max()}] do not fit dtype {shape.dtype}",
                node,
            )
    return arr.astype(want)


def check_dims(
    what: str, name: str, arr: np.ndarray, shape: Shape, node: Node | None = None
) -> None:
    """Rank and static dims of ``arr`` against ``shape`` (symbolic dims checked later)."""
    if arr.ndim != shape.rank:
        raise _err(
            f"{what} {name!r}: expected rank {shape.rank} {shape}, given shape {tuple(arr.shape)}",
            node,
        )
    for ax, (d, got) in enumerate(zip(shape.dims, arr.shape, strict=True)):
        if isinstance(d, int) and d != got:
            raise _err(
                f"{what} {name!r}: expected {shape}, given shape {tuple(arr.shape)} (dim {ax} is {got}, expected {d})",
                node,
            )


def bind_inputs(
    arrays: Mapping[str, np.ndarray],
    nodes: Mapping[str, Node],
    bounds: Mapping[str, tuple[int, int | None]],
) -> dict[str, int]:
    """Bind every symbol from the input sizes; InputError on a conflict, a dim that is not
    a multiple of its coefficient, a compound dim that disagrees, or a bound violation."""
    bindings: dict[str, int] = {}
    where: dict[str, str] = {}
    for name, arr in arrays.items():
        node = nodes[name]
        for ax, d in enumerate(node.shape.dims):
            if not isinstance(d, Sym) or len(d.terms) != 1 or d.terms[0][1] != 1:
                continue
            sym = d.terms[0][0]
            got = arr.shape[ax]
            if got % d.coeff:
                raise _err(
                    f"input {name!r}: dim {ax} = {got} is not a multiple of {d.coeff} ({node.shape})",
                    node,
                )
            v = got // d.coeff
            if sym in bindings and bindings[sym] != v:
                raise _err(
                    f"input {name!r}: symbolic dim {sym!r} is {v} here (dim {ax} of {node.shape}) but "
                    f"{bindings[sym]} in input {where[sym]!r}",
                    node,
                )
            bindings[sym] = v
            where[sym] = name
    for name, arr in arrays.items():
        node = nodes[name]
        for ax, d in enumerate(node.shape.dims):
            if isinstance(d, Sym):
                missing = [s for s in d.names if s not in bindings]
                if missing:
                    raise _err(
                        f"input {name!r}: dim {ax} is {d}, but {missing} is bound by no input", node
                    )
                if d.evaluate(bindings) != arr.shape[ax]:
                    raise _err(
                        f"input {name!r}: dim {ax} is {arr.shape[ax]}, expected {d} = {d.evaluate(bindings)} "
                        f"(shape {node.shape}, given {tuple(arr.shape)})",
                        node,
                    )
    for sym, v in bindings.items():
        lo, hi = bounds.get(sym, (1, None))
        if v < lo or (hi is not None and v > hi):
            node = nodes[where[sym]]
            raise _err(
                f"input {where[sym]!r}: symbolic dim {sym!r} = {v} is outside its declared bounds "
                f"[{lo}, {hi if hi is not None else 'inf'}] (shape {node.shape})",
                node,
            )
    return bindings


def check_finite(what: str, name: str, arr: np.ndarray, node: Node | None = None) -> None:
    """InputError when a float/complex array holds NaN or Inf (says how many and where)."""
    if arr.dtype.kind not in "fcV" and not arr.dtype.name.startswith(("bfloat", "float8")):
        return
    finite = np.isfinite(arr.astype(np.float32) if arr.dtype.kind == "V" else arr)
    if finite.all():
        return
    bad = int(finite.size - np.count_nonzero(finite))
    first = np.unravel_index(int(np.argmin(finite.reshape(-1))), arr.shape) if arr.ndim else ()
    raise _err(
        f"{what} {name!r}: {bad} non-finite value(s) (NaN or Inf), first at index "
        f"{tuple(int(i) for i in first)} = {arr[first] if arr.ndim else arr[()]}; "
        f"check_finite is on",
        node,
    )
