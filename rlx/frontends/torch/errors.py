"""The PyTorch importer's errors: rlx.errors subclasses naming the ATen op, the module path
that produced it (from the node's ``nn_module_stack``) and the model's source line."""

from __future__ import annotations

from rlx.errors import ModelError, UnsupportedOpError

__all__ = ["TorchImportError", "TorchUnsupportedError"]


class TorchImportError(ModelError):
    """A module rlx cannot import: torch missing, ``torch.export`` failing, a training-mode
    module that mutates its buffers, an input or output rlx cannot represent."""


class TorchUnsupportedError(UnsupportedOpError):
    """An ATen op (or a form of one) with no rlx mapping. ``op`` is the ATen op
    (``aten.cummax.default``), ``module_path`` the submodule that called it (``''`` for
    the root module) and ``source`` its ``file:line`` when torch recorded it."""

    def __init__(self, message: str, *, op: str = "", module_path: str = "", source: str = ""):
        super().__init__(message)
        self.op = op
        self.module_path = module_path
        self.source = source
