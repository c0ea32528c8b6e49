"""Shape arithmetic over symbolic dims at import. In: ONNX values computed from the ``Shape``
of tensors with symbolic dims (an exported model's dynamic batch / sequence axes). Out:
:class:`SymValue`\\ s, small integer arrays whose elements are ints or :class:`~rlx.shape.Sym`
monomials, which ``Reshape``, ``Expand``, ``ConstantOfShape``, ``Slice`` and ``Range`` read
as dims (``NodeCtx.dims``), so one import serves every binding of the symbols.

Exporters spell shapes out as ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` chains
(and ``Equal(shape, -1)`` / ``Where`` fix-ups); :func:`evaluate` runs those ops on SymValues.
A value that leaves the symbolic world (a sum like ``seq + 1``, a comparison it cannot
decide, a float cast, a use as a tensor operand) is *materialized*: :func:`materialize`
builds it in the graph from ``shape_of`` of a tensor that carries each symbol
(``ImportState.carriers``), so it is computed when the graph runs. A ``Slice`` of a static
axis to a symbolic end (a position table cut to ``seq``) also bounds that symbol
(``seq <= 512``), so a longer input is an InputError naming the bound."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import NodeProto

from rlx.dtype import DType
from rlx.errors import ShapeError
from rlx.ops.movement import Concat, Gather, Reshape, ShapeOf
from rlx.shape import Dim, Shape, Sym

if TYPE_CHECKING:
    from rlx.frontends.onnx.context import ImportState

__all__ = ["SymValue", "evaluate", "materialize", "shape_value", "dims_of"]


@dataclass(frozen=True)
class SymValue:
    """An integer ONNX value known at import up to symbols: ``data`` is an object array of
    ints and Sym monomials, ``dtype`` its integer NumPy dtype."""

    data: np.ndarray
    dtype: np.dtype

    @property
    def shape(self) -> Shape:
        return Shape(self.data.shape, DType.from_numpy(self.dtype))

    def __repr__(self) -> str:
        return f"SymValue({[str(d) for d in self.data.reshape(-1)]}, {self.dtype})"


class _NotSymbolic(Exception):
    """The result is not an int or a monomial of the symbols (materialize instead)."""


def _is_sym(v: object) -> bool:
    return isinstance(v, Sym)


def wrap(data: np.ndarray, dtype: np.dtype) -> SymValue | np.ndarray:
    """``data`` as a plain integer array when no element is symbolic, else a SymValue."""
    data = np.asarray(data, dtype=object)
    if not any(_is_sym(v) for v in data.reshape(-1)):
        return np.asarray(data.astype(np.int64), dtype=dtype)
    return SymValue(data, np.dtype(dtype))


def shape_value(dims: tuple[Dim, ...], start: int, end: int) -> SymValue | np.ndarray:
    """The ONNX ``Shape`` (``start:end``) of a tensor with ``dims``."""
    out = np.empty(len(dims[start:end]), dtype=object)
    out[:] = list(dims[start:end])
    return wrap(out, np.dtype(np.int64))


def dims_of(v: SymValue | np.ndarray) -> list[Dim]:
    """The elements of a shape value, flattened, as dims (ints or Syms)."""
    if isinstance(v, SymValue):
        return [v if _is_sym(v) else int(v) for v in v.data.reshape(-1)]
    return [int(x) for x in np.asarray(v).reshape(-1)]


# ---- elementwise rules ------------------------------------------------------------------
def _mul(a: Any, b: Any) -> Any:
    if not (_is_sym(a) or _is_sym(b)):
        return int(a) * int(b)
    if (not _is_sym(a) and int(a) < 0) or (not _is_sym(b) and int(b) < 0):
        raise _NotSymbolic
    return a * b if _is_sym(a) else b * int(a)


def _add(a: Any, b: Any) -> Any:
    if not (_is_sym(a) or _is_sym(b)):
        return int(a) + int(b)
    if not _is_sym(b) and int(b) == 0:
        return a
    if not _is_sym(a) and int(a) == 0:
        return b
    raise _NotSymbolic


def _sub(a: Any, b: Any) -> Any:
    if not (_is_sym(a) or _is_sym(b)):
        return int(a) - int(b)
    if not _is_sym(b) and int(b) == 0:
        return a
    if a == b:
        return 0
    raise _NotSymbolic


def _div(a: Any, b: Any) -> Any:
    if not (_is_sym(a) or _is_sym(b)):
        q = abs(int(a)) // abs(int(b))  # ONNX integer Div truncates toward zero
        return q if (int(a) < 0) == (int(b) < 0) else -q
    if not _is_sym(a) or (not _is_sym(b) and int(b) <= 0):
        raise _NotSymbolic
    q = a.divide(b if _is_sym(b) else int(b))
    if q is None:
        raise _NotSymbolic
    return q


def _equal(a: Any, b: Any) -> bool:
    if not (_is_sym(a) or _is_sym(b)):
        return int(a) == int(b)
    if _is_sym(a) and _is_sym(b) and a == b:
        return True
    other = b if _is_sym(a) else a
    if not _is_sym(other) and int(other) < 0:  # a dim is never negative
        return False
    raise _NotSymbolic


def _max(a: Any, b: Any) -> Any:
    if not (_is_sym(a) or _is_sym(b)):
        return max(int(a), int(b))
    if a == b:
        return a
    other, s = (b, a) if _is_sym(a) else (a, b)
    if not _is_sym(other) and int(other) <= 0:
        return s
    raise _NotSymbolic


def _min(a: Any, b: Any) -> Any:
    if not (_is_sym(a) or _is_sym(b)):
        return min(int(a), int(b))
    if a == b:
        return a
    other = b if _is_sym(a) else a
    if not _is_sym(other) and int(other) <= 0:
        return other
    raise _NotSymbolic


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Mul": _mul,
    "Add": _add,
    "Sub": _sub,
    "Div": _div,
    "Equal": _equal,
}
_VARIADIC: dict[str, Callable[[Any, Any], Any]] = {"Max": _max, "Min": _min}
_INT_TYPES = frozenset({2, 3, 4, 5, 6, 7, 12, 13})  # onnx TensorProto integer types


def _obj(v: SymValue | np.ndarray) -> np.ndarray:
    if isinstance(v, SymValue):
        return v.data
    return np.asarray(v).astype(object)


def _dtype(v: SymValue | np.ndarray) -> np.dtype:
    return v.dtype if isinstance(v, SymValue) else np.asarray(v).dtype


def _ints(v: SymValue | np.ndarray) -> list[int]:
    if isinstance(v, SymValue):
        raise _NotSymbolic
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _attr(node: NodeProto, name: str, default: Any) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _evaluate(node: NodeProto, opset: int, vals: list[Any]) -> SymValue | np.ndarray:
    op = node.op_type
    x = vals[0]
    if op in _BINARY:
        a, b = np.broadcast_arrays(_obj(vals[0]), _obj(vals[1]))
        f = np.frompyfunc(_BINARY[op], 2, 1)
        out = f(a, b)
        dt = np.dtype(bool) if op == "Equal" else _dtype(x)
        return wrap(np.asarray(out, dtype=object), dt)
    if op in _VARIADIC:
        acc = _obj(vals[0])
        for v in vals[1:]:
            acc = np.frompyfunc(_VARIADIC[op], 2, 1)(*np.broadcast_arrays(acc, _obj(v)))
        return wrap(np.asarray(acc, dtype=object), _dtype(x))
    if op == "Identity":
        return x
    if op == "Cast":
        to = int(_attr(node, "to", 0))
        if to not in _INT_TYPES:
            raise _NotSymbolic
        from onnx import helper

        return wrap(_obj(x), np.dtype(helper.tensor_dtype_to_np_dtype(to)))
    if op == "Where":
        cond = vals[0]
        if isinstance(cond, SymValue):
            raise _NotSymbolic
        out = np.where(np.asarray(cond, bool), *np.broadcast_arrays(_obj(vals[1]), _obj(vals[2])))
        return wrap(np.asarray(out, dtype=object), _dtype(vals[1]))
    data = _obj(x)
    if op == "Gather":
        idx = np.asarray(vals[1])
        if isinstance(vals[1], SymValue) or idx.dtype.kind not in "iu":
            raise _NotSymbolic
        axis = int(_attr(node, "axis", 0))
        return wrap(np.take(data, idx, axis=axis), _dtype(x))
    if op in ("Unsqueeze", "Squeeze"):
        axes = _ints(vals[1]) if len(vals) > 1 else list(_attr(node, "axes", []) or [])
        if op == "Unsqueeze":
            r = data.ndim + len(axes)
            out = data
            for a in sorted(a % r for a in axes):
                out = np.expand_dims(out, a)
        else:
            out = np.squeeze(data, axis=tuple(a % data.ndim for a in axes) if axes else None)
        return wrap(out, _dtype(x))
    if op == "Concat":
        axis = int(_attr(node, "axis", 0))
        return wrap(np.concatenate([_obj(v) for v in vals], axis=axis), _dtype(x))
    if op == "Reshape":
        spec = _ints(vals[1])
        dims = [data.shape[i] if d == 0 else d for i, d in enumerate(spec)]
        return wrap(data.reshape(dims), _dtype(x))
    if op == "Flatten":
        ax = int(_attr(node, "axis", 1)) % max(data.ndim, 1)
        return wrap(data.reshape(int(np.prod(data.shape[:ax])), -1), _dtype(x))
    if op == "ReduceProd" and data.ndim <= 1 and len(vals) == 1:  # all axes, as Size
        acc: Any = 1
        for d in data.reshape(-1):
            acc = _mul(acc, d)
        keep = int(_attr(node, "keepdims", 1))
        out = np.empty((1,) * data.ndim if keep else (), dtype=object)
        out.reshape(-1)[0] = acc
        return wrap(out, _dtype(x))
    if op == "Slice" and opset >= 10:
        starts, ends = _ints(vals[1]), _ints(vals[2])
        axes = _ints(vals[3]) if len(vals) > 3 else list(range(len(starts)))
        steps = _ints(vals[4]) if len(vals) > 4 else [1] * len(starts)
        key = [slice(None)] * data.ndim
        for a, s, e, c in zip(axes, starts, ends, steps, strict=True):
            key[a % data.ndim] = slice(s, e, c)
        return wrap(data[tuple(key)], _dtype(x))
    raise _NotSymbolic


def evaluate(st: ImportState, node: NodeProto, opset: int) -> SymValue | np.ndarray | None:
    """The value of ``node`` (ai.onnx domain) over SymValue / constant inputs, or None when
    it does not stay symbolic (the node is then converted into graph ops)."""
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return None
    vals: list[Any] = []
    for name in node.input:
        if not name:
            return None
        v = st.syms.get(name)
        vals.append(v if v is not None else st.const(name))
    try:
        return _evaluate(node, opset, vals)
    except (_NotSymbolic, ShapeError, ValueError, TypeError, IndexError):
        return None


def _sym_scalar(st: ImportState, name: str) -> int:
    """The run-time value of the symbol ``name`` as an i64 scalar node."""
    cache = st.sym_scalars
    if name in cache:
        return cache[name]
    if name not in st.carriers:
        from rlx.frontends.onnx.errors import OnnxImportError

        raise OnnxImportError(
            f"symbolic dim {name!r} is needed as a value but no tensor of this graph carries it"
        )
    nid, axis = st.carriers[name]
    g = st.g
    shp = g.apply(ShapeOf(), [nid])
    cache[name] = g.apply(Gather(0), [shp, g.constant(np.asarray(axis, np.int64))])
    return cache[name]


def _dim_node(st: ImportState, d: Dim) -> int:
    g = st.g
    if not _is_sym(d):
        return g.constant(np.asarray(int(d), np.int64))
    out: int | None = None
    for n, p in d.terms:
        for _ in range(p):
            s = _sym_scalar(st, n)
            out = s if out is None else g.mul(out, s)
    assert out is not None
    if d.coeff != 1:
        out = g.mul(out, g.constant(np.asarray(d.coeff, np.int64)))
    return out


def materialize(st: ImportState, v: SymValue) -> int:
    """A graph node computing ``v`` when the graph runs (dims read with ``shape_of``)."""
    g = st.g
    flat = [_dim_node(st, d) for d in v.data.reshape(-1)]
    if len(flat) == 1:
        out = flat[0]
    else:
        out = g.apply(Concat(0), [g.apply(Reshape((1,)), [f]) for f in flat])
    if v.data.shape != g.shape(out).dims:
        out = g.apply(Reshape(tuple(v.data.shape)), [out])
    dt = DType.from_numpy(v.dtype)
    return out if dt is DType.I64 else g.cast(out, dt)


def register_carriers(st: ImportState, nid: int, dims: tuple[Dim, ...]) -> None:
    """Record ``nid`` as a carrier of each plain symbol among its ``dims``."""
    for axis, d in enumerate(dims):
        if _is_sym(d) and d.coeff == 1 and len(d.terms) == 1 and d.terms[0][1] == 1:
            st.carriers.setdefault(d.terms[0][0], (nid, axis))
