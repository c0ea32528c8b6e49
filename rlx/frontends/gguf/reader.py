"""Read a GGUF file. In: a path. Out: a :class:`GgufFile` (metadata as Python values,
``general.architecture``, and every tensor as a :class:`~rlx.frontends.gguf.tensor.GgufTensor`
whose data is a zero-copy view of the memory-mapped file).

The header (GGUF v2 / v3, little-endian) is parsed here rather than with
``gguf.GGUFReader``: the reader builds one numpy view per array element, which takes
about 10 s for the 262k-token vocabulary of Gemma 3; this parser takes a fraction of a
second (strings are decoded in one pass, numeric arrays are one ``np.frombuffer``). The
type tables come from the ``gguf`` package, and the tests check the result field by
field and tensor by tensor against ``gguf.GGUFReader``.

Everything is checked before anything is returned: the magic, the version, every read
against the file size, value and tensor types, duplicate keys or tensor names, the
alignment, each tensor's first dim against its block size, each tensor's bytes inside
the file and not overlapping another's. Any failure is a :class:`~rlx.errors.GgufError`
naming the key, tensor or offset.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import GgufError
from rlx.formats.schemes import GGUF_SCHEMES
from rlx.frontends.gguf.tensor import PLAIN_TYPES, GgufTensor, type_layout

__all__ = ["GgufFile", "load", "VALUE_TYPES"]

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NESTING = 8  # arrays of arrays of ...: deeper is a malformed file, not recursion

#: GGUF metadata value type id -> (name, struct format or None for string / array)
VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("UINT8", "<B"),
    1: ("INT8", "<b"),
    2: ("UINT16", "<H"),
    3: ("INT16", "<h"),
    4: ("UINT32", "<I"),
    5: ("INT32", "<i"),
    6: ("FLOAT32", "<f"),
    7: ("BOOL", "<?"),
    8: ("STRING", None),
    9: ("ARRAY", None),
    10: ("UINT64", "<Q"),
    11: ("INT64", "<q"),
    12: ("FLOAT64", "<d"),
}
_NP = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 10: "<u8", 11: "<i8"}
_NP.update({12: "<f8", 7: "u1"})


@dataclass(eq=False)
class GgufFile:
    """A parsed GGUF file: ``metadata`` (key -> str / int / float / bool / list),
    ``value_types`` (key -> GGUF value type name, ``"ARRAY[FLOAT32]"`` for arrays),
    ``tensors`` (name -> :class:`GgufTensor`, in file order), ``version``, ``alignment``
    and ``data_offset`` (where the tensor data starts)."""

    path: Path
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, str]
    tensors: dict[str, GgufTensor]
    alignment: int
    data_offset: int
    _map: Any = field(default=None, repr=False)

    @property
    def architecture(self) -> str | None:
        """``general.architecture`` (e.g. ``"gemma3"``, ``"llama"``), None if absent."""
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def __repr__(self) -> str:
        return (
            f"GgufFile({str(self.path)!r}, architecture={self.architecture!r}, "
            f"{len(self.metadata)} keys, {len(self.tensors)} tensors)"
        )


class _Cursor:
    """Sequential little-endian reads over the mapped file, each checked against its size."""

    def __init__(self, buf: Any, size: int, path: Path):
        self.buf, self.size, self.pos, self.path = buf, size, 0, path

    def need(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise GgufError(
                f"GGUF file {str(self.path)!r} is truncated: {what} at offset {start} needs "
                f"{n} bytes, the file has {self.size - start} left ({self.size} bytes in all)"
            )
        self.pos = start + n
        return start

    def scalar(self, fmt: str, what: str) -> Any:
        at = self.need(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, at)[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        at = self.need(n, what)
        try:
            return bytes(self.buf[at : at + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise GgufError(f"GGUF {what} at offset {at} is not valid UTF-8: {e}") from None

    def strings(self, count: int, what: str) -> list[str]:
        buf, size, unpack = self.buf, self.size, struct.unpack_from
        pos, out = self.pos, []
        try:
            for _ in range(count):
                if pos + 8 > size:
                    raise IndexError
                n = unpack("<Q", buf, pos)[0]
                pos += 8
                if pos + n > size:
                    raise IndexError
                out.append(buf[pos : pos + n].decode("utf-8"))
                pos += n
        except IndexError:
            self.pos = pos
            self.need(size + 1 - pos, f"{what} element {len(out)}")
        except UnicodeDecodeError as e:
            raise GgufError(f"GGUF {what} element {len(out)} is not valid UTF-8: {e}") from None
        self.pos = pos
        return out

    def value(self, vtype: int, key: str, depth: int = 0) -> tuple[Any, str]:
        spec = VALUE_TYPES.get(vtype)
        if spec is None:
            raise GgufError(f"GGUF key {key!r}: unknown value type id {vtype} at {self.pos}")
        name, fmt = spec
        if fmt is not None:
            return self.scalar(fmt, f"value of {key!r}"), name
        if vtype == 8:
            return self.string(f"value of {key!r}"), name
        etype = self.scalar("<I", f"array type of {key!r}")
        count = self.scalar("<Q", f"array length of {key!r}")
        espec = VALUE_TYPES.get(etype)
        if espec is None:
            raise GgufError(f"GGUF key {key!r}: array of unknown value type id {etype}")
        if etype == 8:
            return self.strings(count, f"string array {key!r}"), f"ARRAY[{espec[0]}]"
        if etype == 9:
            if depth >= MAX_NESTING:
                raise GgufError(f"GGUF key {key!r}: arrays nested deeper than {MAX_NESTING}")
            items = [self.value(9, f"{key}[{i}]", depth + 1)[0] for i in range(count)]
            return items, "ARRAY[ARRAY]"
        dt = np.dtype(_NP[etype])
        at = self.need(count * dt.itemsize, f"array {key!r} of {count} {espec[0]}")
        arr = np.frombuffer(self.buf, dt, count, at)
        return (arr.astype(bool) if etype == 7 else arr).tolist(), f"ARRAY[{espec[0]}]"


def load(path: str | os.PathLike[str]) -> GgufFile:
    """Parse the GGUF file at ``path`` (memory-mapped, tensor data not copied) -> GgufFile.
    GgufError for anything malformed (see the module docstring)."""
    p = Path(path)
    if not p.is_file():  # as the ONNX loader: open() on a FIFO would wait for a writer
        raise GgufError(
            f"cannot open GGUF file {str(p)!r}: it does not exist or is not a regular file "
            f"(a directory, a FIFO or a device)"
        )
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                head = f.read(4)
                if head != MAGIC:
                    raise GgufError(
                        f"{str(p)!r} is not a GGUF file: magic {head!r}, want {MAGIC!r}"
                    )
                raise GgufError(f"GGUF file {str(p)!r} is truncated: {size} bytes, no header")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise GgufError(f"cannot open GGUF file {str(p)!r}: {e}") from None
    return _parse(mm, size, p)


def _parse(buf: Any, size: int, path: Path) -> GgufFile:
    cur = _Cursor(buf, size, path)
    magic = bytes(buf[0:4])
    if magic != MAGIC:
        raise GgufError(f"{str(path)!r} is not a GGUF file: magic {magic!r}, want {MAGIC!r}")
    cur.pos = 4
    version = cur.scalar("<I", "version")
    if version & 0xFFFF == 0 and version:
        raise GgufError(f"GGUF file {str(path)!r} is big-endian; rlx reads little-endian only")
    if version not in (2, 3):
        raise GgufError(f"GGUF file {str(path)!r} has version {version}; rlx reads 2 and 3")
    n_tensors = cur.scalar("<Q", "tensor count")
    n_kv = cur.scalar("<Q", "metadata count")
    if n_tensors > size or n_kv > size:  # each needs more than a byte
        raise GgufError(
            f"GGUF file {str(path)!r}: {n_tensors} tensors / {n_kv} keys cannot fit in {size} bytes"
        )
    metadata: dict[str, Any] = {}
    vtypes: dict[str, str] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key {i}")
        if key in metadata:
            raise GgufError(f"GGUF file {str(path)!r}: metadata key {key!r} appears twice")
        vtype = cur.scalar("<I", f"value type of {key!r}")
        metadata[key], vtypes[key] = cur.value(vtype, key)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in metadata and (
        vtypes["general.alignment"] != "UINT32" or alignment <= 0 or alignment & (alignment - 1)
    ):
        raise GgufError(
            f"GGUF file {str(path)!r}: general.alignment must be a UINT32 power of two, "
            f"given {vtypes['general.alignment']} {alignment!r}"
        )
    infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = _tensors(infos, buf, size, data_offset, alignment, path)
    return GgufFile(path, version, metadata, vtypes, tensors, alignment, data_offset, buf)


def _tensor_info(cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string(f"name of tensor {i}")
    n_dims = cur.scalar("<I", f"rank of tensor {name!r}")
    if n_dims > MAX_DIMS:
        raise GgufError(f"tensor {name!r}: rank {n_dims}, GGUF allows at most {MAX_DIMS}")
    ne = tuple(cur.scalar("<Q", f"dim {d} of tensor {name!r}") for d in range(n_dims))
    type_id = cur.scalar("<I", f"type of tensor {name!r}")
    offset = cur.scalar("<Q", f"offset of tensor {name!r}")
    return name, ne, type_id, offset


def _tensors(
    infos: list[tuple[str, tuple[int, ...], int, int]],
    buf: Any,
    size: int,
    data_offset: int,
    alignment: int,
    path: Path,
) -> dict[str, GgufTensor]:
    spans: list[tuple[int, int, str]] = []
    out: dict[str, GgufTensor] = {}
    for name, ne, type_id, rel in infos:
        if name in out:
            raise GgufError(f"GGUF file {str(path)!r}: tensor {name!r} appears twice")
        tname, qk, bb = type_layout(type_id, name)
        shape = tuple(int(d) for d in reversed(ne))
        if (ne[0] if ne else 1) % qk:
            raise GgufError(
                f"tensor {name!r}: {tname} packs the last dim in blocks of {qk}, but the "
                f"tensor has shape {list(shape)}"
            )
        count = int(np.prod(ne, dtype=object)) if ne else 1
        nbytes = count // qk * bb
        start = data_offset + rel
        if rel % alignment:
            raise GgufError(
                f"tensor {name!r}: data offset {rel} is not a multiple of the alignment {alignment}"
            )
        if start + nbytes > size:
            raise GgufError(
                f"tensor {name!r} ({tname} {list(shape)}, {nbytes} bytes) at file offset "
                f"{start} runs past the end of the file ({size} bytes): the file is "
                f"truncated or the tensor's shape or type is wrong"
            )
        spans.append((start, start + nbytes, name))
        if tname in PLAIN_TYPES:
            data = np.frombuffer(buf, PLAIN_TYPES[tname], count, start).reshape(shape)
            scheme = None
        else:
            row = shape[-1] // qk * bb
            data = np.frombuffer(buf, np.uint8, nbytes, start).reshape(*shape[:-1], row)
            scheme = GGUF_SCHEMES[tname]()
        out[name] = GgufTensor(name, tname, shape, scheme, data, start)
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise GgufError(
                f"tensor {a!r} (ends at file offset {end}) overlaps tensor {b!r} (starts "
                f"at {start}): a tensor's shape or type does not match its bytes"
            )
    return out
