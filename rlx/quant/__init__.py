"""Post-training quantization: calibration records, Q/DQ insertion, lowering of
Q/DQ-bracketed matmuls and convs to integer kernels, dynamic (per-row) activation
lowering, SmoothQuant, and the one-call ``rlx.quantize``.

Names are imported on first use (``rlx.quant.insert_q_dq``), so importing the package
stays cheap (the packed-weight layouts live in ``rlx.formats``).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "CalibrationEntry": "rlx.quant.record",
    "CalibrationRecord": "rlx.quant.record",
    "insert_q_dq": "rlx.quant.record",
    "QuantLowering": "rlx.quant.lower",
    "LoweringDecision": "rlx.quant.lower",
    "ExpandFusedMatMuls": "rlx.quant.lower",
    "quantize_weight": "rlx.quant.lower",
    "quantize": "rlx.quant.api",
    "QuantizeResult": "rlx.quant.api",
    "AccuracyReport": "rlx.quant.report",
    "fake_quant_graph": "rlx.quant.api",
    "find_layers": "rlx.quant.api",
    "dequantize_rows": "rlx.formats.gguf",
    "DynamicLowering": "rlx.quant.dynamic",
    "smooth_graph": "rlx.quant.smooth",
    "SmoothResult": "rlx.quant.smooth",
    "canonical_weights": "rlx.quant.layers",
    "VariantBuilder": "rlx.quant.mix",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rlx.quant' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value
