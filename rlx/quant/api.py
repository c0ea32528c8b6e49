"""``rlx.quantize``: post-training INT8 quantization in one call.

In: a float graph (or GraphModule), its params, and (for static activations or
SmoothQuant) an iterable of calibration input dicts. Out: a :class:`QuantizeResult` with
the compiled INT8 graph, the compiled float graph and an
:class:`~rlx.quant.report.AccuracyReport`.

Steps (stages 1-3 are :func:`_plan`, :func:`_calibrate` and :func:`_lower`; the report,
:func:`_result`):

1. *Layers*: fused matmul ops are expanded first (``ExpandFusedMatMuls``), and
   ``matmul(x, transpose(W))`` / weight-shaped ``dot_general`` become ``matmul(x, W.T)``
   (:func:`~rlx.quant.layers.canonical_weights`, the transposed weight named
   ``"<name>.T"``); then every ``matmul`` whose right operand is a 2-D float weight known now (a param in ``params``
   or a constant) is a layer, named by its weight (``exclude`` takes these names or node
   ids), and so is every 2-D ``conv`` with a known weight (lowered to ``qconv2d``;
   always with static activation scales: there is no dynamic integer conv).
2. *SmoothQuant* (``smooth_alpha``): one calibration pass collects each layer input's
   per-channel max ``|x|``; :func:`~rlx.quant.smooth.smooth_graph` moves the outliers into
   the weights (``X/s``, ``s*W``, ``1/s`` folded into the preceding layer norm or linear
   where one exists). The calibration data is then read a second time, so it is kept in
   memory (a list) when it is not one already.
3. *Activations*: ``activations="dynamic"`` lowers each matmul to ``dynamic_qmatmul``
   (per-row scales at run time, ``dynamic_mode`` "u8" asymmetric or "s8" symmetric; no
   calibration). ``"static"`` calibrates: the layers' inputs are tapped and run through
   ``rlx.Session`` batch by batch with the calibrator of ``method`` (max-abs, percentile
   or entropy; running statistics only, plus the first ``eval_batches`` batches kept to
   measure accuracy). Each activation gets one per-tensor scale: symmetric int8, or
   asymmetric uint8 with a zero point where that lowers the error (``asymmetric``, see
   :mod:`rlx.quant.static`); weights are symmetric per output channel (or per tensor with
   ``per_channel=False``), in [-127, 127], or [-64, 64] with ``reduce_range`` (the
   default on a target whose int8 GEMM is the AVX2 one: its vpmaddubsw kernel).
4. *Lowering* (:mod:`rlx.quant.mix`): ``dynamic_qmatmul`` for dynamic layers, Q/DQ then
   ``qmatmul`` / ``qconv2d`` for static ones, weights quantized into i8 constants (the f32
   weight params leave the graph); with ``activation_products=True`` attention's products
   and other activation x activation products become ``dynamic_qbatch_matmul``
   (:mod:`rlx.quant.products`; off by default: on all-MiniLM-L6-v2 they cost no accuracy
   but the fused float attention kernel is faster); then compile (the compile pipeline fuses bias,
   activation and residual into the integer GEMM's epilogue). Compiles bypass the
   in-process compile cache: each variant is compiled once and thrown away.
5. *Accuracy*: outputs vs the float graph (max abs, relative L2, cosine); a per-layer
   ranking (each layer quantized alone); with ``accuracy_budget`` (a relative error) the
   cheapest mix that meets it: all layers in the requested mode first, then the worst
   layers one at a time move static -> dynamic -> float (dynamic only when
   ``activations="static"``: it needs no calibrated range and holds outlier rows).
   The report says per layer which method it got (:attr:`AccuracyReport.methods`) and why
   a layer stayed float.

Degenerate data is refused or worked around, never quantized silently, and the message
names the tensor:
- a weight holding NaN / Inf, an activation that saw only non-finite values, a
  calibrated range at or above ~1.8e19 (where squaring a value overflows f32: calibration
  on 1e30 or the f32 maximum) or a non-finite threshold raises
  :class:`~rlx.errors.QuantizationError`;
- an activation that saw only zeros (or no value at all), values with no spread (within
  one int8 step of each other, e.g. constant data), or a range whose int8 step falls
  below the 1e-6 scale floor (the same floor for s8 and u8) keeps its layers in float
  with a :class:`~rlx.errors.QuantizationWarning` (a RuntimeWarning) and a ``kept_float``
  entry saying why;
- NaN / Inf among otherwise finite calibration values is a QuantizationWarning. Evaluation data whose float
outputs are all zero or non-finite cannot measure an error: the report says so instead
of printing 0 or nan.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.errors import QuantizationError, QuantizationWarning
from rlx.ir.mir import Graph
from rlx.ops.qmatmul import ActQuant
from rlx.options import CompileOptions
from rlx.passes.pipeline import to_mir
from rlx.quant.args import check_args as _check_args
from rlx.quant.calibrate import CalibrationMethod
from rlx.quant.layers import (
    Layer,
    canonical_weights,
    check_exclude,
    check_weights,
    find_conv_layers,
    find_layers,
    float_products,
    weight_value,
)
from rlx.quant.lower import ExpandFusedMatMuls, default_reduce_range, quantize_weight
from rlx.quant.mix import VariantBuilder, fake_quant_graph, meet_budget
from rlx.quant.record import CalibrationEntry
from rlx.quant.report import AccuracyReport, ErrorAccumulator, LayerError, measure, method_text
from rlx.quant.static import Tee, act_entry, calibrate_taps, degenerate_taps, session

__all__ = ["quantize", "QuantizeResult", "Layer", "find_layers", "fake_quant_graph"]


@dataclass
class QuantizeResult:
    """The compiled INT8 graph, the compiled float graph and the accuracy report.
    ``graph`` is the quantized MIR (before the compile pipeline); ``record`` maps each
    statically quantized layer name to its (activation, weight) calibration entries;
    ``params``: the params ``graph`` reads (smoothed values where SmoothQuant changed
    them)."""

    compiled: Any
    float_compiled: Any
    report: AccuracyReport
    graph: Graph
    record: dict[str, tuple[CalibrationEntry, CalibrationEntry]] = field(default_factory=dict)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    #: 8, or 7 when the weights were quantized to [-64, 64] (``reduce_range``)
    weight_bits: int = 8


def _no_data(graph: Graph, why: str) -> QuantizationError:
    return QuantizationError(
        f"quantize: {why} needs calibration_data (an iterable of input dicts with the "
        f"inputs of graph {graph.name!r}: {graph.input_names})"
    )


def quantize(
    graph_or_module: Any,
    calibration_data: Iterable[Mapping[str, Any]] | None = None,
    *,
    params: Mapping[str, Any],
    activations: str = "static",
    method: CalibrationMethod | str = "minmax",
    per_channel: bool = True,
    asymmetric: bool | None = None,
    smooth_alpha: float | None = None,
    dynamic_mode: str = "u8",
    activation_products: bool = False,
    exclude: Iterable[str | int] = (),
    accuracy_budget: float | None = None,
    options: CompileOptions | None = None,
    eval_data: Iterable[Mapping[str, Any]] | None = None,
    eval_batches: int = 4,
    rank_layers: bool = True,
    weights_only: bool = False,
    scheme: Any = None,
    reduce_range: bool | None = None,
) -> QuantizeResult:
    """Post-training INT8 quantization of every matmul with a known 2-D weight (and every
    2-D conv with a known weight); see the module docstring for the steps.

    ``calibration_data``: iterable of input dicts (streamed; needed for static
    activations and SmoothQuant, optional for dynamic). ``params``: the float weights.
    ``activations``: "static" (calibrated per-tensor scales) or "dynamic" (per-row scales
    at run time, ``dynamic_mode`` "u8" or "s8"). ``method``: "minmax", "percentile" or
    "entropy" (static). ``asymmetric``: None picks u8 with a zero point per tensor where it
    lowers the error, True / False force it. ``smooth_alpha``: SmoothQuant's migration
    strength (0.5 is the paper's default). ``activation_products``: attention's ``q k^T``
    and ``probabilities x v`` and other activation x activation products run as integer
    ``dynamic_qbatch_matmul`` too (see :mod:`rlx.quant.products`). ``exclude``: layer
    (weight) names or node ids to
    keep in float. ``accuracy_budget``: the largest acceptable relative output error (the
    cheapest mix that meets it is picked). Accuracy is measured on ``eval_data`` (default:
    the first ``eval_batches`` calibration batches). ``rank_layers`` computes the
    one-layer-at-a-time ranking (one compile per layer). ``reduce_range``: weights to
    [-64, 64] (7 bits, ONNX Runtime's ``reduce_range``) instead of [-127, 127], so the
    AVX2 int8 GEMM takes its faster vpmaddubsw kernel (exact either way; the cost is
    accuracy: the weight step doubles); None (the default) picks it when the selected
    native target's int8 GEMM is the AVX2 one (no VNNI:
    :func:`~rlx.quant.lower.default_reduce_range`); the weights are quantized now, so
    the choice follows the target of the process that quantizes
    (:attr:`QuantizeResult.weight_bits` says which). Returns a :class:`QuantizeResult`.

    Raises QuantizationError naming the tensor for a NaN / Inf weight of a quantized
    layer, an activation that saw only non-finite values or a saturating range; an
    activation with no usable range keeps its layers in float with a QuantizationWarning
    (see the module docstring).

    ``weights_only=True`` with ``scheme=`` a QuantScheme (Int8Block(32), Int4Block(32),
    Fp8E4m3(), a GGUF scheme...) packs the weights instead and emits DequantMatMul
    (activations stay f32, no calibration: ``calibration_data`` only feeds the accuracy
    measurement); see :mod:`rlx.quant.weight_only`.
    """
    if weights_only or scheme is not None:
        from rlx.quant.weight_only import quantize_weights_only

        if not weights_only:
            raise QuantizationError("scheme= applies to weights_only=True quantization")
        if reduce_range:
            raise QuantizationError(
                "reduce_range=True applies to int8 GEMM weights, not to weights_only=True "
                "schemes (their block formats fix the range)"
            )
        return quantize_weights_only(
            graph_or_module, calibration_data, params=params, scheme=scheme, exclude=exclude,
            options=options, eval_data=eval_data, eval_batches=eval_batches,
            rank_layers=rank_layers, accuracy_budget=accuracy_budget,
        )  # fmt: skip
    plan = _plan(
        graph_or_module, calibration_data, params, activations, method, smooth_alpha,
        dynamic_mode, exclude, accuracy_budget, options, reduce_range,
    )  # fmt: skip
    cal = _calibrate(
        plan, calibration_data, activations, asymmetric, per_channel, smooth_alpha,
        eval_data, eval_batches,
    )  # fmt: skip
    low = _lower(
        plan, cal, activations, per_channel, activation_products, rank_layers, accuracy_budget
    )
    return _result(plan, cal, low, activations, method, accuracy_budget, smooth_alpha)


# ---- 1. validate and plan --------------------------------------------------------------


@dataclass
class _Plan:
    """What :func:`_plan` found: the float graph (fused matmuls expanded, weights made
    canonical) and its params, every layer, those to quantize (``active``), those kept
    float and why, the float-only products, and the checked arguments."""

    graph: Graph
    params: dict[str, np.ndarray]
    layers: list[Layer]
    active: list[Layer]
    kept_float: dict[str, str]
    float_compute: dict[str, str]
    method: CalibrationMethod
    dyn_mode: ActQuant
    opts: CompileOptions
    reduce_range: bool = False


def _plan(
    graph_or_module: Any,
    calibration_data: Iterable[Mapping[str, Any]] | None,
    params: Mapping[str, Any],
    activations: str,
    method: CalibrationMethod | str,
    smooth_alpha: float | None,
    dynamic_mode: str,
    exclude: Iterable[str | int],
    accuracy_budget: float | None,
    options: CompileOptions | None,
    reduce_range: bool | None = None,
) -> _Plan:
    """Stage 1: check the arguments, bring the graph to MIR with canonical weights, find
    its layers (matmuls and convs) and pick those to quantize (not excluded, not a conv
    without calibration data); refuses NaN / Inf weights."""
    meth, dyn_mode = _check_args(method, activations, accuracy_budget, smooth_alpha, dynamic_mode)
    if reduce_range is not None and not isinstance(reduce_range, bool):
        raise QuantizationError(
            f"reduce_range must be True, False or None (auto), got {reduce_range!r}"
        )
    reduced = default_reduce_range() if reduce_range is None else reduce_range
    graph = ExpandFusedMatMuls().run(to_mir(graph_or_module))
    graph.verify()
    if isinstance(calibration_data, Sized) and len(calibration_data) == 0:
        raise QuantizationError(
            f"quantize: calibration_data has no batches; expected at least one input dict with "
            f"the inputs of graph {graph.name!r}: {graph.input_names}"
        )
    if calibration_data is None and (activations == "static" or smooth_alpha is not None):
        raise _no_data(graph, "static activations" if smooth_alpha is None else "smooth_alpha")
    np_params = {k: np.asarray(v) for k, v in params.items()}
    # matmul(x, transpose(W)) and weight-shaped dot_general -> matmul(x, W [K, N])
    graph, np_params, _ = canonical_weights(graph, np_params)
    opts = (options or CompileOptions()).replace(use_cache=False)
    layers, kept_float = find_layers(graph, np_params)
    convs, conv_skipped = find_conv_layers(graph, np_params)
    if convs:
        kept_float.update(conv_skipped)
    all_layers = layers + convs
    float_compute = float_products(graph, all_layers)
    excl = check_exclude(graph, all_layers, exclude)
    for ly in all_layers:
        if ly.name in excl or ly.node in excl:
            kept_float[ly.name] = "excluded by the caller"
    active = [ly for ly in all_layers if ly.name not in kept_float]
    if not active:
        raise QuantizationError(
            f"graph {graph.name!r} has no quantizable matmul (need a 2-D f32 weight given in "
            f"params or as a constant); skipped: {kept_float or 'no matmul at all'}"
        )
    check_weights(graph, active, np_params)
    if calibration_data is None:
        for ly in [ly for ly in active if ly.kind == "conv2d"]:
            kept_float[ly.name] = (
                "a conv needs calibrated (static) activation scales: give calibration_data"
            )
        active = [ly for ly in active if ly.name not in kept_float]
    return _Plan(
        graph, np_params, all_layers, active, kept_float, float_compute, meth, dyn_mode, opts,
        reduced,
    )  # fmt: skip


# ---- 2. calibrate ----------------------------------------------------------------------


@dataclass
class _Calibration:
    """What :func:`_calibrate` made: the graph and params to lower (smoothed when
    SmoothQuant ran), the layers still to quantize, each static layer's (activation,
    weight) entries, SmoothQuant's note per layer, the number of calibration batches read
    and the evaluation batches."""

    graph: Graph
    params: dict[str, np.ndarray]
    active: list[Layer]
    entries: dict[str, tuple[CalibrationEntry, CalibrationEntry]]
    smooth_info: dict[str, str]
    n_cal: int
    evals: list[dict[str, np.ndarray]]


def _calibrate(
    plan: _Plan,
    calibration_data: Iterable[Mapping[str, Any]] | None,
    activations: str,
    asymmetric: bool | None,
    per_channel: bool,
    smooth_alpha: float | None,
    eval_data: Iterable[Mapping[str, Any]] | None,
    eval_batches: int,
) -> _Calibration:
    """Stage 2: read the calibration data once (twice with SmoothQuant): SmoothQuant's
    per-channel statistics and smoothed graph, then the static layers' activation and
    weight entries (layers whose activation saw no usable range stay float, with a
    QuantizationWarning); keeps the batches that measure the accuracy."""
    keep = 0 if eval_data is not None else eval_batches
    data: Iterable[Mapping[str, Any]] | None = calibration_data
    if smooth_alpha is not None and data is not None and not isinstance(data, Sequence):
        data = list(data)  # read twice: per-channel statistics, then the smoothed ranges
    tee = Tee(data, keep) if data is not None else None
    cal = _Calibration(plan.graph, plan.params, plan.active, {}, {}, 0, [])
    if smooth_alpha is not None:
        assert tee is not None
        _smooth(plan, cal, tee, float(smooth_alpha))
        tee = Tee(data, 0) if data is not None else None  # type: ignore[arg-type]
    static_layers = [ly for ly in cal.active if activations == "static" or ly.kind == "conv2d"]
    if static_layers:
        assert tee is not None
        _static_entries(plan, cal, static_layers, tee, asymmetric, per_channel)
    elif tee is not None:
        for _ in tee:  # dynamic: the data only feeds the accuracy measurement
            if len(tee.kept) >= keep:
                break
    if eval_data is not None:
        cal.evals = [dict(b) for b in eval_data]
    elif smooth_alpha is not None and isinstance(data, Sequence):
        cal.evals = [dict(b) for b in list(data)[:eval_batches]]
    else:
        cal.evals = tee.kept if tee is not None else []
    return cal


def _smooth(plan: _Plan, cal: _Calibration, tee: Tee, alpha: float) -> None:
    """SmoothQuant: one max-abs pass over ``tee`` for each matmul input's per-channel
    max ``|x|``, then ``cal``'s graph, params, layers and notes become the smoothed ones."""
    from rlx.quant.smooth import smooth_graph

    graph, params = plan.graph, plan.params
    mm = [ly for ly in cal.active if ly.kind == "matmul"]
    taps = sorted({ly.act for ly in mm})
    # per-channel max |x| is all smoothing needs: the cheap max-abs calibrator
    stats, cal.n_cal = calibrate_taps(
        graph, taps, tee, params, CalibrationMethod.MAX_ABS, plan.opts, channel_stats=True
    )
    degenerate_taps(graph, mm, taps, stats)  # raises on non-finite-only data
    channel_max = {t: st.channel_max_abs for t, st in zip(taps, stats, strict=True)}
    sm = smooth_graph(graph, mm, params, channel_max, alpha)
    cal.graph, cal.params, cal.smooth_info = sm.graph, sm.params, sm.info
    by_name = {
        ly.name: ly
        for ly in find_layers(cal.graph, cal.params)[0] + find_conv_layers(cal.graph, cal.params)[0]
    }
    cal.active = [by_name[ly.name] for ly in cal.active]


