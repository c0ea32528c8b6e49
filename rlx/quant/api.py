"""``rlx.quantize``: post-training INT8 quantization in one call.

In: a float graph (or GraphModule), its params, and an iterable of calibration input
dicts. Out: a :class:`QuantizeResult` with the compiled INT8 graph, the compiled float
graph and an :class:`~rlx.quant.report.AccuracyReport`.

Steps:

1. *Layers*: fused matmul ops are expanded first (``ExpandFusedMatMuls``); then every
   ``matmul`` whose right operand is a 2-D float weight known now (a param
   in ``params`` or a constant) is a layer, named by its weight (``exclude`` takes these
   names or matmul node ids).
2. *Calibration*: the layers' input activations are tapped and run through ``rlx.Session``
   batch by batch with the chosen calibrator of ``rlx.backends.cpu.calibrate``
   (max-abs, percentile or entropy histograms). Memory stays bounded: batches are
   consumed one at a time and only running statistics are kept, plus the first
   ``eval_batches`` batches (reused to measure accuracy).
3. *Q/DQ*: each quantized layer gets ``dequantize(quantize(.))`` on its activation
   (symmetric per-tensor int8) and on its weight (symmetric per output channel, or per
   tensor with ``per_channel=False``), on that layer's edges only, so a float layer
   that reads the same activation keeps reading it unquantized.
4. *Lowering*: :class:`~rlx.quant.lower.QuantLowering` turns each bracketed matmul into a
   ``qmatmul`` (int8 GEMM) with its weight quantized into an i8 constant (the f32 weight
   param leaves the graph); then compile. Compiles bypass the in-process compile cache:
   each per-layer variant is compiled once and thrown away.
5. *Accuracy*: outputs vs the float graph (max abs, relative L2, cosine); a per-layer
   ranking (each layer quantized alone); with ``accuracy_budget`` (a relative error) the
   worst layers are kept in float, one at a time, until the budget is met.

Degenerate data is refused or worked around, never quantized silently: a weight holding
NaN / Inf, or an activation that saw only non-finite values during calibration, raises
:class:`~rlx.errors.QuantizationError` naming it; an activation that saw only zeros (or
no value at all) has no range to calibrate (its scale would be the 1e-6 floor, which
saturates every real input: relative error 1.0), so its layers stay in float with a
``RuntimeWarning`` and a ``kept_float`` entry saying why. Evaluation data whose float
outputs are all zero or non-finite cannot measure an error: the report says so instead
of printing 0 or nan.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.backends.cpu.calibrate import CalibrationMethod
from rlx.dtype import DType
from rlx.errors import QuantizationError
from rlx.ir.mir import Graph, NodeId
from rlx.ops.core import Constant, Input, Param
from rlx.ops.linalg import MatMul
from rlx.ops.quant import Dequantize, Quantize
from rlx.passes.base import Rewriter
from rlx.passes.pipeline import to_mir
from rlx.quant.lower import ExpandFusedMatMuls, QuantLowering, quantize_weight
from rlx.quant.record import CalibrationEntry
from rlx.quant.report import AccuracyReport, ErrorAccumulator, LayerError
from rlx.runtime.options import CompileOptions

__all__ = ["quantize", "QuantizeResult", "Layer", "find_layers", "fake_quant_graph"]


@dataclass(frozen=True, slots=True)
class Layer:
    """A quantizable matmul: ``node`` = matmul(``act``, ``weight``)."""

    name: str
    node: NodeId
    act: NodeId
    weight: NodeId


@dataclass
class QuantizeResult:
    """The compiled INT8 graph, the compiled float graph and the accuracy report.
    ``graph`` is the quantized MIR (before the compile pipeline); ``record`` maps each
    quantized layer name to its (activation, weight) calibration entries."""

    compiled: Any
    float_compiled: Any
    report: AccuracyReport
    graph: Graph
    record: dict[str, tuple[CalibrationEntry, CalibrationEntry]] = field(default_factory=dict)


#: ``method=`` strings accepted by :func:`quantize`.
_METHODS: dict[str, CalibrationMethod] = {
    "minmax": CalibrationMethod.MAX_ABS,
    "max_abs": CalibrationMethod.MAX_ABS,
    "percentile": CalibrationMethod.PERCENTILE,
    "entropy": CalibrationMethod.ENTROPY,
}


def find_layers(
    graph: Graph, params: Mapping[str, np.ndarray]
) -> tuple[list[Layer], dict[str, str]]:
    """The quantizable matmuls of ``graph``, and the skipped ones with the reason."""
    layers: list[Layer] = []
    skipped: dict[str, str] = {}
    for node in graph.find(MatMul):
        a, w = node.inputs
        wn = graph.nodes[w]
        # reports name the matmul by the user's graph: "%19 matmul (model.py:42)"
        mm = node.label
        ref = mm.split(" ", 1)[0] if mm.startswith("%") else f"#{node.id}"
        name = wn.op.name if isinstance(wn.op, Param) else ref  # type: ignore[attr-defined]
        if wn.shape.rank != 2 or not wn.shape.is_static:
            skipped[name] = f"{mm}: rhs {wn.shape} is not a static 2-D weight"
        elif node.dtype is not DType.F32 or graph.nodes[a].dtype is not DType.F32:
            skipped[name] = f"{mm}: not f32 ({graph.nodes[a].shape} @ {wn.shape})"
        elif isinstance(wn.op, Param) and wn.op.name not in params:
            skipped[name] = f"{mm}: weight param {wn.op.name!r} was not given in params"
        elif not isinstance(wn.op, (Param, Constant)):
            skipped[name] = f"{mm}: rhs is computed ({wn.op.mnemonic}), not a weight"
        else:
            layers.append(Layer(name, node.id, a, w))
    return layers, skipped


def _weight_value(graph: Graph, layer: Layer, params: Mapping[str, np.ndarray]) -> np.ndarray:
    op = graph.nodes[layer.weight].op
    if isinstance(op, Constant):
        return op.value.array().astype(np.float32)
    return np.asarray(params[op.name], dtype=np.float32)  # type: ignore[attr-defined]


def fake_quant_graph(
    graph: Graph, entries: Mapping[NodeId, tuple[CalibrationEntry, CalibrationEntry]]
) -> Graph:
    """Q/DQ on the activation and weight edges of the matmuls in ``entries`` (matmul id ->
    (activation entry, weight entry)); other readers of those tensors are untouched.
    Matmuls with equal activation entries share one Q/DQ pair."""
    rw = Rewriter(graph)
    shared: dict[tuple[NodeId, CalibrationEntry], NodeId] = {}

    def qdq(old: NodeId, e: CalibrationEntry) -> NodeId:
        key = (old, e)
        if key not in shared:
            src, loc = rw.map[old], graph.nodes[old].loc  # reports: "quantize for %5 add"
            q = rw.emit(Quantize(e.axis, e.scales, e.zero_points, e.dtype), [src], loc)
            shared[key] = rw.emit(Dequantize(e.axis, e.scales, e.zero_points), [q], loc)
        return shared[key]

    for nid in graph.topo_order():
        node = graph.nodes[nid]
        pair = entries.get(nid)
        if pair is None:
            rw.copy(node)
            continue
        a, w = node.inputs
        rw.map[nid] = rw.dst.add_node(
            node.op, [qdq(a, pair[0]), qdq(w, pair[1])], node.shape, node.loc
        )
    return rw.finish()


@dataclass(frozen=True, slots=True)
class _TapStats:
    """What calibration saw of one tapped activation: its int8 scale, max |x| and how
    many finite and non-finite values."""

    scale: float
    max_abs: float
    finite: int
    nonfinite: int


def _calibrate(
    graph: Graph,
    taps: Sequence[NodeId],
    batches: Iterable[Mapping[str, Any]],
    params: Mapping[str, np.ndarray],
    method: CalibrationMethod,
    options: CompileOptions,
) -> tuple[list[_TapStats], int]:
    """Per-tap symmetric int8 scales from the calibrator of ``method``, run through
    ``rlx.Session`` on a copy of ``graph`` whose outputs are the taps; returns
    (statistics aligned with ``taps``, number of batches seen)."""
    from rlx.backends.cpu.calibrate import calibrate

    it = iter(batches)
    first = next(it, None)
    if first is None:
        raise QuantizationError(
            f"quantize: calibration_data has no batches; expected at least one input dict "
            f"with the inputs of graph {graph.name!r}: {graph.input_names}"
        )
    # The copy keeps the user's graph name: input errors during calibration name it.
    tapped = graph.copy(graph.name)
    tapped.outputs = list(taps)
    compiled = _session().compile(tapped, options, params=params)
    cal = calibrate(compiled, itertools.chain([first], it), method, taps=list(taps), progress=False)
    finite, nonfinite = cal.value_counts()
    stats = [
        _TapStats(float(s), float(m), int(f), int(n))
        for s, m, f, n in zip(cal.scales(), cal.max_abs(), finite, nonfinite, strict=True)
    ]
    return stats, cal.batches


def _tensor_name(graph: Graph, nid: NodeId) -> str:
    """How errors and the report name a tensor: input / param by name, else id and op."""
    node = graph.nodes[nid]
    op = node.op
    if isinstance(op, (Input, Param)):
        return f"{op.mnemonic} {op.name!r}"
    fn = getattr(getattr(op, "fn", None), "value", None)  # relu rather than unary
    where = f" built at {node.loc}" if node.loc is not None and node.loc.file else ""
    return f"%{nid} {fn if isinstance(fn, str) else op.mnemonic}{where}"


def _check_weights(graph: Graph, layers: Sequence[Layer], params: Mapping[str, np.ndarray]) -> None:
    """QuantizationError naming the first weight that holds NaN or +-inf: int8 has no
    code for them (a NaN weight would silently become a finite int8)."""
    for ly in layers:
        w = _weight_value(graph, ly, params)
        bad = ~np.isfinite(w)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise QuantizationError(
                f"quantize: the weight of layer {ly.name!r} ({_tensor_name(graph, ly.weight)}, "
                f"shape {w.shape}) holds {int(bad.sum())} NaN/Inf values (first at {first}: "
                f"{w[first]}); int8 cannot represent them. Fix the weight, or keep the layer "
                f"in float with exclude=[{ly.name!r}]"
            )


def _degenerate_taps(
    graph: Graph, layers: Sequence[Layer], taps: Sequence[NodeId], stats: Sequence[_TapStats]
) -> dict[NodeId, str]:
    """Taps whose calibration gives no usable int8 range, with the reason. Raises
    QuantizationError for a tap that saw only non-finite values (the data is broken);
    a tap that saw only zeros (or nothing) is returned: its layers stay in float."""
    out: dict[NodeId, str] = {}
    for t, st in zip(taps, stats, strict=True):
        users = [ly.name for ly in layers if ly.act == t]
        what = f"activation {_tensor_name(graph, t)} (the input of layer(s) {users})"
        if st.finite == 0 and st.nonfinite > 0:
            raise QuantizationError(
                f"quantize: {what} saw only non-finite values during calibration "
                f"({st.nonfinite} NaN/Inf, no finite value), so its int8 range cannot be "
                f"calibrated; check the calibration data, or exclude={users}"
            )
        if st.max_abs == 0.0:
            seen = "no value at all" if st.finite == 0 else f"only zeros ({st.finite} values)"
            out[t] = (
                f"{what} saw {seen} during calibration: no range to calibrate (scale 0), "
                "so int8 would saturate every real input"
            )
    return out


class _Tee:
    """Iterate once over the calibration data while keeping its first ``keep`` batches."""

    def __init__(self, data: Iterable[Mapping[str, Any]], keep: int):
        self.data = data
        self.keep = keep
        self.kept: list[dict[str, np.ndarray]] = []

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        for i, batch in enumerate(self.data):
            if not isinstance(batch, Mapping):
                raise QuantizationError(
                    f"calibration batch {i} is a {type(batch).__name__}; expected a dict of input name -> array"
                )
            if i < self.keep:
                self.kept.append({k: np.array(v, copy=True) for k, v in batch.items()})
            yield batch


def _session() -> Any:
    from rlx.runtime.session import Session

    return Session("cpu")


def _measure(
    compiled: Any,
    float_outs: list[list[np.ndarray]],
    batches: list[dict[str, np.ndarray]],
    n_outputs: int,
) -> ErrorAccumulator:
    acc = ErrorAccumulator(n_outputs)
    for batch, ref in zip(batches, float_outs, strict=True):
        acc.add(compiled.run(batch), ref)
    return acc


def quantize(
    graph_or_module: Any,
    calibration_data: Iterable[Mapping[str, Any]],
    *,
    params: Mapping[str, Any],
    method: CalibrationMethod | str = "minmax",
    per_channel: bool = True,
    exclude: Iterable[str | int] = (),
    accuracy_budget: float | None = None,
    options: CompileOptions | None = None,
    eval_data: Iterable[Mapping[str, Any]] | None = None,
    eval_batches: int = 4,
    rank_layers: bool = True,
    weights_only: bool = False,
    scheme: Any = None,
) -> QuantizeResult:
    """Post-training INT8 quantization of every matmul with a known 2-D weight.

    ``calibration_data``: iterable of input dicts (consumed once, streamed). ``params``:
    the float weights. ``method``: "minmax", "percentile" or "entropy". ``exclude``:
    layer (weight) names or matmul node ids to keep in float. ``accuracy_budget``: the
    largest acceptable relative output error; the worst layers are kept in float until it
    holds. Accuracy is measured on ``eval_data`` (default: the first ``eval_batches``
    calibration batches). ``rank_layers`` computes the one-layer-at-a-time ranking (one
    compile per layer). Returns a :class:`QuantizeResult`.

    Raises QuantizationError naming the tensor for a NaN / Inf weight of a quantized
    layer and for an activation that saw only non-finite values; an activation that saw
    only zeros keeps its layers in float with a RuntimeWarning (see the module docstring).

    ``weights_only=True`` with ``scheme=`` a QuantScheme (Int8Block(32), Int4Block(32),
    Fp8E4m3(), a GGUF scheme...) packs the weights instead and emits DequantMatMul
    (activations stay f32, no calibration: ``calibration_data`` only feeds the accuracy
    measurement); see :mod:`rlx.quant.weight_only`.
    """
    if weights_only or scheme is not None:
        from rlx.quant.weight_only import quantize_weights_only

        if not weights_only:
            raise QuantizationError("scheme= applies to weights_only=True quantization")
        return quantize_weights_only(
            graph_or_module, calibration_data, params=params, scheme=scheme, exclude=exclude,
            options=options, eval_data=eval_data, eval_batches=eval_batches,
            rank_layers=rank_layers, accuracy_budget=accuracy_budget,
        )  # fmt: skip
    meth = _METHODS.get(method) if isinstance(method, str) else method
    if not isinstance(meth, CalibrationMethod):
        raise QuantizationError(
            f"unknown calibration method {method!r}; expected one of {sorted(_METHODS)} or a CalibrationMethod"
        )
    if accuracy_budget is not None and not accuracy_budget > 0:
        raise QuantizationError(
            f"accuracy_budget must be > 0 (a relative error), got {accuracy_budget}"
        )
    graph = ExpandFusedMatMuls().run(to_mir(graph_or_module))
    graph.verify()
    if isinstance(calibration_data, Sized) and len(calibration_data) == 0:
        raise QuantizationError(
            f"quantize: calibration_data has no batches; expected at least one input dict with "
            f"the inputs of graph {graph.name!r}: {graph.input_names}"
        )
    np_params = {k: np.asarray(v) for k, v in params.items()}
    opts = (options or CompileOptions()).replace(use_cache=False)
    layers, kept_float = find_layers(graph, np_params)
    names = {ly.name for ly in layers} | {ly.node for ly in layers}
    excl = list(exclude)
    unknown = [e for e in excl if e not in names]
    if unknown:
        raise QuantizationError(
            f"exclude names unknown layers {unknown}; layers of graph {graph.name!r}: {[ly.name for ly in layers]}"
        )
    for ly in layers:
        if ly.name in excl or ly.node in excl:
            kept_float[ly.name] = "excluded by the caller"
    active = [ly for ly in layers if ly.name not in kept_float]
    if not active:
        raise QuantizationError(
            f"graph {graph.name!r} has no quantizable matmul (need a 2-D f32 weight given in "
            f"params or as a constant); skipped: {kept_float or 'no matmul at all'}"
        )

    _check_weights(graph, active, np_params)

    # calibration (one streamed pass) -> per-layer (activation, weight) entries
    taps = sorted({ly.act for ly in active})
    tee = _Tee(calibration_data, 0 if eval_data is not None else eval_batches)
    tap_stats, n_cal = _calibrate(graph, taps, tee, np_params, meth, opts)
    degenerate = _degenerate_taps(graph, active, taps, tap_stats)
    for ly in active:
        if ly.act in degenerate:
            why = degenerate[ly.act]
            warnings.warn(
                f"rlx.quantize: layer {ly.name!r} is kept in float: {why}",
                RuntimeWarning,
                stacklevel=2,
            )
            kept_float[ly.name] = why
    active = [ly for ly in active if ly.act not in degenerate]
    act_entry = {
        t: CalibrationEntry.per_tensor(max(st.scale, 1e-12))
        for t, st in zip(taps, tap_stats, strict=True)
    }
    entries: dict[NodeId, tuple[CalibrationEntry, CalibrationEntry]] = {}
    for ly in active:
        _, ws = quantize_weight(_weight_value(graph, ly, np_params), per_channel)
        w_entry = (
            CalibrationEntry.per_channel(1, ws)
            if per_channel
            else CalibrationEntry.per_tensor(ws[0])
        )
        entries[ly.node] = (act_entry[ly.act], w_entry)
    evals = [dict(b) for b in eval_data] if eval_data is not None else tee.kept
    if not evals and accuracy_budget is not None:
        raise QuantizationError(
            "accuracy_budget needs evaluation batches (eval_data or eval_batches >= 1)"
        )
    n_out = len(graph.outputs)

    session = _session()
    float_compiled = session.compile(graph, opts, params=np_params)
    float_outs = [float_compiled.run(b) for b in evals]

    def build(chosen: Sequence[Layer]) -> tuple[Graph, Any]:
        fake = fake_quant_graph(graph, {ly.node: entries[ly.node] for ly in chosen})
        low = QuantLowering(np_params, per_channel).run(fake)
        kept = {k: v for k, v in np_params.items() if k in set(low.param_names)}
        return low, session.compile(low, opts, params=kept)

    ranking: list[LayerError] = []
    if rank_layers or accuracy_budget is not None:
        for ly in active:
            _, comp = build([ly])
            ranking.append(
                LayerError(ly.name, ly.node, _measure(comp, float_outs, evals, n_out).worst())
            )
        # worst first; an unmeasured error (NaN) sorts last
        ranking.sort(key=lambda le: le.error.relative if le.error.measured else -1.0, reverse=True)

    chosen = list(active)
    if chosen:
        low, compiled = build(chosen)
    else:  # every layer kept in float (degenerate calibration data)
        low, compiled = graph, float_compiled
    acc = _measure(compiled, float_outs, evals, n_out)
    if accuracy_budget is not None and not acc.worst().measured:
        raise QuantizationError(
            f"quantize: accuracy_budget {accuracy_budget:g} cannot be checked: the error is "
            f"{acc.worst().note}. Pass eval_data with inputs whose float outputs are finite "
            "and not all zero"
        )
    if accuracy_budget is not None and chosen:
        for name in [le.layer for le in ranking]:
            if acc.worst().relative <= accuracy_budget:
                break
            chosen = [ly for ly in chosen if ly.name != name]
            kept_float[name] = f"kept in float to meet the accuracy budget {accuracy_budget:g}"
            if not chosen:
                low, compiled = graph, float_compiled
                acc = _measure(compiled, float_outs, evals, n_out)
                break
            low, compiled = build(chosen)
            acc = _measure(compiled, float_outs, evals, n_out)

    out_names = [graph.nodes[o].label for o in graph.outputs]
    report = AccuracyReport(
        method=method if isinstance(method, str) else meth.value,  # as the user spelled it
        labels={ly.name: graph.nodes[ly.node].label for ly in layers},
        outputs=acc.stats(),
        output_names=out_names,
        layers=ranking,
        quantized=[ly.name for ly in chosen],
        kept_float=kept_float,
        accuracy_budget=accuracy_budget,
        eval_batches=len(evals),
        calibration_batches=n_cal,
    )
    record = {ly.name: entries[ly.node] for ly in chosen}
    return QuantizeResult(compiled, float_compiled, report, low, record)
