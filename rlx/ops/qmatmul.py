"""Integer matmul ops: ``qmatmul`` (static activation quantization) and ``dynamic_qmatmul``
(per-row activation quantization at run time), both with a fused f32 epilogue, and
``dynamic_qbatch_matmul`` (two activations, both quantized at run time: attention's
products; see :class:`DynamicQBatchMatMul`).

In: activations (integer for :class:`QMatMul`, float for :class:`DynamicQMatMul`), an I8
weight ``[K, N]`` (symmetric, per-tensor or per-output-channel scales), an optional float
``bias [N]`` and an optional float ``residual`` of the output's dims. Out: f32 ``[..., N]``::

    acc[m, n] = sum_k (x_q[m, k] - x_zp[m]) * w_q[k, n]                   (exact integer)
    y[m, n]   = act(f32(acc) * (f32(x_scale[m]) * f32(w_scales[n])) + bias[n]) + residual[m, n]

``act`` is ``None`` or one of :data:`EPILOGUE_ACTS` (relu, gelu (erf), gelu_tanh, silu: the
:class:`~rlx.ops.elementwise.UnaryKind` members the fused f32 ops use), applied in f32.
The epilogue attributes (``act``, ``has_residual``) default to none, so graphs and files
written before they existed load unchanged. Input order: ``(x, w_q[, bias][, residual])``.
A :class:`QMatMul` with ``x_dtype`` set reads the float activation and quantizes it per
tensor itself (what the compile pipeline makes of ``quantize -> qmatmul``).

Dynamic activation quantization (:class:`DynamicQMatMul`, as ONNX Runtime's
``DynamicQuantizeMatMul`` and PyTorch's dynamic quantization), per row of ``x`` (in f32;
bf16/f16 rows are widened exactly first):

* ``ActQuant.S8`` (symmetric): ``scale = max|x| / 127``, ``zp = 0``,
  ``q = clip(rint(x / scale), -128, 127)``.
* ``ActQuant.U8`` (asymmetric, ONNX ``DynamicQuantizeLinear``): ``lo = min(0, min x)``,
  ``hi = max(0, max x)``, ``scale = (hi - lo) / 255``, ``zp = clip(rint(-lo / scale), 0,
  255)``, ``q = clip(rint(x / scale) + zp, 0, 255)``.

Every step is one f32 operation rounded to nearest (``rint`` is round-half-even); a row of
zeros (``scale == 0``) takes ``scale = 1``; a row holding NaN or +-inf (a non-finite
scale) gives NaN outputs. The CPU kernels accumulate in int32 (exact while ``K * 255 * 128
< 2**31``); the reference accumulates in int64.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.elementwise import UNARY_FNS, UnaryKind
from rlx.ops.quant import QUANT_RANGES, _scales, _short, quantize_array
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId

__all__ = [
    "ActQuant",
    "EPILOGUE_ACTS",
    "IntEpilogueOp",
    "QMatMul",
    "DynamicQMatMul",
    "DynamicQBatchMatMul",
    "dynamic_quantize_rows",
    "apply_epilogue",
]

#: Activations the integer ops' epilogue may apply (``act=None`` applies nothing).
EPILOGUE_ACTS: tuple[UnaryKind, ...] = (
    UnaryKind.RELU,
    UnaryKind.GELU,
    UnaryKind.GELU_TANH,
    UnaryKind.SILU,
)


class ActQuant(enum.Enum):
    """How :class:`DynamicQMatMul` quantizes each activation row (see the module doc)."""

    S8 = "s8"  # symmetric int8, zero point 0
    U8 = "u8"  # asymmetric uint8 with a per-row zero point

    @classmethod
    def parse(cls, v: ActQuant | str) -> ActQuant:
        """``ActQuant`` or its value (``"s8"`` / ``"u8"``)."""
        return v if isinstance(v, ActQuant) else cls(str(v).lower())


def dynamic_quantize_rows(
    x: np.ndarray, mode: ActQuant
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize each row of ``x [M, K]`` (any float) as ``mode`` says; returns ``(q int64
    [M, K], scale f32 [M], zero_point int64 [M])``. A non-finite row's scale is NaN."""
    xf = np.asarray(x).astype(np.float32)
    m = xf.shape[0]
    with np.errstate(all="ignore"):
        if xf.shape[1] == 0:
            lo = hi = np.zeros(m, np.float32)
        else:
            lo, hi = xf.min(axis=1), xf.max(axis=1)
        if mode is ActQuant.S8:
            amax = np.maximum(np.abs(lo), np.abs(hi))
            scale = (amax / np.float32(127)).astype(np.float32)
            qmin, qmax = -128, 127
        else:
            lo = np.minimum(lo, np.float32(0))
            hi = np.maximum(hi, np.float32(0))
            scale = ((hi - lo) / np.float32(255)).astype(np.float32)
            qmin, qmax = 0, 255
        bad = ~np.isfinite(scale) | np.isnan(lo) | np.isnan(hi)
        scale = np.where(scale == 0, np.float32(1), scale).astype(np.float32)
        scale[bad] = np.float32(np.nan)
        zp = np.zeros(m, np.int64)
        if mode is ActQuant.U8:
            z = np.rint(-lo / scale)
            zp = np.clip(np.nan_to_num(z, nan=0.0), 0, 255).astype(np.int64)
        t = np.rint(xf / scale[:, None])
    t = np.clip(np.nan_to_num(t, nan=0.0, posinf=2.0**40, neginf=-(2.0**40)), -(2.0**40), 2.0**40)
    q = np.clip(t.astype(np.int64) + zp[:, None], qmin, qmax)
    return q, scale, zp


