"""Elementwise ops: unary activations, binary arithmetic, compares, where, cast. The
unary kinds and their facts (reference, C expression, derivative, complex support) are
one row each in ``unary_kinds.py``.

Each is fusable into an ElementwiseRegion (``elementwise = True``). Float math on
f16/bf16/fp8 inputs is computed in f32 and rounded back to the node's dtype, the same as
the CPU kernels do. Derivative rules (``vjp`` / ``jvp``) are methods of the ops; the
pointwise derivative formulas and their conventions at kinks and ties are in
``pointwise_grad.py``. vmap batches these ops by broadcasting (the generic rule).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rlx.dtype import DType, promote
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.core import operand
from rlx.ops.unary_kinds import UNARY, Inputs, UnaryKind
from rlx.shape import Shape, broadcast_dims

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId


def _wide(x: np.ndarray) -> np.ndarray:
    """Upcast low-precision floats to f32 for computing."""
    if x.dtype.kind == "V" or x.dtype.itemsize < 4 and x.dtype.kind == "f":
        return x.astype(np.float32)
    if x.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return x.astype(np.float32)
    return x


#: kind -> its NumPy reference (the ``numpy`` of each row of :data:`UNARY`)
UNARY_FNS: dict[UnaryKind, Callable[[np.ndarray], np.ndarray]] = {
    k: f.numpy for k, f in UNARY.items()
}


@register
class Unary(Op):
    """``y = f(x)`` elementwise, ``f`` one of :class:`UnaryKind` (its facts: the row
    ``UNARY[f]`` of ``rlx/ops/unary_kinds.py``)."""

    mnemonic: ClassVar[str] = "unary"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE
    elementwise: ClassVar[bool] = True
    fn: UnaryKind

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        inputs = UNARY[self.fn].inputs
        if inputs is Inputs.BOOL:
            expect(x.dtype is DType.BOOL, self, f"{self.fn.value} needs a bool input, got {x}")
        elif inputs is Inputs.FLOAT:
            expect(
                x.dtype.is_float or x.dtype.is_complex,
                self,
                f"{self.fn.value} needs a float input, got {x}",
            )
        else:
            expect(not x.dtype.is_bool, self, f"{self.fn.value} of a bool tensor {x}")
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        with np.errstate(all="ignore"):
            return UNARY[self.fn].numpy(_wide(xs[0]))

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return (_unary_times(g, self.fn, node, ct, True),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        (t,) = tangents
        return None if t is None else _unary_times(g, self.fn, node, t)

    def __str__(self) -> str:
        return self.fn.value


class BinaryKind(enum.Enum):
    """Binary elementwise functions (``g.binary(kind, a, b)``); operands broadcast like NumPy
    and are promoted to a common dtype. The output has that dtype."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    POW = "pow"
    MOD = "mod"
    AND = "and"
    OR = "or"


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":  # integer division truncates toward zero, like C / JAX lax.div
        # floor division, then step toward zero where the remainder is non-zero and the
        # signs differ; exact for every value, the type's minimum included (x / 0 -> 0)
        with np.errstate(all="ignore"):
            safe = np.where(b == 0, np.ones((), b.dtype), b)
            q = np.floor_divide(a, safe)
            r = a - q * safe
            q = q + ((r != 0) & ((a < 0) != (safe < 0))).astype(q.dtype)
            return np.where(b == 0, np.zeros((), a.dtype), q).astype(a.dtype)
    return np.divide(a, b)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu" and b.dtype.kind == "i":
        # a ** -n for integers is 1 / a ** n truncated toward zero (as integer division):
        # 1 for a == 1, +-1 for a == -1, else 0 (also for a == 0, like x / 0 here)
        neg = b < 0
        pos = np.power(a, np.where(neg, np.zeros((), b.dtype), b))
        odd = (b % 2) != 0
        recip = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0))
        return np.where(neg, recip.astype(a.dtype), pos).astype(a.dtype)
    return np.power(a, b)


BINARY_FNS: dict[BinaryKind, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    BinaryKind.ADD: np.add,
    BinaryKind.SUB: np.subtract,
    BinaryKind.MUL: np.multiply,
    BinaryKind.DIV: _div,
    BinaryKind.MAX: np.maximum,
    BinaryKind.MIN: np.minimum,
    BinaryKind.POW: _pow,
    BinaryKind.MOD: np.fmod,  # sign of the dividend, like C fmod and lax.rem
    BinaryKind.AND: np.logical_and,
    BinaryKind.OR: np.logical_or,
}


