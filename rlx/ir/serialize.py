"""Graph files. In: a MIR graph and optional weights. Out: one versioned, checksummed
file (``save`` / ``dumps``), and back (``load`` / ``loads``).

Layout (all integers little-endian)::

    b"RLXG"  u32 version  u64 header_len  u64 blob_len      24-byte prelude
    header: UTF-8 JSON, space-padded so the blobs start 64-byte aligned
    blobs: constants and params, each padded to 64 bytes
    sha256 of everything above (32 bytes)

The header holds the graph (nodes: op mnemonic, attributes, inputs, shape, optional
source line; outputs; symbolic-dim bounds), the params (name, dtype, dims, blob) and the
blob table (offset, length). Attributes are encoded generically, so a new op needs no
change here: ints, bools, strings and None as JSON; floats exactly (``float.hex``);
tuples, DTypes, Shapes, symbolic dims, constants (a blob reference), nested Graphs, and
enums and frozen dataclasses by class qualname. Only classes found in the modules that
define registered ops (and the modules those classes come from) can be named, so a file
can never make the loader build an arbitrary type.

``load`` checks the magic, the version, every length and the checksum before it reads the
header, then rebuilds the graph and runs the verifier. Any problem raises
SerializationError saying what was wrong; a half-loaded graph is never returned.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import os
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError, RlxError, SerializationError
from rlx.ir.mir import Graph
from rlx.ir.source import SourceLoc
from rlx.ops.base import OPS
from rlx.shape import Shape, Sym

if TYPE_CHECKING:
    from rlx.ir.module import GraphModule

__all__ = ["save", "load", "dumps", "loads", "MAGIC", "FORMAT_VERSION"]

MAGIC = b"RLXG"
FORMAT_VERSION = 1
_PRELUDE = struct.Struct("<4sIQQ")  # magic, version, header_len, blob_len
_DIGEST = 32  # sha256
_ALIGN = 64


def save(
    graph: Graph | GraphModule,
    path: str | os.PathLike[str],
    params: Mapping[str, Any] | None = None,
    *,
    locations: bool = True,
) -> None:
    """Write ``graph`` (and ``params``: param name -> array) to ``path`` atomically. A
    GraphModule is saved as its MIR graph (HIR is lowered first). ``locations`` keeps each
    node's source line for error messages after loading."""
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
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SerializationError(f"cannot read {str(path)!r}: {e.strerror or e}") from e
    try:
        return loads(data)
    except SerializationError as e:
        raise SerializationError(f"{str(path)!r}: {e.bare_message}") from None


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
    g.verify()
    enc = _Encoder(locations, _known_classes())
    header: dict[str, Any] = {
        "producer": "rlx",
        "graph": enc.graph(g, "graph"),
        "params": [enc.param(g, k, v) for k, v in (params or {}).items()],
    }
    blob_section = bytearray()
    table = []
    for b in enc.blobs:
        table.append([len(blob_section), len(b)])
        blob_section += b + bytes(-len(b) % _ALIGN)
    header["blobs"] = table
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    text += b" " * (-(_PRELUDE.size + len(text)) % _ALIGN)
    body = _PRELUDE.pack(MAGIC, FORMAT_VERSION, len(text), len(blob_section)) + text
    body += bytes(blob_section)
    return body + hashlib.sha256(body).digest()