def apply_epilogue(
    y: np.ndarray,
    act: UnaryKind | None,
    bias: np.ndarray | None,
    residual: np.ndarray | None,
) -> np.ndarray:
    """``act(y + bias) + residual`` in f32 (``y`` f32 ``[..., N]``; each part optional)."""
    with np.errstate(all="ignore"):
        if bias is not None:
            y = y + bias.astype(np.float32)
        if act is not None:
            y = np.asarray(UNARY_FNS[act](y)).astype(np.float32)
        if residual is not None:
            y = y + residual.astype(np.float32)
    return y.astype(np.float32)


class IntEpilogueOp(Op):
    """Base of the integer ops with an f32 epilogue (:class:`QMatMul`,
    :class:`DynamicQMatMul`, :class:`~rlx.ops.qconv.QConv2d`): weight scales ``w_scales``
    (1 or one per output channel), ``has_bias`` (an optional float input) and, on the
    matmuls, ``act`` and ``has_residual``. Not registered itself: each subclass declares
    its fields, where ``@register`` makes them dataclass fields in the subclass's own order
    (its constructor's order and its serialized attributes)."""

    __slots__ = ()
    w_scales: tuple[float, ...]
    has_bias: bool

    def __post_init__(self) -> None:
        if hasattr(self, "x_scale"):
            object.__setattr__(self, "x_scale", float(self.x_scale))  # type: ignore[attr-defined]
            object.__setattr__(self, "x_zero_point", int(self.x_zero_point))  # type: ignore[attr-defined]
        object.__setattr__(self, "w_scales", tuple(float(s) for s in self.w_scales))

    @property
    def epilogue_act(self) -> UnaryKind | None:
        """The fused activation (``None`` on ops without one)."""
        return getattr(self, "act", None)

    @property
    def residual_input(self) -> bool:
        """Whether the last input is a residual added after the activation."""
        return bool(getattr(self, "has_residual", False))

    def num_inputs(self) -> int:
        return 2 + int(self.has_bias) + int(self.residual_input)

    def combined_scales(self, n: int) -> np.ndarray:
        """``f32(x_scale) * f32(w_scales)`` broadcast to ``n`` output channels (static
        activation quantization only)."""
        ws = np.asarray(self.w_scales, dtype=np.float32)
        xs = np.float32(self.x_scale)  # type: ignore[attr-defined]
        return np.broadcast_to(xs * ws, (n,)).astype(np.float32)

    def w_scale_vector(self, n: int) -> np.ndarray:
        """``f32(w_scales)`` broadcast to ``n`` output channels."""
        return np.broadcast_to(np.asarray(self.w_scales, np.float32), (n,)).astype(np.float32)

    def check_x_quant(self, x_dtype: DType) -> None:
        """ShapeError unless ``x_zero_point`` fits ``x_dtype`` and ``x_scale`` is finite
        and > 0."""
        qmin, qmax = QUANT_RANGES[x_dtype]
        zp, xs = self.x_zero_point, self.x_scale  # type: ignore[attr-defined]
        expect(qmin <= zp <= qmax, self, f"x_zero_point {zp} outside [{qmin}, {qmax}] of {x_dtype}")
        expect(math.isfinite(xs) and xs > 0, self, f"x_scale must be finite and > 0, got {xs}")

    def check_weight(self, x: Shape, w: Shape) -> int:
        """Check ``w_q`` I8 ``[K, N]`` against ``x [..., K]`` and ``w_scales``; returns N."""
        expect(w.dtype is DType.I8 and w.rank == 2, self, f"w_q must be i8 [K, N], got {w}")
        expect(x.dims[-1] == w.dims[0], self, f"contraction dims differ: x {x} vs w_q {w}")
        n = w.dims[1]
        expect(
            all(math.isfinite(s) and s > 0 for s in self.w_scales),
            self,
            f"w_scales must be finite and > 0, got {_short(self.w_scales)}",
        )
        expect(
            len(self.w_scales) == 1 or len(self.w_scales) == n,
            self,
            f"w_scales needs 1 or N={n} values, got {len(self.w_scales)}",
        )
        return n  # type: ignore[return-value]

    def check_epilogue(self, ins: tuple[Shape, ...], out: Shape, n: object) -> None:
        """Check ``act``, the bias ``[N]`` and the residual (``out``'s dims)."""
        act = self.epilogue_act
        expect(
            act is None or act in EPILOGUE_ACTS,
            self,
            f"act must be None or one of {[a.value for a in EPILOGUE_ACTS]}, got {act}",
        )
        k = 2
        if self.has_bias:
            b = ins[k]
            expect(b.dtype.is_float and b.dims == (n,), self, f"bias must be float [{n}], got {b}")
            k += 1
        if self.residual_input:
            r = ins[k]
            expect(
                r.dtype.is_float and r.dims == out.dims,
                self,
                f"residual must be float with the output's dims {list(out.dims)}, got {r}",
            )

    def linear_out(self, ins: tuple[Shape, ...]) -> Shape:
        """The F32 ``[..., N]`` output of ``x [..., K] @ w_q [K, N]`` (``ins[0]``,
        ``ins[1]``) once the weight and the epilogue inputs are checked."""
        x, w = ins[0], ins[1]
        n = self.check_weight(x, w)
        out = Shape((*x.dims[:-1], n), DType.F32)
        self.check_epilogue(ins, out, n)
        return out

    def epilogue(self, y: np.ndarray, xs: Sequence[np.ndarray]) -> np.ndarray:
        """The reference epilogue on the scaled product ``y`` (f32)."""
        k = 2
        bias = residual = None
        if self.has_bias:
            bias, k = xs[k], k + 1
        if self.residual_input:
            residual = xs[k]
        return apply_epilogue(y, self.epilogue_act, bias, residual)

    def epilogue_str(self) -> str:
        act = self.epilogue_act
        return f"act={act.value if act else 'none'}, has_residual={self.residual_input}"


