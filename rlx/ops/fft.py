"""Discrete Fourier transforms along one axis, as ``numpy.fft``.

``FFT``/``IFFT`` map c64 -> c64, ``RFFT`` f32 -> c64 (``n//2 + 1`` bins) and ``IRFFT``
c64 -> f32 (``n`` samples, default ``2*(m-1)`` for ``m`` bins). ``n`` crops or zero-pads
the input along the axis as NumPy does. Computed in double precision and rounded once.
The builders cast other float inputs to the op's input dtype.

Derivatives: every transform is linear; its vjp is the adjoint transform (the inverse
with the dual norm; rfft / irfft weight the half-spectrum bins), its jvp itself.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx import source
from rlx.dtype import DType
from rlx.errors import ShapeError
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.elementwise import Cast
from rlx.shape import Dim, Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["FftKind", "FftNorm", "Fft"]


class FftKind(enum.Enum):
    """Which transform ``Fft`` computes, as ``numpy.fft.<value>``: fft/ifft take and give
    c64; rfft takes f32 and gives c64; irfft takes c64 and gives f32."""

    FFT = "fft"
    IFFT = "ifft"
    RFFT = "rfft"
    IRFFT = "irfft"

    @property
    def in_dtype(self) -> DType:
        """The input dtype the ``Fft`` op takes (the builders cast float inputs to it)."""
        return DType.F32 if self is FftKind.RFFT else DType.C64

    @property
    def out_dtype(self) -> DType:
        """The dtype of the transform's output."""
        return DType.F32 if self is FftKind.IRFFT else DType.C64


class FftNorm(enum.Enum):
    """Scaling as ``numpy.fft``'s ``norm``: backward puts 1/n on the inverse, forward on
    the forward transform, ortho 1/sqrt(n) on both."""

    BACKWARD = "backward"
    ORTHO = "ortho"
    FORWARD = "forward"


_NP_FNS = {
    FftKind.FFT: np.fft.fft,
    FftKind.IFFT: np.fft.ifft,
    FftKind.RFFT: np.fft.rfft,
    FftKind.IRFFT: np.fft.irfft,
}