@register
class Binary(Op):
    """``y = a (op) b`` with NumPy broadcasting; both inputs must share a dtype (insert a
    cast to combine two dtypes: implicit promotion is done by the builder, not the op).
    Integer div truncates toward zero (x / 0 gives 0), mod takes the dividend's sign, and
    an integer pow with a negative exponent is the truncated reciprocal."""

    mnemonic: ClassVar[str] = "binary"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE
    elementwise: ClassVar[bool] = True
    fn: BinaryKind

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        a, b = ins
        expect(
            a.dtype is b.dtype,
            self,
            f"{self.fn.value} needs equal dtypes, got {a} and {b} (cast one first)",
        )
        if self.fn in (BinaryKind.AND, BinaryKind.OR):
            expect(a.dtype is DType.BOOL, self, f"{self.fn.value} needs bool, got {a}")
        else:
            expect(not a.dtype.is_bool, self, f"{self.fn.value} of bool tensors")
        return Shape(broadcast_dims(a.dims, b.dims), a.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        with np.errstate(all="ignore"):
            return BINARY_FNS[self.fn](_wide(xs[0]), _wide(xs[1]))

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops.rules import unbroadcast

        parts = _binary_times(g, self.fn, node, ct, ct, True)
        return tuple(
            None if c is None else unbroadcast(g, c, x)
            for c, x in zip(parts, node.inputs, strict=True)
        )

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.rules import add_any

        ta, tb = tangents
        return _like(g, add_any(g, _binary_times(g, self.fn, node, ta, tb)), node)

    def __str__(self) -> str:
        return self.fn.value


class CompareKind(enum.Enum):
    """Elementwise comparisons (``g.eq``, ``g.lt``, ...): two broadcasting operands in,
    a bool tensor out."""

    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"


COMPARE_FNS: dict[CompareKind, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    CompareKind.EQ: np.equal,
    CompareKind.NE: np.not_equal,
    CompareKind.LT: np.less,
    CompareKind.LE: np.less_equal,
    CompareKind.GT: np.greater,
    CompareKind.GE: np.greater_equal,
}


@register
class Compare(Op):
    """``y = a (cmp) b`` -> bool, with broadcasting."""

    mnemonic: ClassVar[str] = "compare"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE
    elementwise: ClassVar[bool] = True
    nondiff: ClassVar[str] = "comparison: bool output"
    fn: CompareKind

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        a, b = ins
        expect(a.dtype is b.dtype, self, f"needs equal dtypes, got {a} and {b}")
        return Shape(broadcast_dims(a.dims, b.dims), DType.BOOL)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return COMPARE_FNS[self.fn](_wide(xs[0]), _wide(xs[1]))

    def __str__(self) -> str:
        return self.fn.value


@register
class Where(Op):
    """``y = cond ? a : b`` with broadcasting over all three."""

    mnemonic: ClassVar[str] = "where"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE
    elementwise: ClassVar[bool] = True

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        c, a, b = ins
        expect(c.dtype is DType.BOOL, self, f"condition must be bool, got {c}")
        expect(a.dtype is b.dtype, self, f"branches need equal dtypes, got {a} and {b}")
        return Shape(broadcast_dims(c.dims, a.dims, b.dims), a.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return np.where(xs[0], xs[1], xs[2])

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops.rules import unbroadcast, zeros

        c, a, b = node.inputs
        z = zeros(g, ct)
        return (
            None,
            unbroadcast(g, g.apply(Where(), [c, ct, z]), a),
            unbroadcast(g, g.apply(Where(), [c, z, ct]), b),
        )

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.rules import zeros

        _, ta, tb = tangents
        if ta is None and tb is None:
            return None
        z = zeros(g, node.shape)
        c = node.inputs[0]
        return _like(
            g, g.apply(Where(), [c, z if ta is None else ta, z if tb is None else tb]), node
        )


def f64_to_bf16(x: np.ndarray) -> np.ndarray:
    """float64 ``x`` rounded once to the nearest bfloat16 (ties to even). ml_dtypes before
    0.7 (0.4.1 to 0.6.0, inside rlx's supported range) converts through float32 and rounds
    twice (13.90625 + 2**-30 gives 13.875 where
    13.9375 is nearest); this rounds to odd into f32 first (truncate toward zero, set the
    last bit when inexact: f32 keeps 16 more bits than bf16, so every tie and sticky bit
    survives), then to nearest even. NaN stays NaN, beyond the range gives inf."""
    shape = np.shape(x)
    x = np.atleast_1d(np.asarray(x, np.float64))
    a = np.abs(x)
    with np.errstate(all="ignore"):
        f = a.astype(np.float32)
    back = f.astype(np.float64)
    u = f.view(np.uint32)
    u -= (back > a).astype(np.uint32)
    u |= (back != a).astype(np.uint32)
    u |= np.signbit(x).astype(np.uint32) << np.uint32(31)
    return u.view(np.float32).astype(DType.BF16.np).reshape(shape)


def int_to_bf16(x: np.ndarray) -> np.ndarray:
    """Integer ``x`` (any width, signed or not) rounded once to the nearest bfloat16 (ties
    to even). ml_dtypes before 0.7 converts through float32 and rounds twice (16842753 gives
    16777216 where 16908288 is nearest); this keeps the top 24 bits of ``|x|`` and ORs
    the dropped ones into the last (round to odd: exact in f32, and every tie and sticky
    bit survives, as bf16 keeps 8), then rounds to nearest even once."""
    x = np.asarray(x)
    m = x.astype(np.uint64)
    neg = x < 0
    m = np.where(neg, ~m + np.uint64(1), m)  # |x| (two's complement; |INT64_MIN| = 2**63)
    # 2**(e-1) <= |x| < 2**e (e one too large when the f64 rounds up to a power of two)
    e = np.frexp(m.astype(np.float64))[1].astype(np.int64)
    k = np.maximum(e - 24, 0).astype(np.uint64)
    keep = (m >> k) | ((m & ((np.uint64(1) << k) - np.uint64(1))) != 0).astype(np.uint64)
    f = np.ldexp(keep.astype(np.float32), k.astype(np.int32))  # exact: keep < 2**24
    return np.where(neg, -f, f).astype(np.float32).astype(DType.BF16.np)


@register
class Cast(Op):
    """Convert to ``to`` (float->int truncates toward zero, saturates nothing: as NumPy;
    complex->real keeps the real part)."""

    mnemonic: ClassVar[str] = "cast"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    elementwise: ClassVar[bool] = True
    to: DType

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return ins[0].with_dtype(self.to)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        # float -> float: the cotangent cast back; to or from an integer or bool type no
        # gradient flows (the driver carries cotangents through float values only)
        # (complex -> real keeps the real part: its adjoint is the cotangent as a complex
        # number; real -> complex: the real part of the cotangent)
        src = g.node(node.inputs[0]).dtype
        if not (_diff(src) and _diff(self.to)):
            return (None,)
        return (g.apply(Cast(src), [ct]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        (t,) = tangents
        if t is None or not (_diff(g.node(t).dtype) and _diff(self.to)):
            return None
        return g.apply(Cast(self.to), [t])

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = xs[0]
        if x.dtype.kind == "c" and not self.to.is_complex:
            x = x.real  # complex -> real keeps the real part (NumPy would warn each time)
        if self.to is DType.BF16 and x.dtype == np.float64:
            return f64_to_bf16(x)  # once, not through f32 as ml_dtypes < 0.7 does
        if self.to is DType.BF16 and x.dtype.kind in "iu":
            return int_to_bf16(x)  # once, as above
        if self.to.is_fp8 or x.dtype.name.startswith("float8") or x.dtype.name == "bfloat16":
            x = x.astype(np.float32) if self.to is not DType.F64 else x.astype(np.float64)
        with np.errstate(all="ignore"):
            return x.astype(self.to.np)

    def __str__(self) -> str:
        return f"cast[to={self.to}]"


def _unary_times(
    g: Graph, fn: UnaryKind, node: Node, t: NodeId, adjoint: bool = False
) -> NodeId | None:
    from rlx.ops.pointwise_grad import unary_times

    return unary_times(g, fn, node, t, adjoint)


def _binary_times(
    g: Graph,
    fn: BinaryKind,
    node: Node,
    ta: NodeId | None,
    tb: NodeId | None,
    adjoint: bool = False,
) -> tuple[NodeId | None, NodeId | None]:
    from rlx.ops.pointwise_grad import binary_times

    return binary_times(g, fn, node, ta, tb, adjoint)


def _diff(dt: DType) -> bool:
    return dt.is_float or dt.is_complex


def _like(g: Graph, t: NodeId | None, node: Node) -> NodeId | None:
    """Tangent ``t`` broadcast to ``node``'s dims (an operand's tangent may be smaller)."""
    if t is None or g.node(t).shape.dims == node.shape.dims:
        return t
    return g.expand(t, list(node.shape.dims))


# ---- builder conveniences ---------------------------------------------------------


def _promoted(g: Graph, *ids: NodeId) -> list[NodeId]:
    """Insert casts so all operands share the promoted dtype (JAX-style implicit promotion)."""
    dts = [g.node(i).dtype for i in ids]
    target = dts[0]
    for d in dts[1:]:
        target = promote(target, d)
    return [i if g.node(i).dtype is target else g.apply(Cast(target), [i]) for i in ids]


def _binary(fn: BinaryKind) -> Callable[..., NodeId]:
    def build(g: Graph, a: Any, b: Any) -> NodeId:
        if not isinstance(a, int) or isinstance(a, bool):
            a, b = b, a
            a_id = a
            b_id = operand(g, b, a_id)
            x, y = _promoted(g, b_id, a_id)
        else:
            b_id = operand(g, b, a)
            x, y = _promoted(g, a, b_id)
        return g.apply(Binary(fn), [x, y])

    build.__name__ = fn.value
    build.__doc__ = f"``{fn.value}(a, b)`` elementwise with broadcasting and promotion; a float scalar operand becomes a constant."
    return build


def _unary(fn: UnaryKind) -> Callable[..., NodeId]:
    def build(g: Graph, x: NodeId) -> NodeId:
        return g.apply(Unary(fn), [x])

    build.__name__ = fn.value
    build.__doc__ = f"``{fn.value}(x)`` elementwise."
    return build


def _compare(fn: CompareKind) -> Callable[..., NodeId]:
    def build(g: Graph, a: NodeId, b: Any) -> NodeId:
        b = operand(g, b, a)
        x, y = _promoted(g, a, b)
        return g.apply(Compare(fn), [x, y])

    build.__name__ = fn.value
    build.__doc__ = f"``{fn.value}(a, b)`` -> bool with broadcasting."
    return build


_NAMES = {
    BinaryKind.MAX: "maximum",
    BinaryKind.MIN: "minimum",
    BinaryKind.AND: "logical_and",
    BinaryKind.OR: "logical_or",
}
for _k in BinaryKind:
    _f = _binary(_k)
    _f.__name__ = _NAMES.get(_k, _k.value)
    graph_method(_f)
for _u in UnaryKind:
    _f = _unary(_u)
    if _u is UnaryKind.NOT:
        _f.__name__ = "logical_not"
    graph_method(_f)
for _c in CompareKind:
    graph_method(_compare(_c))


@graph_method
def unary(g: Graph, fn: UnaryKind, x: NodeId) -> NodeId:
    """Apply any :class:`UnaryKind` to ``x``."""
    return g.apply(Unary(fn), [x])


@graph_method
def binary(g: Graph, fn: BinaryKind, a: NodeId, b: NodeId) -> NodeId:
    """Apply any :class:`BinaryKind` (no implicit promotion)."""
    return g.apply(Binary(fn), [a, b])


@graph_method
def where(g: Graph, cond: NodeId, a: Any, b: Any) -> NodeId:
    """``cond ? a : b``; float scalars allowed for a or b."""
    like = a if isinstance(a, int) else b
    a = operand(g, a, like)
    b = operand(g, b, like)
    a, b = _promoted(g, a, b)
    return g.apply(Where(), [cond, a, b])


@graph_method
def cast(g: Graph, x: NodeId, to: DType | str) -> NodeId:
    """Convert ``x`` to dtype ``to``."""
    return g.apply(Cast(DType.parse(to)), [x])
