"""CPU kernels of the 2-D spatial ops (``rlx/ops/spatial.py``). In: a ResizeNearest2x or
AxialRope2d node and its arena views. Out: a closure writing into the output view.

* resize: one broadcasting ``np.copyto`` of ``x[..., H, 1, W, 1]`` into the output seen
  as ``[..., H, 2, W, 2]`` (any dtype).
* axial rope: the cos / sin tables are made once at schedule-build time
  (:func:`rlx.ops.spatial.axial_tables`), then six ufuncs per half of each head write the
  rotated pairs into ``out`` through one scratch (:func:`rlx.ops.spatial.rotate_into`,
  the reference's arithmetic); f16 / bf16 / fp8 computed in f32 scratch (``lowp``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, lowp
from rlx.ops.spatial import AxialRope2d, ResizeNearest2x, axial_tables, rotate_into

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["resize_kernel", "axial_rope_kernel"]


def resize_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """``out[..., i, a, j, b] = x[..., i, j]`` for ``a, b`` in ``{0, 1}``."""
    (x,) = ins
    *lead, h, w = x.shape
    src = x.reshape(*lead, h, 1, w, 1)
    dst = out.reshape(*lead, h, 2, w, 2)

    def resize_nearest_2x() -> None:
        np.copyto(dst, src)

    return resize_nearest_2x


@lowp
def axial_rope_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """The rotation with tables made now, into ``out``."""
    (x,) = ins
    op: AxialRope2d = node.op  # type: ignore[assignment]
    cos, sin = axial_tables(op, x.dtype)
    heads = x.shape[-1] // op.head_dim
    tmp = ctx.scratch((*x.shape[:-1], heads, op.head_dim // 4), x.dtype, 80)

    def axial_rope_2d() -> None:
        rotate_into(op, x, cos, sin, out, tmp)

    return axial_rope_2d


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    ResizeNearest2x: (resize_kernel,),
    AxialRope2d: (axial_rope_kernel,),
}