def _static_entries(
    plan: _Plan,
    cal: _Calibration,
    static_layers: list[Layer],
    tee: Tee,
    asymmetric: bool | None,
    per_channel: bool,
) -> None:
    """Calibrate the static layers' activations with ``plan.method`` and fill
    ``cal.entries`` (activation entry, symmetric weight entry); a layer whose activation
    has no usable range stays float with a QuantizationWarning."""
    taps = sorted({ly.act for ly in static_layers})
    stats, n2 = calibrate_taps(cal.graph, taps, tee, cal.params, plan.method, plan.opts)
    cal.n_cal = max(cal.n_cal, n2)
    degenerate = degenerate_taps(cal.graph, static_layers, taps, stats)
    for ly in static_layers:
        if ly.act in degenerate:
            why = degenerate[ly.act]
            warnings.warn(
                f"rlx.quantize: layer {ly.name!r} is kept in float: {why}",
                QuantizationWarning,
                stacklevel=4,  # the caller of quantize
            )
            plan.kept_float[ly.name] = why
    cal.active = [ly for ly in cal.active if ly.name not in plan.kept_float]
    by_tap = {t: act_entry(st, asymmetric) for t, st in zip(taps, stats, strict=True)}
    for ly in cal.active:
        if ly.act not in by_tap or ly.act in degenerate:
            continue
        axis = 0 if ly.kind == "conv2d" else 1
        w = weight_value(cal.graph, ly, cal.params)
        _, ws = quantize_weight(w, per_channel, axis, plan.reduce_range)
        w_entry = (
            CalibrationEntry.per_channel(axis, ws)
            if per_channel
            else CalibrationEntry.per_tensor(ws[0])
        )
        cal.entries[ly.name] = (by_tap[ly.act], w_entry)