def loads(data: bytes | bytearray | memoryview) -> tuple[Graph, dict[str, np.ndarray]]:
    """Parse the bytes of a graph file: ``(graph, params)``, as :func:`load`."""
    _check_host()
    data = bytes(data)
    header, blobs = _split(data)
    dec = _Decoder(header, blobs, _known_classes())
    try:
        graph = dec.graph(dec.field(header, "graph", dict, "header"), "graph")
        params = dec.params(dec.field(header, "params", list, "header"))
        graph.verify()
        _check_params(graph, params)
    except SerializationError:
        raise
    except RlxError as e:
        raise SerializationError(f"the saved graph is invalid: {e.bare_message}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError) as e:
        raise SerializationError(f"malformed file: {type(e).__name__}: {e}") from None
    return graph, params


def _check_params(graph: Graph, params: Mapping[str, np.ndarray]) -> None:
    shapes = {n.op.name: n.shape for n in graph.param_nodes()}  # type: ignore[attr-defined]
    for name, a in params.items():
        want = shapes.get(name)
        if want is None:
            raise SerializationError(f"stored param {name!r} is not a param of the graph")
        fits = a.dtype == want.dtype.np and a.ndim == want.rank
        if not fits or any(isinstance(d, int) and d != n for d, n in zip(want.dims, a.shape)):
            raise SerializationError(
                f"stored param {name!r} is {a.dtype}{list(a.shape)}, the graph says {want}"
            )


# ---- framing ------------------------------------------------------------------------


def _check_host() -> None:
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        raise SerializationError("rlx graph files are little-endian; this host is big-endian")


def _split(data: bytes) -> tuple[dict[str, Any], memoryview]:
    """Check magic, version, lengths and checksum; return the header and the blobs."""
    n = len(data)
    head = data[: len(MAGIC)]
    if head != MAGIC[: len(head)]:
        raise SerializationError(f"not an rlx graph file: starts with {head!r}, expected {MAGIC!r}")
    if n < _PRELUDE.size:
        raise SerializationError(
            f"truncated at byte {n}: the fixed header alone needs {_PRELUDE.size} bytes"
        )
    _, version, header_len, blob_len = _PRELUDE.unpack_from(data)
    if version != FORMAT_VERSION:
        raise SerializationError(
            f"unsupported version {version} (this build reads {FORMAT_VERSION})"
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
    digest = hashlib.sha256(memoryview(data)[: want - _DIGEST]).digest()
    if digest != data[want - _DIGEST :]:
        raise SerializationError("checksum mismatch: the file is corrupted")
    start = _PRELUDE.size
    try:
        header = json.loads(data[start : start + header_len].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SerializationError(f"the header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise SerializationError(f"the header must be a JSON object, got {type(header).__name__}")
    return header, memoryview(data)[start + header_len : start + header_len + blob_len]


# ---- the classes a file may name ----------------------------------------------------


def _is_frozen_dataclass(cls: type) -> bool:
    return dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def _known_classes() -> dict[str, list[type]]:
    """Qualname -> enum and frozen dataclass classes found in the modules of registered
    ops (and in the rlx modules those classes are defined in)."""
    found: dict[str, list[type]] = {}
    todo = [sys.modules[c.__module__] for c in OPS.values() if c.__module__ in sys.modules]
    seen: set[str] = set()

    def visit(cls: type) -> None:
        if not (issubclass(cls, enum.Enum) or _is_frozen_dataclass(cls)):
            return
        entry = found.setdefault(cls.__qualname__, [])
        if cls in entry:
            return
        entry.append(cls)
        mod = sys.modules.get(cls.__module__)
        if mod is not None and mod.__name__.startswith("rlx."):
            todo.append(mod)
        for v in vars(cls).values():
            if isinstance(v, type) and v.__qualname__.startswith(cls.__qualname__ + "."):
                visit(v)

    while todo:
        mod: ModuleType = todo.pop()
        if mod.__name__ in seen:
            continue
        seen.add(mod.__name__)
        for v in list(vars(mod).values()):
            if isinstance(v, type):
                visit(v)
    return found


def _lookup(classes: dict[str, list[type]], name: str, where: str) -> type:
    got = classes.get(name, [])
    if not got:
        raise SerializationError(f"{where}: unknown class {name!r} (not an rlx enum or dataclass)")
    if len(got) > 1:
        mods = sorted(c.__module__ for c in got)
        raise SerializationError(f"{where}: class name {name!r} is ambiguous, defined in {mods}")
    return got[0]


# ---- encoding -------------------------------------------------------------------------


class _Encoder:
    def __init__(self, locations: bool, classes: dict[str, list[type]]):
        self.locations = locations
        self.classes = classes
        self.blobs: list[bytes] = []
        self._index: dict[bytes, int] = {}

    def blob(self, data: bytes) -> int:
        if data not in self._index:
            self._index[data] = len(self.blobs)
            self.blobs.append(data)
        return self._index[data]

    def graph(self, g: Graph, where: str) -> dict[str, Any]:
        nodes = []
        for n in g.nodes:
            w = f"{where} node %{n.id} ({n.op.mnemonic})"
            attrs = {
                f.name: self.value(getattr(n.op, f.name), f"{w} attribute {f.name!r}")
                for f in dataclasses.fields(n.op)  # type: ignore[arg-type]
                if f.init
            }
            loc = None
            if self.locations and n.loc is not None:
                loc = [n.loc.file, n.loc.line, n.loc.function]
            nodes.append(
                {
                    "op": n.op.mnemonic,
                    "attrs": attrs,
                    "inputs": list(n.inputs),
                    "shape": self.shape(n.shape),
                    "loc": loc,
                }
            )
        bounds = [[k, lo, hi] for k, (lo, hi) in g.sym_bounds.items()]
        return {"name": g.name, "nodes": nodes, "outputs": list(g.outputs), "sym_bounds": bounds}

    def shape(self, s: Shape) -> dict[str, Any]:
        return {"dims": [self.dim(d) for d in s.dims], "dtype": s.dtype.value}

    @staticmethod
    def dim(d: int | Sym) -> Any:
        if isinstance(d, Sym):
            return {"sym": [[k, p] for k, p in d.terms], "coeff": d.coeff}
        return d

    def value(self, v: Any, where: str) -> Any:
        from rlx.ops.core import ConstValue

        t = type(v)
        if v is None or t in (bool, int, str):
            return v
        if t is float:
            return {"float": v.hex()}
        if t is tuple:
            return {"tuple": [self.value(x, f"{where}[{k}]") for k, x in enumerate(v)]}
        if t is DType:
            return {"dtype": v.value}
        if t is Sym:
            return self.dim(v)
        if t is Shape:
            return {"shape": self.shape(v)}
        if t is ConstValue:
            return {"const": self.blob(v.data), "dims": list(v.dims), "dtype": v.dtype.value}
        if isinstance(v, Graph):
            return {"graph": self.graph(v, f"{where} sub-graph {v.name!r}")}
        if isinstance(v, enum.Enum) or _is_frozen_dataclass(t):
            if t not in self.classes.get(t.__qualname__, []):
                raise SerializationError(
                    f"{where}: {t.__module__}.{t.__qualname__} is not an enum or frozen "
                    "dataclass of an op module, so files cannot hold it"
                )
            _lookup(self.classes, t.__qualname__, where)
            if isinstance(v, enum.Enum):
                return {"enum": t.__qualname__, "member": v.name}
            fields = {
                f.name: self.value(getattr(v, f.name), f"{where}.{f.name}")
                for f in dataclasses.fields(v)
                if f.init
            }
            return {"dataclass": t.__qualname__, "fields": fields}
        raise SerializationError(
            f"{where}: cannot store a value of type {t.__module__}.{t.__qualname__} "
            f"({v!r}); attributes must be int, float, bool, str, None, tuple, DType, Shape, "
            "Sym, a constant, a Graph, or an rlx enum / frozen dataclass"
        )

    def param(self, g: Graph, name: str, value: Any) -> dict[str, Any]:
        nodes = {n.op.name: n for n in g.param_nodes()}  # type: ignore[attr-defined]
        if name not in nodes:
            raise InputError(f"unknown param {name!r}; params of graph {g.name!r}: {sorted(nodes)}")
        want = nodes[name].shape
        a = np.asarray(value)
        if a.dtype != want.dtype.np:
            if np.can_cast(a.dtype, want.dtype.np, "same_kind") or (
                a.dtype.kind in "iub" and want.dtype.is_float
            ):
                a = a.astype(want.dtype.np)
            else:
                raise InputError(f"param {name!r}: expected {want}, given dtype {a.dtype}")
        if a.ndim != want.rank or any(
            isinstance(d, int) and d != got for d, got in zip(want.dims, a.shape)
        ):
            raise InputError(f"param {name!r}: expected {want}, given shape {tuple(a.shape)}")
        a = np.ascontiguousarray(a)
        blob = self.blob(a.tobytes())
        return {"name": name, "dtype": want.dtype.value, "dims": list(a.shape), "blob": blob}


# ---- decoding ---------------------------------------------------------------------------

_TAGS = ("float", "tuple", "dtype", "sym", "shape", "const", "graph", "enum", "dataclass")


class _Decoder:
    def __init__(self, header: dict[str, Any], blobs: memoryview, classes: dict[str, list[type]]):
        self.classes = classes
        self.section = blobs
        table = self.field(header, "blobs", list, "header")
        self.table: list[tuple[int, int]] = []
        for k, entry in enumerate(table):
            ok = (
                isinstance(entry, list)
                and len(entry) == 2
                and all(type(x) is int and x >= 0 for x in entry)
            )
            if not ok:
                raise SerializationError(f"blob table entry {k} is malformed: {entry!r}")
            off, length = entry
            if off + length > len(blobs):
                raise SerializationError(
                    f"blob {k} (offset {off}, length {length}) runs past the end of the blob "
                    f"section ({len(blobs)} bytes)"
                )
            self.table.append((off, length))

    @staticmethod
    def field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise SerializationError(f"malformed file: {where} lacks {key!r}")
        v = obj[key]
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise SerializationError(f"malformed file: {where}.{key} is {v!r}")
        return v

    def blob(self, k: Any, nbytes: int, where: str) -> bytes:
        if type(k) is not int or not 0 <= k < len(self.table):
            raise SerializationError(f"{where}: blob {k!r} is not in the blob table")
        off, length = self.table[k]
        if length != nbytes:
            raise SerializationError(f"{where}: blob {k} holds {length} bytes, expected {nbytes}")
        return bytes(self.section[off : off + length])

    def dtype(self, v: Any, where: str) -> DType:
        try:
            return DType(v)
        except ValueError:
            raise SerializationError(f"{where}: unknown dtype {v!r}") from None

    def dim(self, v: Any, where: str) -> int | Sym:
        if type(v) is int and v >= 0:
            return v
        if isinstance(v, dict) and set(v) == {"sym", "coeff"}:
            terms = v["sym"]
            ok = isinstance(terms, list) and all(
                isinstance(t, list) and len(t) == 2 and type(t[0]) is str and type(t[1]) is int
                for t in terms
            )
            if ok and type(v["coeff"]) is int:
                return Sym(tuple((t[0], t[1]) for t in terms), v["coeff"])
        raise SerializationError(f"{where}: malformed dim {v!r}")

    def dims(self, v: Any, where: str) -> tuple[int | Sym, ...]:
        if not isinstance(v, list):
            raise SerializationError(f"{where}: dims must be a list, got {v!r}")
        return tuple(self.dim(d, where) for d in v)

    def shape(self, v: Any, where: str) -> Shape:
        dims = self.dims(self.field(v, "dims", list, where), where)
        return Shape(dims, self.dtype(self.field(v, "dtype", str, where), where))

    def value(self, v: Any, where: str) -> Any:
        if v is None or type(v) in (bool, int, str):
            return v
        if not isinstance(v, dict) or not any(t in v for t in _TAGS):
            raise SerializationError(f"{where}: malformed value {v!r}")
        if "float" in v:
            try:
                return float.fromhex(v["float"])
            except (TypeError, ValueError):
                raise SerializationError(f"{where}: malformed float {v['float']!r}") from None
        if "tuple" in v:
            items = self.field(v, "tuple", list, where)
            return tuple(self.value(x, f"{where}[{k}]") for k, x in enumerate(items))
        if "dtype" in v and len(v) == 1:
            return self.dtype(v["dtype"], where)
        if "sym" in v:
            return self.dim(v, where)
        if "shape" in v:
            return self.shape(v["shape"], where)
        if "const" in v:
            return self.const(v, where)
        if "graph" in v:
            return self.graph(self.field(v, "graph", dict, where), f"{where} sub-graph")
        if "enum" in v:
            cls = _lookup(self.classes, self.field(v, "enum", str, where), where)
            member = self.field(v, "member", str, where)
            if not issubclass(cls, enum.Enum) or member not in cls.__members__:
                raise SerializationError(f"{where}: {cls.__qualname__} has no member {member!r}")
            return cls[member]
        cls = _lookup(self.classes, self.field(v, "dataclass", str, where), where)
        raw = self.field(v, "fields", dict, where)
        kwargs = {k: self.value(x, f"{where}.{k}") for k, x in raw.items()}
        return self.construct(cls, kwargs, where)

    def const(self, v: dict[str, Any], where: str) -> Any:
        from rlx.ops.core import ConstValue

        dims = self.dims(self.field(v, "dims", list, where), where)
        if not all(isinstance(d, int) for d in dims):
            raise SerializationError(f"{where}: a constant needs static dims, got {dims}")
        dt = self.dtype(self.field(v, "dtype", str, where), where)
        nbytes = math.prod(dims) * dt.itemsize  # type: ignore[arg-type]
        return ConstValue(self.blob(v["const"], nbytes, where), dims, dt)  # type: ignore[arg-type]

    @staticmethod
    def construct(cls: type, kwargs: dict[str, Any], where: str) -> Any:
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        extra = sorted(set(kwargs) - names)
        if extra:
            raise SerializationError(
                f"{where}: {cls.__qualname__} has no attributes {extra} (it has {sorted(names)})"
            )
        try:
            return cls(**kwargs)
        except RlxError as e:
            raise SerializationError(f"{where}: {e.bare_message}") from None
        except (TypeError, ValueError) as e:
            raise SerializationError(f"{where}: cannot build {cls.__qualname__}: {e}") from None

    def graph(self, j: dict[str, Any], where: str) -> Graph:
        g = Graph(self.field(j, "name", str, where))
        for k, nj in enumerate(self.field(j, "nodes", list, where)):
            w = f"{where} node %{k}"
            mnemonic = self.field(nj, "op", str, w)
            cls = OPS.get(mnemonic)
            if cls is None:
                raise SerializationError(
                    f"{w}: unknown op {mnemonic!r} (this build has {len(OPS)} ops; was the "
                    "file written by a newer rlx?)"
                )
            w = f"{where} node %{k} ({mnemonic})"
            attrs = self.field(nj, "attrs", dict, w)
            op = self.construct(
                cls, {a: self.value(x, f"{w} attribute {a!r}") for a, x in attrs.items()}, w
            )
            inputs = self.field(nj, "inputs", list, w)
            if not all(type(i) is int for i in inputs):
                raise SerializationError(f"{w}: inputs must be node ids, got {inputs!r}")
            shape = self.shape(self.field(nj, "shape", dict, w), w)
            g.add_node(op, inputs, shape, self.loc(nj.get("loc"), w))
        outputs = self.field(j, "outputs", list, where)
        if not all(type(o) is int for o in outputs):
            raise SerializationError(f"{where}: outputs must be node ids, got {outputs!r}")
        g.outputs = list(outputs)
        for b in self.field(j, "sym_bounds", list, where):
            ok = isinstance(b, list) and len(b) == 3 and type(b[0]) is str and type(b[1]) is int
            if not ok or not (b[2] is None or type(b[2]) is int):
                raise SerializationError(f"{where}: malformed symbolic-dim bound {b!r}")
            g.sym_bounds[b[0]] = (b[1], b[2])
        return g

    @staticmethod
    def loc(v: Any, where: str) -> SourceLoc | None:
        if v is None:
            return None
        ok = isinstance(v, list) and len(v) == 3 and type(v[0]) is str and type(v[1]) is int
        if not ok or type(v[2]) is not str:
            raise SerializationError(f"{where}: malformed source location {v!r}")
        return SourceLoc(v[0], v[1], v[2])

    def params(self, items: list[Any]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for k, p in enumerate(items):
            w = f"params[{k}]"
            name = self.field(p, "name", str, w)
            w = f"param {name!r}"
            if name in out:
                raise SerializationError(f"{w} is stored twice")
            dt = self.dtype(self.field(p, "dtype", str, w), w)
            dims = self.dims(self.field(p, "dims", list, w), w)
            if not all(isinstance(d, int) for d in dims):
                raise SerializationError(f"{w}: stored dims must be static, got {dims}")
            data = self.blob(p.get("blob"), math.prod(dims) * dt.itemsize, w)  # type: ignore[arg-type]
            out[name] = np.frombuffer(data, dtype=dt.np).reshape(dims).copy()
        return out
