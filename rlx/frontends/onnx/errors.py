"""The ONNX importer's errors: rlx.errors subclasses that name the file, node or tensor."""

from __future__ import annotations

from rlx.errors import ModelError, UnsupportedOpError

__all__ = ["OnnxImportError", "OnnxUnsupportedError", "NeedsConstantError"]


class OnnxImportError(ModelError):
    """A model that cannot be read or is malformed (checker failure, missing external data,
    truncated file, a tensor whose bytes do not match its dims)."""


class OnnxUnsupportedError(UnsupportedOpError):
    """An ONNX op (or an attribute, dtype or input form of one) that rlx cannot import.
    ``op_type``, ``domain`` and ``opset`` say which."""

    def __init__(self, message: str, *, op_type: str = "", domain: str = "", opset: int = 0):
        super().__init__(message)
        self.op_type = op_type
        self.domain = domain
        self.opset = opset


class NeedsConstantError(OnnxImportError):
    """A node needs the value of an input when importing (a Reshape's shape, a Slice's
    starts) and that input is a graph input: rlx compiles static shapes. ``input_name``
    names the graph input; pass its value in ``load(..., constant_inputs={name: array})``."""

    def __init__(self, message: str, *, input_name: str):
        super().__init__(message)
        self.input_name = input_name
