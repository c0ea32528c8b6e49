"""CPU kernel of ``custom_fn`` (``rlx/ops/custom.py``: a sub-graph as one op). In: the
node and its arena views. Out: a closure running the op's ``fwd_body`` as a compiled
sub-program (``kernels/control.py``: planned once on its own arena). Custom ops a user
registers (``rlx.register_custom_op``) have no kernel: they run their reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind
from rlx.backends.cpu.kernels.control import SubProgram
from rlx.ops.custom import CustomFn

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = ["custom_fn_kernel"]


def custom_fn_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """``fwd_body`` as a compiled sub-program (``kernels.control.SubProgram``: planned
    once on its own arena with the node's symbol bindings); a run copies the operands in,
    runs the body's kernels and copies its output into ``out``."""
    sub = SubProgram(node.op.fwd_body, ctx.bindings, ctx)  # type: ignore[attr-defined]
    kinds = sub.kinds()
    ctx.notes.append(
        "fwd_body: " + (", ".join(f"{c} {k}" for k, c in sorted(kinds.items())) or "no kernels")
    )
    if kinds.get(KernelKind.REFERENCE.value):
        ctx.kind = KernelKind.REFERENCE
    result = sub.outputs[0]

    def run() -> None:
        for k, x in enumerate(ins):
            sub.feed(k, x)
        sub.run()
        np.copyto(out, result, casting="unsafe")

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    CustomFn: (custom_fn_kernel,),
}
