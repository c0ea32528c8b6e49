"""ONNX tensor element types <-> rlx DTypes. In: a TensorProto.DataType code. Out: the
DType, or OnnxUnsupportedError naming the type when rlx has no such dtype."""

from __future__ import annotations

from onnx import TensorProto

from rlx.dtype import DType
from rlx.frontends.onnx.errors import OnnxUnsupportedError

__all__ = ["to_dtype", "to_onnx_type", "type_name"]

_T = TensorProto
_MAP: dict[int, DType] = {
    _T.FLOAT: DType.F32,
    _T.FLOAT16: DType.F16,
    _T.BFLOAT16: DType.BF16,
    _T.DOUBLE: DType.F64,
    _T.INT8: DType.I8,
    _T.INT16: DType.I16,
    _T.INT32: DType.I32,
    _T.INT64: DType.I64,
    _T.UINT8: DType.U8,
    _T.UINT32: DType.U32,
    _T.BOOL: DType.BOOL,
    _T.COMPLEX64: DType.C64,
    _T.FLOAT8E4M3FN: DType.F8E4M3,
    _T.FLOAT8E5M2: DType.F8E5M2,
}
_BACK = {v: k for k, v in _MAP.items()}


def type_name(code: int) -> str:
    """The ONNX name of element type ``code`` ('FLOAT', 'UINT16', ...)."""
    try:
        return TensorProto.DataType.Name(code)
    except ValueError:
        return f"<unknown type {code}>"


def to_dtype(code: int, what: str) -> DType:
    """The DType of ONNX element type ``code``; ``what`` names the tensor in the error."""
    try:
        return _MAP[code]
    except KeyError:
        supported = ", ".join(type_name(c) for c in _MAP)
        raise OnnxUnsupportedError(
            f"{what}: ONNX element type {type_name(code)} has no rlx dtype "
            f"(rlx imports {supported})",
            op_type=f"dtype:{type_name(code)}",
        ) from None


def to_onnx_type(dt: DType) -> int:
    """The ONNX element type code of ``dt``."""
    return _BACK[dt]
