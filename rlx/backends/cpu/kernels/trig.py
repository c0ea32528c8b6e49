"""CPU kernel of ``trig`` (``rlx/ops/trig.py``: tan, asin, acos, atan, sinh, cosh, asinh,
acosh, atanh): one NumPy ufunc into the output view (16-bit floats computed in f32,
rounded once)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx
from rlx.ops.trig import TRIG_FNS, Trig

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["trig_kernel"]


def trig_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    (x,) = ins
    f = TRIG_FNS[node.op.fn]  # type: ignore[attr-defined]
    if out.dtype in (np.float32, np.float64):

        def run() -> None:
            with np.errstate(all="ignore"):
                f(x, out=out)

        return run

    def run_lowp() -> None:
        with np.errstate(all="ignore"):
            np.copyto(out, f(x.astype(np.float32)), casting="unsafe")

    return run_lowp


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Trig: (trig_kernel,),
}
