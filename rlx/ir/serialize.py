"""Graph files. In: a MIR graph and optional weights. Out: one versioned, checksummed
file (``save`` / ``dumps``), and back (``load`` / ``loads``).

Layout (all integers little-endian)::

    b"RLXG"  u32 version  u64 header_len  u64 blob_len      24-byte prelude
    header: UTF-8 JSON, space-padded so the blobs start 64-byte aligned
    blobs: constants and params, each padded to 64 bytes, back to back
    sha256 of everything above (32 bytes)

The header holds the graph (nodes: op mnemonic, attributes, inputs, shape, optional
source line; outputs; symbolic-dim bounds), its sub-graphs (a flat table, children first,
so no depth of nesting makes the JSON or the code that walks it recurse), the params
(name, dtype, dims, blob) and the blob table (offset, length). How attributes are encoded,
and how decoding checks them, is in :mod:`rlx.ir.serialize_codec`. Version 2 added the
sub-graph table; version 1 files (sub-graphs nested in place) still load.

``load`` takes the file's size from the open file (``os.fstat``) and checks the magic, the
version and that the prelude's lengths add up to exactly that size before it reads
anything else; then it reads the header (bounded reads, never more than the prelude
declares) and checks that the blob table accounts for the whole blob section before it
reads the blobs. A padded, truncated or inflated file is refused without reading its bulk
(a pipe, which has no size, is read to its end first). Then the checksum, then the graph is
rebuilt, every attribute type-checked and the graph verified. Any problem raises
SerializationError saying what was wrong; a half-loaded graph is never returned.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from rlx.errors import SerializationError
from rlx.ir.mir import Graph
from rlx.ir.serialize_codec import ALIGN, MAX_NESTING, Encoder, decode, nesting_depth

if TYPE_CHECKING:
    from rlx.ir.module import GraphModule

__all__ = ["save", "load", "dumps", "loads", "MAGIC", "FORMAT_VERSION"]

MAGIC = b"RLXG"
FORMAT_VERSION = 2  # 2: sub-graphs in a table (serialize_codec); 1: nested in place
READ_VERSIONS = (1, 2)
_PRELUDE = struct.Struct("<4sIQQ")  # magic, version, header_len, blob_len
_DIGEST = 32  # sha256
_CHUNK = 1 << 24  # the largest single read from a file


def save(
    graph: Graph | GraphModule,
    path: str | os.PathLike[str],
    params: Mapping[str, Any] | None = None,
    *,
    locations: bool = True,
) -> None:
    """Write ``graph`` (and ``params``: param name -> array) to ``path`` atomically. A
    GraphModule is saved as its MIR graph (HIR is lowered first). ``locations`` keeps each
    node's source line for error messages after loading.

    Params follow the runtime's rule (``CompiledGraph.set_param``, ``run``; see
    :mod:`rlx.runtime.inputs`): an array is converted to the param's declared dtype only
    when no value can change (i8 -> f32, f32 -> f64), Python lists and scalars take the
    declared dtype when their kind fits, and anything else (an f64 array for an f32
    param, i32 -> f32, f32 -> bf16) is an InputError: cast it first. A param declared f64
    is stored as f64."""
    data = dumps(graph, params, locations=locations)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SerializationError(f"cannot write {str(path)!r}: {e.strerror or e}") from e


def load(path: str | os.PathLike[str]) -> tuple[Graph, dict[str, np.ndarray]]:
    """Read a file written by :func:`save`: returns ``(graph, params)``, where params maps
    param names to arrays (empty when none were saved). The graph is verified."""
    _check_host()
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # a pipe: no size to check
                return _load(_BytesSource(memoryview(f.read())))
            return _load(_FileSource(f))
    except OSError as e:
        raise SerializationError(f"cannot read {str(path)!r}: {e.strerror or e}") from e
    except SerializationError as e:
        raise SerializationError(f"{str(path)!r}: {e.bare_message}") from e.__cause__


def dumps(
    graph: Graph | GraphModule, params: Mapping[str, Any] | None = None, *, locations: bool = True
) -> bytes:
    """The bytes :func:`save` writes."""
    _check_host()
    g: Graph
    if isinstance(graph, Graph):
        g = graph
    else:
        into = getattr(graph, "into_graph", None)
        if into is None:
            raise SerializationError(
                f"save takes a Graph or a GraphModule, got {type(graph).__name__}"
            )
        g = into()
    depth = nesting_depth(g)  # before verify, which recurses into sub-graphs
    if depth > MAX_NESTING:
        raise SerializationError(
            f"graph {g.name!r}: sub-graphs nested more than {MAX_NESTING} deep; a graph file "
            f"holds at most {MAX_NESTING} levels"
        )
    try:
        g.verify()
    except RecursionError:
        raise SerializationError(
            f"graph {g.name!r}: its sub-graphs nest {depth} deep, too deep to verify under "
            f"Python's recursion limit ({sys.getrecursionlimit()})"
        ) from None
    enc = Encoder(locations)
    main, subgraphs = enc.graphs(g)
    header: dict[str, Any] = {
        "producer": "rlx",
        "graph": main,
        "subgraphs": subgraphs,
        "params": [enc.param(g, k, v) for k, v in (params or {}).items()],
    }
    blob_section = bytearray()
    table = []
    for b in enc.blobs:
        table.append([len(blob_section), len(b)])
        blob_section += b + bytes(-len(b) % ALIGN)
    header["blobs"] = table
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    text += b" " * (-(_PRELUDE.size + len(text)) % ALIGN)
    body = _PRELUDE.pack(MAGIC, FORMAT_VERSION, len(text), len(blob_section)) + text
    body += bytes(blob_section)
    return body + hashlib.sha256(body).digest()


def loads(data: bytes | bytearray | memoryview) -> tuple[Graph, dict[str, np.ndarray]]:
    """Parse the bytes of a graph file: ``(graph, params)``, as :func:`load`."""
    _check_host()
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SerializationError(f"loads takes bytes, got {type(data).__name__}")
    return _load(_BytesSource(memoryview(data).cast("B")))


# ---- reading, with every length checked before the bytes it covers ----------------


class _BytesSource:
    """A file already in memory."""

    def __init__(self, data: memoryview):
        self.data = data
        self.size = len(data)
        self.pos = 0

    def read(self, n: int) -> memoryview:
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out


class _FileSource:
    """An open file: its size from fstat, read in bounded chunks."""

    def __init__(self, f: IO[bytes]):
        self.f = f
        self.size = os.fstat(f.fileno()).st_size
        self.pos = 0

    def read(self, n: int) -> memoryview:
        buf = bytearray(n)
        view = memoryview(buf)
        done = 0
        while done < n:
            got = self.f.readinto(view[done : done + _CHUNK])  # type: ignore[attr-defined]
            if not got:
                raise SerializationError(
                    f"truncated at byte {self.pos + done}: the file shrank while it was read "
                    f"(it was {self.size} bytes)"
                )
            done += got
        self.pos += n
        return view


def _load(src: _BytesSource | _FileSource) -> tuple[Graph, dict[str, np.ndarray]]:
    n = src.size
    prelude = src.read(min(n, _PRELUDE.size))
    version, header_len, blob_len = _check_prelude(prelude, n)
    digest = hashlib.sha256(prelude)
    text = src.read(header_len)
    digest.update(text)
    try:
        header: dict[str, Any] | None = _parse_header(text)
        problem = None
    except SerializationError as e:  # reported after the checksum: corruption says so
        header, problem = None, e
    table = _blob_table(header, blob_len) if header is not None else []
    blobs = src.read(blob_len)
    digest.update(blobs)
    if digest.digest() != src.read(_DIGEST):
        raise SerializationError("checksum mismatch: the file is corrupted")
    if problem is not None or header is None:
        raise problem or SerializationError("the header is missing")
    return decode(header, table, blobs, version)


def _check_host() -> None:
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        raise SerializationError("rlx graph files are little-endian; this host is big-endian")


def _check_prelude(prelude: memoryview, n: int) -> tuple[int, int, int]:
    """Magic, version, and the lengths against the whole size ``n``: (version,
    header_len, blob_len)."""
    head = bytes(prelude[: len(MAGIC)])
    if head != MAGIC[: len(head)]:
        raise SerializationError(f"not an rlx graph file: starts with {head!r}, expected {MAGIC!r}")
    if n < _PRELUDE.size:
        raise SerializationError(
            f"truncated at byte {n}: the fixed header alone needs {_PRELUDE.size} bytes"
        )
    _, version, header_len, blob_len = _PRELUDE.unpack_from(prelude)
    if version not in READ_VERSIONS:
        raise SerializationError(
            f"unsupported version {version} (this build reads {', '.join(map(str, READ_VERSIONS))})"
        )
    want = _PRELUDE.size + header_len + blob_len + _DIGEST
    if n < want:
        raise SerializationError(
            f"truncated at byte {n}: the lengths in the file (header {header_len}, blobs "
            f"{blob_len}) need {want} bytes"
        )
    if n > want:
        raise SerializationError(
            f"{n - want} unexpected bytes after the checksum (file is {n} bytes, its "
            f"lengths say {want})"
        )
    return version, header_len, blob_len


def _parse_header(text: memoryview) -> dict[str, Any]:
    try:
        header = json.loads(bytes(text).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SerializationError(f"the header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise SerializationError(f"the header must be a JSON object, got {type(header).__name__}")
    return header


def _blob_table(header: dict[str, Any], blob_len: int) -> list[tuple[int, int]]:
    """The header's blob table, checked to tile the blob section exactly as the writer lays
    it out (each blob at the previous one's end rounded up to 64 bytes, the section ending
    at the last one's): a section with room the table does not account for is refused."""
    entries = header.get("blobs")
    if not isinstance(entries, list):
        raise SerializationError(f"malformed file: header.blobs is {entries!r}")
    table: list[tuple[int, int]] = []
    end = 0
    for k, entry in enumerate(entries):
        ok = (
            isinstance(entry, list)
            and len(entry) == 2
            and all(type(x) is int and x >= 0 for x in entry)
        )
        if not ok:
            raise SerializationError(f"blob table entry {k} is malformed: {entry!r}")
        off, length = entry
        if off + length > blob_len:
            raise SerializationError(
                f"blob {k} (offset {off}, length {length}) runs past the end of the blob "
                f"section ({blob_len} bytes)"
            )
        if off != end:
            raise SerializationError(
                f"blob {k} starts at offset {off}, expected {end} (the end of blob {k - 1} "
                "rounded up to 64 bytes): the sizes in the file do not add up"
            )
        table.append((off, length))
        end = off + length + (-length % ALIGN)
    if end != blob_len:
        raise SerializationError(
            f"the blob section is {blob_len} bytes but its table accounts for {end}: the "
            "sizes in the file do not add up"
        )
    return table
