"""Quantization-aware training: fake-quantize a float model the way ``rlx.quantize`` would
quantize it, fine-tune it, and lower it through the same INT8 path.

:func:`prepare` — in: a float graph (or GraphModule), its params and calibration input
dicts. Out: ``(qat_graph, params)``, the graph with fake quantizers on every layer that
``rlx.quantize`` quantizes (the same search: fused matmuls expanded, ``x @ W.T`` made
canonical, every ``matmul`` with a known 2-D f32 weight and every 2-D ``conv`` with a known
weight), exactly as that path quantizes it:

* weights: symmetric int8 per output channel, scale ``max|w| / 127`` recomputed from the
  current weight at every step (``fake_quantize_lsq`` with ``learn_scale=False``: the
  scale gets no gradient, as a PyTorch observer's); with ``learn_scales=True`` a learned
  per-channel scale param ``<weight>.qscale`` (LSQ), started at that value;
* activations: one per-tensor scale from a calibration run with ``rlx.quantize``'s
  calibrators (``method`` "minmax" / "percentile" / "entropy"; symmetric int8, or uint8
  with a zero point where that lowers the error, as ``asymmetric=None`` picks), a fixed
  ``fake_quantize`` (straight-through gradient); with ``learn_scales=True`` a learned
  scale param ``qat.act<k>.qscale`` (LSQ, gradient scaled by ``1/sqrt(features * qmax)``).

The graph trains with any trainer (``rlx.grad`` / ``rlx.train``): the fake quantizers'
derivative rules live in :mod:`rlx.ops.fake_quant`.

:func:`convert` — in: the trained QAT graph and its params. Out: a :class:`QatModel`, the
INT8 graph and its compiled form, built by ``rlx.quant``'s own lowering (the Q/DQ
canonical form, then ``QuantLowering``: ``qmatmul`` / ``qconv2d`` with i8 weight
constants): the fake quantizers are removed and their scales (calibrated, learned, or the
weights' current ``max|w| / 127``) become its calibration entries, so the INT8 model
computes what the QAT graph computed up to the integer GEMM's f32 rounding.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import QuantizationError, QuantizationWarning
from rlx.ir.mir import Graph, NodeId
from rlx.ops.core import Constant, Input, Param
from rlx.ops.elementwise import Unary, UnaryKind
from rlx.ops.fake_quant import FakeQuantizeLSQ
from rlx.ops.linalg import MatMul
from rlx.ops.nn import Conv
from rlx.ops.quant import QUANT_RANGES, FakeQuantize
from rlx.ops.rules import stamp
from rlx.options import CompileOptions
from rlx.passes.base import Rewriter, live_nodes
from rlx.passes.pipeline import to_mir
from rlx.quant.calibrate import CalibrationMethod
from rlx.quant.layers import (
    Layer,
    canonical_weights,
    check_exclude,
    check_weights,
    find_conv_layers,
    find_layers,
    tensor_name,
    weight_value,
)
from rlx.quant.lower import ExpandFusedMatMuls
from rlx.quant.mix import VariantBuilder, rewrite_layer_edges
from rlx.quant.record import CalibrationEntry
from rlx.quant.static import act_entry, calibrate_taps, degenerate_taps

__all__ = ["prepare", "convert", "QatModel", "METHODS", "weight_scales"]

#: ``method=`` strings :func:`prepare` accepts (as ``rlx.quantize``).
METHODS: dict[str, CalibrationMethod] = {
    "minmax": CalibrationMethod.MAX_ABS,
    "max_abs": CalibrationMethod.MAX_ABS,
    "percentile": CalibrationMethod.PERCENTILE,
    "entropy": CalibrationMethod.ENTROPY,
}
_FQ = (FakeQuantize, FakeQuantizeLSQ)


def _range_dtype(qmin: int, qmax: int) -> DType | None:
    return next((d for d in (DType.I8, DType.U8) if QUANT_RANGES[d] == (qmin, qmax)), None)


def _weight_axis(layer: Layer) -> int:
    return 0 if layer.kind == "conv2d" else 1


def weight_scales(w: np.ndarray, axis: int, qmax: int = 127) -> np.ndarray:
    """Symmetric per-channel scales ``where(amax > 0, amax / qmax, 1)`` (f32): for
    ``qmax=127`` exactly ``rlx.quant.lower.quantize_weight``'s."""
    w = np.asarray(w, np.float32)
    amax = np.abs(w).max(axis=tuple(d for d in range(w.ndim) if d != axis))
    return np.where(amax > 0, amax / np.float32(qmax), np.float32(1.0)).astype(np.float32)


