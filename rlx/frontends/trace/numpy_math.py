"""``rlx.numpy`` math: elementwise functions, reductions and products over traced values.

In: traced values, NumPy arrays and Python scalars (weakly typed). Out: traced values;
each function adds the IR ops it names (``unary``, ``binary``, ``compare``, ``where``,
``reduce``, ``argmax``, ``matmul``, ``dot_general``, ``cumsum``) to the current trace.
Integer inputs of transcendental functions are computed in f32 (as ``jax.numpy``).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from rlx import source
from rlx.dtype import DType
from rlx.errors import TraceError
from rlx.frontends.trace.tracer import find_trace, lift
from rlx.frontends.trace.values import (
    Traced,
    binary,
    cast,
    compare,
    promote_args,
    true_divide,
    unary,
)
from rlx.ops.elementwise import BinaryKind, CompareKind, UnaryKind, Where
from rlx.ops.linalg import DotGeneral, MatMul
from rlx.ops.reduce import ArgMax, ArgMin, Cumsum, Reduce, ReduceKind

__all__ = [
    "add", "subtract", "multiply", "divide", "true_divide", "floor_divide", "remainder",
    "mod", "power", "maximum", "minimum", "negative", "abs", "absolute", "exp", "log",
    "tanh", "sqrt", "rsqrt", "square", "sin", "cos", "sign", "floor", "ceil", "round",
    "reciprocal", "erf", "log1p", "expm1", "sigmoid", "equal", "not_equal", "less",
    "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_not",
    "where", "clip", "sum", "mean", "max", "min", "prod", "amax", "amin", "var", "std",
    "argmax", "argmin", "cumsum", "matmul", "dot", "dot_general", "logsumexp", "einsum",
    "outer",
]  # fmt: skip


def _lift1(x: Any) -> Traced:
    return lift(find_trace(x), x)


# ---- elementwise -------------------------------------------------------------------


def add(a: Any, b: Any) -> Traced:
    """``a + b``."""
    return binary(BinaryKind.ADD, a, b)


def subtract(a: Any, b: Any) -> Traced:
    """``a - b``."""
    return binary(BinaryKind.SUB, a, b)


def multiply(a: Any, b: Any) -> Traced:
    """``a * b``."""
    return binary(BinaryKind.MUL, a, b)


divide = true_divide


def power(a: Any, b: Any) -> Traced:
    """``a ** b``."""
    return binary(BinaryKind.POW, a, b)


def maximum(a: Any, b: Any) -> Traced:
    """Elementwise maximum (NaN propagates)."""
    return binary(BinaryKind.MAX, a, b)


def minimum(a: Any, b: Any) -> Traced:
    """Elementwise minimum (NaN propagates)."""
    return binary(BinaryKind.MIN, a, b)


def floor_divide(a: Any, b: Any) -> Traced:
    """``a // b``: floor of the quotient (integers: rounded toward minus infinity)."""
    (x, y), _ = promote_args(a, b)
    if x.aval.dtype.is_float:
        return unary(UnaryKind.FLOOR, binary(BinaryKind.DIV, x, y))
    q = binary(BinaryKind.DIV, x, y)  # truncated toward zero
    r = binary(BinaryKind.MOD, x, y)
    fix = (r != 0) & ((r < 0) != (y < 0))
    return where(fix, q - 1, q)


def remainder(a: Any, b: Any) -> Traced:
    """``a % b`` with the sign of ``b`` (NumPy's ``mod``)."""
    (x, y), _ = promote_args(a, b)
    r = binary(BinaryKind.MOD, x, y)  # sign of the dividend
    fix = (r != 0) & ((r < 0) != (y < 0))
    return where(fix, r + y, r)


mod = remainder


def negative(x: Any) -> Traced:
    """``-x``."""
    return unary(UnaryKind.NEG, x)


def abs(x: Any) -> Traced:  # noqa: A001 - NumPy's name
    """``|x|``."""
    return unary(UnaryKind.ABS, x)


absolute = abs


def _named(fn: Any, name: str, doc: str) -> Any:
    """``fn`` given NumPy's function name ``name`` and the docstring ``doc`` -> ``fn``."""
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


