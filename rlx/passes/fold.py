"""Constant folding. In: a graph (and, to freeze them, parameter values). Out: an
equivalent graph where every pure node whose inputs are all constants is replaced by a
Constant holding its value, computed with the op's NumPy reference.

With ``params`` given (``CompileOptions.freeze_params``), each Param named in ``params``
first becomes a Constant, so param-only subgraphs (a transposed weight, a folded scale)
are computed once at compile time. A node is not folded when its shape is symbolic, when
its op is impure, or when its value would be larger than ``max_growth`` elements and
larger than its largest input (an ``expand`` of a scalar stays an expand); the notes say
which and why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from rlx.errors import CompileError
from rlx.ir.mir import Graph
from rlx.ops.base import RefCtx
from rlx.ops.core import Constant, ConstValue, Param
from rlx.passes.base import Rewriter
from rlx.shape import Shape

__all__ = ["ConstantFolding"]

MAX_GROWTH = 1 << 16


def _frozen_value(name: str, value: object, shape: Shape) -> np.ndarray:
    a = np.asarray(value)
    dims = shape.concrete()
    if tuple(a.shape) != dims:
        raise CompileError(
            f"freeze_params: param {name!r} expects shape {shape}, given {tuple(a.shape)}"
        )
    want = shape.dtype.np
    if a.dtype != want:
        if not (np.can_cast(a.dtype, want, casting="same_kind") or a.dtype.kind in "iub"):
            raise CompileError(
                f"freeze_params: param {name!r} expects dtype {shape.dtype}, given {a.dtype}"
            )
        a = a.astype(want)
    return a


class ConstantFolding:
    """Evaluate constant subgraphs at compile time (and freeze given params)."""

    name = "constant_folding"

    def __init__(
        self, params: Mapping[str, np.ndarray] | None = None, max_growth: int = MAX_GROWTH
    ):
        self.params = dict(params) if params else {}
        self.max_growth = max_growth
        self.notes: list[str] = []

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        rw = Rewriter(graph)
        values: dict[int, np.ndarray] = {}  # new id -> value, for constants
        folded = frozen = 0
        skipped: list[str] = []
        for nid in graph.topo_order():
            node = graph.nodes[nid]
            op = node.op
            if isinstance(op, Param) and op.name in self.params:
                if not node.shape.is_static:
                    skipped.append(f"param {op.name!r} has symbolic shape {node.shape}")
                    rw.copy(node)
                    continue
                arr = _frozen_value(op.name, self.params[op.name], node.shape)
                new = rw.emit(Constant(ConstValue.of(arr, node.dtype)), [], node.loc, node.shape)
                rw.map[nid] = new
                values[new] = arr
                frozen += 1
                continue
            if isinstance(op, Constant):
                new = rw.copy(node)
                values[new] = op.value.array()
                continue
            ins = [rw.map[i] for i in node.inputs]
            if not node.inputs or not op.pure or not all(i in values for i in ins):
                rw.copy(node)
                continue
            if not node.shape.is_static:
                skipped.append(f"%{nid} {op.mnemonic}: symbolic shape {node.shape}")
                rw.copy(node)
                continue
            dims = node.shape.concrete()
            size = math.prod(dims)
            biggest = max(values[i].size for i in ins)
            if size > self.max_growth and size > biggest:
                skipped.append(
                    f"%{nid} {op.mnemonic}: value of {size} elements would grow the graph "
                    f"(largest input {biggest})"
                )
                rw.copy(node)
                continue
            ctx = RefCtx(dims, node.dtype.np, {}, {}, {})
            with np.errstate(all="ignore"):
                out = np.asarray(op.reference([values[i] for i in ins], ctx))
                if out.dtype != node.dtype.np:
                    out = out.astype(node.dtype.np)
            if tuple(out.shape) != dims:  # pragma: no cover - a broken reference
                raise AssertionError(f"reference of %{nid} {op} gave {out.shape}, expected {dims}")
            new = rw.emit(Constant(ConstValue.of(out, node.dtype)), [], node.loc, node.shape)
            rw.map[nid] = new
            values[new] = out
            folded += 1
        if frozen:
            self.notes.append(f"froze {frozen} params as constants")
        if folded:
            self.notes.append(f"folded {folded} nodes")
        if skipped:
            self.notes.append(
                "not folded: " + "; ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else "")
            )
        return rw.finish()