def _tracked_scale(g: Graph, w: NodeId, axis: int, qmax: int) -> NodeId:
    """:func:`weight_scales` computed in the graph from the weight's current value (f32,
    the same operations)."""
    rank = g.shape(w).rank
    amax = g.max(g.abs(w), [a for a in range(rank) if a != axis])
    f32 = g.shape(w).dtype.np.type
    zero, one = g.constant(f32(0.0)), g.constant(f32(1.0))
    return g.where(g.gt(amax, zero), g.div(amax, g.constant(f32(qmax))), one)


def prepare(
    graph_or_module: Any,
    params: Mapping[str, Any],
    calibration_inputs: Iterable[Mapping[str, Any]],
    *,
    method: str = "minmax",
    asymmetric: bool | None = None,
    learn_scales: bool = False,
    weight_bits: int = 8,
    exclude: Iterable[str | int] = (),
    options: CompileOptions | None = None,
) -> tuple[Graph, dict[str, np.ndarray]]:
    """The QAT graph and its params (see the module docstring). ``calibration_inputs``:
    input dicts for the activation ranges; ``exclude``: layer (weight) names or node ids
    kept in float. ``weight_bits`` (2..8): weights on the symmetric grid ``[-(2**(b-1) - 1),
    2**(b-1) - 1]`` (still stored and run as i8 by ``qmatmul``: a coarser scheme for
    experiments). Raises QuantizationError for an unknown method / exclude name, a graph
    without a quantizable layer, non-finite weights or non-finite-only activations."""
    meth = METHODS.get(method) if isinstance(method, str) else method
    if not isinstance(meth, CalibrationMethod):
        raise QuantizationError(
            f"qat.prepare: unknown calibration method {method!r}; expected one of {sorted(METHODS)}"
        )
    if isinstance(weight_bits, bool) or weight_bits not in range(2, 9):
        raise QuantizationError(
            f"qat.prepare: weight_bits must be an int in 2..8 (run as i8), given {weight_bits!r}"
        )
    graph = ExpandFusedMatMuls().run(to_mir(graph_or_module))
    graph.verify()
    np_params = {k: np.asarray(v) for k, v in params.items()}
    graph, np_params, _ = canonical_weights(graph, np_params)
    layers = find_layers(graph, np_params)[0] + find_conv_layers(graph, np_params)[0]
    excl = check_exclude(graph, layers, exclude, "qat.prepare: ")
    layers = [ly for ly in layers if ly.name not in excl and ly.node not in excl]
    if not layers:
        raise QuantizationError(
            f"qat.prepare: graph {graph.name!r} has no quantizable matmul or conv (need a "
            "2-D f32 weight given in params or as a constant)"
        )
    check_weights(graph, layers, np_params)
    taps = sorted({ly.act for ly in layers})
    opts = (options or CompileOptions()).replace(use_cache=False)
    stats, _ = calibrate_taps(graph, taps, calibration_inputs, np_params, meth, opts)
    degenerate = degenerate_taps(graph, layers, taps, stats)
    for why in degenerate.values():
        warnings.warn(f"qat.prepare: {why}; its layers stay float", QuantizationWarning, 2)
    layers = [ly for ly in layers if ly.act not in degenerate]
    acts = {t: act_entry(st, asymmetric) for t, st in zip(taps, stats, strict=True)}
    return _insert(graph, np_params, layers, acts, learn_scales, 2 ** (weight_bits - 1) - 1)


