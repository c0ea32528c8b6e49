"""CPU kernel of ``assign`` (``rlx/ops/state.py``): copy the value into the param's
private storage through :meth:`~rlx.backends.cpu.memory.ParamStore.write` (in place, no
reallocation; the store's ``version`` moves, so the next run recomputes param-derived
values and repacks packed weights before it starts). The executor schedules it after every
other node (``Op.effect``). ``barrier`` is a view and has no kernel.

``adam_update``: the new ``p, m, v`` are written into the three params' private storage
(made once if a param was read from the caller's array) in one pass by
``csrc/adam_update.c`` (f32 / f64, OpenMP over static chunks from 32K elements), or by
:func:`~rlx.ops.state.adam_formula` in NumPy (other dtypes, native kernels off); the
store's ``version`` moves like ``assign``'s. The step's scalars come from the ``lr`` and
``step`` inputs at each run (``adam_scalars``: f64, rounded once to the param's dtype).
"""

from __future__ import annotations

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind
from rlx.backends.cpu.native import bindings
from rlx.backends.cpu.native.cpu import selected_target
from rlx.errors import CompileError
from rlx.ir.mir import Node
from rlx.ops.core import Param
from rlx.ops.state import AdamUpdate, Assign, adam_formula, adam_scalars

__all__ = ["assign_kernel", "adam_update_kernel"]


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


#: below this many elements the native update runs on one thread
_PARALLEL_MIN = 1 << 15


def _native_adam(dtype: np.dtype, ctx: KernelCtx):  # noqa: ANN202 - a ctypes function or None
    if dtype not in (np.float32, np.float64):
        return None
    lib = bindings.lib_or_note(
        ctx,
        "adam_update",
        lambda: bindings.csrc_library(("adam_update.c",), selected_target(), "adam_update"),
    )
    if lib is None:
        return None
    return lib.rlx_adam_update_f32 if dtype == np.float32 else lib.rlx_adam_update_f64


def adam_update_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel:
    """``p, m, v`` <- one Adam / AdamW step, in place in the store; the token holds no
    bytes."""
    names = []
    for i in (0, 2, 3):
        src = ctx.graph.nodes[node.inputs[i]]
        if not isinstance(src.op, Param):
            raise CompileError(
                f"adam_update %{node.id}: input {i} must be a param, got %{src.id} "
                f"{src.op.mnemonic} (a pass rewrote the target?)"
            )
        names.append(src.op.name)
    store = ctx.store
    if store is None:
        raise CompileError(f"adam_update %{node.id}: runs only in an executor with a param store")
    op: AdamUpdate = node.op  # type: ignore[assignment]
    grad, lr_in, step_in = ins[1], ins[4], ins[5]
    dtype = grad.dtype
    fn = _native_adam(dtype, ctx)
    n = grad.size
    threads = ctx.num_threads if n >= _PARALLEL_MIN else 1
    if fn is not None:
        ctx.kind = KernelKind.NATIVE

    def run() -> None:
        own = []
        for name in names:
            arr = store.private(name)
            if arr is None or not arr.flags.c_contiguous:
                store.write(name, np.array(store.params[name]))
                arr = store.private(name)
            own.append(arr)
        p, m, v = own
        g = np.ascontiguousarray(grad)
        lr, step = float(lr_in), float(step_in)
        if fn is not None and g.size == p.size:
            sc = adam_scalars(op, lr, step, np.dtype(dtype))
            fn(
                p.ctypes.data,
                g.ctypes.data,
                m.ctypes.data,
                v.ctypes.data,
                n,
                *sc,
                int(op.decoupled),
                threads,
            )
        else:
            new = adam_formula(op, p, g.reshape(p.shape), m, v, lr, step)
            for dst, val in zip((p, m, v), new):
                np.copyto(dst, val, casting="unsafe")
        store.version += 1

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    Assign: (assign_kernel,),
    AdamUpdate: (adam_update_kernel,),
}
