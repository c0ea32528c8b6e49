"""PyTorch import: ``rlx.from_torch(module, example_inputs, dynamic_shapes=...) ->
TorchModel`` (a GraphModule at MIR stage plus its params, as ``rlx.onnx.load`` returns an
OnnxModel). Needs PyTorch (``pip install 'rlx[torch]'``); importing this package does not
import torch, calling ``from_torch`` does.

``export.py`` is the entry (torch.export, the decomposition fallback, :class:`TorchModel`);
``program.py`` walks the exported graph; ``context.py`` is what a converter sees;
``dims.py`` maps dtypes and symbolic sizes; ``aten/`` holds the one ATen table (one
module per op family); ``errors.py`` the errors."""

from __future__ import annotations

from rlx.frontends.torch.errors import TorchImportError, TorchUnsupportedError
from rlx.frontends.torch.export import TorchModel, from_torch

__all__ = [
    "from_torch",
    "TorchModel",
    "TorchImportError",
    "TorchUnsupportedError",
    "supported_aten_ops",
]


def supported_aten_ops() -> list[str]:
    """The ATen op names rlx maps (``name`` or ``name.overload``), sorted."""
    from rlx.frontends.torch.aten import supported_aten_ops as _ops

    return _ops()
