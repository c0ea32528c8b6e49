"""ONNX TensorProto -> NumPy array, checked. In: a TensorProto (inline bytes, typed fields
or external data) and the model's directory. Out: an array with the tensor's dims and
dtype; a byte count that does not match the dims, a missing or short external data file,
or a location outside the model's directory is an OnnxImportError naming the tensor."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from rlx.frontends.onnx.dtypes import to_dtype, type_name
from rlx.frontends.onnx.errors import OnnxImportError

__all__ = ["to_array"]

_FIELD = {
    TensorProto.FLOAT: "float_data",
    TensorProto.DOUBLE: "double_data",
    TensorProto.INT64: "int64_data",
    TensorProto.UINT64: "uint64_data",
    TensorProto.COMPLEX64: "float_data",
    TensorProto.COMPLEX128: "double_data",
}

#: element types whose raw bytes are the NumPy array's bytes (little-endian)
_PLAIN = frozenset(
    {
        TensorProto.FLOAT,
        TensorProto.DOUBLE,
        TensorProto.FLOAT16,
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
    }
)


def _external(t: TensorProto, base_dir: Path | None, nbytes: int) -> bytes:
    info = {e.key: e.value for e in t.external_data}
    where = f"tensor {t.name!r}"
    loc = info.get("location")
    if not loc:
        raise OnnxImportError(f"{where}: external data without a 'location'")
    if base_dir is None:
        raise OnnxImportError(
            f"{where}: its data is in the external file {loc!r}, but the model was given "
            f"as bytes; load it from its path so rlx can find that file"
        )
    if os.path.isabs(loc) or ".." in Path(loc).parts:
        raise OnnxImportError(
            f"{where}: external data location {loc!r} must be a relative path inside the "
            f"model's directory {str(base_dir)!r}"
        )
    path = base_dir / loc
    if not path.is_file():
        raise OnnxImportError(f"{where}: external data file {str(path)!r} does not exist")
    offset = int(info.get("offset", 0))
    length = int(info.get("length", nbytes))
    if length != nbytes:
        raise OnnxImportError(
            f"{where}: external data length {length} bytes, but dims {list(t.dims)} of "
            f"{type_name(t.data_type)} need {nbytes}"
        )
    size = path.stat().st_size
    if offset < 0 or offset + length > size:
        raise OnnxImportError(
            f"{where}: external data [{offset}, {offset + length}) lies past the end of "
            f"{str(path)!r} ({size} bytes): the file is truncated"
        )
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def to_array(t: TensorProto, base_dir: Path | None = None) -> np.ndarray:
    """The array of tensor ``t`` (see the module docstring)."""
    dt = to_dtype(t.data_type, f"tensor {t.name!r}")
    dims = tuple(int(d) for d in t.dims)
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"tensor {t.name!r}: negative dim in {list(dims)}")
    n = math.prod(dims)
    npdt = helper.tensor_dtype_to_np_dtype(t.data_type)
    nbytes = n * np.dtype(npdt).itemsize
    if t.data_location == TensorProto.EXTERNAL:
        raw = _external(t, base_dir, nbytes)
        return np.frombuffer(raw, dtype=npdt).reshape(dims).astype(dt.np, copy=True)
    if t.HasField("raw_data"):
        raw = t.raw_data  # each read of the field copies the bytes: read it once
        if len(raw) != nbytes:
            raise OnnxImportError(
                f"tensor {t.name!r}: {len(raw)} bytes of data, but dims {list(dims)} "
                f"of {type_name(t.data_type)} need {nbytes}"
            )
        if t.data_type in _PLAIN and np.little_endian:  # numpy_helper would copy them again
            return np.frombuffer(raw, dtype=npdt).reshape(dims).astype(dt.np, copy=False)
    else:
        field = _FIELD.get(t.data_type, "int32_data")
        count = len(getattr(t, field))
        want = 2 * n if t.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128) else n
        if count != want:
            raise OnnxImportError(
                f"tensor {t.name!r}: {count} values in {field}, but dims {list(dims)} need {want}"
            )
    return np.asarray(numpy_helper.to_array(t)).astype(dt.np, copy=False).reshape(dims)