def _float_unary(kind: UnaryKind, name: str) -> Any:
    def fn(x: Any) -> Traced:
        return unary(kind, x, floating=True)

    return _named(fn, name, f"``{name}(x)`` elementwise (integers computed as f32).")


exp = _float_unary(UnaryKind.EXP, "exp")
log = _float_unary(UnaryKind.LOG, "log")
tanh = _float_unary(UnaryKind.TANH, "tanh")
sqrt = _float_unary(UnaryKind.SQRT, "sqrt")
rsqrt = _float_unary(UnaryKind.RSQRT, "rsqrt")
sin = _float_unary(UnaryKind.SIN, "sin")
cos = _float_unary(UnaryKind.COS, "cos")
reciprocal = _float_unary(UnaryKind.RECIP, "reciprocal")
erf = _float_unary(UnaryKind.ERF, "erf")
sigmoid = _float_unary(UnaryKind.SIGMOID, "sigmoid")


def square(x: Any) -> Traced:
    """``x * x``."""
    return unary(UnaryKind.SQUARE, x)


def sign(x: Any) -> Traced:
    """-1, 0 or 1 by the sign of ``x``."""
    return unary(UnaryKind.SIGN, x)


def floor(x: Any) -> Traced:
    """Round toward minus infinity."""
    return unary(UnaryKind.FLOOR, x, floating=True)


def ceil(x: Any) -> Traced:
    """Round toward plus infinity."""
    return unary(UnaryKind.CEIL, x, floating=True)


def round(x: Any, decimals: int = 0) -> Traced:  # noqa: A001 - NumPy's name
    """Round half to even (``decimals=0`` only)."""
    if decimals != 0:
        scale = 10.0**decimals
        return true_divide(unary(UnaryKind.ROUND, multiply(x, scale)), scale)
    return unary(UnaryKind.ROUND, x)


def log1p(x: Any) -> Traced:
    """``log(1 + x)``."""
    return log(add(x, 1.0))


def expm1(x: Any) -> Traced:
    """``exp(x) - 1``."""
    return subtract(exp(x), 1.0)


def _cmp(kind: CompareKind, name: str) -> Any:
    def fn(a: Any, b: Any) -> Traced:
        return compare(kind, a, b)

    return _named(fn, name, f"``{name}(a, b)`` -> bool, with broadcasting.")


equal = _cmp(CompareKind.EQ, "equal")
not_equal = _cmp(CompareKind.NE, "not_equal")
less = _cmp(CompareKind.LT, "less")
less_equal = _cmp(CompareKind.LE, "less_equal")
greater = _cmp(CompareKind.GT, "greater")
greater_equal = _cmp(CompareKind.GE, "greater_equal")


def _as_bool(x: Any) -> Traced:
    v = _lift1(x)
    return v if v.aval.dtype.is_bool else compare(CompareKind.NE, v, 0)


def logical_and(a: Any, b: Any) -> Traced:
    """``a and b`` elementwise (non-bool inputs: != 0)."""
    return binary(BinaryKind.AND, _as_bool(a), _as_bool(b))


def logical_or(a: Any, b: Any) -> Traced:
    """``a or b`` elementwise (non-bool inputs: != 0)."""
    return binary(BinaryKind.OR, _as_bool(a), _as_bool(b))


def logical_not(a: Any) -> Traced:
    """``not a`` elementwise."""
    return unary(UnaryKind.NOT, _as_bool(a))


def where(cond: Any, a: Any, b: Any) -> Traced:
    """``cond ? a : b`` with broadcasting over all three (non-bool cond: != 0)."""
    c = _as_bool(cond)
    (x, y), weak = promote_args(a, b)
    t = x.trace
    return t.wrap(t.g.apply(Where(), [c.id, x.id, y.id]), weak)


def clip(x: Any, a_min: Any = None, a_max: Any = None) -> Traced:
    """``min(max(x, a_min), a_max)``; either bound may be None."""
    y = _lift1(x)
    if a_min is not None:
        y = maximum(y, a_min)
    if a_max is not None:
        y = minimum(y, a_max)
    return y


# ---- reductions ----------------------------------------------------------------------


def _axes(v: Traced, axis: Any) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(v.ndim))
    if isinstance(axis, int):
        axis = (axis,)
    r = v.ndim
    return tuple(sorted(a % r if -r <= a < r else a for a in axis))