@register
class Fft(Op):
    """One 1-D transform ``fn`` along ``axis``; ``n`` is the transform length (None: the
    input length, or ``2*(m-1)`` for IRFFT)."""

    mnemonic: ClassVar[str] = "fft"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    fn: FftKind
    norm: FftNorm = FftNorm.BACKWARD
    n: int | None = None
    axis: int = -1

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (x,) = ins
        want = self.fn.in_dtype
        expect(x.dtype is want, self, f"{self.fn.value} needs a {want} input, got {x}")
        expect(x.rank >= 1, self, f"{self.fn.value} of a scalar {x}")
        expect(
            self.n is None or (isinstance(self.n, int) and self.n >= 1),
            self,
            f"n must be None or an int >= 1, got {self.n!r}",
        )
        expect(
            -x.rank <= self.axis < x.rank,
            self,
            f"axis {self.axis} is out of range for {x}",
        )
        ax = self.axis % x.rank
        d = x.dims[ax]
        out: Dim
        if self.fn in (FftKind.FFT, FftKind.IFFT):
            out = d if self.n is None else self.n
        elif self.fn is FftKind.RFFT:
            n = self.n if self.n is not None else d
            expect(
                isinstance(n, int),
                self,
                f"rfft of symbolic length {d} (axis {ax} of {x}) needs an explicit n",
            )
            out = n // 2 + 1  # type: ignore[operator]
        else:
            if self.n is None:
                expect(
                    isinstance(d, int) and d >= 2,
                    self,
                    f"irfft of {x} along axis {ax} needs n (default 2*(m-1) needs a static "
                    f"m >= 2, got m={d})",
                )
            out = self.n if self.n is not None else 2 * (d - 1)  # type: ignore[operator]
        dims = list(x.dims)
        dims[ax] = out
        return Shape(dims, self.fn.out_dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x = xs[0].astype(np.complex128 if self.fn.in_dtype.is_complex else np.float64)
        y = _NP_FNS[self.fn](x, n=self.n, axis=self.axis, norm=self.norm.value)
        return y.astype(ctx.out_dtype)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        # the adjoint (for the real inner product Re<u, v>) of each transform is its
        # inverse with the dual norm; rfft / irfft also weight the bins a half spectrum
        # stands for twice (every bin but DC and Nyquist)
        (x,) = node.inputs
        ax = self.axis % node.shape.rank
        d, dual = g.shape(x).dims[ax], _DUAL[self.norm]
        if self.fn in (FftKind.FFT, FftKind.IFFT):
            inv = FftKind.IFFT if self.fn is FftKind.FFT else FftKind.FFT
            return (_resize(g, g.apply(Fft(inv, dual, None, ax), [ct]), ax, d),)
        if self.fn is FftKind.RFFT:
            n = self.n if self.n is not None else d
            ct = g.mul(ct, _bins(g, node.shape.rank, ax, n, 0.5))
            return (_resize(g, g.apply(Fft(FftKind.IRFFT, dual, n, ax), [ct]), ax, d),)
        n = node.shape.dims[ax]
        gz = g.apply(Fft(FftKind.RFFT, dual, n, ax), [ct])
        return (_resize(g, g.mul(gz, _bins(g, node.shape.rank, ax, n, 2.0)), ax, d),)

    def jvp(self, g: Graph, node: Node, tangents: tuple) -> NodeId | None:
        t = tangents[0]  # every transform is linear (over the reals)
        return None if t is None else g.apply(self, [t])

    def batch(self, g: Graph, node: Node, ins: tuple, bdims: tuple) -> tuple[NodeId, int]:
        x, bd = ins[0], bdims[0]
        ax = self.axis % node.shape.rank
        return g.apply(Fft(self.fn, self.norm, self.n, ax + (ax >= bd)), [x]), bd

    def __str__(self) -> str:
        parts = [f"norm={self.norm.value}", f"axis={self.axis}"]
        if self.n is not None:
            parts.insert(0, f"n={self.n}")
        return f"{self.fn.value}[{', '.join(parts)}]"


_DUAL = {
    FftNorm.BACKWARD: FftNorm.FORWARD,
    FftNorm.FORWARD: FftNorm.BACKWARD,
    FftNorm.ORTHO: FftNorm.ORTHO,
}


def _bins(g: Graph, rank: int, ax: int, n: int, w: float) -> NodeId:
    """A c64 weight for the ``n//2 + 1`` bins of a length-``n`` real transform along
    ``ax``: ``w`` on every bin but DC and Nyquist, 1 on those."""
    v = np.ones(n // 2 + 1, np.complex64)
    v[1 : (n - 1) // 2 + 1] = w
    return g.constant(v.reshape(-1, *(1,) * (rank - 1 - ax)))


def _resize(g: Graph, x: NodeId, ax: int, d: Dim) -> NodeId:
    """``x`` cropped or zero-padded along ``ax`` to length ``d`` (the adjoint of the
    transform's own crop / pad to ``n``)."""
    have = g.shape(x).dims[ax]
    if have == d:
        return x
    if not (isinstance(have, int) and isinstance(d, int)):
        raise ShapeError(f"fft: cannot resize axis {ax} from {have} to symbolic {d}")
    if have > d:
        return g.narrow(x, ax, 0, d)
    pads = [(0, 0)] * g.shape(x).rank
    pads[ax] = (0, d - have)
    return g.pad(x, pads)


# ---- builder conveniences ---------------------------------------------------------


def _fft(g: Graph, fn: FftKind, x: NodeId, n: int | None, axis: int, norm: FftNorm | str) -> NodeId:
    s = g.node(x).shape
    if s.rank == 0:
        raise ShapeError(f"{fn.value}: input %{x} is a scalar {s}", loc=source.capture())
    if not -s.rank <= axis < s.rank:
        raise ShapeError(
            f"{fn.value}: axis {axis} is out of range for %{x} {s}", loc=source.capture()
        )
    want = fn.in_dtype
    if s.dtype is not want:
        ok = s.dtype.is_float or (want.is_complex and s.dtype.is_complex)
        if not ok:
            raise ShapeError(
                f"{fn.value}: needs a float or complex input, got %{x} {s}", loc=source.capture()
            )
        x = g.apply(Cast(want), [x])
    if isinstance(norm, FftNorm):
        nm = norm
    else:
        try:
            nm = FftNorm(norm)
        except ValueError:
            raise ShapeError(
                f"{fn.value}: norm must be one of {[m.value for m in FftNorm]}, got {norm!r}",
                loc=source.capture(),
            ) from None
    return g.apply(Fft(fn, nm, n, axis % s.rank), [x])


def _builder(kind: FftKind, doc: str) -> Callable[..., NodeId]:
    """The ``g.<kind>(x, n=None, axis=-1, norm="backward")`` builder for one transform."""

    def build(
        g: Graph,
        x: NodeId,
        n: int | None = None,
        axis: int = -1,
        norm: FftNorm | str = FftNorm.BACKWARD,
    ) -> NodeId:
        return _fft(g, kind, x, n, axis, norm)

    build.__name__ = build.__qualname__ = kind.value
    build.__doc__ = doc
    return graph_method(build)


fft = _builder(FftKind.FFT, "Complex FFT along ``axis`` (real inputs are cast to c64).")
ifft = _builder(FftKind.IFFT, "Inverse complex FFT along ``axis`` (real inputs are cast to c64).")
rfft = _builder(
    FftKind.RFFT, "Real FFT: f32 ``[..., n]`` -> c64 ``[..., n//2+1]`` (other floats cast to f32)."
)
irfft = _builder(
    FftKind.IRFFT,
    "Inverse real FFT: c64 ``[..., m]`` -> f32 ``[..., n]`` (default ``n = 2*(m-1)``).",
)
