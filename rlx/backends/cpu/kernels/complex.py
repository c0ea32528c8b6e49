"""CPU kernels of the complex elementwise ops (``rlx/ops/complex.py``). In: a Conjugate,
ComplexNormSq or ComplexNormSqBackward node and its arena views. Out: a closure writing
the result into the output view with NumPy ufuncs (``out=``): ``np.conjugate``; ``re*re
+ im*im`` through one scratch of the parts (:func:`rlx.ops.complex.norm_sq`, the
reference's arithmetic, so the two agree bit for bit); ``(2 * ct) * z`` through one
scratch. f16 / bf16 / fp8 operands are computed in f32 scratch and rounded once
(``lowp``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, lowp
from rlx.ops.complex import ComplexNormSq, ComplexNormSqBackward, Conjugate, norm_sq

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["conjugate_kernel", "norm_sq_kernel", "norm_sq_backward_kernel"]


@lowp
def conjugate_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """``np.conjugate(z, out=out)``."""
    (z,) = ins

    def conjugate() -> None:
        np.conjugate(z, out=out)

    return conjugate


@lowp
def norm_sq_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """``re*re + im*im`` (``z*z`` for reals) into ``out``."""
    (z,) = ins
    tmp = ctx.scratch(out.shape, out.dtype, 70) if z.dtype.kind == "c" else None

    def complex_norm_sq() -> None:
        norm_sq(z, out, tmp)

    return complex_norm_sq


@lowp
def norm_sq_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """``(2 * ct) * z`` into ``out``."""
    ct, z = ins
    twice = ctx.scratch(ct.shape, ct.dtype, 71)
    two = ct.dtype.type(2)

    def complex_norm_sq_backward() -> None:
        np.multiply(ct, two, out=twice)
        np.multiply(twice, z, out=out)

    return complex_norm_sq_backward


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Conjugate: (conjugate_kernel,),
    ComplexNormSq: (norm_sq_kernel,),
    ComplexNormSqBackward: (norm_sq_backward_kernel,),
}
