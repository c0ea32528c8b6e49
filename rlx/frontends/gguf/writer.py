"""Write a GGUF file. In: named tensors (numpy arrays, or :class:`GgufTensor` copied as
they are), a default scheme and per-tensor schemes, metadata. Out: a GGUF v3 file
written with ``gguf.GGUFWriter``, quantized with rlx's packers (:mod:`rlx.quant.pack`:
the GGUF block bytes), which ``gguf.GGUFReader`` and :func:`rlx.gguf.load` read back
bit-exactly; :func:`save` returns the ggml type written for each tensor.

A scheme is a GGUF :class:`~rlx.formats.schemes.QuantScheme` (``GgufQ4K()``), a ggml type
name (``"Q4_K"``, ``"F16"``, ``"BF16"``, ``"F32"``) or None (float arrays as F32, integer
arrays as their own type). The default ``scheme`` applies to the tensors that can hold
it (rank >= 2, last dim a multiple of its block); 1-D tensors (norms, biases) and the
others stay F32, as llama.cpp's converter keeps them. A per-tensor scheme that cannot
apply is a GgufError naming the tensor. Everything is packed before the file is opened,
and the file is written to a temporary name and renamed: a failure leaves no file.

:func:`save_graph_weights` writes the params of an rlx graph: a param read as a matmul
weight ``W [K, N]`` (``y = x @ W``) is stored transposed, as the GGUF ``(N, K)`` weight
(``y = x @ W.T``), so its packed rows are what ``DequantMatMul`` reads.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from rlx.errors import GgufError, QuantizationError
from rlx.formats.schemes import GGUF_SCHEMES, QuantScheme
from rlx.frontends.gguf.reader import VALUE_TYPES
from rlx.frontends.gguf.tensor import PLAIN_TYPES, GgufTensor
from rlx.quant.pack import can_pack, pack

__all__ = ["save", "save_graph_weights"]

Scheme = QuantScheme | str | None
_FLOAT_TYPES = ("F32", "F16", "BF16")
_NP_TO_TYPE = {v.newbyteorder("<"): k for k, v in PLAIN_TYPES.items() if k != "BF16"}


def _type_name(scheme: Scheme, name: str) -> str | None:
    if scheme is None:
        return None
    if isinstance(scheme, QuantScheme):
        if not scheme.is_gguf:
            raise GgufError(
                f"tensor {name!r}: {scheme} is not a GGUF scheme; GGUF holds "
                f"{', '.join([*_FLOAT_TYPES, *GGUF_SCHEMES])}"
            )
        return type(scheme).gguf_name  # type: ignore[attr-defined]
    if scheme in GGUF_SCHEMES or scheme in _FLOAT_TYPES:
        return scheme
    raise GgufError(
        f"tensor {name!r}: scheme {scheme!r} is not a GGUF type rlx writes; one of "
        f"{', '.join([*_FLOAT_TYPES, *GGUF_SCHEMES])}"
    )


def _why_not(tname: str, arr: np.ndarray) -> str | None:
    """None when ``arr`` can be written as ``tname``, else the reason."""
    if tname in _FLOAT_TYPES:
        return None if arr.dtype.kind == "f" else f"{arr.dtype} is not a float array"
    if arr.ndim < 2:
        return f"{tname} needs a weight of rank >= 2, the tensor has shape {list(arr.shape)}"
    scheme = GGUF_SCHEMES[tname]()
    return can_pack(scheme, arr.shape[-1])


def _encode(name: str, arr: np.ndarray, tname: str | None) -> tuple[str, np.ndarray]:
    """-> (ggml type name, the array GGUFWriter takes: typed for plain types, else u8 bytes
    of shape (*shape[:-1], row_bytes))."""
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if tname is None:
        if arr.dtype == ml_dtypes.bfloat16:
            tname = "BF16"
        elif arr.dtype.kind == "f":
            tname = "F16" if arr.dtype == np.float16 else "F32"
        else:
            t = _NP_TO_TYPE.get(arr.dtype.newbyteorder("<"))
            if t is None:
                raise GgufError(f"tensor {name!r}: GGUF has no type for {arr.dtype} arrays")
            return t, np.ascontiguousarray(arr, PLAIN_TYPES[t])
    if tname == "F32":
        return tname, np.ascontiguousarray(arr, np.float32)
    if tname == "F16":
        return tname, np.ascontiguousarray(arr, np.float16)
    if tname == "BF16":
        b = np.ascontiguousarray(arr).astype(np.float32).astype(ml_dtypes.bfloat16)
        return tname, b.view(np.uint8)
    try:
        (packed,) = pack(GGUF_SCHEMES[tname](), arr.reshape(-1, arr.shape[-1]), name)
    except QuantizationError as e:
        raise GgufError(f"cannot write tensor {name!r} as {tname}: {e}") from None
    return tname, packed.reshape(*arr.shape[:-1], packed.shape[-1])


def save(
    path: str | os.PathLike[str],
    tensors: Mapping[str, np.ndarray | GgufTensor],
    scheme: Scheme = None,
    metadata: Mapping[str, Any] | None = None,
    schemes: Mapping[str, Scheme] | None = None,
    metadata_types: Mapping[str, str] | None = None,
    architecture: str | None = None,
) -> dict[str, str]:
    """Write ``tensors`` to a GGUF file at ``path`` -> {tensor name: ggml type written}.

    ``scheme`` is the default for tensors that can hold it, ``schemes`` per tensor (None
    there keeps the tensor float). ``metadata`` values: str, int, float, bool or lists of
    one of them; ``metadata_types`` (e.g. ``GgufFile.value_types``) names their GGUF
    types, else int is UINT32 (INT32 if negative, 64-bit if larger), float FLOAT32.
    ``general.architecture`` comes from ``architecture``, else the metadata, else "rlx".
    A GgufTensor is written with its own type and bytes unless a scheme is given for it
    (then it is decoded and re-packed)."""
    import gguf

    schemes = dict(schemes or {})
    unknown = sorted(set(schemes) - set(tensors))
    if unknown:
        raise GgufError(f"schemes name tensors that are not given: {unknown}")
    planned: list[tuple[str, str, np.ndarray]] = []
    for name, value in tensors.items():
        if isinstance(value, GgufTensor) and name not in schemes and scheme is None:
            raw = value.data.view(np.uint8) if value.type_name == "BF16" else value.data
            planned.append((name, value.type_name, np.ascontiguousarray(raw)))
            continue
        arr = value.dequantize() if isinstance(value, GgufTensor) else np.asarray(value)
        if name in schemes:
            tname = _type_name(schemes[name], name)
            why = None if tname is None else _why_not(tname, arr)
            if why is not None:
                raise GgufError(f"tensor {name!r} {list(arr.shape)}: {why}")
        else:
            tname = _type_name(scheme, name)
            if tname is not None and (arr.ndim < 2 or _why_not(tname, arr) is not None):
                tname = None if arr.dtype.kind != "f" else "F32"
        planned.append((name, *_encode(name, arr, tname)))
    md = dict(metadata or {})
    arch = architecture or md.pop("general.architecture", None) or "rlx"
    md.pop("general.architecture", None)
    kv = [(k, *_value(k, v, (metadata_types or {}).get(k), gguf)) for k, v in md.items()]

    dest = Path(path)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        w = gguf.GGUFWriter(str(tmp), arch=str(arch))
        for k, v, vtype, sub in kv:
            if k == "general.alignment":
                w.data_alignment = int(v)
            w.add_key_value(k, v, vtype, sub)
        if "general.quantization_version" not in md and any(
            t in GGUF_SCHEMES for _, t, _ in planned
        ):
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for name, tname, arr in planned:
            qt = gguf.GGMLQuantizationType[tname]
            raw = tname in GGUF_SCHEMES or tname == "BF16"
            w.add_tensor(name, arr, raw_dtype=qt if raw else None)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {name: tname for name, tname, _ in planned}


def _value(key: str, v: Any, type_name: str | None, gguf: Any) -> tuple[Any, Any, Any]:
    """A metadata value -> (value, GGUFValueType, array sub type or None), checked to fit
    its type (GgufError naming the key otherwise)."""
    VT = gguf.GGUFValueType
    if type_name is not None:
        sub = None
        if type_name.startswith("ARRAY[") and type_name.endswith("]"):
            sub, type_name = VT.__members__.get(type_name[6:-1]), "ARRAY"
        vt = VT.__members__.get(type_name)
        if vt is None or (type_name == "ARRAY" and sub in (None, VT.ARRAY)):
            raise GgufError(f"metadata {key!r}: value type {type_name!r} cannot be written")
    elif isinstance(v, list | tuple):
        if not v:
            raise GgufError(f"metadata {key!r}: GGUF cannot hold an empty array")
        vt, sub = VT.ARRAY, _common_type(key, [_scalar_type(key, x, VT) for x in v], v, VT)
    else:
        vt, sub = _scalar_type(key, v, VT), None
    items = list(v) if vt == VT.ARRAY and isinstance(v, list | tuple) else None
    if vt == VT.ARRAY and items is None:
        raise GgufError(f"metadata {key!r}: an ARRAY value must be a list, given {v!r}")
    for x in items if items is not None else [v]:
        _check_fits(key, x, (sub if items is not None else vt).name)
    return (items if items is not None else v), vt, sub


def _check_fits(key: str, x: Any, type_name: str) -> None:
    if type_name in ("STRING", "BOOL"):
        if not isinstance(x, str if type_name == "STRING" else bool | np.bool_):
            raise GgufError(f"metadata {key!r}: {x!r} is not a {type_name}")
        return
    fmt = {v[0]: v[1] for v in VALUE_TYPES.values()}[type_name]
    try:
        struct.pack(fmt, x)
    except (struct.error, TypeError, OverflowError):
        raise GgufError(f"metadata {key!r}: {x!r} does not fit {type_name}") from None
    if type_name in ("FLOAT32", "FLOAT64") and isinstance(x, bool | str):
        raise GgufError(f"metadata {key!r}: {x!r} is not a {type_name}")


def _common_type(key: str, kinds: list[Any], v: Any, VT: Any) -> Any:
    """One element type for a list: its elements' type, or for mixed numbers the
    narrowest integer type that holds them all (FLOAT32 when floats are among them)."""
    kset = set(kinds)
    if len(kset) == 1:
        return kinds[0]
    ints = {VT.UINT32, VT.INT32, VT.UINT64, VT.INT64}
    if kset <= ints:
        lo, hi = min(int(x) for x in v), max(int(x) for x in v)
        if -(2**31) <= lo and hi < 2**31:
            return VT.INT32
        return VT.INT64 if hi < 2**63 else VT.UINT64
    if kset <= ints | {VT.FLOAT32}:
        return VT.FLOAT32
    raise GgufError(
        f"metadata {key!r}: a GGUF array holds one type, the list mixes "
        f"{sorted(k.name for k in kset)}"
    )


def _scalar_type(key: str, v: Any, VT: Any) -> Any:
    if isinstance(v, bool | np.bool_):
        return VT.BOOL
    if isinstance(v, int | np.integer):
        v = int(v)
        if 0 <= v < 2**32:
            return VT.UINT32
        if -(2**31) <= v < 0:
            return VT.INT32
        return VT.UINT64 if v >= 2**63 else VT.INT64
    if isinstance(v, float | np.floating):
        return VT.FLOAT32
    if isinstance(v, str):
        return VT.STRING
    raise GgufError(f"metadata {key!r}: GGUF cannot hold a {type(v).__name__} value")


def save_graph_weights(
    path: str | os.PathLike[str],
    graph: Any,
    params: Mapping[str, np.ndarray],
    scheme: Scheme = None,
    schemes: Mapping[str, Scheme] | None = None,
    metadata: Mapping[str, Any] | None = None,
    architecture: str = "rlx",
) -> dict[str, str]:
    """Write the ``params`` of ``graph`` (a Graph or GraphModule) -> {name: ggml type}.
    Params read as a matmul weight ``[K, N]`` are stored transposed ``(N, K)`` and take
    ``scheme`` where K allows; the others are written as they are (floats F32)."""
    from rlx.passes.pipeline import to_mir
    from rlx.quant.layers import find_layers

    layers, _ = find_layers(to_mir(graph), params)
    weights = {ly.name for ly in layers if ly.name in params}
    out: dict[str, np.ndarray] = {}
    per: dict[str, Scheme] = dict(schemes or {})
    for name, value in params.items():
        arr = np.asarray(value)
        if name in weights:
            out[name] = np.ascontiguousarray(arr.T)
        else:
            out[name] = arr
            if name not in per and scheme is not None:
                per[name] = None if arr.dtype.kind != "f" else "F32"
    return save(path, out, scheme, metadata, per, architecture=architecture)
