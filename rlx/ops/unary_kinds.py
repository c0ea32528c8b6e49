"""The unary elementwise kinds, one row of facts each. In: nothing (a table). Out:
:class:`UnaryKind` and :data:`UNARY` (kind -> :class:`UnaryFacts`).

Every table about a kind reads its row, so adding a kind is one enum member and one row
here (docs/adding_an_op.md): the reference (``Unary.reference``), the shape rule's input
dtypes (``Unary.infer``), the derivative (``pointwise_grad.unary_times``, both modes),
the C expression (``codegen/elementwise.py``: elementwise regions, the row kernels'
matmul epilogues, the standalone native loop) and the CPU kernel's NumPy and complex
paths (``kernels/elementwise.py``). Builders (``g.<kind>(x)``), batching (vmap
broadcasts elementwise ops), serialization (by member name), the precision pass and
fusion need nothing per kind.

A row's fields:

* ``numpy``: the reference, on the widened input (f16 / bf16 / fp8 are computed in f32 and
  rounded once, as the CPU kernels do); it keeps the input's dtype.
* ``c``: the C expression of one element (what makes the kind fusable: a kind without one
  is computed by NumPy, in regions too). A template: ``{x}`` the operand, ``{t}`` the C
  register type (``float``, ``double``, an integer type), ``{f}`` the libm suffix
  (``"f"`` for float: ``tanh{f}`` is ``tanhf``); or, when the text depends on the type
  beyond that, a function ``(args, ctype) -> str`` of the operands' expressions and the
  C type (``ctype.value``, ``.signed_int``, ``.unsigned``, ``.is_float``, ``.fn(name)``).
  It must compute what ``numpy`` computes, in the same order (the build uses
  ``-ffp-contract=off``): the tests compare bit for bit where C allows.
* ``derivative``: ``f'(x)`` as a graph builder ``(g, x, y) -> node`` (``y = f(x)``), a
  number for a constant derivative, or None where it is zero (piecewise constant).
  Complex cotangents take ``conj(f'(z))`` (reverse mode).
* ``inputs``: the input dtypes the shape rule accepts (:class:`Inputs`).
* ``ufunc``: a NumPy ufunc computing the kind in one call with ``out=`` (the NumPy
  kernel's direct path); None for a composite (the native C loop, else the kernel's
  composite code, else the reference kernel).
* ``complex``: what a complex input means (:class:`Complex`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId

__all__ = ["UnaryKind", "UnaryFacts", "Inputs", "Complex", "UNARY", "CRender"]

#: ``(operand expressions, C type) -> C expression`` (see the module docstring)
CRender = Callable[[Sequence[str], Any], str]
Derivative = Callable[["Graph", "NodeId", "NodeId"], "NodeId"]


class UnaryKind(enum.Enum):
    """Unary elementwise functions; each has a row of facts in :data:`UNARY`."""

    RELU = "relu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    SILU = "silu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    NEG = "neg"
    ABS = "abs"
    SIN = "sin"
    COS = "cos"
    ROUND = "round"
    FLOOR = "floor"
    CEIL = "ceil"
    RECIP = "recip"
    SQUARE = "square"
    SOFTPLUS = "softplus"
    ERF = "erf"
    SIGN = "sign"
    NOT = "not"
    HARDSWISH = "hardswish"


class Inputs(enum.Enum):
    """The input dtypes a kind takes (its output has the input's dtype)."""

    FLOAT = "float or complex"
    NUMBER = "float, complex or integer"
    BOOL = "bool"


class Complex(enum.Enum):
    """What a complex input means for a kind."""

    KERNEL = "NumPy's complex function (the kind's ufunc, or the complex kernel's code)"
    REFERENCE = "only the reference's NumPy expression applied to complex numbers"
    UNDEFINED = "no definition: compiling it is an UnsupportedOpError"


@dataclass(frozen=True, slots=True)
class UnaryFacts:
    """One kind's row (see the module docstring)."""

    numpy: Callable[[np.ndarray], np.ndarray]
    c: str | CRender | None
    derivative: Derivative | float | None
    inputs: Inputs = Inputs.FLOAT
    ufunc: np.ufunc | None = None
    complex: Complex = Complex.REFERENCE


# ---- NumPy -------------------------------------------------------------------------------


def _erf(x: np.ndarray) -> np.ndarray:
    """scipy's exact erf (imported on first use: scipy.special costs ~0.2 s to import);
    math.erf vectorised without scipy."""
    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover
        return np.vectorize(math.erf, otypes=[np.float64])(x)
    return erf(x)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)).astype(x.dtype))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = np.asarray(math.sqrt(2.0 / math.pi), dtype=x.dtype)
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.asarray(0.044715, x.dtype) * x * x * x)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # numerically stable in both tails
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype)


