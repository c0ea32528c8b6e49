"""The traced value: what a function traced by ``rlx.jit`` computes with.

In: a trace and a node id of its graph. Out: a NumPy-like object whose operators
(``+ - * / // % ** @``, unary ``-``, comparisons, ``&``, ``|``, ``~``, indexing) add
nodes to the graph and return new traced values. Asking it for a concrete value
(``bool(x)``, ``int(x)``, ``float(x)``, iterating it) raises a TraceError that points at
``rlx.cond`` / ``rlx.while_loop`` / ``rlx.scan``: the value only exists when the
compiled graph runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx import source
from rlx.dtype import DType
from rlx.errors import TraceError
from rlx.frontends.trace.tracer import find_trace, lift, result_type, scalar_kind
from rlx.ir.mir import NodeId
from rlx.ops.bitwise import Bitwise, BitwiseKind, BitwiseNot
from rlx.ops.elementwise import Binary, BinaryKind, Cast, Compare, CompareKind, Unary, UnaryKind
from rlx.shape import Dim, Shape

if TYPE_CHECKING:
    from rlx.frontends.trace.tracer import Trace

__all__ = ["Traced", "binary", "unary", "compare", "cast", "promote_args", "is_traced"]

_CONTROL = (
    "use rlx.cond(pred, true_fn, false_fn, *operands) for a branch, rlx.while_loop("
    "cond_fn, body_fn, init) for a loop whose trip count depends on data, or rlx.scan("
    "f, init, xs) for a loop over an axis; or make the value static (static_argnums)"
)


def is_traced(v: Any) -> bool:
    return isinstance(v, Traced)


class Traced:
    """A value of a traced function: node ``id`` of ``trace.g`` (see the module doc)."""

    __slots__ = ("trace", "id", "weak")
    __array_ufunc__ = None  # NumPy operators defer to ours (np_array + traced -> traced)

    def __init__(self, trace: Trace, nid: NodeId, weak: bool = False):
        self.trace = trace
        self.id = nid
        self.weak = weak

    # ---- metadata -------------------------------------------------------------------

    @property
    def aval(self) -> Shape:
        """The rlx Shape (dims and DType) of this value."""
        return self.trace.g.nodes[self.id].shape

    @property
    def shape(self) -> tuple[Dim, ...]:
        """Dims: ints, or symbolic dims (``rlx.shape.Sym``) for dims declared dynamic."""
        return self.aval.dims

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype (``x.dtype == np.float32``); ``x.rlx_dtype`` is the DType."""
        return self.aval.dtype.np

    @property
    def rlx_dtype(self) -> DType:
        return self.aval.dtype

    @property
    def ndim(self) -> int:
        return self.aval.rank

    @property
    def size(self) -> Dim:
        return self.aval.numel

    @property
    def T(self) -> Traced:
        from rlx.frontends.trace.numpy_shape import transpose

        return transpose(self)

    def __repr__(self) -> str:
        return f"Traced(%{self.id}: {self.aval}{', weak' if self.weak else ''})"

    # ---- no concrete values while tracing ---------------------------------------

    def _concrete(self, what: str) -> TraceError:
        return TraceError(
            f"{what} needs a concrete value, but {self!r} is traced (its value exists only "
            f"when the compiled graph runs); {_CONTROL}",
            node=self.id,
            loc=source.capture(),
        )

    def __bool__(self) -> bool:
        raise self._concrete("Python control flow on a traced value (`if x`, bool(x))")

    def __int__(self) -> int:
        raise self._concrete("int(x)")

    def __float__(self) -> float:
        raise self._concrete("float(x)")

    def __index__(self) -> int:
        raise self._concrete("using a traced value as a Python index")

    def __iter__(self) -> Any:
        raise self._concrete("iterating over a traced value")

    def __len__(self) -> int:
        d = self.shape[0] if self.shape else None
        if isinstance(d, int):
            return d
        raise self._concrete("len(x) of a rank-0 or dynamic-size value")

    def __array__(self, *args: Any, **kw: Any) -> np.ndarray:
        raise self._concrete("converting a traced value to a NumPy array")

    __hash__ = None  # type: ignore[assignment]  # == builds a node, so no hashing

    # ---- operators --------------------------------------------------------------------

    def __add__(self, o: Any) -> Traced:
        return binary(BinaryKind.ADD, self, o)

    def __radd__(self, o: Any) -> Traced:
        return binary(BinaryKind.ADD, o, self)

    def __sub__(self, o: Any) -> Traced:
        return binary(BinaryKind.SUB, self, o)

    def __rsub__(self, o: Any) -> Traced:
        return binary(BinaryKind.SUB, o, self)

    def __mul__(self, o: Any) -> Traced:
        return binary(BinaryKind.MUL, self, o)

    def __rmul__(self, o: Any) -> Traced:
        return binary(BinaryKind.MUL, o, self)

    def __truediv__(self, o: Any) -> Traced:
        return true_divide(self, o)

    def __rtruediv__(self, o: Any) -> Traced:
        return true_divide(o, self)

    def __floordiv__(self, o: Any) -> Traced:
        from rlx.frontends.trace.numpy_math import floor_divide

        return floor_divide(self, o)

    def __rfloordiv__(self, o: Any) -> Traced:
        from rlx.frontends.trace.numpy_math import floor_divide

        return floor_divide(o, self)

    def __mod__(self, o: Any) -> Traced:
        from rlx.frontends.trace.numpy_math import remainder

        return remainder(self, o)

    def __rmod__(self, o: Any) -> Traced:
        from rlx.frontends.trace.numpy_math import remainder

        return remainder(o, self)

    def __pow__(self, o: Any) -> Traced:
        return binary(BinaryKind.POW, self, o)

    def __rpow__(self, o: Any) -> Traced:
        return binary(BinaryKind.POW, o, self)

    def __matmul__(self, o: Any) -> Traced:
        from rlx.frontends.trace.numpy_math import matmul

        return matmul(self, o)

    def __rmatmul__(self, o: Any) -> Traced:
        from rlx.frontends.trace.numpy_math import matmul

        return matmul(o, self)

    def __neg__(self) -> Traced:
        return unary(UnaryKind.NEG, self)

    def __pos__(self) -> Traced:
        return self

    def __abs__(self) -> Traced:
        return unary(UnaryKind.ABS, self)

    def __invert__(self) -> Traced:
        if self.aval.dtype.is_bool:
            return unary(UnaryKind.NOT, self)
        t = self.trace
        return t.wrap(t.g.apply(BitwiseNot(), [self.id]), self.weak)

    def __and__(self, o: Any) -> Traced:
        return _logic(BinaryKind.AND, BitwiseKind.AND, self, o)

    def __rand__(self, o: Any) -> Traced:
        return _logic(BinaryKind.AND, BitwiseKind.AND, o, self)

    def __or__(self, o: Any) -> Traced:
        return _logic(BinaryKind.OR, BitwiseKind.OR, self, o)

    def __ror__(self, o: Any) -> Traced:
        return _logic(BinaryKind.OR, BitwiseKind.OR, o, self)

    def __xor__(self, o: Any) -> Traced:
        return _logic(None, BitwiseKind.XOR, self, o)

    def __rxor__(self, o: Any) -> Traced:
        return _logic(None, BitwiseKind.XOR, o, self)

    def __eq__(self, o: Any) -> Traced:  # type: ignore[override]
        return compare(CompareKind.EQ, self, o)

    def __ne__(self, o: Any) -> Traced:  # type: ignore[override]
        return compare(CompareKind.NE, self, o)

    def __lt__(self, o: Any) -> Traced:
        return compare(CompareKind.LT, self, o)

    def __le__(self, o: Any) -> Traced:
        return compare(CompareKind.LE, self, o)

    def __gt__(self, o: Any) -> Traced:
        return compare(CompareKind.GT, self, o)

    def __ge__(self, o: Any) -> Traced:
        return compare(CompareKind.GE, self, o)

    def __getitem__(self, key: Any) -> Traced:
        from rlx.frontends.trace.indexing import getitem

        return getitem(self, key)

    # ---- NumPy-style methods ---------------------------------------------------------

    def astype(self, dtype: Any) -> Traced:
        from rlx.frontends.trace.tracer import to_dtype

        return cast(self, to_dtype(dtype))

    def reshape(self, *shape: Any) -> Traced:
        from rlx.frontends.trace.numpy_shape import reshape

        return reshape(self, shape[0] if len(shape) == 1 else shape)

    def transpose(self, *axes: Any) -> Traced:
        from rlx.frontends.trace.numpy_shape import transpose

        ax = axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else axes
        return transpose(self, ax or None)

    def swapaxes(self, a: int, b: int) -> Traced:
        from rlx.frontends.trace.numpy_shape import swapaxes

        return swapaxes(self, a, b)

    def squeeze(self, axis: Any = None) -> Traced:
        from rlx.frontends.trace.numpy_shape import squeeze

        return squeeze(self, axis)

    def ravel(self) -> Traced:
        return self.reshape(-1)

    flatten = ravel

    def sum(self, axis: Any = None, keepdims: bool = False) -> Traced:
        from rlx.frontends.trace.numpy_math import sum as sum_

        return sum_(self, axis, keepdims=keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Traced:
        from rlx.frontends.trace.numpy_math import mean

        return mean(self, axis, keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Traced:
        from rlx.frontends.trace.numpy_math import max as max_

        return max_(self, axis, keepdims=keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Traced:
        from rlx.frontends.trace.numpy_math import min as min_

        return min_(self, axis, keepdims=keepdims)

    def prod(self, axis: Any = None, keepdims: bool = False) -> Traced:
        from rlx.frontends.trace.numpy_math import prod

        return prod(self, axis, keepdims=keepdims)

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> Traced:
        from rlx.frontends.trace.numpy_math import argmax

        return argmax(self, axis, keepdims=keepdims)

    def argmin(self, axis: int | None = None, keepdims: bool = False) -> Traced:
        from rlx.frontends.trace.numpy_math import argmin

        return argmin(self, axis, keepdims=keepdims)

    def clip(self, min: Any = None, max: Any = None) -> Traced:
        from rlx.frontends.trace.numpy_math import clip

        return clip(self, min, max)

    def dot(self, o: Any) -> Traced:
        from rlx.frontends.trace.numpy_math import dot

        return dot(self, o)


# ---- elementwise machinery -----------------------------------------------------------


_WEAK_DEFAULT = {0: DType.BOOL, 1: DType.I32, 2: DType.F32, 3: DType.C64}


def cast(x: Traced, to: DType) -> Traced:
    """``x`` as dtype ``to`` (no node when it already is); the result is strong."""
    if x.aval.dtype is to:
        return x if not x.weak else Traced(x.trace, x.id, False)
    t = x.trace
    return t.wrap(t.g.apply(Cast(to), [x.id]))


def promote_args(*vals: Any, floating: bool = False) -> tuple[list[Traced], bool]:
    """Operands lifted into the current trace and cast to their common dtype (weak typing
    for Python scalars); ``floating`` lifts an integer or bool result to f32 (true
    division, mean, exp of an int). Returns (values, weak)."""
    t = find_trace(*vals)
    vals = tuple(
        v if isinstance(v, Traced) or scalar_kind(v) is not None else lift(t, v) for v in vals
    )
    items: list[tuple[DType, bool]] = []
    for v in vals:
        k = scalar_kind(v)
        if k is None:
            items.append((v.aval.dtype, v.weak))
        else:
            items.append((_WEAK_DEFAULT[k], True))
    dtype, weak = result_type(items)
    if floating and (dtype.is_int or dtype.is_bool):
        dtype = DType.F32
    out = []
    for v in vals:
        x = lift(t, v, dtype)
        out.append(cast(x, dtype) if x.aval.dtype is not dtype else x)
    return out, weak


def binary(kind: BinaryKind, a: Any, b: Any) -> Traced:
    """``a (kind) b`` with broadcasting and promotion."""
    (x, y), weak = promote_args(a, b)
    t = x.trace
    return t.wrap(t.g.apply(Binary(kind), [x.id, y.id]), weak)


def true_divide(a: Any, b: Any) -> Traced:
    """``a / b``; integers divide as f32 (as ``jnp.true_divide``)."""
    (x, y), weak = promote_args(a, b, floating=True)
    t = x.trace
    return t.wrap(t.g.apply(Binary(BinaryKind.DIV), [x.id, y.id]), weak)


def compare(kind: CompareKind, a: Any, b: Any) -> Traced:
    """``a (kind) b`` -> bool, operands promoted first."""
    (x, y), _ = promote_args(a, b)
    t = x.trace
    return t.wrap(t.g.apply(Compare(kind), [x.id, y.id]))


def unary(kind: UnaryKind, a: Any, floating: bool = False) -> Traced:
    """``kind(a)``; ``floating`` casts integer inputs to f32 first (exp, log, tanh...)."""
    (x,), weak = promote_args(a, floating=floating)
    t = x.trace
    return t.wrap(t.g.apply(Unary(kind), [x.id]), weak)


def _logic(logical: BinaryKind | None, bits: BitwiseKind, a: Any, b: Any) -> Traced:
    (x, y), weak = promote_args(a, b)
    t = x.trace
    if x.aval.dtype.is_bool:
        if logical is None:  # xor of bools: a != b
            return t.wrap(t.g.apply(Compare(CompareKind.NE), [x.id, y.id]))
        return t.wrap(t.g.apply(Binary(logical), [x.id, y.id]), weak)
    return t.wrap(t.g.apply(Bitwise(bits), [x.id, y.id]), weak)


def nodes_of(vals: Sequence[Traced]) -> list[NodeId]:
    return [v.id for v in vals]
