"""Weights derived as rarely as their inputs allow (packed for a GEMM, decoded from a
quantized layout). In: the node's weight view(s) and a ``derive`` function. Out: a getter
of the derived value.

``packed_weight`` (the int8 GEMMs of ``kernels/qmatmul.py`` and ``kernels/qconv.py``):
derived at compile time when the weight is a Constant, in a prologue step once per param
change when it changes only with the params (``KernelCtx.stable``), otherwise at the first
run and again only when its bytes change; constant and param-only values are kept once
per compiled graph (``KernelCtx.keep``). ``WeightCache`` (the decoded DequantMatMul weight
of ``kernels/quant.py``): derived at once for constant inputs, else again whenever the
input bytes changed since the last derivation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlx.backends.cpu.dispatch import KernelCtx
from rlx.ir.mir import Node
from rlx.ops.core import Constant

__all__ = ["packed_weight", "WeightCache"]


def packed_weight(
    ctx: KernelCtx, node: Node, i: int, w: np.ndarray, derive: Callable[[np.ndarray], object]
) -> Callable[[], object]:
    """A getter of ``derive(w)`` for input ``i`` of ``node``, derived as rarely as the
    input allows (see the module docstring). Constant and param-only weights are kept once
    per compiled graph (``KernelCtx.keep``), shared by the schedules of every shape."""
    src = ctx.graph.nodes[node.inputs[i]]
    isa = getattr(getattr(derive, "__self__", None), "isa", None)
    key = ("qgemm.pack", node.id, node.inputs[i], w.shape, getattr(derive, "__qualname__", ""), isa)
    if isinstance(src.op, Constant):
        value = ctx.keep(key, lambda: derive(w))
        return lambda: value
    if node.inputs[i] in ctx.stable:
        box: list[object] = ctx.keep(key, lambda: [None])

        def prep() -> None:
            box[0] = derive(w)

        ctx.prologue_once(key, prep)
        return lambda: box[0]
    seen: list[np.ndarray | None] = [None]
    box2: list[object] = [None]

    def get() -> object:
        if seen[0] is None or not np.array_equal(seen[0], w):
            box2[0] = derive(w)
            seen[0] = w.copy()
        return box2[0]

    return get


class WeightCache:
    """A value derived from some input arrays (a packed or decoded weight), rebuilt only
    when those inputs change. Constant inputs (already in the arena when the kernels are
    built) are derived right away, at compile time, and never re-checked."""

    def __init__(self, ins: list[np.ndarray], constant: bool, derive: Callable[..., Any]):
        self.ins = ins
        self.constant = constant
        self.derive = derive
        self.value: Any = None
        self.seen: list[np.ndarray] | None = None
        if constant:
            self.value = derive(*ins)

    def get(self) -> Any:
        if self.value is not None and (
            self.constant or all(np.array_equal(a, b) for a, b in zip(self.ins, self.seen or []))
        ):
            return self.value
        self.value = self.derive(*self.ins)
        if not self.constant:
            self.seen = [a.copy() for a in self.ins]
        return self.value