# ---- C (integer-aware expressions; the rest are templates in the rows) --------------------


def _c_neg(a: Sequence[str], t: Any) -> str:
    return f"({t.value})(0 - ({t.unsigned}){a[0]})" if t.signed_int else f"(-{a[0]})"


def _c_abs(a: Sequence[str], t: Any) -> str:
    if t.is_float:
        return f"{t.fn('fabs')}({a[0]})"
    if t.signed_int:
        return f"({a[0]} < 0 ? {_c_neg(a, t)} : {a[0]})"
    return a[0]


def _c_square(a: Sequence[str], t: Any) -> str:
    if t.signed_int:  # through the unsigned twin: wraps like NumPy, no undefined overflow
        return f"({t.value})(({t.unsigned}){a[0]} * ({t.unsigned}){a[0]})"
    return f"({a[0]} * {a[0]})"


# ---- derivatives: f'(x) from x and y = f(x) ------------------------------------------------

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_TWO_SQRT_PI = 2.0 / math.sqrt(math.pi)
_GELU_K = 0.044715


def _indicator(g: Graph, cond: NodeId, like: NodeId) -> NodeId:
    """``cond`` (bool) as 0/1 in ``like``'s dtype."""
    return g.cast(cond, g.node(like).dtype)


def _d_gelu(g: Graph, x: NodeId, y: NodeId) -> NodeId:
    cdf = g.mul(g.add(g.erf(g.mul(x, _SQRT1_2)), 1.0), 0.5)
    pdf = g.mul(g.exp(g.mul(g.square(x), -0.5)), _INV_SQRT_2PI)
    return g.add(cdf, g.mul(x, pdf))


def _d_gelu_tanh(g: Graph, x: NodeId, y: NodeId) -> NodeId:
    x2 = g.square(x)
    th = g.tanh(g.mul(g.add(x, g.mul(g.mul(x2, x), _GELU_K)), _SQRT_2_PI))
    du = g.mul(g.add(g.mul(x2, 3.0 * _GELU_K), 1.0), _SQRT_2_PI)
    left = g.mul(g.add(th, 1.0), 0.5)
    right = g.mul(g.mul(g.mul(x, 0.5), g.sub(1.0, g.square(th))), du)
    return g.add(left, right)


def _d_silu(g: Graph, x: NodeId, y: NodeId) -> NodeId:
    s = g.sigmoid(x)
    return g.mul(s, g.add(g.mul(x, g.sub(1.0, s)), 1.0))


# ---- the table -----------------------------------------------------------------------------

_K, _R, _U = Complex.KERNEL, Complex.REFERENCE, Complex.UNDEFINED
_NUM = Inputs.NUMBER