@register
class QMatMul(IntEpilogueOp):
    """Integer GEMM with an f32 epilogue (``linear`` semantics, weight ``[K, N]``, see the
    module docstring) and static activation quantization::

        acc[..., n] = sum_k (x_q[..., k] - x_zero_point) * w_q[k, n]        (exact int)
        y[..., n]   = act(f32(acc) * (f32(x_scale) * f32(w_scales[n])) + bias[n]) + residual

    Inputs: ``x_q`` I8 or U8 ``[..., K]`` (per-tensor activation quantization), ``w_q`` I8
    ``[K, N]``, then the optional ``bias [N]`` and ``residual``. Output f32.

    With ``x_dtype`` (I8 or U8) the first input is the float activation itself and the op
    quantizes it first, exactly as ``quantize(x, x_scale, x_zero_point, dtype=x_dtype)``
    (what ``fuse_quant_epilogue`` makes of a quantize feeding a qmatmul).
    """

    mnemonic: ClassVar[str] = "qmatmul"
    nondiff: ClassVar[str] = (
        "integer GEMM of quantized activations and inference-only packed i8 weights "
        "(piecewise constant in a float x); train the float model with fake_quantize "
        "(rlx.train.qat) and convert it"
    )
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    x_scale: float
    x_zero_point: int
    w_scales: tuple[float, ...]
    has_bias: bool = False
    act: UnaryKind | None = None
    has_residual: bool = False
    x_dtype: DType | None = None

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x = ins[0]
        if self.x_dtype is None:
            expect(
                x.dtype in (DType.I8, DType.U8) and x.rank >= 1,
                self,
                f"x_q must be i8 or u8 of rank >= 1, got {x}",
            )
        else:
            expect(
                self.x_dtype in (DType.I8, DType.U8),
                self,
                f"x_dtype must be i8 or u8 (or None), got {self.x_dtype}",
            )
            expect(
                x.dtype.is_float and x.rank >= 1,
                self,
                f"with x_dtype={self.x_dtype} x must be float of rank >= 1, got {x}",
            )
        self.check_x_quant(self.x_dtype or x.dtype)
        return self.linear_out(ins)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, w = xs[0], xs[1]
        if self.x_dtype is not None:
            lo, hi = QUANT_RANGES[self.x_dtype]
            x = quantize_array(x, (self.x_scale,), (self.x_zero_point,), None, lo, hi)
        acc = np.matmul(x.astype(np.int64) - self.x_zero_point, w.astype(np.int64))
        y = acc.astype(np.float32) * self.combined_scales(w.shape[1])
        return self.epilogue(y, xs)

    def attrs_str(self) -> str:
        ws = _short(tuple(f"{s:g}" for s in self.w_scales))
        return (
            f"x_scale={self.x_scale:g}, x_zero_point={self.x_zero_point}, w_scales={ws}, "
            f"has_bias={self.has_bias}, {self.epilogue_str()}"
            + (f", x_dtype={self.x_dtype}" if self.x_dtype is not None else "")
        )