# ---- 3. lower, rank and meet the budget --------------------------------------------------


@dataclass
class _Lowered:
    """What :func:`_lower` picked: the lowered graph, its compiled form and params, its
    error, the per-layer ranking, each quantized layer's mode, the builder (its integer
    products) and the compiled float graph."""

    graph: Graph
    compiled: Any
    params: dict[str, np.ndarray]
    acc: ErrorAccumulator
    ranking: list[LayerError]
    modes: dict[str, str]
    builder: VariantBuilder
    products: bool
    float_compiled: Any


def _lower(
    plan: _Plan,
    cal: _Calibration,
    activations: str,
    per_channel: bool,
    activation_products: bool,
    rank_layers: bool,
    accuracy_budget: float | None,
) -> _Lowered:
    """Stage 3: compile the float graph and the quantized variant(s) and measure them:
    each layer alone (the ranking, worst first), all layers in their mode, then, with an
    ``accuracy_budget``, the products back to float and the cheapest mix that meets it."""
    if not cal.evals and accuracy_budget is not None:
        raise QuantizationError(
            "accuracy_budget needs evaluation batches (eval_data or eval_batches >= 1)"
        )
    graph, evals, opts = plan.graph, cal.evals, plan.opts
    n_out = len(graph.outputs)
    sess = session()
    float_compiled = sess.compile(graph, opts, params=plan.params)
    float_outs = [float_compiled.run(b) for b in evals]
    builder = VariantBuilder(
        cal.graph,
        cal.params,
        {ly.name: ly for ly in cal.active},
        cal.entries,
        plan.dyn_mode,
        per_channel,
        plan.reduce_range,
    )
    use_products = [activation_products]

    def build(
        modes: Mapping[str, str], alone: bool = False
    ) -> tuple[Graph, Any, dict[str, np.ndarray]]:
        low, kept = builder.lower(modes, products=use_products[0] and not alone)
        return low, sess.compile(low, opts, params=kept), kept

    def error(compiled: Any) -> ErrorAccumulator:
        return measure(compiled, float_outs, evals, n_out)

    def start_mode(ly: Layer) -> str:
        return "static" if ly.kind == "conv2d" or activations == "static" else "dynamic"

    modes = {ly.name: start_mode(ly) for ly in cal.active}
    ranking: list[LayerError] = []
    if rank_layers or accuracy_budget is not None:
        for ly in cal.active:
            _, comp, _ = build({ly.name: modes[ly.name]}, alone=True)
            ranking.append(LayerError(ly.name, ly.node, error(comp).worst()))
        # worst first; an unmeasured error (NaN) sorts last
        ranking.sort(key=lambda le: le.error.relative if le.error.measured else -1.0, reverse=True)

    if modes:
        low, compiled, low_params = build(modes)
    else:  # every layer kept in float (degenerate calibration data)
        low, compiled, low_params = graph, float_compiled, plan.params
    acc = error(compiled)
    if accuracy_budget is not None and not acc.worst().measured:
        raise QuantizationError(
            f"quantize: accuracy_budget {accuracy_budget:g} cannot be checked: the error is "
            f"{acc.worst().note}. Pass eval_data with inputs whose float outputs are finite "
            "and not all zero"
        )
    if accuracy_budget is not None and use_products[0] and acc.worst().relative > accuracy_budget:
        use_products[0] = False  # the products go back to float before any layer does
        for label in builder.products_done:
            plan.float_compute[label] = (
                f"kept in float to meet the accuracy budget {accuracy_budget:g}"
            )
        builder.products_done = {}
        low, compiled, low_params = build(modes)
        acc = error(compiled)
    if accuracy_budget is not None and modes:
        low, compiled, low_params, acc = meet_budget(
            modes, [le.layer for le in ranking], activations, accuracy_budget, plan.kept_float,
            builder, build, acc, error, (graph, float_compiled, plan.params),
        ) or (low, compiled, low_params, acc)  # fmt: skip
    return _Lowered(
        low, compiled, low_params, acc, ranking, modes, builder, use_products[0], float_compiled
    )


