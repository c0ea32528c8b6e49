"""Quantization ops: quantize, dequantize, fake_quantize, dequant_matmul (qmatmul and
dynamic_qmatmul: :mod:`rlx.ops.qmatmul`).

Affine quantization, as in ONNX QuantizeLinear / DequantizeLinear::

    q = saturate(round_half_even(x / scale) + zero_point, qmin, qmax)
    x' = (q - zero_point) * scale

``axis=None`` is per-tensor (one scale and zero point); ``axis=d`` is per-channel along
dim ``d`` (one scale and zero point per index of that dim, which must be static).
The division is done in f32 (f64 for f64 inputs), exactly as the CPU kernels do; NaN
quantizes to the zero point and +-inf saturate.

Weight-only quantized matmuls (:class:`DequantMatMul`) describe the packed weight with a
:class:`QuantScheme` (the variants live in ``rlx.formats.schemes`` and are re-exported
here). The integer matmuls live in :mod:`rlx.ops.qmatmul` and are re-exported here:
:class:`QMatMul` (the integer GEMM that the quantization lowering, ``rlx.quant.lower``,
produces from Q/DQ-bracketed matmuls) and :class:`DynamicQMatMul` (activations quantized
per row at run time); they and ``qconv2d``'s :class:`~rlx.ops.qconv.QConv2d` share the
unregistered base :class:`IntEpilogueOp` (scale attributes, their checks, the f32
epilogue).

Q/DQ are deliberately not ``elementwise``: region fusion must not swallow them, since
the quantization lowering matches the ``dequantize(quantize(x))`` pattern.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.formats.schemes import (
    WEIGHT_DTYPES,
    Fp8E4m3,
    Fp8E5m2,
    GgufQ4K,
    GgufQ5K,
    GgufQ6K,
    GgufQ8K,
    Int4Block,
    Int8Block,
    Int8BlockAsym,
    QuantScheme,
    dequantize_weight,
)
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.shape import Shape

__all__ = [
    "Quantize",
    "Dequantize",
    "FakeQuantize",
    "QuantScheme",
    "Int8Block",
    "Int8BlockAsym",
    "Int4Block",
    "Fp8E4m3",
    "Fp8E5m2",
    "GgufQ4K",
    "GgufQ5K",
    "GgufQ6K",
    "GgufQ8K",
    "DequantMatMul",
    "IntEpilogueOp",
    "QMatMul",
    "DynamicQMatMul",
    "DynamicQBatchMatMul",
    "ActQuant",
    "QUANT_RANGES",
    "quantize_array",
    "dequantize_array",
    "dequantize_weight",
]

#: Integer storage types a Quantize may produce, with their saturation range.
QUANT_RANGES: dict[DType, tuple[int, int]] = {
    DType.I8: (-128, 127),
    DType.U8: (0, 255),
    DType.I16: (-32768, 32767),
    DType.I32: (-(2**31), 2**31 - 1),
}


def _compute_dtype(x: np.ndarray) -> np.dtype:
    return np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)


def _channel_shape(rank: int, axis: int | None, n: int) -> tuple[int, ...]:
    if axis is None:
        return ()
    shp = [1] * rank
    shp[axis] = n
    return tuple(shp)


def quantize_array(
    x: np.ndarray,
    scales: Sequence[float],
    zero_points: Sequence[int],
    axis: int | None,
    qmin: int,
    qmax: int,
) -> np.ndarray:
    """``clip(rint(x / scale) + zp, qmin, qmax)`` as int64 (axis already normalised)."""
    ct = _compute_dtype(x)
    xs = np.asarray(x).astype(ct, copy=False)
    cs = _channel_shape(xs.ndim, axis, len(scales))
    s = np.asarray(scales, dtype=ct).reshape(cs)
    z = np.asarray(zero_points, dtype=np.int64).reshape(cs)
    with np.errstate(all="ignore"):
        r = np.rint(xs / s)
    # NaN maps to the zero point; +-inf and huge values saturate
    r = np.clip(np.nan_to_num(r, nan=0.0, posinf=2.0**40, neginf=-(2.0**40)), -(2.0**40), 2.0**40)
    return np.clip(r.astype(np.int64) + z, qmin, qmax)


def dequantize_array(
    q: np.ndarray, scales: Sequence[float], zero_points: Sequence[int], axis: int | None
) -> np.ndarray:
    """``(q - zp) * scale`` in f32 (axis already normalised)."""
    cs = _channel_shape(q.ndim, axis, len(scales))
    s = np.asarray(scales, dtype=np.float32).reshape(cs)
    z = np.asarray(zero_points, dtype=np.int64).reshape(cs)
    return (q.astype(np.int64) - z).astype(np.float32) * s


def _coerce_params(op: Op) -> None:
    """Store scales / zero points as hashable tuples of float / int."""
    object.__setattr__(op, "scales", tuple(float(s) for s in op.scales))  # type: ignore[attr-defined]
    object.__setattr__(op, "zero_points", tuple(int(z) for z in op.zero_points))  # type: ignore[attr-defined]


def _check_params(op: Op, x: Shape, qmin: int, qmax: int) -> int | None:
    """Validate scales / zero points against ``x``; returns the normalised axis."""
    scales: tuple[float, ...] = op.scales  # type: ignore[attr-defined]
    zps: tuple[int, ...] = op.zero_points  # type: ignore[attr-defined]
    axis: int | None = op.axis  # type: ignore[attr-defined]
    expect(
        len(scales) == len(zps),
        op,
        f"{len(scales)} scales but {len(zps)} zero points (need one of each per channel)",
    )
    expect(
        all(math.isfinite(s) and s > 0 for s in scales),
        op,
        f"scales must be finite and > 0, got {_short(scales)}",
    )
    expect(
        all(qmin <= z <= qmax for z in zps),
        op,
        f"zero points must lie in [{qmin}, {qmax}], got {_short(zps)}",
    )
    if axis is None:
        expect(len(scales) == 1, op, f"per-tensor needs 1 scale, got {len(scales)}")
        return None
    expect(-x.rank <= axis < x.rank, op, f"axis {axis} out of range for input {x}")
    ax = axis % x.rank
    d = x.dims[ax]
    expect(isinstance(d, int), op, f"per-channel axis {axis} of {x} must be a static dim")
    expect(
        len(scales) == d,
        op,
        f"per-channel along axis {axis} of {x} needs {d} scales, got {len(scales)}",
    )
    return ax


def _short(v: tuple) -> str:
    return str(v) if len(v) <= 6 else f"({', '.join(map(str, v[:6]))}, ... {len(v)} values)"


def _norm_axis(axis: int | None, rank: int) -> int | None:
    return None if axis is None else axis % rank


@register
class Quantize(Op):
    """Float -> integer: ``saturate(rint(x / scale) + zp)`` into ``dtype`` (I8, U8, I16,
    I32), per-tensor (``axis=None``) or per-channel along ``axis``. NaN gives the zero
    point; +-inf and out-of-range values saturate to the dtype's limits (exactly
    2**31 - 1 / -2**31 for I32: the zero point is added and clipped in int64, since f32
    cannot hold 2**31 - 1)."""

    mnemonic: ClassVar[str] = "quantize"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE  # the seed's class
    nondiff: ClassVar[str] = (
        "integer output: piecewise constant in x (train through fake_quantize, whose "
        "straight-through rule passes the gradient)"
    )
    axis: int | None
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    dtype: DType = DType.I8

    def __post_init__(self) -> None:
        _coerce_params(self)

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        expect(
            self.dtype in QUANT_RANGES,
            self,
            f"dtype must be one of {[str(d) for d in QUANT_RANGES]}, got {self.dtype}",
        )
        expect(x.dtype.is_float, self, f"input must be float, got {x}")
        _check_params(self, x, *QUANT_RANGES[self.dtype])
        return x.with_dtype(self.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = xs[0]
        qmin, qmax = QUANT_RANGES[self.dtype]
        q = quantize_array(
            x, self.scales, self.zero_points, _norm_axis(self.axis, x.ndim), qmin, qmax
        )
        return q.astype(self.dtype.np)

    def attrs_str(self) -> str:
        return f"axis={self.axis}, scales={_short(self.scales)}, zero_points={_short(self.zero_points)}, dtype={self.dtype}"


@register
class Dequantize(Op):
    """Integer -> f32: ``(q - zp) * scale``, per-tensor or per-channel along ``axis``."""

    mnemonic: ClassVar[str] = "dequantize"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE  # the seed's class
    nondiff: ClassVar[str] = "integer input: no float input to carry a gradient"
    axis: int | None
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]

    def __post_init__(self) -> None:
        _coerce_params(self)

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (q,) = ins
        expect(
            q.dtype in QUANT_RANGES,
            self,
            f"input must be one of {[str(d) for d in QUANT_RANGES]}, got {q}",
        )
        _check_params(self, q, *QUANT_RANGES[q.dtype])
        return q.with_dtype(DType.F32)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        q = xs[0]
        return dequantize_array(q, self.scales, self.zero_points, _norm_axis(self.axis, q.ndim))

    def attrs_str(self) -> str:
        return f"axis={self.axis}, scales={_short(self.scales)}, zero_points={_short(self.zero_points)}"


@register
class FakeQuantize(Op):
    """Float -> float: ``dequantize(quantize(x))`` with saturation to ``[qmin, qmax]``;
    the output keeps the input dtype (computed in f32, or f64 for f64)."""

    mnemonic: ClassVar[str] = "fake_quantize"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE  # the seed's class
    axis: int | None
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    qmin: int = -128
    qmax: int = 127

    def __post_init__(self) -> None:
        _coerce_params(self)

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        expect(self.qmin < self.qmax, self, f"qmin {self.qmin} must be < qmax {self.qmax}")
        expect(x.dtype.is_float, self, f"input must be float, got {x}")
        _check_params(self, x, self.qmin, self.qmax)
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = xs[0]
        ax = _norm_axis(self.axis, x.ndim)
        q = quantize_array(x, self.scales, self.zero_points, ax, self.qmin, self.qmax)
        ct = _compute_dtype(x)
        cs = _channel_shape(x.ndim, ax, len(self.scales))
        s = np.asarray(self.scales, dtype=ct).reshape(cs)
        z = np.asarray(self.zero_points, dtype=np.int64).reshape(cs)
        return (q - z).astype(ct) * s

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        """Straight-through estimator (``rlx.ops.fake_quant``): ``ct`` inside the clip
        range, 0 where the value saturates."""
        from rlx.ops.fake_quant import fake_quantize_ste

        return (fake_quantize_ste(g, node, ct),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.fake_quant import fake_quantize_ste

        (t,) = tangents
        return None if t is None else fake_quantize_ste(g, node, t)

    def attrs_str(self) -> str:
        return f"axis={self.axis}, scales={_short(self.scales)}, zero_points={_short(self.zero_points)}, qmin={self.qmin}, qmax={self.qmax}"


@register
class DequantMatMul(Op):
    """``y[..., N] = x[..., K] @ dequant(w).T`` with a weight packed as ``scheme`` says
    (rows = output channels). Inputs: ``(x, w_q, scale, zp)``, or ``(x, packed)`` for the
    GGUF schemes (packed U8 [N, K/qk * block_bytes]; qk = 32 for the legacy types, 256
    for the K-quants). Output f32."""

    mnemonic: ClassVar[str] = "dequant_matmul"
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    scheme: QuantScheme

    def num_inputs(self) -> int:
        return self.scheme.num_inputs()

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, w = ins[0], ins[1]
        expect(x.dtype.is_float and x.rank >= 1, self, f"x must be float of rank >= 1, got {x}")
        expect(
            w.rank == 2 and w.is_static, self, f"packed weight must be static 2-D [N, ...], got {w}"
        )
        k = x.dims[-1]
        expect(isinstance(k, int), self, f"the contraction dim of x {x} must be static")
        n, cols = w.dims
        s = self.scheme
        if s.is_gguf:
            expect(w.dtype is DType.U8, self, f"{s} packed bytes must be u8, got {w}")
            bb, qk = type(s).block_bytes, s.block_size  # type: ignore[attr-defined]
            expect(k % qk == 0, self, f"{s} needs K divisible by {qk}, x is {x}")
            expect(
                cols == k // qk * bb,
                self,
                f"{s} with K={k} needs packed [N, {k // qk * bb}] ({bb} bytes per {qk} "
                f"weights), got {w}",
            )
        else:
            sc, zp = ins[2], ins[3]
            expect(
                w.dtype in WEIGHT_DTYPES[type(s)],
                self,
                f"{s} weight must be {WEIGHT_DTYPES[type(s)][0]}, got {w}",
            )
            want_cols = k // 2 if isinstance(s, Int4Block) else k
            expect(
                cols == want_cols and (not isinstance(s, Int4Block) or k % 2 == 0),
                self,
                f"{s} with x {x} needs weight [N, {want_cols}], got {w}",
            )
            if s.block_size is None:
                want = (1,)
            else:
                expect(
                    s.block_size > 0 and k % s.block_size == 0,
                    self,
                    f"K={k} of x {x} is not a multiple of block size {s.block_size}",
                )
                expect(
                    not isinstance(s, Int4Block) or s.block_size % 2 == 0,
                    self,
                    f"Int4Block block size must be even, got {s.block_size}",
                )
                want = (n, k // s.block_size)
            expect(
                sc.dtype is DType.F32 and sc.dims == want,
                self,
                f"scale must be f32{list(want)}, got {sc}",
            )
            expect(
                zp.dtype is DType.I32 and zp.dims == want,
                self,
                f"zp must be i32{list(want)}, got {zp}",
            )
        return Shape((*x.dims[:-1], n), DType.F32)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = xs[0].astype(np.float32)
        w = dequantize_weight(self.scheme, *xs[1:])
        return np.matmul(x, w.T)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        """Linear in ``x``: ``dx = ct @ dequant(w)``, with ``dequant(w).T`` made by the op
        itself from an identity (``I_K @ dequant(w).T``, any scheme). The packed weight
        and its scales get none (inference-only packed weights: train a float copy, or
        an adapter beside it)."""
        x, *weights = node.inputs
        k = g.shape(x).dims[-1]
        eye = g.constant(np.eye(k, dtype=np.float32))
        wt = g.dequant_matmul(eye, self.scheme, *weights)  # [K, N] = dequant(w).T
        dx = g.matmul(ct, g.transpose(wt, [1, 0]))
        if g.shape(x).dtype is not DType.F32:
            dx = g.cast(dx, g.shape(x).dtype)
        return (dx, *(None for _ in weights))

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        tx = tangents[0]
        return None if tx is None else g.dequant_matmul(tx, self.scheme, *node.inputs[1:])


# ---- builder conveniences ---------------------------------------------------------


def _zps(scales: Sequence[float], zero_points: Sequence[int] | None) -> tuple[int, ...]:
    return tuple(zero_points) if zero_points is not None else (0,) * len(scales)


def _scales(scales: float | Sequence[float]) -> tuple[float, ...]:
    return (float(scales),) if isinstance(scales, (int, float)) else tuple(scales)


@graph_method
def quantize(
    g: Graph,
    x: NodeId,
    scales: float | Sequence[float],
    zero_points: Sequence[int] | None = None,
    axis: int | None = None,
    dtype: DType | str = DType.I8,
) -> NodeId:
    """Quantize ``x`` (float) to ``dtype``; a float ``scales`` is per-tensor."""
    s = _scales(scales)
    return g.apply(Quantize(axis, s, _zps(s, zero_points), DType.parse(dtype)), [x])


@graph_method
def dequantize(
    g: Graph,
    q: NodeId,
    scales: float | Sequence[float],
    zero_points: Sequence[int] | None = None,
    axis: int | None = None,
) -> NodeId:
    """Dequantize integer ``q`` to f32."""
    s = _scales(scales)
    return g.apply(Dequantize(axis, s, _zps(s, zero_points)), [q])


@graph_method
def fake_quantize(
    g: Graph,
    x: NodeId,
    scales: float | Sequence[float],
    zero_points: Sequence[int] | None = None,
    axis: int | None = None,
    qmin: int = -128,
    qmax: int = 127,
) -> NodeId:
    """Quantize-dequantize ``x`` in one op (keeps the float dtype)."""
    s = _scales(scales)
    return g.apply(FakeQuantize(axis, s, _zps(s, zero_points), qmin, qmax), [x])


@graph_method
def dequant_matmul(g: Graph, x: NodeId, scheme: QuantScheme, *weights: NodeId) -> NodeId:
    """``x @ dequant(w).T``: weights are ``(w_q, scale, zp)`` or ``(packed,)`` for GGUF."""
    return g.apply(DequantMatMul(scheme), [x, *weights])


# the integer matmuls live in rlx.ops.qmatmul (imported here so that ``rlx.ops.quant``
# keeps exporting them; that module needs the helpers above, hence the import at the end)
from rlx.ops.qmatmul import (  # noqa: E402
    ActQuant,
    DynamicQBatchMatMul,
    DynamicQMatMul,
    IntEpilogueOp,
    QMatMul,
)

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId
