"""Static activation calibration for ``rlx.quantize``. In: a float graph, the activation
taps of its layers, calibration batches and a method. Out: per tap, :class:`TapStats`
(the method's symmetric scale, max ``|x|``, signed min / max, value counts and, on
request, each channel's max ``|x|``), the int8 / uint8 :class:`CalibrationEntry` chosen
from them, and the taps whose data has no usable range.

Asymmetric u8 (``asymmetric=None``: chosen per tensor when it lowers the error): the
range ``[min(lo, 0), max(hi, 0)]`` of what calibration saw, clipped to the method's
threshold, is covered by 255 steps with a zero point instead of ``[-amax, amax]`` by 254.
The rounding error of a uniform quantizer grows with its step, so u8 is taken when its
step is at most 0.9x the symmetric one (a clearly one-sided tensor, such as a GELU or
ReLU output); ``asymmetric=True`` / ``False`` forces it either way.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import QuantizationError
from rlx.ir.mir import Graph, NodeId
from rlx.options import CompileOptions
from rlx.quant.calibrate import CalibrationMethod
from rlx.quant.layers import Layer, tensor_name
from rlx.quant.record import CalibrationEntry

__all__ = [
    "TapStats",
    "Tee",
    "calibrate_taps",
    "act_entry",
    "degenerate_taps",
    "ASYM_STEP_RATIO",
]

#: u8 is chosen (``asymmetric=None``) when its step is at most this times the s8 step.
ASYM_STEP_RATIO = 0.9


@dataclass(frozen=True, slots=True)
class TapStats:
    """What calibration saw of one tapped activation."""

    scale: float  # the method's symmetric int8 scale
    max_abs: float
    lo: float  # smallest finite value (inf if none)
    hi: float  # largest finite value (-inf if none)
    finite: int
    nonfinite: int
    channel_max_abs: np.ndarray | None = None


def session() -> Any:
    from rlx.runtime.session import Session

    return Session("cpu")


def calibrate_taps(
    graph: Graph,
    taps: Sequence[NodeId],
    batches: Iterable[Mapping[str, Any]],
    params: Mapping[str, np.ndarray],
    method: CalibrationMethod,
    options: CompileOptions,
    channel_stats: bool = False,
) -> tuple[list[TapStats], int]:
    """Run ``graph`` with the taps as outputs over ``batches`` with ``method``'s
    calibrator; returns (statistics aligned with ``taps``, number of batches seen)."""
    from rlx.quant.calibrate import calibrate

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
    compiled = session().compile(tapped, options, params=params)
    cal = calibrate(
        compiled,
        itertools.chain([first], it),
        method,
        taps=list(taps),
        progress=False,
        channel_stats=channel_stats,
    )
    finite, nonfinite = cal.value_counts()
    lo, hi = cal.min_max()
    chans = cal.channel_max_abs()
    stats = [
        TapStats(float(s), float(m), float(a), float(b), int(f), int(n), c)
        for s, m, a, b, f, n, c in zip(
            cal.scales(), cal.max_abs(), lo, hi, finite, nonfinite, chans, strict=True
        )
    ]
    return stats, cal.batches


def act_entry(st: TapStats, asymmetric: bool | None) -> CalibrationEntry:
    """The activation's per-tensor entry: symmetric i8, or u8 with a zero point (see the
    module docstring for the choice)."""
    scale = max(st.scale, 1e-12)
    sym = CalibrationEntry.per_tensor(scale)
    if asymmetric is False or not np.isfinite(st.lo) or not np.isfinite(st.hi):
        return sym
    amax = scale * 127.0
    lo = min(max(st.lo, -amax), 0.0)
    hi = max(min(st.hi, amax), 0.0)
    if not hi - lo > 0:
        return sym
    s = (hi - lo) / 255.0
    if asymmetric is None and not s <= ASYM_STEP_RATIO * scale:
        return sym
    zp = int(np.clip(np.rint(-lo / s), 0, 255))
    return CalibrationEntry.per_tensor(s, zp, DType.U8)


def degenerate_taps(
    graph: Graph, layers: Sequence[Layer], taps: Sequence[NodeId], stats: Sequence[TapStats]
) -> dict[NodeId, str]:
    """Taps whose calibration gives no usable int8 range, with the reason. Raises
    QuantizationError for a tap that saw only non-finite values (the data is broken);
    a tap that saw only zeros (or nothing) is returned: its layers stay in float."""
    out: dict[NodeId, str] = {}
    for t, st in zip(taps, stats, strict=True):
        users = [ly.name for ly in layers if ly.act == t]
        what = f"activation {tensor_name(graph, t)} (the input of layer(s) {users})"
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


class Tee:
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
