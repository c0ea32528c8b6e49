"""ONNX import: ``rlx.onnx.load(path | bytes | ModelProto) -> OnnxModel`` (a GraphModule at
MIR stage plus its params). Needs the ``onnx`` package (``pip install 'rlx[onnx]'``).

``loader.py`` reads and checks the model and builds the graph; ``tensors.py`` turns
initializers (inline or external data) into arrays; ``dtypes.py`` maps element types;
``ops/`` holds the converter table (one module per op family); ``control.py`` converts
If / Loop / Scan into rlx control flow; ``symbolic.py`` evaluates shape arithmetic over
symbolic dims (values computed from ``Shape`` of a dynamic axis)."""

from __future__ import annotations

try:
    import onnx as _onnx  # noqa: F401
except ImportError as _e:  # pragma: no cover - exercised in an environment without onnx
    from rlx.errors import ModelError

    raise ModelError(
        "rlx.onnx needs the 'onnx' package, which is not installed: "
        "pip install 'rlx[onnx]' (the onnx extra)"
    ) from _e

from rlx.frontends.onnx.errors import NeedsConstantError, OnnxImportError, OnnxUnsupportedError
from rlx.frontends.onnx.loader import OnnxModel, load, read_model
from rlx.frontends.onnx.ops import supported_op_types

__all__ = [
    "load",
    "read_model",
    "OnnxModel",
    "OnnxImportError",
    "OnnxUnsupportedError",
    "NeedsConstantError",
    "supported_op_types",
]