@register
class DynamicQMatMul(IntEpilogueOp):
    """Integer GEMM with activations quantized per row at run time (see the module
    docstring)::

        q, x_scale[m], x_zp[m] = quantize_row(x[m, :], mode)
        acc[m, n] = sum_k (q[m, k] - x_zp[m]) * w_q[k, n]                    (exact int)
        y[m, n]   = act(f32(acc) * (x_scale[m] * f32(w_scales[n])) + bias[n]) + residual

    Inputs: float ``x [..., K]`` (f32/bf16/f16), ``w_q`` I8 ``[K, N]`` (symmetric), then
    the optional float ``bias [N]`` and ``residual`` (the output's dims). Output f32.
    """

    mnemonic: ClassVar[str] = "dynamic_qmatmul"
    nondiff: ClassVar[str] = (
        "integer GEMM: x is quantized per row at run time (piecewise constant in x) and "
        "the i8 weights are inference-only; train with fake_quantize (rlx.train.qat)"
    )
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    w_scales: tuple[float, ...]
    has_bias: bool = False
    act: UnaryKind | None = None
    has_residual: bool = False
    mode: ActQuant = ActQuant.S8

    def __post_init__(self) -> None:
        IntEpilogueOp.__post_init__(self)
        object.__setattr__(self, "mode", ActQuant.parse(self.mode))

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x = ins[0]
        expect(x.dtype.is_float and x.rank >= 1, self, f"x must be float of rank >= 1, got {x}")
        return self.linear_out(ins)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, w = xs[0], xs[1]
        k, n = w.shape
        q, xs_row, zp = dynamic_quantize_rows(x.reshape(-1, k), self.mode)
        acc = np.matmul(q - zp[:, None], w.astype(np.int64))
        with np.errstate(all="ignore"):
            scale = xs_row[:, None] * self.w_scale_vector(n)[None, :]
            y = acc.astype(np.float32) * scale
        return self.epilogue(y.reshape(*x.shape[:-1], n), xs)

    def attrs_str(self) -> str:
        ws = _short(tuple(f"{s:g}" for s in self.w_scales))
        return (
            f"mode={self.mode.value}, w_scales={ws}, has_bias={self.has_bias}, "
            f"{self.epilogue_str()}"
        )