UNARY: dict[UnaryKind, UnaryFacts] = {
    UnaryKind.RELU: UnaryFacts(
        lambda x: np.maximum(x, np.zeros((), x.dtype)),
        "({x} < 0 ? ({t})0 : {x})",
        lambda g, x, y: _indicator(g, g.gt(x, 0.0), x),  # relu'(0) = 0, as PyTorch
        inputs=_NUM,
        complex=_K,  # maximum(z, 0) in NumPy's lexicographic complex order
    ),
    UnaryKind.GELU: UnaryFacts(
        _gelu,
        # erf's argument in f64, as the reference divides by np.sqrt(2.0) (a float64)
        "((({t})0.5 * {x}) * (({t})1 + ({t})erf((double){x} / 1.4142135623730951)))",
        _d_gelu,
    ),
    UnaryKind.GELU_TANH: UnaryFacts(
        _gelu_tanh,
        # the constants rounded to the register type, as the reference makes them arrays
        # of x's dtype
        "((({t})0.5 * {x}) * (({t})1 + tanh{f}(({t})0.7978845608028654"
        " * ({x} + ((({t})0.044715 * {x}) * {x}) * {x}))))",
        _d_gelu_tanh,
    ),
    UnaryKind.SILU: UnaryFacts(lambda x: x * _sigmoid(x), "({x} * rlx_sigmoid{f}({x}))", _d_silu),
    UnaryKind.SIGMOID: UnaryFacts(
        _sigmoid, "rlx_sigmoid{f}({x})", lambda g, x, y: g.mul(y, g.sub(1.0, y))
    ),
    UnaryKind.TANH: UnaryFacts(
        np.tanh, "tanh{f}({x})", lambda g, x, y: g.sub(1.0, g.square(y)), ufunc=np.tanh, complex=_K
    ),
    UnaryKind.EXP: UnaryFacts(np.exp, "exp{f}({x})", lambda g, x, y: y, ufunc=np.exp, complex=_K),
    UnaryKind.LOG: UnaryFacts(
        np.log, "log{f}({x})", lambda g, x, y: g.recip(x), ufunc=np.log, complex=_K
    ),
    UnaryKind.SQRT: UnaryFacts(
        np.sqrt, "sqrt{f}({x})", lambda g, x, y: g.div(0.5, y), ufunc=np.sqrt, complex=_K
    ),
    UnaryKind.RSQRT: UnaryFacts(
        lambda x: 1.0 / np.sqrt(x),
        "(({t})1 / sqrt{f}({x}))",
        lambda g, x, y: g.mul(g.mul(g.square(y), y), -0.5),
        complex=_K,
    ),
    UnaryKind.NEG: UnaryFacts(
        np.negative, _c_neg, -1.0, inputs=_NUM, ufunc=np.negative, complex=_K
    ),
    UnaryKind.ABS: UnaryFacts(
        np.abs,
        _c_abs,
        lambda g, x, y: g.sign(x),  # abs'(0) = sign(0) = 0, as PyTorch
        inputs=_NUM,
        ufunc=np.absolute,
        complex=_K,  # f32 magnitudes stored as complex, as the reference
    ),
    UnaryKind.SIN: UnaryFacts(
        np.sin, "sin{f}({x})", lambda g, x, y: g.cos(x), ufunc=np.sin, complex=_K
    ),
    UnaryKind.COS: UnaryFacts(
        np.cos, "cos{f}({x})", lambda g, x, y: g.neg(g.sin(x)), ufunc=np.cos, complex=_K
    ),
    # round half to even, as NumPy, JAX and ONNX (C rint in the default rounding mode)
    UnaryKind.ROUND: UnaryFacts(np.rint, "rint{f}({x})", None, ufunc=np.rint, complex=_K),
    UnaryKind.FLOOR: UnaryFacts(np.floor, "floor{f}({x})", None, ufunc=np.floor, complex=_U),
    UnaryKind.CEIL: UnaryFacts(np.ceil, "ceil{f}({x})", None, ufunc=np.ceil, complex=_U),
    UnaryKind.RECIP: UnaryFacts(
        lambda x: 1.0 / x, "(({t})1 / {x})", lambda g, x, y: g.neg(g.square(y)), complex=_K
    ),
    UnaryKind.SQUARE: UnaryFacts(
        np.square,
        _c_square,
        lambda g, x, y: g.mul(x, 2.0),
        inputs=_NUM,
        ufunc=np.square,
        complex=_K,
    ),
    UnaryKind.SOFTPLUS: UnaryFacts(
        lambda x: np.logaddexp(np.zeros((), x.dtype), x),
        "rlx_softplus{f}({x})",
        lambda g, x, y: g.sigmoid(x),
        complex=_U,
    ),
    UnaryKind.ERF: UnaryFacts(
        lambda x: _erf(x).astype(x.dtype),
        "({t})erf((double){x})",  # scipy's f32 erf computes in f64 and rounds once
        lambda g, x, y: g.mul(g.exp(g.neg(g.square(x))), _TWO_SQRT_PI),
    ),
    UnaryKind.SIGN: UnaryFacts(
        np.sign,
        "({x} > 0 ? ({t})1 : ({x} < 0 ? ({t})-1 : {x}))",
        None,
        inputs=_NUM,
        ufunc=np.sign,
        complex=_K,
    ),
    UnaryKind.NOT: UnaryFacts(
        np.logical_not, "(!{x})", None, inputs=Inputs.BOOL, ufunc=np.logical_not, complex=_U
    ),
    UnaryKind.HARDSWISH: UnaryFacts(
        lambda x: x * np.clip(x + 3, 0, 6) / 6,  # x * relu6(x + 3) / 6, as PyTorch
        "({x} * fmin{f}(fmax{f}({x} + ({t})3, ({t})0), ({t})6) / ({t})6)",
        # 0 up to -3, x / 3 + 1/2 below 3, 1 from 3 on (PyTorch's values at the kinks)
        lambda g, x, y: g.where(
            g.le(x, -3.0), 0.0, g.where(g.lt(x, 3.0), g.add(g.div(x, 3.0), 0.5), 1.0)
        ),
        complex=_U,
    ),
}
