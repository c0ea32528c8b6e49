"""CPU kernels of the loss ops (``rlx/ops/loss.py``). In: a SoftmaxCrossEntropyWithLogits
node (``logits [..., C]``, ``labels [...]``) or a SoftmaxCrossEntropyBackward node
(``ct``, ``logits``, ``labels``) with their arena views. Out: a closure writing the
per-row loss, or the logits' cotangent, into the output view.

Row-vectorised NumPy over ``[rows, C]``: the row maximum, ``exp`` of the shifted logits
and their row sum into scratch made at schedule-build time (one tensor and two row
vectors), the loss ``log(sum) - shifted[label]`` or the cotangent ``(exp / sum -
onehot) * ct`` written into ``out``; the labels are range-checked (an InputError naming
the op) and picked with one fancy index per run. f16 / bf16 / fp8 logits are computed
in f32 scratch and rounded once (``lowp``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, lowp
from rlx.ops.loss import SoftmaxCrossEntropyBackward, SoftmaxCrossEntropyWithLogits, label_rows

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["cross_entropy_kernel", "cross_entropy_backward_kernel"]


@lowp
def cross_entropy_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """``log(sum(exp(x - max))) - (x - max)[label]`` per row, into ``out``."""
    x, labels = ins
    c = x.shape[-1]
    n = labels.size
    rows, flat = x.reshape(n, c), out.reshape(n)
    shifted = ctx.scratch((n, c), x.dtype, 60)
    top = ctx.scratch((n, 1), x.dtype, 61)
    total = ctx.scratch((n,), x.dtype, 62)
    at = np.arange(n)
    op = node.op

    def cross_entropy() -> None:
        idx = label_rows(op, labels, c)
        if n == 0:
            return
        with np.errstate(all="ignore"):
            np.max(rows, axis=1, keepdims=True, out=top)
            np.subtract(rows, top, out=shifted)
            picked = shifted[at, idx]
            np.exp(shifted, out=shifted)
            np.sum(shifted, axis=1, out=total)
            np.log(total, out=total)
            np.subtract(total, picked, out=flat)

    return cross_entropy


@lowp
def cross_entropy_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """``(exp(x - max) / sum - onehot) * ct`` per row, into ``out``."""
    ct, x, labels = ins
    c = x.shape[-1]
    n = labels.size
    rows, dst = x.reshape(n, c), out.reshape(n, c)
    col = ct.reshape(n, 1)
    top = ctx.scratch((n, 1), x.dtype, 63)
    at = np.arange(n)
    op = node.op

    def cross_entropy_backward() -> None:
        idx = label_rows(op, labels, c)
        if n == 0 or c == 0:
            return
        with np.errstate(all="ignore"):
            np.max(rows, axis=1, keepdims=True, out=top)
            np.subtract(rows, top, out=dst)
            np.exp(dst, out=dst)
            np.sum(dst, axis=1, keepdims=True, out=top)
            np.divide(dst, top, out=dst)
            dst[at, idx] -= 1
            np.multiply(dst, col, out=dst)

    return cross_entropy_backward


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    SoftmaxCrossEntropyWithLogits: (cross_entropy_kernel,),
    SoftmaxCrossEntropyBackward: (cross_entropy_backward_kernel,),
}