@register
class DynamicQBatchMatMul(Op):
    """Batched product of two float activations, both quantized at run time (attention's
    ``Q @ K^T`` and ``P @ V``)::

        qa, sa[m], za[m] = quantize_row(a[b, m, :], a_mode)                 (rows of a)
        qb, sb[n], 0     = quantize_row(bT[b, n, :], S8)     (columns of b: rows of b^T)
        acc[b, m, n]     = sum_k (qa[m, k] - za[m]) * qb[n, k]               (exact int)
        y[b, m, n]       = f32(acc) * (sa[m] * (sb[n] * alpha))

    Inputs: float ``a [..., M, K]`` and ``b [..., K, N]`` (``[..., N, K]`` with
    ``transpose_b``), the same leading dims. Output f32 ``[..., M, N]``. ``alpha`` (e.g.
    attention's ``1/sqrt(d)``) is folded into b's scales.
    """

    mnemonic: ClassVar[str] = "dynamic_qbatch_matmul"
    nondiff: ClassVar[str] = (
        "integer product of two activations quantized per row at run time: piecewise "
        "constant in both; inference-only"
    )
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    a_mode: ActQuant = ActQuant.S8
    transpose_b: bool = False
    alpha: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "a_mode", ActQuant.parse(self.a_mode))
        object.__setattr__(self, "alpha", float(self.alpha))

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        a, b = ins
        expect(a.dtype.is_float and a.rank >= 2, self, f"a must be float [..., M, K], got {a}")
        expect(b.dtype.is_float and b.rank == a.rank, self, f"b must be float of a's rank, got {b}")
        expect(a.dims[:-2] == b.dims[:-2], self, f"leading dims differ: a {a} vs b {b}")
        k_b, n = (b.dims[-1], b.dims[-2]) if self.transpose_b else (b.dims[-2], b.dims[-1])
        expect(a.dims[-1] == k_b, self, f"contraction dims differ: a {a} vs b {b}")
        expect(
            math.isfinite(self.alpha) and self.alpha != 0,
            self,
            f"alpha must be finite and non-zero, got {self.alpha}",
        )
        return Shape((*a.dims[:-1], n), DType.F32)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        a, b = xs
        m, k = a.shape[-2:]
        bt = b if self.transpose_b else np.swapaxes(b, -1, -2)
        n = bt.shape[-2]
        a3, b3 = a.reshape(-1, m, k), bt.reshape(-1, n, k)
        out = np.empty((a3.shape[0], m, n), np.float32)
        for i in range(a3.shape[0]):
            qa, sa, za = dynamic_quantize_rows(a3[i], self.a_mode)
            qb, sb, _ = dynamic_quantize_rows(b3[i], ActQuant.S8)
            acc = (qa - za[:, None]) @ qb.T
            with np.errstate(all="ignore"):
                sbn = (sb * np.float32(self.alpha)).astype(np.float32)
                out[i] = acc.astype(np.float32) * (sa[:, None] * sbn[None, :])
        return out.reshape(*a.shape[:-1], n)

    def attrs_str(self) -> str:
        return f"a_mode={self.a_mode.value}, transpose_b={self.transpose_b}, alpha={self.alpha:g}"


# ---- builder conveniences ---------------------------------------------------------


def _extra(bias: NodeId | None, residual: NodeId | None) -> list[NodeId]:
    return [i for i in (bias, residual) if i is not None]


@graph_method
def qmatmul(
    g: Graph,
    x_q: NodeId,
    w_q: NodeId,
    x_scale: float,
    w_scales: float | Sequence[float],
    x_zero_point: int = 0,
    bias: NodeId | None = None,
    act: UnaryKind | None = None,
    residual: NodeId | None = None,
) -> NodeId:
    """Integer matmul ``x_q @ w_q`` rescaled to f32 (see :class:`QMatMul`)."""
    op = QMatMul(
        x_scale, x_zero_point, _scales(w_scales), bias is not None, act, residual is not None
    )
    return g.apply(op, [x_q, w_q, *_extra(bias, residual)])


@graph_method
def dynamic_qmatmul(
    g: Graph,
    x: NodeId,
    w_q: NodeId,
    w_scales: float | Sequence[float],
    bias: NodeId | None = None,
    act: UnaryKind | None = None,
    residual: NodeId | None = None,
    mode: ActQuant | str = ActQuant.S8,
) -> NodeId:
    """Float ``x`` quantized per row at run time, times int8 ``w_q`` (see
    :class:`DynamicQMatMul`)."""
    op = DynamicQMatMul(
        _scales(w_scales), bias is not None, act, residual is not None, ActQuant.parse(mode)
    )
    return g.apply(op, [x, w_q, *_extra(bias, residual)])


@graph_method
def dynamic_qbatch_matmul(
    g: Graph,
    a: NodeId,
    b: NodeId,
    transpose_b: bool = False,
    alpha: float = 1.0,
    a_mode: ActQuant | str = ActQuant.S8,
) -> NodeId:
    """``alpha * a @ b`` (``b^T`` with ``transpose_b``) with both operands quantized per
    row / column at run time (see :class:`DynamicQBatchMatMul`)."""
    op = DynamicQBatchMatMul(ActQuant.parse(a_mode), bool(transpose_b), float(alpha))
    return g.apply(op, [a, b])
