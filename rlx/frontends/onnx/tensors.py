"""ONNX TensorProto -> NumPy array, checked. In: a TensorProto (inline bytes, typed fields
or external data) and the model's directory. Out: an array with the tensor's dims and
dtype; a byte count that does not match the dims, a missing or short external data file,
an offset or length that is not a non-negative integer, a location outside the model's
directory (``..``, absolute, or a symlink, of the file or of a directory on its way, that
leads out of it) or one that is not a regular file (a directory, a FIFO) is an
OnnxImportError naming the tensor."""

from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from rlx.frontends.onnx.dtypes import to_dtype, type_name
from rlx.frontends.onnx.errors import OnnxImportError

__all__ = ["to_array"]

_FIELD: dict[int, str] = {
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


_UINT = re.compile(r"[0-9]+")


def _uint(where: str, loc: str, info: dict[str, str], key: str, default: int) -> int:
    """External data field ``key`` (``offset`` / ``length``): a non-negative integer."""
    if key not in info:
        return default
    text = info[key]
    if not _UINT.fullmatch(text):
        raise OnnxImportError(
            f"{where}: external data {key} {text!r} of location {loc!r} must be a "
            f"non-negative integer (a byte count in decimal digits)"
        )
    return int(text)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "named pipe (FIFO)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def _resolve(where: str, loc: str, base_dir: Path) -> str:
    """The real path of ``base_dir / loc``: it must exist and, with every symlink on the
    way followed, stay inside the model's (real) directory."""
    path = os.path.join(base_dir, loc)
    try:
        base = os.path.realpath(base_dir, strict=True)
        real = os.path.realpath(path, strict=True)
    except (OSError, ValueError) as e:  # missing, a symlink loop, a NUL in the name
        raise OnnxImportError(
            f"{where}: external data file {path!r} (location {loc!r}) does not exist or "
            f"cannot be resolved: {e}"
        ) from None
    if os.path.commonpath([base, real]) != base:
        raise OnnxImportError(
            f"{where}: external data location {loc!r} resolves (through a symlink) to "
            f"{real!r}, outside the model's directory {base!r}; the data file must be "
            f"inside that directory"
        )
    return real


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
    offset = _uint(where, loc, info, "offset", 0)
    length = _uint(where, loc, info, "length", nbytes)
    if length != nbytes:
        raise OnnxImportError(
            f"{where}: external data length {length} bytes, but dims {list(t.dims)} of "
            f"{type_name(t.data_type)} need {nbytes}"
        )
    real = _resolve(where, loc, base_dir)
    # O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a
    # writer; O_NOFOLLOW: the resolved name cannot have been swapped for a symlink since
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(real, flags)
    except OSError as e:
        raise OnnxImportError(
            f"{where}: cannot open external data file {real!r} (location {loc!r}): {e}"
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OnnxImportError(
            f"{where}: external data location {loc!r} ({real!r}) is a "
            f"{_kind(st.st_mode)}; want a regular file"
        )
    with os.fdopen(fd, "rb") as f:
        size = st.st_size
        if offset + length > size:
            raise OnnxImportError(
                f"{where}: external data [{offset}, {offset + length}) of location {loc!r} "
                f"lies past the end of {real!r} ({size} bytes): the file is truncated or "
                f"the offset / length are wrong"
            )
        f.seek(offset)
        raw = f.read(length)
    if len(raw) != length:
        raise OnnxImportError(
            f"{where}: read {len(raw)} of the {length} bytes at offset {offset} of "
            f"{real!r} (location {loc!r}): the file shrank while it was read"
        )
    return raw


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
