"""The argument checks of :func:`rlx.quant.quantize`: the calibration method, the
activation kind, the accuracy budget, SmoothQuant's alpha and the dynamic mode."""

from __future__ import annotations

from rlx.errors import QuantizationError
from rlx.ops.qmatmul import ActQuant
from rlx.quant.calibrate import CalibrationMethod

__all__ = ["check_args"]


#: ``method=`` strings accepted by :func:`quantize`.
_METHODS: dict[str, CalibrationMethod] = {
    "minmax": CalibrationMethod.MAX_ABS,
    "max_abs": CalibrationMethod.MAX_ABS,
    "percentile": CalibrationMethod.PERCENTILE,
    "entropy": CalibrationMethod.ENTROPY,
}
_ACTIVATIONS = ("static", "dynamic")


def check_args(
    method: CalibrationMethod | str,
    activations: str,
    accuracy_budget: float | None,
    smooth_alpha: float | None,
    dynamic_mode: str,
) -> tuple[CalibrationMethod, ActQuant]:
    """The checked calibration method and dynamic activation mode of a ``quantize`` call;
    QuantizationError naming the argument otherwise."""
    meth = _METHODS.get(method) if isinstance(method, str) else method
    if not isinstance(meth, CalibrationMethod):
        raise QuantizationError(
            f"unknown calibration method {method!r}; expected one of {sorted(_METHODS)} or a CalibrationMethod"
        )
    if activations not in _ACTIVATIONS:
        raise QuantizationError(
            f"activations must be one of {list(_ACTIVATIONS)}, got {activations!r}"
        )
    if accuracy_budget is not None and not accuracy_budget > 0:
        raise QuantizationError(
            f"accuracy_budget must be > 0 (a relative error), got {accuracy_budget}"
        )
    if smooth_alpha is not None and not (
        isinstance(smooth_alpha, (int, float)) and 0.0 <= smooth_alpha <= 1.0
    ):
        raise QuantizationError(f"smooth_alpha must be a number in [0, 1], got {smooth_alpha!r}")
    try:
        mode = ActQuant.parse(dynamic_mode)
    except ValueError:
        raise QuantizationError(
            f"dynamic_mode must be 's8' or 'u8', got {dynamic_mode!r}"
        ) from None
    return meth, mode
