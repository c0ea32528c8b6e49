"""The header of a graph file, both ways. In: a Graph and its params (encode), or a parsed
JSON header, its blob table and the blob section (decode). Out: a JSON-able header plus the
blobs it references, or ``(graph, params)`` checked against everything the file claims.

Attributes are encoded generically, so a new op needs no change here: ints, bools, strings
and None as JSON; floats exactly (``float.hex``); and tagged objects (exactly these keys):
``{"float"}``, ``{"tuple"}``, ``{"dtype"}``, ``{"sym", "coeff"}``, ``{"shape"}``,
``{"const", "dims", "dtype"}`` (a blob reference), ``{"graph"}``, ``{"enum", "member"}``
and ``{"dataclass", "fields"}`` (classes by qualname). Only classes found in the modules
that define registered ops (and the modules those classes come from) can be named, so a
file can never make the loader build an arbitrary type.

Sub-graphs (control flow, fused regions) are not nested in the JSON: the header's
``subgraphs`` table lists every sub-graph once, children before their parents, and an
attribute holding one is ``{"graph": k}``, the index of an earlier entry (the main graph
may name any entry). Encoding and decoding walk that table with loops, not recursion, so
the depth of nesting is bounded by :data:`MAX_NESTING` only (a graph nested 150 ``If``
deep round-trips; a crafted file nested 10**5 deep is a SerializationError at its entry
MAX_NESTING, never a RecursionError); every entry must be used exactly once, so a file
cannot make the loader share one sub-graph between nodes, or loop. A sub-graph object
that several nodes hold is stored once per node. Version 1 files held sub-graphs inline
(nested at most :data:`MAX_DEPTH` deep); they still load.

Decoding trusts nothing: every value is type-checked against the field it fills
(:mod:`rlx.ir.serialize_validate`), dims and symbol bounds are validated, constants are
only read through the ``const`` tag (whose blob must hold exactly dims x itemsize bytes),
nesting is bounded, and the graph is verified. Every problem is a SerializationError naming
the node, op and attribute.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError, RlxError, SerializationError
from rlx.ir.mir import Graph
from rlx.ir.serialize_classes import is_frozen_dataclass, known_classes, lookup
from rlx.ir.serialize_validate import check_fields
from rlx.ops.base import OPS
from rlx.shape import Shape, Sym, check_bounds
from rlx.source import SourceLoc

__all__ = ["Encoder", "decode", "known_classes", "nesting_depth", "ALIGN", "MAX_NESTING"]

ALIGN = 64  # blobs (and the blob section) start at multiples of this
MAX_DEPTH = 64  # nesting of tuples and dataclasses (and, in version 1, sub-graphs)
# Sub-graphs nested in sub-graphs a file may hold. Python's default recursion limit lets
# the verifier and the reference interpreter handle about 980 levels; the bound leaves
# room for a process that raised it and refuses absurd depths (10**5) before building
# anything.
MAX_NESTING = 4096
_WHERE = 300  # characters of a nested location kept in messages (head and tail)
MAX_DIM = 2**62  # a stored dim (or symbol coefficient) at or above this is refused
# a symbol's power above this is refused: evaluating ``value ** power`` for a crafted
# power of 2**60 would never finish (any real dim is < 2**62, so its powers are < 63)
MAX_POWER = 64


# ---- encoding -------------------------------------------------------------------------


def _clip(where: str) -> str:
    """``where`` shortened in the middle: the locations of deeply nested sub-graphs would
    otherwise grow with their depth (and cost time quadratic in it)."""
    if len(where) <= 2 * _WHERE:
        return where
    return f"{where[:_WHERE]} ... {where[-_WHERE:]}"


def nesting_depth(g: Graph, limit: int = MAX_NESTING) -> int:
    """How deep ``g``'s sub-graphs (``op.subgraphs()``) nest (0: none), by a loop, not
    recursion; stops counting once above ``limit``."""
    deepest = 0
    todo = [(g, 0)]
    while todo:
        graph, depth = todo.pop()
        deepest = max(deepest, depth)
        if depth > limit:
            break
        for n in graph.nodes:
            todo.extend((sub, depth + 1) for sub in n.op.subgraphs())
    return deepest


class Encoder:
    """Graph and params -> JSON-able header parts; ``blobs`` collects the byte strings
    they reference (identical bytes are stored once)."""

    def __init__(self, locations: bool):
        self.locations = locations
        self.classes = known_classes()
        self.blobs: list[bytes] = []
        self._index: dict[bytes, int] = {}
        self._found: list[tuple[Graph, dict[str, Any], str]] = []

    def blob(self, data: bytes) -> int:
        if data not in self._index:
            self._index[data] = len(self.blobs)
            self.blobs.append(data)
        return self._index[data]

    def graphs(self, root: Graph) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The main graph's entry and the sub-graph table (module docstring): every
        sub-graph reached from ``root``, once per place that holds it, children first.
        A loop over the nesting, not recursion; SerializationError beyond MAX_NESTING."""
        entries: list[dict[str, Any]] = []
        kids: list[list[tuple[dict[str, Any], int]]] = []  # (placeholder, child entry)
        todo: list[tuple[Graph, str, int, int, dict[str, Any] | None]] = [
            (root, "graph", 0, -1, None)
        ]
        while todo:  # pre-order: each graph once, its sub-graphs left as placeholders
            g, where, depth, parent, placeholder = todo.pop()
            if depth > MAX_NESTING:
                raise SerializationError(
                    f"{where}: sub-graphs nested more than {MAX_NESTING} deep; a graph file "
                    f"holds at most {MAX_NESTING} levels"
                )
            self._found = []
            me = len(entries)
            entries.append(self.graph(g, where))
            kids.append([])
            if placeholder is not None:
                kids[parent].append((placeholder, me))
            todo.extend((sub, w, depth + 1, me, ph) for sub, ph, w in reversed(self._found))
        table: list[dict[str, Any]] = []
        index: dict[int, int] = {}
        stack = [(0, False)]
        while stack:  # post-order: an entry's sub-graphs get lower indices than itself
            e, done = stack.pop()
            if done:
                if e:
                    index[e] = len(table)
                    table.append(entries[e])
                continue
            stack.append((e, True))
            stack.extend((c, False) for _, c in reversed(kids[e]))
        for refs in kids:
            for placeholder, c in refs:
                placeholder["graph"] = index[c]
        return entries[0], table

    def graph(self, g: Graph, where: str) -> dict[str, Any]:
        """One graph's entry; its sub-graphs become ``{"graph": None}`` placeholders,
        listed in ``_found`` (:meth:`graphs` numbers them)."""
        nodes = []
        for n in g.nodes:
            w = f"{where} node %{n.id} ({n.op.mnemonic})"
            attrs = {
                f.name: self.value(getattr(n.op, f.name), f"{w} attribute {f.name!r}")
                for f in dataclasses.fields(n.op)  # type: ignore[arg-type]
                if f.init
            }
            loc = None
            if self.locations and n.loc is not None and n.loc.file:
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

    def value(self, v: Any, where: str, depth: int = 0) -> Any:
        from rlx.ops.core import ConstValue

        t = type(v)
        if v is None or t in (bool, int, str):
            return v
        if depth > MAX_DEPTH:
            raise SerializationError(
                f"{where}: values nested more than {MAX_DEPTH} deep (tuples, dataclasses) "
                "cannot be stored"
            )
        if t is float:
            return {"float": v.hex()}
        if t is tuple:
            return {"tuple": [self.value(x, f"{where}[{k}]", depth + 1) for k, x in enumerate(v)]}
        if t is DType:
            return {"dtype": v.value}
        if t is Sym:
            return self.dim(v)
        if t is Shape:
            return {"shape": self.shape(v)}
        if t is ConstValue:
            return {"const": self.blob(v.data), "dims": list(v.dims), "dtype": v.dtype.value}
        if isinstance(v, Graph):
            placeholder: dict[str, Any] = {"graph": None}
            self._found.append((v, placeholder, _clip(f"{where} sub-graph {v.name!r}")))
            return placeholder
        if isinstance(v, enum.Enum) or is_frozen_dataclass(t):
            if t not in self.classes.get(t.__qualname__, []):
                self.classes = known_classes(fresh=True)
            if t not in self.classes.get(t.__qualname__, []):
                raise SerializationError(
                    f"{where}: {t.__module__}.{t.__qualname__} is not an enum or frozen "
                    "dataclass of an op module, so files cannot hold it"
                )
            lookup(self.classes, t.__qualname__, where)
            if isinstance(v, enum.Enum):
                return {"enum": t.__qualname__, "member": v.name}
            fields = {
                f.name: self.value(getattr(v, f.name), f"{where}.{f.name}", depth + 1)
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
        """A param's entry. ``value`` is checked and converted exactly as
        ``CompiledGraph.set_param`` does (:func:`rlx.runtime.inputs.to_array`): lossless
        conversions only, so an f64 array for an f32 param is an InputError here too,
        never rounded to f32 on the way to the file."""
        from rlx.runtime.inputs import check_dims, to_array

        nodes = {n.op.name: n for n in g.param_nodes()}  # type: ignore[attr-defined]
        if name not in nodes:
            raise InputError(f"unknown param {name!r}; params of graph {g.name!r}: {sorted(nodes)}")
        node = nodes[name]
        want = node.shape
        a = to_array("param", name, value, want, node)
        check_dims("param", name, a, want, node)
        a = np.ascontiguousarray(a).reshape(a.shape)  # ascontiguousarray makes rank 0 rank 1
        blob = self.blob(a.tobytes())
        return {"name": name, "dtype": want.dtype.value, "dims": list(a.shape), "blob": blob}


# ---- decoding ---------------------------------------------------------------------------

_TAGS = {
    frozenset(keys): keys[0]
    for keys in (
        ("float",),
        ("tuple",),
        ("dtype",),
        ("sym", "coeff"),
        ("shape",),
        ("const", "dims", "dtype"),
        ("graph",),
        ("enum", "member"),
        ("dataclass", "fields"),
    )
}


def decode(
    header: dict[str, Any], table: list[tuple[int, int]], blobs: memoryview, version: int = 2
) -> tuple[Graph, dict[str, np.ndarray]]:
    """The graph and params of a framed, checksummed file of format ``version`` whose
    blob ``table`` (offset, length) has been checked against ``blobs``. The graph is
    verified; anything wrong is a SerializationError."""
    dec = _Decoder(table, blobs, version)
    try:
        main = dec.field(header, "graph", dict, "header")
        if version == 1:
            graph = dec.graph(main, "graph", 0)
        else:
            graph = dec.graphs(main, dec.field(header, "subgraphs", list, "header"))
        params = dec.params(dec.field(header, "params", list, "header"))
        try:
            graph.verify()
        except RecursionError:
            raise SerializationError(
                f"graph {graph.name!r}: its sub-graphs nest {dec.nesting} deep, too deep to "
                f"verify under Python's recursion limit ({sys.getrecursionlimit()}); raise "
                "it with sys.setrecursionlimit to load this file"
            ) from None
        _check_params(graph, params)
    except SerializationError:
        raise
    except RlxError as e:
        raise SerializationError(f"the saved graph is invalid: {e.bare_message}") from None
    except Exception as e:
        # A path no check above foresaw. Still a SerializationError for the caller, but it
        # keeps its cause: the loader fuzz tests fail on any error that carries one.
        raise SerializationError(
            f"malformed file (unexpected {type(e).__name__} while decoding: {e})"
        ) from e
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


def _check_sym(s: Sym, where: str) -> Sym:
    """``s``, unless its coefficient or a power is beyond what a real dim can have."""
    if s.coeff >= MAX_DIM:
        raise SerializationError(f"{where}: symbolic dim {s}: coefficient {s.coeff} >= 2**62")
    for name, p in s.terms:
        if p > MAX_POWER:
            raise SerializationError(
                f"{where}: symbolic dim {s}: power {p} of {name!r} is above {MAX_POWER}"
            )
    return s


def _const_class() -> type:
    from rlx.ops.core import ConstValue

    return ConstValue


class _Decoder:
    def __init__(self, table: list[tuple[int, int]], blobs: memoryview, version: int = 2):
        self.classes = known_classes()
        self.section = blobs
        self.table = table
        self.version = version
        self._shapes: dict[tuple[Any, ...], Shape] = {}  # a file repeats a few shapes
        # the sub-graph table (version 2): decoded entries, their nesting heights, which
        # are taken; entries below ``_usable`` may be referenced by the graph being decoded
        self._subs: list[Graph] = []
        self._heights: list[int] = []
        self._taken: list[bool] = []
        self._usable = 0
        self._below = 0  # the greatest height among the references of the current graph
        self.nesting = 0  # how deep the main graph's sub-graphs nest

    def graphs(self, main: dict[str, Any], entries: list[Any]) -> Graph:
        """The main graph of a version 2 header and its sub-graph ``entries``, decoded in
        order by a loop (module docstring). SerializationError for a reference to an entry
        that is not an earlier one, an entry used twice or never, or nesting deeper than
        MAX_NESTING."""
        self._taken = [False] * len(entries)
        for k, entry in enumerate(entries):
            self._usable, self._below = k, 0
            g = self.graph(entry, f"sub-graph {k}", 0)
            height = self._below + 1
            if height > MAX_NESTING:
                raise SerializationError(
                    f"sub-graph {k} ({g.name!r}): sub-graphs nested more than {MAX_NESTING} deep"
                )
            self._subs.append(g)
            self._heights.append(height)
        self._usable, self._below = len(entries), 0
        graph = self.graph(main, "graph", 0)
        self.nesting = self._below
        unused = [k for k, taken in enumerate(self._taken) if not taken]
        if unused:
            raise SerializationError(
                f"malformed file: sub-graph table entries {unused[:8]} are used by no node"
            )
        return graph

    def subgraph(self, ref: Any, where: str) -> Graph:
        """The sub-graph of table entry ``ref`` (version 2), taken once."""
        if type(ref) is not int or not 0 <= ref < self._usable:
            raise SerializationError(
                f"{where}: sub-graph {ref!r} is not an earlier entry of the sub-graph table "
                f"(0 to {self._usable - 1})"
            )
        if self._taken[ref]:
            raise SerializationError(f"{where}: sub-graph {ref} is used a second time")
        self._taken[ref] = True
        self._below = max(self._below, self._heights[ref])
        return self._subs[ref]

    @staticmethod
    def field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise SerializationError(f"malformed file: {where} lacks {key!r}")
        v = obj[key]
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise SerializationError(f"malformed file: {where}.{key} is {v!r}")
        return v

    def blob(self, k: Any, nbytes: int, where: str) -> memoryview:
        """Blob ``k`` (a view into the file's bytes), which must hold ``nbytes``."""
        if type(k) is not int or not 0 <= k < len(self.table):
            raise SerializationError(f"{where}: blob {k!r} is not in the blob table")
        off, length = self.table[k]
        if length != nbytes:
            raise SerializationError(f"{where}: blob {k} holds {length} bytes, expected {nbytes}")
        return self.section[off : off + length]

    @staticmethod
    def dtype(v: Any, where: str) -> DType:
        if type(v) is str:
            try:
                return DType(v)
            except ValueError:
                pass
        raise SerializationError(f"{where}: unknown dtype {v!r}")

    @staticmethod
    def dim(v: Any, where: str) -> int | Sym:
        if type(v) is int and 0 <= v < MAX_DIM:
            return v
        if isinstance(v, dict) and set(v) == {"sym", "coeff"}:
            terms, coeff = v["sym"], v["coeff"]
            ok = isinstance(terms, list) and all(
                isinstance(t, list) and len(t) == 2 and type(t[0]) is str and type(t[1]) is int
                for t in terms
            )
            if ok and type(coeff) is int:
                try:
                    return _check_sym(Sym(tuple((t[0], t[1]) for t in terms), coeff), where)
                except RlxError as e:
                    raise SerializationError(f"{where}: {e.bare_message}") from None
        raise SerializationError(f"{where}: malformed dim {v!r}")

    def dims(self, v: Any, where: str) -> tuple[int | Sym, ...]:
        if not isinstance(v, list):
            raise SerializationError(f"{where}: dims must be a list, got {v!r}")
        return tuple(self.dim(d, where) for d in v)

    def shape(self, v: Any, where: str) -> Shape:
        dims = self.dims(self.field(v, "dims", list, where), where)
        key = (dims, self.dtype(self.field(v, "dtype", str, where), where))
        got = self._shapes.get(key)
        if got is None:
            got = self._shapes[key] = Shape(*key)
        return got

    def value(self, v: Any, where: str, depth: int) -> Any:
        if v is None or type(v) in (bool, int, str):
            return v
        if depth > MAX_DEPTH:
            raise SerializationError(f"{where}: values nested more than {MAX_DEPTH} deep")
        tag = _TAGS.get(frozenset(v)) if isinstance(v, dict) else None
        if tag is None:
            raise SerializationError(f"{where}: malformed value {v!r}")
        if tag == "float":
            if type(v["float"]) is str:
                try:
                    return float.fromhex(v["float"])
                except ValueError:
                    pass
            raise SerializationError(f"{where}: malformed float {v['float']!r}")
        if tag == "tuple":
            items = self.field(v, "tuple", list, where)
            return tuple(self.value(x, f"{where}[{k}]", depth + 1) for k, x in enumerate(items))
        if tag == "dtype":
            return self.dtype(v["dtype"], where)
        if tag == "sym":
            return self.dim(v, where)
        if tag == "shape":
            return self.shape(v["shape"], where)
        if tag == "const":
            return self.const(v, where)
        if tag == "graph":
            if self.version != 1:
                return self.subgraph(v["graph"], where)
            return self.graph(self.field(v, "graph", dict, where), f"{where} sub-graph", depth + 1)
        if tag == "enum":
            cls = lookup(self.classes, self.field(v, "enum", str, where), where)
            member = self.field(v, "member", str, where)
            if not issubclass(cls, enum.Enum) or member not in cls.__members__:
                raise SerializationError(f"{where}: {cls.__qualname__} has no member {member!r}")
            return cls[member]
        cls = lookup(self.classes, self.field(v, "dataclass", str, where), where)
        if not dataclasses.is_dataclass(cls):
            raise SerializationError(f"{where}: {cls.__qualname__} is not a dataclass")
        if cls is _const_class():
            raise SerializationError(f"{where}: a constant must be stored as a blob reference")
        raw = self.field(v, "fields", dict, where)
        kwargs = {k: self.value(x, f"{where}.{k}", depth + 1) for k, x in raw.items()}
        return self.construct(cls, kwargs, where)

    def const(self, v: dict[str, Any], where: str) -> Any:
        from rlx.ops.core import ConstValue

        dims = self.dims(self.field(v, "dims", list, where), where)
        if not all(isinstance(d, int) for d in dims):
            raise SerializationError(f"{where}: a constant needs static dims, got {dims}")
        dt = self.dtype(self.field(v, "dtype", str, where), where)
        nbytes = math.prod(dims) * dt.itemsize  # type: ignore[arg-type]
        data = bytes(self.blob(v["const"], nbytes, where))
        return ConstValue(data, dims, dt)  # type: ignore[arg-type]

    @staticmethod
    def construct(cls: type, kwargs: dict[str, Any], where: str) -> Any:
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        extra = sorted(set(kwargs) - names)
        if extra:
            raise SerializationError(
                f"{where}: {cls.__qualname__} has no attributes {extra} (it has {sorted(names)})"
            )
        check_fields(cls, kwargs, where)
        try:
            out = cls(**kwargs)
            return _check_sym(out, where) if type(out) is Sym else out
        except SerializationError:
            raise
        except RlxError as e:
            raise SerializationError(f"{where}: {e.bare_message}") from None
        except (TypeError, ValueError) as e:  # a missing attribute, or __post_init__
            raise SerializationError(f"{where}: cannot build {cls.__qualname__}: {e}") from None

    def graph(self, j: dict[str, Any], where: str, depth: int) -> Graph:
        if depth > MAX_DEPTH:
            raise SerializationError(f"{where}: sub-graphs nested more than {MAX_DEPTH} deep")
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
            values = {a: self.value(x, f"{w} attribute {a!r}", depth + 1) for a, x in attrs.items()}
            op = self.construct(cls, values, w)
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
            if not isinstance(b, list) or len(b) != 3:
                raise SerializationError(f"{where}: malformed symbolic-dim bound {b!r}")
            try:
                g.sym_bounds[b[0]] = check_bounds(*b)
            except RlxError as e:
                raise SerializationError(f"{where}: {e.bare_message}") from None
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
