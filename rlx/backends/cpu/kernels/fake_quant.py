"""CPU kernel of ``fake_quantize_lsq`` (fake quantization with the scale as an input, see
:mod:`rlx.ops.fake_quant`): the scale clamped into a scratch, then the steps of
``fake_quantize`` (``kernels/quant.py``: ``fake_quantize_into``), NumPy calls writing into
build-time scratch and the output view."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx
from rlx.backends.cpu.kernels.quant import fake_quantize_into
from rlx.ops.fake_quant import SCALE_EPS, FakeQuantizeLSQ

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["fake_quantize_lsq_kernel"]


def fake_quantize_lsq_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``(clip(rint(x / s) + z, qmin, qmax) - z) * s`` with ``s = max(scale, eps)`` read
    from the scale input at run time, in f32 (f64 for f64 inputs)."""
    x, scale = ins
    op: FakeQuantizeLSQ = node.op  # type: ignore[assignment]
    ct = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    ax = None if op.axis is None else op.axis % x.ndim
    cs: tuple[int, ...] = (1,) * x.ndim
    if ax is not None:
        cs = tuple(len(op.zero_points) if i == ax else 1 for i in range(x.ndim))
    z = np.asarray(op.zero_points, dtype=np.int64).reshape(cs)
    s = ctx.scratch(cs, ct, 63)
    eps = ct.type(SCALE_EPS)
    step = fake_quantize_into(x, s, z, op.qmin, op.qmax, out, ctx)

    def run() -> None:
        np.copyto(s, scale.reshape(cs), casting="unsafe")
        np.maximum(s, eps, out=s)
        step()

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    FakeQuantizeLSQ: (fake_quantize_lsq_kernel,),
}