def _insert(
    graph: Graph,
    params: dict[str, np.ndarray],
    layers: Sequence[Layer],
    acts: Mapping[NodeId, CalibrationEntry],
    learn: bool,
    wq: int,
) -> tuple[Graph, dict[str, np.ndarray]]:
    """Rewrite ``graph`` with fake quantizers on the layers' activation and weight edges."""
    rw = Rewriter(graph)
    g = rw.dst
    by_node = {ly.node: ly for ly in layers}
    act_fq: dict[NodeId, NodeId] = {}
    w_fq: dict[NodeId, NodeId] = {}
    out_params = dict(params)

    def act(old: NodeId) -> NodeId:
        if old not in act_fq:
            start, e = len(g.nodes), acts[old]
            qmin, qmax = QUANT_RANGES[e.dtype]
            x = rw.map[old]
            if learn:
                name = f"qat.act{len(act_fq)}.log_qscale"
                out_params[name] = np.log(np.asarray(e.scales, np.float32))
                feats = math.prod(d for d in g.shape(x).dims[1:] if isinstance(d, int)) or 1
                gf = 1.0 / math.sqrt(feats * qmax)
                s = g.exp(g.param(name, (1,)))
                act_fq[old] = g.fake_quantize_lsq(x, s, e.zero_points, None, qmin, qmax, gf)
            else:
                op = FakeQuantize(None, e.scales, e.zero_points, qmin, qmax)
                act_fq[old] = rw.emit(op, [x])
            stamp(g, start, graph.nodes[old])  # reports: "fake_quantize for %5 relu"
        return act_fq[old]

    def weight(ly: Layer) -> NodeId:
        if ly.weight not in w_fq:
            w, axis = rw.map[ly.weight], _weight_axis(ly)
            wnode, start = graph.nodes[ly.weight], len(g.nodes)
            ws = weight_scales(weight_value(graph, ly, params), axis, wq)
            if isinstance(wnode.op, Constant):  # a fixed weight: fixed scales
                fq = FakeQuantize(axis, tuple(ws.tolist()), (0,) * ws.size, -wq, wq)
                w_fq[ly.weight] = rw.emit(fq, [w])
            elif learn:
                name = f"{ly.name}.log_qscale"
                out_params[name] = np.log(ws)
                s = g.exp(g.param(name, (ws.size,)))
                fan_in = math.prod(d for i, d in enumerate(wnode.shape.dims) if i != axis)
                gf = 1.0 / math.sqrt(fan_in * wq)
                w_fq[ly.weight] = g.fake_quantize_lsq(w, s, None, axis, -wq, wq, gf)
            else:
                s = _tracked_scale(g, w, axis, wq)
                w_fq[ly.weight] = g.fake_quantize_lsq(w, s, None, axis, -wq, wq, learn_scale=False)
            stamp(g, start, wnode)
        return w_fq[ly.weight]

    qat = rewrite_layer_edges(
        graph, rw, by_node, lambda a, _ly: act(a), lambda _w, ly: weight(ly)
    ).verify()
    qat.name = f"{graph.name}.qat"
    return qat, out_params


# ---- convert -----------------------------------------------------------------------