def _reduce(fn: ReduceKind, x: Any, axis: Any, keepdims: bool, dtype: Any = None) -> Traced:
    v = _lift1(x)
    if dtype is not None:
        from rlx.frontends.trace.tracer import to_dtype

        v = cast(v, to_dtype(dtype))
    elif fn is ReduceKind.MEAN and not v.aval.dtype.is_float and not v.aval.dtype.is_complex:
        v = cast(v, DType.F32)
    elif fn in (ReduceKind.SUM, ReduceKind.PROD) and v.aval.dtype.is_bool:
        v = cast(v, DType.I32)
    t = v.trace
    return t.wrap(t.g.apply(Reduce(fn, _axes(v, axis), bool(keepdims)), [v.id]), v.weak)


def sum(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Traced:  # noqa: A001
    """Sum over ``axis`` (int, tuple or None for all); bools sum as i32."""
    return _reduce(ReduceKind.SUM, x, axis, keepdims, dtype)


def mean(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Traced:
    """Mean over ``axis``; integers average as f32."""
    return _reduce(ReduceKind.MEAN, x, axis, keepdims, dtype)


def max(x: Any, axis: Any = None, keepdims: bool = False) -> Traced:  # noqa: A001
    """Maximum over ``axis``."""
    return _reduce(ReduceKind.MAX, x, axis, keepdims)


def min(x: Any, axis: Any = None, keepdims: bool = False) -> Traced:  # noqa: A001
    """Minimum over ``axis``."""
    return _reduce(ReduceKind.MIN, x, axis, keepdims)


amax, amin = max, min


def prod(x: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Traced:
    """Product over ``axis``."""
    return _reduce(ReduceKind.PROD, x, axis, keepdims, dtype)


def var(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Traced:
    """Variance over ``axis`` (``mean(|x - mean(x)|**2)``, ``ddof`` as NumPy)."""
    v = _lift1(x)
    d = subtract(v, mean(v, axis, keepdims=True))
    s = sum(multiply(d, d), axis, keepdims=keepdims)
    n = 1
    for a in _axes(v, axis):
        n *= v.shape[a]  # type: ignore[assignment]
    return true_divide(s, float(n - ddof))


def std(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Traced:
    """Standard deviation over ``axis``."""
    return sqrt(var(x, axis, keepdims, ddof))


def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Traced:
    """``log(sum(exp(x)))`` computed stably (max subtracted)."""
    v = _lift1(x)
    m = max(v, axis, keepdims=True)
    s = log(sum(exp(subtract(v, m)), axis, keepdims=True))
    out = add(s, m)
    if not keepdims:
        from rlx.frontends.trace.numpy_shape import squeeze

        out = squeeze(out, _axes(v, axis))
    return out


def _arg(op: type, x: Any, axis: int | None, keepdims: bool) -> Traced:
    v = _lift1(x)
    if axis is None:
        from rlx.frontends.trace.numpy_shape import reshape

        v, axis = reshape(v, (-1,)), 0
        if keepdims:
            raise ValueError("keepdims with axis=None is not supported")
    t = v.trace
    return t.wrap(t.g.apply(op(axis % v.ndim, bool(keepdims)), [v.id]))


def argmax(x: Any, axis: int | None = None, keepdims: bool = False) -> Traced:
    """Index (i64) of the maximum along ``axis`` (None: of the flattened value)."""
    return _arg(ArgMax, x, axis, keepdims)


def argmin(x: Any, axis: int | None = None, keepdims: bool = False) -> Traced:
    """Index (i64) of the minimum along ``axis``."""
    return _arg(ArgMin, x, axis, keepdims)


def cumsum(x: Any, axis: int | None = None) -> Traced:
    """Running sum along ``axis`` (None: of the flattened value)."""
    v = _lift1(x)
    if axis is None:
        v, axis = v.reshape(-1), 0
    if v.aval.dtype.is_bool:
        v = cast(v, DType.I32)
    t = v.trace
    return t.wrap(t.g.apply(Cumsum(axis % v.ndim), [v.id]), v.weak)


# ---- products ------------------------------------------------------------------------


def matmul(a: Any, b: Any) -> Traced:
    """``a @ b`` as ``np.matmul`` (batched, broadcast); operands promoted."""
    (x, y), _ = promote_args(a, b)
    t = x.trace
    return t.wrap(t.g.apply(MatMul(), [x.id, y.id]))


def dot(a: Any, b: Any) -> Traced:
    """``np.dot``: scalars multiply, 1-D/2-D as matmul, N-D contracts a's last axis with
    b's second-to-last (``dot_general``)."""
    (x, y), _ = promote_args(a, b)
    if x.ndim == 0 or y.ndim == 0:
        return multiply(x, y)
    if y.ndim <= 2:
        return matmul(x, y)
    t = x.trace
    op = DotGeneral((x.ndim - 1,), (y.ndim - 2,))
    return t.wrap(t.g.apply(op, [x.id, y.id]))


def dot_general(
    a: Any, b: Any, contract: tuple[Sequence[int], Sequence[int]],
    batch: tuple[Sequence[int], Sequence[int]] = ((), ()),
) -> Traced:  # fmt: skip
    """``lax.dot_general(a, b, (contract, batch))``: batch dims, then a's free dims,
    then b's."""
    (x, y), _ = promote_args(a, b)
    t = x.trace
    norm = [tuple(builtins.int(i) % r for i in ax) for ax, r in (
        (contract[0], x.ndim), (contract[1], y.ndim), (batch[0], x.ndim), (batch[1], y.ndim))]  # fmt: skip
    return t.wrap(t.g.apply(DotGeneral(*norm), [x.id, y.id]))


def outer(a: Any, b: Any) -> Traced:
    """``a[:, None] * b[None, :]`` of the flattened operands."""
    x, y = _lift1(a).reshape(-1), _lift1(b).reshape(-1)
    return multiply(x[:, None], y[None, :])


def einsum(subscripts: str, *operands: Any) -> Traced:
    """``np.einsum`` for one or two operands without ``...`` or repeated labels in one
    operand: sums over labels that leave, then one ``dot_general`` (batch labels shared
    by both operands and the output, contracted labels shared by the operands only) and
    a ``transpose`` to the output order."""
    from rlx.frontends.trace.numpy_shape import transpose

    spec = subscripts.replace(" ", "")
    ins, arrow, out = spec.partition("->")
    terms = ins.split(",")
    if "." in spec or len(terms) != len(operands) or len(terms) not in (1, 2):
        raise TraceError(
            f"einsum {subscripts!r}: one or two operands without '...' are supported "
            f"(given {len(operands)} operands)",
            loc=source.capture(),
        )
    if any(len(set(t)) != len(t) for t in terms):
        raise TraceError(
            f"einsum {subscripts!r}: a label repeated in one operand (a diagonal) is not supported",
            loc=source.capture(),
        )
    if not arrow:  # implicit output: labels seen once, sorted
        joined = "".join(terms)
        out = "".join(sorted(c for c in set(joined) if joined.count(c) == 1))
    vals, _ = promote_args(*operands)
    for t, v in zip(terms, vals):
        if len(t) != v.ndim:
            raise TraceError(
                f"einsum {subscripts!r}: term {t!r} has {len(t)} labels for {v.aval}",
                loc=source.capture(),
            )
    reduced = []
    for k, (t, v) in enumerate(zip(terms, vals)):  # labels only here that leave: sum them
        other = terms[1 - k] if len(terms) == 2 else ""
        gone = [i for i, c in enumerate(t) if c not in out and c not in other]
        if gone:
            v = sum(v, tuple(gone))
            t = "".join(c for i, c in enumerate(t) if i not in gone)
        reduced.append((t, v))
    if len(reduced) == 1:
        t, v = reduced[0]
        return transpose(v, [t.index(c) for c in out]) if t != out else v
    (ta, a), (tb, b) = reduced
    batch = [c for c in ta if c in tb and c in out]
    contract = [c for c in ta if c in tb and c not in out]
    y = dot_general(
        a, b, ([ta.index(c) for c in contract], [tb.index(c) for c in contract]),
        ([ta.index(c) for c in batch], [tb.index(c) for c in batch]),
    )  # fmt: skip
    got = batch + [c for c in ta if c not in tb] + [c for c in tb if c not in ta]
    return transpose(y, [got.index(c) for c in out]) if got != list(out) else y