# ---- 4. report -------------------------------------------------------------------------


def _result(
    plan: _Plan,
    cal: _Calibration,
    low: _Lowered,
    activations: str,
    method: CalibrationMethod | str,
    accuracy_budget: float | None,
    smooth_alpha: float | None,
) -> QuantizeResult:
    """Stage 4: the :class:`AccuracyReport` (errors, ranking, each layer's method, what
    stayed float and why) and the :class:`QuantizeResult`."""
    graph, modes, builder = plan.graph, low.modes, low.builder
    spelled = method if isinstance(method, str) else plan.method.value  # as the user spelled it
    methods = {
        n: method_text(
            m, cal.entries.get(n, (None,))[0], str(spelled), plan.dyn_mode, cal.smooth_info.get(n)
        )
        for n, m in modes.items()
    }
    report = AccuracyReport(
        method=spelled,
        labels={ly.name: graph.nodes[ly.node].label for ly in plan.layers},
        outputs=low.acc.stats(),
        output_names=[graph.nodes[o].label for o in graph.outputs],
        layers=low.ranking,
        quantized=[ly.name for ly in cal.active if ly.name in modes],
        kept_float=plan.kept_float,
        accuracy_budget=accuracy_budget,
        eval_batches=len(cal.evals),
        calibration_batches=cal.n_cal,
        activations=activations,
        methods=methods,
        smooth_alpha=smooth_alpha,
        smoothing={n: t for n, t in cal.smooth_info.items() if n in modes},
        float_compute={
            k: v for k, v in plan.float_compute.items() if k not in builder.products_done
        },
        products=dict(builder.products_done) if low.products else {},
    )
    record = {n: cal.entries[n] for n, m in modes.items() if m == "static"}
    bits = 7 if plan.reduce_range else 8
    return QuantizeResult(
        low.compiled, low.float_compiled, report, low.graph, record, low.params, bits
    )
