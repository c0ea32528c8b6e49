"""``onnx.checker`` without re-serialising the weights. In: a ModelProto whose large
initializers the loader has already read and checked (:func:`~rlx.frontends.onnx.tensors.
to_array`: byte counts, external files). Out: the checker's verdict on the model's
structure (opsets, nodes, graph inputs / outputs, names, attributes), or its
ValidationError.

``onnx.checker.check_model(model)`` serialises the whole model to hand it to C++: 0.8 s of
the 1.1 s it took on all-MiniLM-L6-v2 (88 MB). The checker is run instead on a light
copy whose initializers above :data:`STUB_BYTES` keep their name, type and an
one-element shape with zero data (the user's ModelProto is not modified); what the
stubs no longer show it (a tensor's byte count against its dims, a missing external
file) the loader has checked already when it read the tensors."""

from __future__ import annotations

import math

import onnx
from google.protobuf.message import Message
from onnx import ModelProto, TensorProto, helper

__all__ = ["check_model", "STUB_BYTES"]

STUB_BYTES = 1 << 16  # initializers holding more than this many bytes are stubbed


def _nbytes(t: TensorProto) -> int:
    """The tensor's size from its dims (reading ``raw_data`` would copy the bytes)."""
    if t.data_location == TensorProto.EXTERNAL:
        return STUB_BYTES + 1  # read (and checked) from its file by the loader
    if t.HasField("raw_data"):
        item = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        return math.prod(t.dims) * item
    return 0  # typed fields: small in practice, copied as they are


def _stub(t: TensorProto) -> TensorProto:
    s = TensorProto(name=t.name, data_type=t.data_type, dims=[1] if t.dims else [])
    item = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    s.raw_data = b"\0" * item
    return s


def _repeated(fd: object) -> bool:
    rep = getattr(fd, "is_repeated", None)  # protobuf >= 5; older ones have ``label``
    return bool(rep) if rep is not None else fd.label == fd.LABEL_REPEATED  # type: ignore[attr-defined]


def _copy_fields(src: Message, dst: Message, skip: str) -> None:
    """Every set field of ``src`` but ``skip`` into ``dst``."""
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        if _repeated(fd):
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def check_model(m: ModelProto) -> None:
    """``onnx.checker.check_model`` on a copy of ``m`` with its large initializers stubbed
    (see the module docstring); raises ``onnx.checker.ValidationError``."""
    light = ModelProto()
    _copy_fields(m, light, "graph")
    if m.HasField("graph"):
        _copy_fields(m.graph, light.graph, "initializer")
        light.graph.initializer.extend(
            _stub(t) if _nbytes(t) > STUB_BYTES else t for t in m.graph.initializer
        )
    onnx.checker.check_model(light)
