"""Quantization lowering. In: a graph in Q/DQ canonical form (``rlx.quant.record``).
Out: the graph with every Q/DQ-bracketed matmul replaced by an integer :class:`QMatMul`
and every Q/DQ-bracketed 2-D ``conv`` by a :class:`~rlx.ops.qconv.QConv2d` (activation per
tensor, weight i8 per output channel along axis 0, the conv's bias kept as its bias).

Matched pattern (``linear`` shape: a 2-D weight ``[K, N]`` on the right)::

    matmul(dequantize(quantize(x)), W) [+ bias[N]]   ->   qmatmul(quantize(x), w_q[, bias])

* the activation side must be quantized per tensor to i8/u8 (any zero point);
* ``W`` is ``dequantize(quantize(w))`` quantized to i8 per tensor or per output channel
  (axis 1) with zero point 0, or a plain f32 weight. When the float weight is a constant
  or a param whose value was given (``params``), it is quantized now, to an i8 constant
  (symmetric, per output channel unless ``per_channel=False``); otherwise the weight's
  quantize node feeds the QMatMul and runs each time;
* a following ``add`` of a float ``[N]`` vector whose only reader is this matmul's
  result is folded in as the bias.

Every matmul is reported in ``notes`` / ``decisions``: lowered, or why not. A param whose
value was folded into an i8 constant and that nothing else reads is removed from the
graph (``drop_folded_params``), so the f32 copy takes no memory and setting it later is
an "unknown param" error rather than a silent no-op.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rlx.dtype import DType
from rlx.errors import QuantizationError
from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.core import Constant, ConstValue, Param
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind
from rlx.ops.fused import FusedMatMulBiasAct, FusedSwiGLU
from rlx.ops.linalg import MatMul
from rlx.ops.nn import Conv
from rlx.ops.qconv import QConv2d
from rlx.ops.quant import Dequantize, QMatMul, Quantize, quantize_array
from rlx.passes.base import Rewriter, use_counts
from rlx.passes.dce import DeadCodeElimination
from rlx.shape import Shape

__all__ = [
    "QuantLowering",
    "LoweringDecision",
    "ExpandFusedMatMuls",
    "quantize_weight",
    "default_reduce_range",
    "REDUCED_QMAX",
    "drop_params",
]


@dataclass(frozen=True, slots=True)
class LoweringDecision:
    """What the pass did with one matmul (``node`` is its id in the input graph)."""

    node: NodeId
    weight: str
    lowered: bool
    reason: str

    op: str = "qmatmul"

    def __str__(self) -> str:
        verb = f"lowered to {self.op}" if self.lowered else "kept in float"
        return f"%{self.node} ({self.weight}): {verb}: {self.reason}"


#: The largest weight magnitude of ``reduce_range`` (7-bit) weights: [-64, 64] is what the
#: AVX2 int8 GEMM's vpmaddubsw kernel takes exactly (``csrc/qgemm.c``), ONNX Runtime's
#: ``reduce_range`` on CPUs without VNNI.
REDUCED_QMAX = 64


def default_reduce_range() -> bool:
    """``rlx.quantize(reduce_range=None)``: True when the int8 GEMM of the selected native
    target (``RLX_ISA``) is the AVX2 one, whose vpmaddubsw kernel takes 7-bit weights
    (about 1.3x the vpmaddwd kernel 8-bit weights need). False with VNNI (vpdpbusd takes
    8-bit weights at full rate) and on the portable target (plain C: no gain, only the
    accuracy cost)."""
    from rlx.backends.cpu.native.cpu import Isa, detect_isa

    return detect_isa() is Isa.AVX2


def quantize_weight(
    w: np.ndarray, per_channel: bool = True, axis: int = 1, reduce_range: bool = False
) -> tuple[np.ndarray, tuple[float, ...]]:
    """Symmetric i8 quantization of a float weight to [-127, 127] (``reduce_range``: to
    [-64, 64], :data:`REDUCED_QMAX`); per output channel (one scale per index of ``axis``:
    1 for a matmul weight [K, N], 0 for a conv weight [O, C, kH, kW]) or per tensor.
    Returns (w_q, scales).
    QuantizationError when ``w`` holds NaN or Inf (it has no int8 value)."""
    w = np.asarray(w, dtype=np.float32)
    if not np.isfinite(w).all():
        bad = np.argwhere(~np.isfinite(w))
        raise QuantizationError(
            f"cannot quantize a weight with {len(bad)} non-finite value(s) "
            f"(first at index {tuple(int(i) for i in bad[0])}: {w[tuple(bad[0])]})"
        )
    other = tuple(d for d in range(w.ndim) if d != axis)
    amax = np.abs(w).max(axis=other) if per_channel else np.abs(w).max(keepdims=True)
    amax = np.asarray(amax, dtype=np.float32).reshape(-1)
    qmax = REDUCED_QMAX if reduce_range else 127
    scales = np.where(amax > 0, amax / np.float32(qmax), np.float32(1.0)).astype(np.float32)
    q = quantize_array(
        w, scales.tolist(), [0] * scales.size, axis if per_channel else None, -qmax, qmax
    )
    return q.astype(np.int8), tuple(float(s) for s in scales)


def _same_qparams(q: Quantize, dq: Dequantize) -> bool:
    """``q`` and ``dq`` use the same axis, scales and zero points."""
    return (q.axis, q.scales, q.zero_points) == (dq.axis, dq.scales, dq.zero_points)


def _param_name(node: Node) -> str | None:
    return node.op.name if isinstance(node.op, Param) else None  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class _Plan:
    mm: NodeId
    q_act: NodeId  # the activation's quantize node (old id)
    w_src: NodeId  # old id: the float weight, or the weight's quantize node
    w_value: np.ndarray | None  # quantized i8 weight when known now
    w_scales: tuple[float, ...]
    folded: str | None  # name of the param whose value became the i8 constant
    bias: NodeId | None
    add: NodeId | None


@dataclass(frozen=True, slots=True)
class _ConvPlan:
    q_act: NodeId
    w_value: np.ndarray
    w_scales: tuple[float, ...]
    folded: str | None


class QuantLowering:
    """Pass: Q/DQ-bracketed matmuls -> :class:`QMatMul`, conv2d -> :class:`QConv2d` (see
    the module docstring)."""

    name = "quant_lowering"

    def __init__(
        self,
        params: Mapping[str, np.ndarray] | None = None,
        per_channel: bool = True,
        drop_folded_params: bool = True,
        reduce_range: bool = False,
    ):
        self.params = dict(params or {})
        self.per_channel = per_channel
        self.reduce_range = reduce_range  # weights without Q/DQ quantized to [-64, 64]
        self.drop_folded_params = drop_folded_params
        self.notes: list[str] = []
        self.decisions: list[LoweringDecision] = []

    # ---- matching ---------------------------------------------------------------

    def _weight_name(self, g: Graph, nid: NodeId) -> str:
        node = g.nodes[nid]
        for _ in range(3):
            if isinstance(node.op, Param):
                return node.op.name
            if not node.inputs:
                break
            node = g.nodes[node.inputs[0]]
        return f"%{nid}"

    def _float_value(self, node: Node) -> np.ndarray | None:
        if isinstance(node.op, Constant):
            return node.op.value.array()
        if isinstance(node.op, Param) and node.op.name in self.params:
            return np.asarray(self.params[node.op.name], dtype=np.float32)
        return None

    def _match_act(self, g: Graph, nid: NodeId) -> NodeId | str:
        dq = g.nodes[nid]
        if not isinstance(dq.op, Dequantize):
            return f"lhs %{nid} is {dq.op.mnemonic}, not dequantize(quantize(x))"
        q = g.nodes[dq.inputs[0]]
        if not isinstance(q.op, Quantize):
            return f"lhs dequantize %{nid} reads {q.op.mnemonic}, not quantize"
        if not _same_qparams(q.op, dq.op):
            return f"lhs quantize %{q.id} and dequantize %{nid} disagree on their parameters"
        if q.op.axis is not None:
            return f"lhs %{q.id} is quantized per channel; qmatmul needs a per-tensor activation"
        if q.op.dtype not in (DType.I8, DType.U8):
            return f"lhs %{q.id} is quantized to {q.op.dtype}; qmatmul needs i8 or u8"
        return q.id

    def _match_weight(
        self, g: Graph, nid: NodeId
    ) -> tuple[NodeId, np.ndarray | None, tuple[float, ...], str | None] | str:
        node = g.nodes[nid]
        if node.shape.rank != 2 or not node.shape.is_static:
            return f"rhs %{nid} is {node.shape}, not a static 2-D weight [K, N]"
        if isinstance(node.op, Dequantize):
            q = g.nodes[node.inputs[0]]
            if not isinstance(q.op, Quantize) or q.op.dtype is not DType.I8:
                return f"rhs dequantize %{nid} does not read an i8 quantize"
            if not _same_qparams(q.op, node.op):
                return f"rhs quantize %{q.id} and dequantize %{nid} disagree on their parameters"
            axis = None if q.op.axis is None else q.op.axis % 2
            if axis == 0:
                return "weight quantized per input channel (axis 0): its scale cannot be factored out of the sum"
            if any(q.op.zero_points):
                return "weight has a non-zero zero point; qmatmul needs symmetric weights"
            src = g.nodes[q.inputs[0]]
            w = self._float_value(src)
            if w is None:
                return (q.id, None, q.op.scales, None)
            wq = quantize_array(w, q.op.scales, q.op.zero_points, axis, -128, 127).astype(np.int8)
            return (q.id, wq, q.op.scales, _param_name(src))
        if not node.dtype.is_float:
            return f"rhs %{nid} is {node.shape}, not a float weight"
        w = self._float_value(node)
        if w is None:
            return f"rhs %{nid} ({node.op.mnemonic}) has no value at compile time (give params to quantize it)"
        wq, scales = quantize_weight(w, self.per_channel, reduce_range=self.reduce_range)
        return (nid, wq, scales, _param_name(node))

    def _match_bias(
        self, g: Graph, mm: Node, uses: list[int], readers: dict[NodeId, list[NodeId]]
    ) -> tuple[NodeId, NodeId] | None:
        if uses[mm.id] != 1 or len(readers[mm.id]) != 1:
            return None
        add = g.nodes[readers[mm.id][0]]
        if not (isinstance(add.op, Binary) and add.op.fn is BinaryKind.ADD):
            return None
        other = add.inputs[1] if add.inputs[0] == mm.id else add.inputs[0]
        b = g.nodes[other]
        n = mm.shape.dims[-1]
        if (
            other == mm.id
            or b.shape.dims != (n,)
            or b.dtype is not DType.F32
            or add.shape != mm.shape
        ):
            return None
        return other, add.id

    def _match_conv(self, g: Graph, node: Node) -> _ConvPlan | str:
        """A conv2d whose input is per-tensor Q/DQ and whose weight is i8 per output
        channel (axis 0) Q/DQ or a float value known now."""
        op: Conv = node.op  # type: ignore[assignment]
        if len(op.stride) != 2:
            return f"conv of {len(op.stride)} spatial dims; qconv2d is 2-D"
        if node.dtype is not DType.F32:
            return f"conv result is {node.dtype}; qconv2d produces f32"
        act = self._match_act(g, node.inputs[0])
        if isinstance(act, str):
            return act
        wn = g.nodes[node.inputs[1]]
        if isinstance(wn.op, Dequantize):
            q = g.nodes[wn.inputs[0]]
            if not isinstance(q.op, Quantize) or q.op.dtype is not DType.I8:
                return f"weight dequantize %{wn.id} does not read an i8 quantize"
            if not _same_qparams(q.op, wn.op) or any(q.op.zero_points):
                return f"weight quantize %{q.id} is not symmetric or disagrees with %{wn.id}"
            axis = None if q.op.axis is None else q.op.axis % 4
            if axis not in (None, 0):
                return f"conv weight quantized along axis {axis}; qconv2d needs axis 0"
            src = g.nodes[q.inputs[0]]
            w = self._float_value(src)
            if w is None:
                return f"conv weight %{src.id} has no value at compile time"
            wq = quantize_array(w, q.op.scales, q.op.zero_points, axis, -128, 127)
            return _ConvPlan(act, wq.astype(np.int8), q.op.scales, _param_name(src))
        w = self._float_value(wn)
        if w is None or not wn.dtype.is_float:
            return f"conv weight %{wn.id} has no float value at compile time"
        wq, scales = quantize_weight(w, self.per_channel, 0, self.reduce_range)
        return _ConvPlan(act, wq, scales, _param_name(wn))

    # ---- rewriting --------------------------------------------------------------

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        self.decisions = []
        uses = use_counts(graph)
        readers = graph.consumers()
        plans: dict[NodeId, _Plan] = {}
        convs: dict[NodeId, _ConvPlan] = {}
        for node in graph.nodes:
            if isinstance(node.op, Conv):
                cp = self._match_conv(graph, node)
                wname = self._weight_name(graph, node.inputs[1])
                if isinstance(cp, str):
                    self.decisions.append(LoweringDecision(node.id, wname, False, cp, "qconv2d"))
                else:
                    convs[node.id] = cp
                    chan = "per-channel" if len(cp.w_scales) > 1 else "per-tensor"
                    self.decisions.append(
                        LoweringDecision(node.id, wname, True, f"{chan} weight", "qconv2d")
                    )
                continue
            if not isinstance(node.op, MatMul):
                continue
            a, b = node.inputs
            wname = self._weight_name(graph, b)
            act = self._match_act(graph, a)
            wt = self._match_weight(graph, b) if not isinstance(act, str) else None
            reason = act if isinstance(act, str) else wt if isinstance(wt, str) else None
            if reason is None and node.dtype is not DType.F32:
                reason = f"matmul result is {node.dtype}; qmatmul produces f32"
            if reason is not None:
                self.decisions.append(LoweringDecision(node.id, wname, False, reason))
                continue
            assert isinstance(act, int) and isinstance(wt, tuple)
            w_src, w_value, w_scales, folded = wt
            bias = self._match_bias(graph, node, uses, readers)
            new = _Plan(node.id, act, w_src, w_value, w_scales, folded, *(bias or (None, None)))
            plans[new.add if new.add is not None else node.id] = new
            how = "weight quantized now" if w_value is not None else "weight quantized at run time"
            chan = "per-channel" if len(w_scales) > 1 else "per-tensor"
            extra = ", bias folded" if bias else ""
            self.decisions.append(
                LoweringDecision(node.id, wname, True, f"{chan} weight, {how}{extra}")
            )
        self.notes = [str(d) for d in self.decisions] or ["no matmul in the graph"]
        if not plans and not convs:
            return graph
        skip = {p.mm for p in plans.values() if p.add is not None}
        rw = Rewriter(graph)
        consts: dict[tuple[NodeId, tuple[float, ...]], NodeId] = {}
        for nid in graph.topo_order():
            node = graph.nodes[nid]
            if nid in skip:
                continue
            cplan = convs.get(nid)
            if cplan is not None:
                rw.map[nid] = self._emit_conv(rw, node, cplan)
                continue
            plan = plans.get(nid)
            if plan is None:
                rw.copy(node)
                continue
            if plan.w_value is not None:
                key = (plan.w_src, plan.w_scales)
                if key not in consts:
                    cv = ConstValue.of(plan.w_value, DType.I8)
                    consts[key] = rw.emit(Constant(cv), [], node.loc, Shape(cv.dims, DType.I8))
                w_id = consts[key]
            else:
                w_id = rw.map[plan.w_src]
            ins = [rw.map[plan.q_act], w_id]
            if plan.bias is not None:
                ins.append(rw.map[plan.bias])
            q_act: Quantize = graph.nodes[plan.q_act].op  # type: ignore[assignment]
            has_bias = plan.bias is not None
            op = QMatMul(q_act.scales[0], q_act.zero_points[0], plan.w_scales, has_bias)
            rw.map[nid] = rw.emit(op, ins, node.loc)
        out = DeadCodeElimination().run(rw.finish())
        folded_params = {p.folded for p in plans.values() if p.folded is not None}
        folded_params |= {c.folded for c in convs.values() if c.folded is not None}
        if self.drop_folded_params and folded_params:
            out = self._drop_params(out, folded_params)
        return out

    @staticmethod
    def _emit_conv(rw: Rewriter, node: Node, plan: _ConvPlan) -> NodeId:
        op: Conv = node.op  # type: ignore[assignment]
        cv = ConstValue.of(plan.w_value, DType.I8)
        w_id = rw.emit(Constant(cv), [], node.loc, Shape(cv.dims, DType.I8))
        q_act: Quantize = rw.src.nodes[plan.q_act].op  # type: ignore[assignment]
        ins = [rw.map[plan.q_act], w_id]
        if op.has_bias:
            ins.append(rw.map[node.inputs[2]])
        qop = QConv2d(
            op.stride,
            op.padding,
            op.dilation,
            q_act.scales[0],
            q_act.zero_points[0],
            plan.w_scales,
            op.groups,
            op.has_bias,
        )
        return rw.emit(qop, ins, node.loc)

    def _drop_params(self, graph: Graph, names: set[str]) -> Graph:
        """Remove the (now unread) params whose values were folded into i8 constants."""
        out, dropped = drop_params(graph, names)
        if dropped:
            self.notes.append(f"dropped params folded into i8 constants: {sorted(dropped)}")
        return out


def drop_params(graph: Graph, names: set[str]) -> tuple[Graph, list[str]]:
    """``graph`` without the params named in ``names`` that nothing reads (their values
    were folded into i8 constants); returns (graph, dropped names)."""
    readers = graph.consumers()
    rw = Rewriter(graph)
    dropped = []
    for nid in graph.topo_order():
        node = graph.nodes[nid]
        op = node.op
        if isinstance(op, Param) and op.name in names and not readers[nid]:
            if nid not in graph.outputs:
                dropped.append(op.name)
                continue
        rw.copy(node)
    if not dropped:
        return graph, []
    return rw.finish(), dropped


class ExpandFusedMatMuls:
    """Pass: ``fused_matmul_bias_act`` -> matmul, add, activation and ``fused_swiglu`` ->
    ``silu(x @ w_gate) * (x @ w_up)``, so their matmuls can be quantized one by one (HIR
    lowering under ``FusionPolicy.DIRECT`` emits the fused forms). The compile pipeline
    fuses whatever stays in float again."""

    name = "expand_fused_matmuls"

    def __init__(self) -> None:
        self.notes: list[str] = []

    def run(self, graph: Graph) -> Graph:
        self.notes = []
        if not any(isinstance(n.op, (FusedMatMulBiasAct, FusedSwiGLU)) for n in graph.nodes):
            return graph
        rw = Rewriter(graph)
        for nid in graph.topo_order():
            node = graph.nodes[nid]
            op = node.op
            ins = [rw.map[i] for i in node.inputs]
            if isinstance(op, FusedMatMulBiasAct):
                y = rw.emit(MatMul(), ins[:2], node.loc)
                if op.has_bias:
                    y = rw.emit(Binary(BinaryKind.ADD), [y, ins[2]], node.loc)
                if op.act is not None:
                    y = rw.emit(Unary(op.act), [y], node.loc)
                rw.map[nid] = y
                self.notes.append(f"{node.label} -> matmul chain")
            elif isinstance(op, FusedSwiGLU):
                gate = rw.emit(
                    Unary(UnaryKind.SILU), [rw.emit(MatMul(), ins[:2], node.loc)], node.loc
                )
                up = rw.emit(MatMul(), [ins[0], ins[2]], node.loc)
                rw.map[nid] = rw.emit(Binary(BinaryKind.MUL), [gate, up], node.loc)
                self.notes.append(f"{node.label} -> silu(matmul) * matmul")
            else:
                rw.copy(node)
        return rw.finish()
