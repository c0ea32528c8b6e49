"""Accuracy of a quantized graph against its float original. In: output arrays of both,
batch by batch. Out: :class:`ErrorStats` per output, :class:`LayerError` rankings and
the :class:`AccuracyReport` that ``rlx.quantize`` returns.

Metrics over all evaluation batches of one output: ``max_abs`` = max |q - f|,
``relative`` = ||q - f||_2 / ||f||_2, ``cosine`` = <q, f> / (||q|| ||f||).

Data that cannot measure an error is said to, never shown as 0 or nan: when the float
output holds NaN / Inf, or is all zeros (no norm to be relative to), the error is
*unmeasured* (``ErrorStats.measured`` False, the fields NaN, ``note`` says why and
``str`` prints the note). A quantized output that is NaN / Inf where the float one is
finite is a measured, unbounded error: ``max_abs`` and ``relative`` are inf.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rlx.ops.qmatmul import ActQuant
    from rlx.quant.record import CalibrationEntry

__all__ = [
    "ErrorStats",
    "ErrorAccumulator",
    "LayerError",
    "AccuracyReport",
    "worst_of",
    "measure",
    "method_text",
]


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """Error of one output (or the worst over all outputs). ``note``: why the error is
    unmeasured (then the numbers are NaN) or unbounded; empty for an ordinary error."""

    max_abs: float
    relative: float
    cosine: float
    note: str = ""

    @property
    def measured(self) -> bool:
        """False when the evaluation data could not measure this error (see ``note``)."""
        return not math.isnan(self.relative)

    def __str__(self) -> str:
        if not self.measured:
            return f"error unmeasured: {self.note}"
        cos = "undefined" if math.isnan(self.cosine) else f"{self.cosine:.6f}"
        text = f"max abs {self.max_abs:.4g}, relative {self.relative:.4g}, cosine {cos}"
        return f"{text} ({self.note})" if self.note else text


def worst_of(stats: Sequence[ErrorStats]) -> ErrorStats:
    """The worst of several outputs' errors: unmeasured if any is (the worst is then
    unknown), else the max of ``max_abs`` / ``relative`` and the min cosine."""
    if not stats:
        return ErrorStats(0.0, 0.0, 1.0)
    unmeasured = [x for x in stats if not x.measured]
    if unmeasured:
        return ErrorStats(math.nan, math.nan, math.nan, unmeasured[0].note)
    cosines = [x.cosine for x in stats if not math.isnan(x.cosine)]
    return ErrorStats(
        max(x.max_abs for x in stats),
        max(x.relative for x in stats),
        min(cosines, default=math.nan),
        next((x.note for x in stats if x.note), ""),
    )


class ErrorAccumulator:
    """Streaming sums for :class:`ErrorStats` of several outputs (constant memory)."""

    def __init__(self, n_outputs: int):
        self.max_abs = [0.0] * n_outputs
        self.err2 = [0.0] * n_outputs
        self.ref2 = [0.0] * n_outputs
        self.got2 = [0.0] * n_outputs
        self.dot = [0.0] * n_outputs
        self.ref_nonfinite = [0] * n_outputs  # NaN / Inf in the float output
        self.got_nonfinite = [0] * n_outputs  # NaN / Inf in the quantized one, float finite

    def add(self, got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> None:
        for i, (q, f) in enumerate(zip(got, ref, strict=True)):
            q64 = np.asarray(q, np.float64)
            f64 = np.asarray(f, np.float64)
            f_ok = np.isfinite(f64)
            ok = f_ok & np.isfinite(q64)
            self.ref_nonfinite[i] += int(f64.size - np.count_nonzero(f_ok))
            self.got_nonfinite[i] += int(np.count_nonzero(f_ok) - np.count_nonzero(ok))
            if not ok.all():  # the sums run over the positions where both are finite
                q64, f64 = q64[ok], f64[ok]
            d = q64 - f64
            if d.size:
                self.max_abs[i] = max(self.max_abs[i], float(np.abs(d).max()))
            self.err2[i] += float(np.vdot(d, d))
            self.ref2[i] += float(np.vdot(f64, f64))
            self.got2[i] += float(np.vdot(q64, q64))
            self.dot[i] += float(np.vdot(q64, f64))

    def stats(self) -> list[ErrorStats]:
        out = []
        nan = math.nan
        for i in range(len(self.max_abs)):
            if self.ref_nonfinite[i]:
                why = (
                    f"the float output holds {self.ref_nonfinite[i]} NaN/Inf values on the "
                    "evaluation data"
                )
                out.append(ErrorStats(nan, nan, nan, why))
                continue
            if self.got_nonfinite[i]:
                why = (
                    f"the quantized output holds {self.got_nonfinite[i]} NaN/Inf values "
                    "where the float output is finite"
                )
                out.append(ErrorStats(math.inf, math.inf, nan, why))
                continue
            if self.ref2[i] == 0:
                why = (
                    "the float output is all zeros on the evaluation data, so there is no "
                    f"norm to be relative to (max abs difference {self.max_abs[i]:.4g}); "
                    "evaluate on real inputs"
                )
                out.append(ErrorStats(nan, nan, nan, why))
                continue
            rel = math.sqrt(self.err2[i] / self.ref2[i])
            den = math.sqrt(self.ref2[i] * self.got2[i])
            cos = self.dot[i] / den if den > 0 else 0.0
            out.append(ErrorStats(self.max_abs[i], rel, cos))
        return out

    def worst(self) -> ErrorStats:
        return worst_of(self.stats())


@dataclass(frozen=True, slots=True)
class LayerError:
    """Output error when only ``layer`` (a matmul, named by its weight) is quantized."""

    layer: str
    node: int
    error: ErrorStats


@dataclass
class AccuracyReport:
    """What ``rlx.quantize`` did and what it cost in accuracy.

    ``outputs``: error of each output of the returned quantized graph vs the float one.
    ``layers``: one-layer-at-a-time errors, worst first (exclude the top ones to gain
    accuracy). ``quantized`` / ``kept_float``: layer names, the latter with a reason.
    ``labels``: layer name -> its matmul named by the user's graph (``'%19 matmul
    (model.py:42)'``, the name the fusion report and the kernel schedule use too).
    ``method``: the calibration method as the caller spelled it (``'minmax'``).
    ``activations``: "static" or "dynamic" as asked; ``methods``: quantized layer name ->
    how it was quantized (``'static minmax u8 asymmetric (zero point 12), scale 0.01'``,
    ``'dynamic u8 per-row activations'``, with the SmoothQuant step when one applied);
    ``smoothing``: layer -> what SmoothQuant did or why it did not (``smooth_alpha`` set).
    ``float_compute``: products that are not layers and stay float (attention, activation x
    activation dot_general), node label -> why; ``products``: those made integer
    (``activation_products=True``), node label -> how.
    """

    method: str
    outputs: list[ErrorStats]
    output_names: list[str]
    layers: list[LayerError] = field(default_factory=list)
    quantized: list[str] = field(default_factory=list)
    kept_float: dict[str, str] = field(default_factory=dict)
    accuracy_budget: float | None = None
    eval_batches: int = 0
    calibration_batches: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    activations: str = "static"
    methods: dict[str, str] = field(default_factory=dict)
    smooth_alpha: float | None = None
    smoothing: dict[str, str] = field(default_factory=dict)
    float_compute: dict[str, str] = field(default_factory=dict)
    products: dict[str, str] = field(default_factory=dict)

    def method_counts(self) -> dict[str, int]:
        """How many layers got each kind of quantization ("static s8", "static u8",
        "dynamic u8", "smooth", ...)."""
        out: dict[str, int] = {}
        for text in self.methods.values():
            parts = text.split()
            key = f"{parts[0]} {parts[2] if parts[0] == 'static' else parts[1]}"
            out[key] = out.get(key, 0) + 1
            if "smooth alpha" in text:
                out["smooth"] = out.get("smooth", 0) + 1
        return out

    @property
    def worst(self) -> ErrorStats:
        """The worst metric over all outputs (unmeasured if any output's error is)."""
        return worst_of(self.outputs)

    @property
    def budget_met(self) -> bool | None:
        """Whether the worst relative error is within the budget (None: no budget, or an
        unmeasured error)."""
        if self.accuracy_budget is None or not self.worst.measured:
            return None
        return self.worst.relative <= self.accuracy_budget

    def worst_layers(self, n: int = 3) -> list[str]:
        """Names of the ``n`` layers whose quantization alone hurts the output most."""
        return [le.layer for le in self.layers[:n]]

    def __str__(self) -> str:
        how = self.method if self.activations == "static" else f"{self.activations}"
        if self.smooth_alpha is not None:
            how += f", smooth_alpha={self.smooth_alpha:g}"
        lines = [
            f"rlx.quantize ({how}): {len(self.quantized)} layers int8, "
            f"{len(self.kept_float)} kept in float; {self.calibration_batches} calibration "
            f"batches, accuracy over {self.eval_batches}",
        ]
        if self.methods:
            counts = ", ".join(f"{k}: {v}" for k, v in self.method_counts().items())
            lines.append(f"  methods: {counts}")
        for name, s in zip(self.output_names, self.outputs, strict=True):
            lines.append(f"  output {name}: {s}")
        if self.accuracy_budget is not None:
            verdict = "met" if self.budget_met else "NOT met"
            lines.append(f"  accuracy budget (relative error) {self.accuracy_budget:g}: {verdict}")
        if self.layers:
            lines.append("  per-layer error (that layer alone in int8), worst first:")
            for le in self.layers:
                where: str | None = self.labels.get(le.layer, f"%{le.node}")
                lines.append(f"    {le.layer:<16} {where:<32} {le.error}")
        if self.methods:
            lines.append("  per-layer method:")
            for name, text in self.methods.items():
                lines.append(f"    {name:<16} {text}")
        for name, why in self.kept_float.items():
            where = self.labels.get(name)
            if why.startswith(f"{name} "):  # the reason names the node already
                lines.append(f"  kept float: {why}")
                continue
            head = f"{name} ({where})" if where and where not in why else name
            lines.append(f"  kept float: {head}: {why}")
        for label, how in self.products.items():
            lines.append(f"  integer product: {label}: {how}")
        for label, why in self.float_compute.items():
            lines.append(f"  float compute: {label}: {why}")
        return "\n".join(lines)


def measure(
    compiled: Any,
    float_outs: list[list[np.ndarray]],
    batches: list[dict[str, np.ndarray]],
    n_outputs: int,
) -> ErrorAccumulator:
    """The error of ``compiled`` run on ``batches`` against the float outputs."""
    acc = ErrorAccumulator(n_outputs)
    for batch, ref in zip(batches, float_outs, strict=True):
        acc.add(compiled.run(batch), ref)
    return acc


def method_text(
    mode: str, entry: CalibrationEntry | None, method: str, dyn: ActQuant, smooth: str | None
) -> str:
    """How the report names one layer's method: its mode, the activation's calibration
    (method, s8 / u8, scale) or dynamic mode, and SmoothQuant's note."""
    if mode == "dynamic":
        text = f"dynamic {dyn.value} per-row activations"
    else:
        assert entry is not None
        if entry.dtype.name == "U8":
            kind = f"u8 asymmetric (zero point {entry.zero_points[0]})"
        else:
            kind = "s8 symmetric"
        text = f"static {method} {kind}, scale {entry.scales[0]:.4g}"
    if smooth is not None and smooth.startswith("smooth"):
        text += f"; {smooth}"
    return text