@dataclass
class QatModel:
    """The INT8 model :func:`convert` made: ``graph`` (quantized MIR), the ``params`` it
    reads, ``compiled`` (CPU), the calibration entries per layer (weight name ->
    (activation, weight)) and what the lowering did with each matmul / conv."""

    graph: Graph
    params: dict[str, np.ndarray]
    compiled: Any
    entries: dict[str, tuple[CalibrationEntry, CalibrationEntry]] = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)

    def run(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        """Run the compiled INT8 graph."""
        return self.compiled.run(inputs)


def _act_entry(g: Graph, fq: NodeId, params: Mapping[str, np.ndarray]) -> CalibrationEntry | str:
    op = g.nodes[fq].op
    dt = _range_dtype(op.qmin, op.qmax)  # type: ignore[attr-defined]
    if dt is None or op.axis is not None:  # type: ignore[attr-defined]
        return f"activation quantizer {g.nodes[fq].label} is not per-tensor i8 / u8"
    if isinstance(op, FakeQuantize):
        return CalibrationEntry.per_tensor(op.scales[0], op.zero_points[0], dt)
    s = _scale_value(g, g.nodes[fq].inputs[1], params)
    if s is None:
        return f"activation quantizer {g.nodes[fq].label} has a computed scale"
    return CalibrationEntry.per_tensor(float(s[0]), op.zero_points[0], dt)  # type: ignore[attr-defined]


def _scale_value(g: Graph, nid: NodeId, params: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The value of a quantizer's scale input: a param, a constant or ``exp`` of a param
    (the learned log-scales of :func:`prepare`); None when the graph computes it."""
    node = g.nodes[nid]
    if isinstance(node.op, Unary) and node.op.fn is UnaryKind.EXP:
        inner = g.nodes[node.inputs[0]]
        if isinstance(inner.op, Param) and inner.op.name in params:
            v = np.exp(np.asarray(params[inner.op.name], np.float32).reshape(-1))
            return np.maximum(v, np.finfo(np.float32).eps)
        return None
    if isinstance(node.op, Param) and node.op.name in params:
        v = np.asarray(params[node.op.name], np.float32).reshape(-1)
        return np.maximum(v, np.finfo(np.float32).eps)  # the op's clamp
    if isinstance(node.op, Constant):
        return np.maximum(node.op.value.array().reshape(-1), np.finfo(np.float32).eps)
    return None


def _w_entry(
    g: Graph, fq: NodeId, axis: int, params: Mapping[str, np.ndarray]
) -> CalibrationEntry | str:
    op = g.nodes[fq].op
    w = g.nodes[g.nodes[fq].inputs[0]]
    if any(op.zero_points) or op.qmin < -128 or op.qmax > 127:  # type: ignore[attr-defined]
        return f"weight quantizer {g.nodes[fq].label} is not symmetric int8"
    if op.axis is None or op.axis % w.shape.rank != axis:  # type: ignore[attr-defined]
        return f"weight quantizer {g.nodes[fq].label} is not per output channel (axis {axis})"
    if isinstance(op, FakeQuantize):
        return CalibrationEntry.per_channel(axis, op.scales)
    s = _scale_value(g, g.nodes[fq].inputs[1], params)
    if s is None:  # computed from the weight (tracked): max |w| / qmax, as in the graph
        if not isinstance(w.op, Param) or w.op.name not in params:
            return f"weight {tensor_name(g, w.id)} has no value in params"
        ws = weight_scales(params[w.op.name], axis, op.qmax)  # type: ignore[attr-defined]
        return CalibrationEntry.per_channel(axis, ws.tolist())
    return CalibrationEntry.per_channel(axis, s.tolist())


def _clip_weight(w: np.ndarray, e: CalibrationEntry, qmin: int, qmax: int) -> np.ndarray:
    """``w`` clipped per channel to ``[qmin * s, qmax * s]``, so that the lowering's i8
    rounding (clipped to [-128, 127]) saturates where the fake quantizer did."""
    assert e.axis is not None
    shape = [1] * w.ndim
    shape[e.axis] = len(e.scales)
    s = np.asarray(e.scales, np.float32).reshape(shape)
    return np.clip(np.asarray(w, np.float32), np.float32(qmin) * s, np.float32(qmax) * s)


def _strip(g: Graph, drop: set[NodeId]) -> tuple[Graph, dict[NodeId, NodeId]]:
    """``g`` without the fake quantizers in ``drop`` (each replaced by its input) and
    without what only they read (the weight-scale computations and scale params)."""
    rw = Rewriter(g)
    for nid in g.topo_order():
        node = g.nodes[nid]
        if nid in drop:
            rw.map[nid] = rw.map[node.inputs[0]]
        else:
            rw.copy(node)
    mid = rw.finish()
    live = live_nodes(mid)
    rw2 = Rewriter(mid)
    for nid in mid.topo_order():
        node = mid.nodes[nid]
        if nid in live or isinstance(node.op, Input):
            rw2.copy(node)
    out = rw2.finish().verify()
    return out, {k: rw2.map[v] for k, v in rw.map.items() if v in rw2.map}


def _describe(name: str, e: tuple[CalibrationEntry, CalibrationEntry]) -> str:
    a, w = e
    kind = f"u8 zero point {a.zero_points[0]}" if a.dtype is DType.U8 else "s8 symmetric"
    return (
        f"{name}: integer, activation {kind} scale {a.scales[0]:.4g}, weight i8 per channel "
        f"({len(w.scales)} scales)"
    )


def convert(
    qat_graph: Graph, params: Mapping[str, Any], *, options: CompileOptions | None = None
) -> QatModel:
    """The INT8 model of a trained QAT graph (see the module docstring). Every matmul /
    conv whose activation and weight both come through fake quantizers is lowered;
    others stay float (``decisions`` says why). Raises QuantizationError when none is."""
    np_params = {k: np.asarray(v) for k, v in params.items()}
    g = qat_graph
    found: dict[NodeId, tuple[CalibrationEntry, CalibrationEntry]] = {}
    drop: set[NodeId] = set()
    ranges: dict[NodeId, tuple[int, int]] = {}
    notes: list[str] = []
    for node in g.nodes:
        if not isinstance(node.op, (MatMul, Conv)):
            continue
        a, w = node.inputs[:2]
        if not (isinstance(g.nodes[a].op, _FQ) and isinstance(g.nodes[w].op, _FQ)):
            notes.append(f"{node.label}: kept in float: no fake quantizer on both operands")
            continue
        axis = 0 if isinstance(node.op, Conv) else 1
        ae, we = _act_entry(g, a, np_params), _w_entry(g, w, axis, np_params)
        bad = ae if isinstance(ae, str) else we if isinstance(we, str) else None
        if bad is not None:
            notes.append(f"{node.label}: kept in float: {bad}")
            continue
        found[node.id] = (ae, we)  # type: ignore[assignment]
        ranges[node.id] = (g.nodes[w].op.qmin, g.nodes[w].op.qmax)  # type: ignore[attr-defined]
        drop |= {a, w}
    if not found:
        raise QuantizationError(
            f"qat.convert: graph {g.name!r} has no matmul or conv with fake-quantized "
            f"activation and weight (made by rlx.train.qat.prepare); {notes or 'no matmul'}"
        )
    plain, idmap = _strip(g, drop)
    layers = find_layers(plain, np_params)[0] + find_conv_layers(plain, np_params)[0]
    by_node = {ly.node: ly for ly in layers}
    chosen = {by_node[idmap[n]].name: by_node[idmap[n]] for n in found if idmap[n] in by_node}
    entries = {by_node[idmap[n]].name: e for n, e in found.items() if idmap[n] in by_node}
    kept = {k: v for k, v in np_params.items() if k in set(plain.param_names)}
    for n, (_, we) in found.items():
        ly = by_node.get(idmap[n])
        wname = plain.nodes[ly.weight].op.name if ly is not None else None  # type: ignore[attr-defined]
        if wname in kept:  # the fake quantizer's range, which may be narrower than i8's
            kept[wname] = _clip_weight(kept[wname], we, *ranges[n])
    builder = VariantBuilder(plain, kept, chosen, entries)
    low, low_params = builder.lower(dict.fromkeys(chosen, "static"))
    from rlx.runtime.session import Session

    opts = (options or CompileOptions()).replace(use_cache=False)
    compiled = Session("cpu").compile(low, opts, params=low_params)
    decisions = notes + [_describe(n, e) for n, e in entries.items()]
    return QatModel(low, low_params, compiled, entries, decisions)
