"""Accuracy of a quantized graph against its float original. In: output arrays of both,
batch by batch. Out: :class:`ErrorStats` per output, :class:`LayerError` rankings and
the :class:`AccuracyReport` that ``rlx.quantize`` returns.

Metrics over all evaluation batches of one output: ``max_abs`` = max |q - f|,
``relative`` = ||q - f||_2 / ||f||_2, ``cosine`` = <q, f> / (||q|| ||f||).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ErrorStats", "ErrorAccumulator", "LayerError", "AccuracyReport"]


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """Error of one output (or the worst over all outputs)."""

    max_abs: float
    relative: float
    cosine: float

    def __str__(self) -> str:
        return f"max abs {self.max_abs:.4g}, relative {self.relative:.4g}, cosine {self.cosine:.6f}"


class ErrorAccumulator:
    """Streaming sums for :class:`ErrorStats` of several outputs (constant memory)."""

    def __init__(self, n_outputs: int):
        self.max_abs = [0.0] * n_outputs
        self.err2 = [0.0] * n_outputs
        self.ref2 = [0.0] * n_outputs
        self.got2 = [0.0] * n_outputs
        self.dot = [0.0] * n_outputs

    def add(self, got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> None:
        for i, (q, f) in enumerate(zip(got, ref, strict=True)):
            q64 = np.asarray(q, np.float64)
            f64 = np.asarray(f, np.float64)
            d = q64 - f64
            if d.size:
                self.max_abs[i] = max(self.max_abs[i], float(np.abs(d).max()))
            self.err2[i] += float(np.vdot(d, d))
            self.ref2[i] += float(np.vdot(f64, f64))
            self.got2[i] += float(np.vdot(q64, q64))
            self.dot[i] += float(np.vdot(q64, f64))

    def stats(self) -> list[ErrorStats]:
        out = []
        for i in range(len(self.max_abs)):
            rel = (
                math.sqrt(self.err2[i] / self.ref2[i])
                if self.ref2[i] > 0
                else math.sqrt(self.err2[i])
            )
            den = math.sqrt(self.ref2[i] * self.got2[i])
            cos = self.dot[i] / den if den > 0 else (1.0 if self.err2[i] == 0 else 0.0)
            out.append(ErrorStats(self.max_abs[i], rel, cos))
        return out

    def worst(self) -> ErrorStats:
        s = self.stats()
        return ErrorStats(
            max(x.max_abs for x in s), max(x.relative for x in s), min(x.cosine for x in s)
        )


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

    @property
    def worst(self) -> ErrorStats:
        """The worst metric over all outputs."""
        return ErrorStats(
            max((s.max_abs for s in self.outputs), default=0.0),
            max((s.relative for s in self.outputs), default=0.0),
            min((s.cosine for s in self.outputs), default=1.0),
        )

    @property
    def budget_met(self) -> bool | None:
        """Whether the worst relative error is within the budget (None: no budget)."""
        if self.accuracy_budget is None:
            return None
        return self.worst.relative <= self.accuracy_budget

    def worst_layers(self, n: int = 3) -> list[str]:
        """Names of the ``n`` layers whose quantization alone hurts the output most."""
        return [le.layer for le in self.layers[:n]]

    def __str__(self) -> str:
        lines = [
            f"rlx.quantize ({self.method}): {len(self.quantized)} layers int8, "
            f"{len(self.kept_float)} kept in float; {self.calibration_batches} calibration "
            f"batches, accuracy over {self.eval_batches}",
        ]
        for name, s in zip(self.output_names, self.outputs, strict=True):
            lines.append(f"  output {name}: {s}")
        if self.accuracy_budget is not None:
            verdict = "met" if self.budget_met else "NOT met"
            lines.append(f"  accuracy budget (relative error) {self.accuracy_budget:g}: {verdict}")
        if self.layers:
            lines.append("  per-layer error (that layer alone in int8), worst first:")
            for le in self.layers:
                lines.append(f"    {le.layer:<24} %{le.node:<5} {le.error}")
        for name, why in self.kept_float.items():
            lines.append(f"  kept float: {name}: {why}")
        return "\n".join(lines)
