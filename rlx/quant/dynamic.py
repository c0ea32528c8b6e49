"""Dynamic activation quantization lowering. In: a float graph, its params and the
matmuls to lower (node id -> :class:`~rlx.ops.qmatmul.ActQuant`). Out: the graph where
each of them is a ``dynamic_qmatmul``: the activation is quantized per row (per token) at
run time inside the integer GEMM, the weight is quantized now to an i8 constant with
symmetric per-output-channel scales (``quantize_weight``). No calibration is needed.

Only the matmul is replaced: the bias add, activation and residual add that follow are
folded into the op's epilogue by the compile pipeline (``fuse_quant_epilogue``). The names
of the weight params whose values became i8 constants are in ``folded`` (drop them with
``rlx.quant.lower.drop_params`` once nothing reads them).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rlx.dtype import DType
from rlx.errors import QuantizationError
from rlx.ir.mir import Graph, NodeId
from rlx.ops.core import Constant, ConstValue, Param
from rlx.ops.linalg import MatMul
from rlx.ops.qmatmul import ActQuant, DynamicQMatMul
from rlx.passes.base import Rewriter
from rlx.quant.lower import LoweringDecision, quantize_weight
from rlx.shape import Shape

__all__ = ["DynamicLowering"]


class DynamicLowering:
    """Pass: the matmuls in ``nodes`` (ids of the input graph) -> ``dynamic_qmatmul``.
    ``map`` holds old id -> new id after :meth:`run` (for passes that follow);
    ``decisions`` says what happened to each requested matmul."""

    name = "dynamic_quant_lowering"

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        nodes: Mapping[NodeId, ActQuant | str],
        per_channel: bool = True,
        reduce_range: bool = False,
    ):
        self.params = dict(params)
        self.nodes = {int(k): ActQuant.parse(v) for k, v in nodes.items()}
        self.per_channel = per_channel
        self.reduce_range = reduce_range  # weights to [-64, 64] (7 bits)
        self.map: dict[NodeId, NodeId] = {}
        self.decisions: list[LoweringDecision] = []
        self.folded: set[str] = set()

    def _weight(self, graph: Graph, nid: NodeId) -> tuple[np.ndarray, str | None] | str:
        node = graph.nodes[nid]
        if node.shape.rank != 2 or not node.shape.is_static or node.dtype is not DType.F32:
            return f"rhs %{nid} is {node.shape}, not a static 2-D f32 weight"
        if isinstance(node.op, Constant):
            return node.op.value.array().astype(np.float32), None
        if isinstance(node.op, Param) and node.op.name in self.params:
            return np.asarray(self.params[node.op.name], np.float32), node.op.name
        return f"rhs %{nid} ({node.op.mnemonic}) has no value now (give params to quantize it)"

    def run(self, graph: Graph) -> Graph:
        self.decisions = []
        rw = Rewriter(graph)
        consts: dict[NodeId, tuple[NodeId, tuple[float, ...]]] = {}
        folded: set[str] = set()
        for nid in graph.topo_order():
            node = graph.nodes[nid]
            mode = self.nodes.get(nid)
            if mode is None:
                rw.copy(node)
                continue
            if not isinstance(node.op, MatMul):
                raise QuantizationError(
                    f"dynamic lowering: node {node.label} is {node.op.mnemonic}, not a matmul"
                )
            a, b = node.inputs
            wname = graph.nodes[b].op.name if isinstance(graph.nodes[b].op, Param) else f"%{b}"  # type: ignore[attr-defined]
            got = self._weight(graph, b)
            why = got if isinstance(got, str) else None
            if why is None and (node.dtype is not DType.F32 or not graph.nodes[a].dtype.is_float):
                why = f"not an f32 matmul ({graph.nodes[a].shape} @ {graph.nodes[b].shape})"
            if why is not None:
                self.decisions.append(LoweringDecision(nid, wname, False, why))
                rw.copy(node)
                continue
            assert not isinstance(got, str)
            w, pname = got
            if b not in consts:
                wq, scales = quantize_weight(w, self.per_channel, reduce_range=self.reduce_range)
                cv = ConstValue.of(wq, DType.I8)
                cid = rw.emit(Constant(cv), [], graph.nodes[b].loc, Shape(cv.dims, DType.I8))
                consts[b] = (cid, scales)
            cid, scales = consts[b]
            if pname is not None:
                folded.add(pname)
            op = DynamicQMatMul(scales, False, None, False, mode)
            rw.map[nid] = rw.emit(op, [rw.map[a], cid], node.loc)
            chan = "per-channel" if len(scales) > 1 else "per-tensor"
            self.decisions.append(
                LoweringDecision(nid, wname, True, f"dynamic {mode.value} rows, {chan} weight")
            )
        self.map = dict(rw.map)
        self.folded = folded
        return rw.finish()
