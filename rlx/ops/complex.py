"""Complex elementwise ops: the conjugate, the squared magnitude and its backward op.

rlx's complex values are the ``c64`` dtype (``rlx/ops/fft.py``: ``rfft`` gives c64 bins).

* :class:`Conjugate` ``z -> conj(z)`` (a real input is returned as it is).
* :class:`ComplexNormSq` ``z -> |z|^2 = re(z)^2 + im(z)^2``: c64 -> f32 (the power
  spectrum of an ``rfft``); a real input gives ``x * x`` in its own dtype.
* :class:`ComplexNormSqBackward` ``(ct, z) -> 2 * ct * z``: the vjp of ``|z|^2`` (``ct``
  real, of ``z``'s dims and real dtype).

Derivatives follow rlx's convention for complex values (docs/autodiff.md): reverse mode
is the adjoint for the real inner product ``Re <u, v>``, so the gradient of the real
``|z|^2`` is ``2 z`` (what PyTorch's autograd gives), conj's vjp is conj, and the
backward op's own vjp is ``(2 Re(conj(w) z), 2 ct w)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.ops.axis_batch import align_batch, batch_same
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.elementwise import _wide
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["Conjugate", "ComplexNormSq", "ComplexNormSqBackward", "real_dtype", "norm_sq"]


def real_dtype(dt: DType) -> DType:
    """The dtype of the parts of ``dt``: f32 for c64, ``dt`` itself for a real dtype."""
    return DType.F32 if dt.is_complex else dt


def _number(op: Op, x: Shape, what: str = "input") -> None:
    expect(
        x.dtype.is_complex or x.dtype.is_float,
        op,
        f"needs a complex (c64) or float {what}, got {x}",
    )


def norm_sq(z: np.ndarray, out: np.ndarray | None = None, tmp: np.ndarray | None = None):
    """``re*re + im*im`` (complex) or ``z*z`` (real), in ``z``'s part dtype: the
    reference's arithmetic, which the CPU kernel repeats into its output view."""
    if z.dtype.kind != "c":
        return np.multiply(z, z, out=out)
    out = np.multiply(z.real, z.real, out=out)
    tmp = np.multiply(z.imag, z.imag, out=tmp)
    return np.add(out, tmp, out=out)


def _re_dot(g: Graph, a: NodeId, b: NodeId) -> NodeId:
    """``Re(conj(a) * b)``: the real inner product's terms (``a * b`` for reals)."""
    if not g.shape(a).dtype.is_complex and not g.shape(b).dtype.is_complex:
        return g.mul(a, b)
    return g.cast(g.mul(g.conjugate(a), b), DType.F32)


@register
class Conjugate(Op):
    """``z -> conj(z)`` elementwise: the imaginary part negated; a float input is
    returned unchanged."""

    mnemonic: ClassVar[str] = "conjugate"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (z,) = ins
        _number(self, z)
        return z

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return np.conjugate(_wide(xs[0]))

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return (g.apply(self, [ct]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        t = tangents[0]
        return None if t is None else g.apply(self, [t])

    batch = batch_same


@register
class ComplexNormSq(Op):
    """``z -> re(z)^2 + im(z)^2`` elementwise: c64 -> f32 (a float input: ``x * x``)."""

    mnemonic: ClassVar[str] = "complex_norm_sq"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        (z,) = ins
        _number(self, z)
        return z.with_dtype(real_dtype(z.dtype))

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return norm_sq(_wide(xs[0]))

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return (g.apply(ComplexNormSqBackward(), [ct, node.inputs[0]]),)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        t = tangents[0]  # d|z|^2 = 2 Re(conj(z) t)
        return None if t is None else g.mul(_re_dot(g, node.inputs[0], t), 2.0)

    batch = batch_same


@register
class ComplexNormSqBackward(Op):
    """``(ct, z) -> 2 * ct * z``: the cotangent of ``z`` from the cotangent ``ct`` of
    ``|z|^2`` (``ct`` of ``z``'s dims and part dtype: f32 for c64); ``z``'s dtype."""

    mnemonic: ClassVar[str] = "complex_norm_sq_backward"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.ELEMENTWISE

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        ct, z = ins
        _number(self, z, "z")
        want = real_dtype(z.dtype)
        expect(
            ct.dims == z.dims and ct.dtype is want,
            self,
            f"the cotangent {ct} must have z's dims {list(z.dims)} and dtype {want.value}",
        )
        return z

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        ct, z = _wide(xs[0]), _wide(xs[1])
        return np.multiply(ct * ct.dtype.type(2), z)

    # out = 2 ct z: Re<w, d out> = 2 dct Re(conj(w) z) + Re(conj(2 ct w) dz)
    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        c, z = node.inputs
        return g.mul(_re_dot(g, ct, z), 2.0), g.apply(self, [c, ct])

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.rules import add_any

        c, z = node.inputs
        tc, tz = tangents
        return add_any(
            g,
            [
                None if tc is None else g.apply(self, [tc, z]),
                None if tz is None else g.apply(self, [c, tz]),
            ],
        )

    def batch(
        self, g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
    ) -> tuple[NodeId, int | None]:
        xs, bd = align_batch(g, ins, bdims)
        return g.apply(self, list(xs)), bd


@graph_method
def conjugate(g: Graph, z: NodeId) -> NodeId:
    """The complex conjugate of ``z`` (``z`` itself as a value when it is real)."""
    return g.apply(Conjugate(), [z])


@graph_method
def complex_norm_sq(g: Graph, z: NodeId) -> NodeId:
    """``|z|^2`` elementwise: c64 -> f32 (``x * x`` for a float ``x``)."""
    return g.apply(ComplexNormSq(), [z])


@graph_method
def complex_norm_sq_backward(g: Graph, ct: NodeId, z: NodeId) -> NodeId:
    """``2 * ct * z``: the cotangent of ``z`` from that of ``|z|^2``."""
    return g.apply(ComplexNormSqBackward(), [ct, z])
