"""CPU kernel for ``gather_backward`` (rlx/ops/grad_util.py), the adjoint of gather: the
output is zeroed and the cotangent's slices added at the indices (``np.add.at``), with
no zeros operand to materialize or copy. f16/bf16 are accumulated in f32 scratch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, lowp
from rlx.ops.grad_util import GatherBackward

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["gather_backward_kernel"]


@lowp
def gather_backward_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``out[...] = 0`` then ``np.add.at(out, idx, ct)`` along the axis. An out-of-range
    index re-runs the reference, which raises the InputError naming it."""
    ct, idx = ins
    if out.dtype.kind not in "fc" or idx.dtype.kind not in "iu":
        return None
    if np.may_share_memory(out, ct) or np.may_share_memory(out, idx):
        return None
    op = node.op
    where = (slice(None),) * op.axis + (idx,)  # type: ignore[attr-defined]
    rctx = ctx.ref_ctx(out)

    def run() -> None:
        out.fill(0)
        try:
            np.add.at(out, where, ct)
        except IndexError:
            op.reference([ct, idx], rctx)
            raise

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    GatherBackward: (gather_backward_kernel,),
}
