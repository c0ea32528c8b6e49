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

One scale floor for both: every activation step, s8 or u8, is at least
:data:`~rlx.quant.calibrate.SCALE_FLOOR` (1e-6). A tap whose symmetric step ``amax / 127``
is below it would have its grid coarsened by the floor (and below ``SCALE_FLOOR / 2``
every value would quantize to 0, relative error 1.0), so :func:`degenerate_taps` keeps its
layers in float and says why instead. (When the s8 step clears the floor, a floored u8
step is still no coarser than the s8 one: such a tap is quantized.)

Calibration data that cannot describe real inputs is refused or worked around, never
quantized silently (:func:`degenerate_taps`, naming the tensor):

* only NaN / Inf values: QuantizationError; NaN / Inf among finite values: a
  :class:`~rlx.errors.QuantizationWarning` (the range is that of the finite values);
* a saturating range, ``max |x|`` at or above ``sqrt(f32 max)`` (~1.8e19, e.g. data
  scaled by 1e30, or the f32 maximum), where the square of a value overflows f32 (a
  product, a norm): QuantizationError (such a range would quantize every real input to
  0), and so is a threshold or scale that is not finite;
* only zeros, or no spread (every finite value within one s8 step ``max |x| / 127`` of the
  others, e.g. constant data: int8 cannot tell the values apart, and their range says
  nothing about real inputs; u8 clipped real inputs of the other sign to 0, relative
  error 0.58 on a one-layer model): kept in float;
* a step below the scale floor: kept in float (above).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import QuantizationError, QuantizationWarning
from rlx.ir.mir import Graph, NodeId
from rlx.options import CompileOptions
from rlx.quant.calibrate import SCALE_FLOOR, CalibrationMethod
from rlx.quant.layers import Layer, tensor_name
from rlx.quant.record import CalibrationEntry

__all__ = [
    "TapStats",
    "Tee",
    "calibrate_taps",
    "act_entry",
    "degenerate_taps",
    "ASYM_STEP_RATIO",
    "SATURATION_LIMIT",
]

#: u8 is chosen (``asymmetric=None``) when its step is at most this times the s8 step.
ASYM_STEP_RATIO = 0.9
#: A calibration range at or above this (``sqrt`` of the f32 maximum, ~1.84e19) saturates:
#: the square of such a value overflows f32.
SATURATION_LIMIT = math.sqrt(float(np.finfo(np.float32).max))


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
    amax: float = math.nan  # the method's clipping threshold (NaN: unknown, ``scale * 127``)

    @property
    def threshold(self) -> float:
        """The method's clipping threshold (``scale * 127`` when not recorded)."""
        return self.scale * 127.0 if math.isnan(self.amax) else self.amax


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
        TapStats(float(s), float(m), float(a), float(b), int(f), int(n), c, float(t))
        for s, m, a, b, f, n, c, t in zip(
            cal.scales(), cal.max_abs(), lo, hi, finite, nonfinite, chans, cal.amax(), strict=True
        )
    ]
    return stats, cal.batches


def act_entry(st: TapStats, asymmetric: bool | None) -> CalibrationEntry:
    """The activation's per-tensor entry: symmetric i8, or u8 with a zero point (see the
    module docstring for the choice); either step is at least ``SCALE_FLOOR``."""
    scale = max(st.scale, SCALE_FLOOR)
    sym = CalibrationEntry.per_tensor(scale)
    if asymmetric is False or not np.isfinite(st.lo) or not np.isfinite(st.hi):
        return sym
    amax = scale * 127.0
    lo = min(max(st.lo, -amax), 0.0)
    hi = max(min(st.hi, amax), 0.0)
    if not hi - lo > 0:
        return sym
    s = max((hi - lo) / 255.0, SCALE_FLOOR)
    if asymmetric is None and not s <= ASYM_STEP_RATIO * scale:
        return sym
    zp = int(np.clip(np.rint(-lo / s), 0, 255))
    return CalibrationEntry.per_tensor(s, zp, DType.U8)


def degenerate_taps(
    graph: Graph, layers: Sequence[Layer], taps: Sequence[NodeId], stats: Sequence[TapStats]
) -> dict[NodeId, str]:
    """Taps whose calibration gives no usable int8 range, with the reason (see the module
    docstring). Raises QuantizationError for a tap that saw only non-finite values, a
    saturating range or a non-finite threshold (the data is broken); warns
    (QuantizationWarning) for NaN / Inf among finite values; a tap that saw only zeros,
    nothing, values without spread, or whose step is below the scale floor is returned:
    its layers stay in float."""
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
        if st.nonfinite > 0:
            warnings.warn(
                f"quantize: {what} saw {st.nonfinite} NaN/Inf values among "
                f"{st.finite + st.nonfinite} during calibration (NaN/Inf in the data, or an "
                "overflow in the float model); its int8 range is that of the finite values: "
                "check the calibration data",
                QuantizationWarning,
                stacklevel=3,
            )
        if st.max_abs == 0.0:
            seen = "no value at all" if st.finite == 0 else f"only zeros ({st.finite} values)"
            out[t] = (
                f"{what} saw {seen} during calibration: no range to calibrate (scale 0), "
                "so int8 would saturate every real input"
            )
            continue
        if not st.max_abs < SATURATION_LIMIT:
            raise QuantizationError(
                f"quantize: {what} saw values up to {st.max_abs:.4g} in magnitude during "
                f"calibration (range [{st.lo:.4g}, {st.hi:.4g}]): at or above "
                f"{SATURATION_LIMIT:.3g}, where the square of a value overflows f32, so "
                "this range cannot describe the inputs of a working f32 model (its int8 "
                f"step {st.max_abs / 127:.3g} would quantize every ordinary input to 0); "
                f"check the calibration data, or exclude={users}"
            )
        thr = st.threshold
        if not (math.isfinite(thr) and math.isfinite(st.scale) and thr >= 0):
            raise QuantizationError(
                f"quantize: {what} has a non-finite calibration threshold {thr} (scale "
                f"{st.scale}) with max |x| {st.max_abs:.4g}; check the calibration data, "
                f"or exclude={users}"
            )
        spread = st.hi - st.lo
        if spread < st.max_abs / 127.0:
            seen = (
                f"a single value ({st.lo:.6g})"
                if spread == 0
                else f"values within [{st.lo:.6g}, {st.hi:.6g}]"
            )
            out[t] = (
                f"{what} saw {seen} in {st.finite} values during calibration: no spread "
                f"(less than one int8 step, max |x| / 127 = {st.max_abs / 127:.3g}): int8 "
                "cannot tell them apart and their range says nothing about real inputs; "
                "calibrate on real inputs"
            )
            continue
        if thr / 127.0 < SCALE_FLOOR:
            levels = int(thr / SCALE_FLOOR)
            out[t] = (
                f"{what} has calibrated range {thr:.3g} (max |x| {st.max_abs:.3g}): its int8 "
                f"step {thr / 127.0:.3g} is below the scale floor {SCALE_FLOOR:g}, which would "
                f"leave it {levels} of 127 levels"
                + (" (every value would quantize to 0)" if thr < SCALE_FLOOR / 2 else "")
                + "; scale the tensor up to quantize it"
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
