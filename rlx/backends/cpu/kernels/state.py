"""CPU kernel of ``assign`` (``rlx/ops/state.py``): copy the value into the param's
private storage through :meth:`~rlx.backends.cpu.memory.ParamStore.write` (in place, no
reallocation; the store's ``version`` moves, so the next run recomputes param-derived
values and repacks packed weights before it starts). The executor schedules it after every
other node (``Op.effect``). ``barrier`` is a view and has no kernel.
"""

from __future__ import annotations

import numpy as np

from rlx.backends.cpu.kernels import Kernel, KernelCtx, kernel
from rlx.errors import CompileError
from rlx.ir.mir import Node
from rlx.ops.core import Param
from rlx.ops.state import Assign

__all__ = ["assign_kernel"]


@kernel(Assign)
def assign_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """``param <- value`` in the store; the token output holds no bytes."""
    src = ctx.graph.nodes[node.inputs[0]]
    if not isinstance(src.op, Param):
        raise CompileError(
            f"assign %{node.id}: its target must be a param, got %{src.id} {src.op.mnemonic} "
            "(a pass rewrote the target?)"
        )
    store = ctx.store
    if store is None:
        raise CompileError(f"assign %{node.id}: runs only in an executor with a param store")
    name = src.op.name
    value = ins[1]

    def run() -> None:
        store.write(name, value)

    return run
