"""MIR: the tensor DAG. In: ops and edges from a builder, HIR lowering or a file.
Out: a verified graph of :class:`Node` with outputs, printable and fingerprinted.

Nodes are frozen; a graph only grows (passes build a new graph). Node ids are indices
into ``graph.nodes``; every builder call infers the node's shape with the op's rule, or
checks a given shape against it, and records the user line that built the node.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx import source
from rlx.dtype import DType
from rlx.errors import RlxError, ShapeError, VerifyError
from rlx.ops.base import Op
from rlx.shape import Shape, Sym, check_bounds
from rlx.source import SourceLoc

if TYPE_CHECKING:
    from rlx.ir.hir import FusionPolicy, HirModule, HirNodeId
    from rlx.ir.module import GraphModule

__all__ = ["Node", "Graph", "NodeId", "op_name"]

NodeId = int


@dataclass(frozen=True, slots=True)
class Node:
    """One op application: ``id = op(inputs) : shape``."""

    id: NodeId
    op: Op
    inputs: tuple[NodeId, ...]
    shape: Shape
    loc: SourceLoc | None = field(default=None, compare=False, hash=False)

    @property
    def dtype(self) -> DType:
        return self.shape.dtype

    @property
    def label(self) -> str:
        """How reports name this node: by the user's graph (``'%19 matmul (model.py:42)'``)
        whatever graph it is in now; a node a pass made for another says so (``'cast for
        %19 matmul (...)'``); without provenance, ``'#<id> <op>'``: ``#`` marks an id of
        the graph the node is in, never the user's."""
        loc = self.loc
        name = op_name(self.op)
        if loc is None or loc.node is None:
            return f"#{self.id} {name}"
        own = loc.label()
        return own if name == loc.op else f"{name} for {own}"


def op_name(op: Op) -> str:
    """The op's short name in reports: ``add`` for Binary(ADD), else the mnemonic."""
    if type(op).__str__ is Op.__str__:
        return op.mnemonic
    return str(op).split("[", 1)[0]


class Graph:
    """A MIR graph builder and container. ``Graph("name")``; see the op modules for
    builder methods (``g.matmul``, ``g.add``, ...) or use :meth:`apply` with any op."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.nodes: list[Node] = []
        self.outputs: list[NodeId] = []
        self.sym_bounds: dict[str, tuple[int, int | None]] = {}

    if TYPE_CHECKING:
        # Builder methods (g.add, g.matmul, ...) are attached at import by @graph_method.
        def __getattr__(self, name: str) -> Any: ...

    # ---- building -------------------------------------------------------------------

    def add_node(
        self,
        op: Op,
        inputs: Sequence[NodeId],
        shape: Shape,
        loc: SourceLoc | None = None,
    ) -> NodeId:
        """Append a node with an explicit shape and no inference (passes use this;
        the verifier checks the result). Returns the new node id."""
        nid = len(self.nodes)
        self.nodes.append(Node(nid, op, tuple(int(i) for i in inputs), shape, loc))
        return nid

    def apply(self, op: Op, inputs: Sequence[NodeId] = (), shape: Shape | None = None) -> NodeId:
        """Append ``op(inputs)``; infer its shape, or check ``shape`` against the rule."""
        loc = source.capture(len(self.nodes), op_name(op))  # the line, and the node's provenance
        for i in inputs:
            if isinstance(i, bool) or not isinstance(i, int | np.integer):
                raise VerifyError(
                    f"{op}: inputs must be node ids (ints returned by builders such as "
                    f"g.input), given {type(i).__name__} {i!r}",
                    loc=loc,
                )
        ins = tuple(int(i) for i in inputs)
        for i in ins:
            if not 0 <= i < len(self.nodes):
                raise VerifyError(
                    f"{op}: input id {i} does not exist in graph {self.name!r} "
                    f"({len(self.nodes)} nodes)",
                    loc=loc,
                )
        n = op.num_inputs()
        if n is not None and len(ins) != n:
            raise ShapeError(f"{op}: expected {n} inputs, got {len(ins)}", loc=loc)
        try:
            inferred = op.infer(tuple(self.nodes[i].shape for i in ins))
        except RlxError as e:
            if e.loc is None:
                msg = e.bare_message
                if not msg.startswith(op.mnemonic):
                    msg = f"{op}: {msg}"
                raise type(e)(msg, node=len(self.nodes), loc=loc) from None
            raise
        if shape is not None and shape != inferred:
            raise ShapeError(
                f"{op}: given shape {shape} but the shape rule gives {inferred}",
                node=len(self.nodes),
                loc=loc,
            )
        return self.add_node(op, ins, inferred, loc)

    def set_outputs(self, outputs: Iterable[NodeId] | NodeId) -> None:
        """Declare the graph outputs (a node id or a sequence of them)."""
        outs = [outputs] if isinstance(outputs, int) else [int(o) for o in outputs]
        for o in outs:
            if not 0 <= o < len(self.nodes):
                raise VerifyError(f"output id {o} does not exist in graph {self.name!r}")
        self.outputs = outs

    def sym(self, name: str, min: int = 1, max: int | None = None) -> Sym:
        """Declare a symbolic dim with bounds ``min <= value <= max`` and return it."""
        self.sym_bounds[name] = check_bounds(name, min, max)
        return Sym.named(name)

    # ---- querying -------------------------------------------------------------------

    def node(self, nid: NodeId) -> Node:
        """The node with id ``nid``; raises VerifyError for an id not in this graph."""
        if isinstance(nid, bool) or not isinstance(nid, int | np.integer):
            raise VerifyError(
                f"graph {self.name!r}: expected a node id (an int returned by a builder such "
                f"as g.input), given {type(nid).__name__} {nid!r}"
            )
        if not 0 <= nid < len(self.nodes):
            raise VerifyError(
                f"graph {self.name!r}: node id {nid} does not exist ({len(self.nodes)} nodes)"
            )
        return self.nodes[nid]

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def shape(self, nid: NodeId) -> Shape:
        """The shape (dims and dtype) of node ``nid``."""
        return self.node(nid).shape

    def find(self, op_type: type[Op]) -> list[Node]:
        """All nodes whose op is an instance of ``op_type``."""
        return [n for n in self.nodes if isinstance(n.op, op_type)]

    def input_nodes(self) -> list[Node]:
        """The Input nodes, in the order they were declared."""
        from rlx.ops.core import Input

        return [n for n in self.nodes if isinstance(n.op, Input)]

    def param_nodes(self) -> list[Node]:
        """The Param nodes, in the order they were declared."""
        from rlx.ops.core import Param

        return [n for n in self.nodes if isinstance(n.op, Param)]

    @property
    def input_names(self) -> list[str]:
        """The names of the graph inputs (what ``run`` and ``evaluate`` take)."""
        return [n.op.name for n in self.input_nodes()]  # type: ignore[attr-defined]

    @property
    def param_names(self) -> list[str]:
        """The names of the graph params (what ``set_params`` takes)."""
        return [n.op.name for n in self.param_nodes()]  # type: ignore[attr-defined]

    def consumers(self) -> dict[NodeId, list[NodeId]]:
        """Node id -> ids of the nodes that read it (in order, with repeats)."""
        out: dict[NodeId, list[NodeId]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                if i in out:
                    out[i].append(n.id)
        return out

    def topo_order(self) -> list[NodeId]:
        """Node ids in a dependency-respecting order (insertion order when it is one).
        A node whose op has an ``effect`` (it writes a param's storage: ``assign``) runs
        right after the last node it must follow: its own inputs and every reader of the
        param it writes (input 0; readers through view ops count), so every reader sees
        the old value and the value written dies at once; effects on one param keep their
        order. An effect whose input 0 is not a param, or whose param another effect reads
        as a value, comes last (nothing reads an effect node's output but the outputs)."""
        if all(i < n.id for n in self.nodes for i in n.inputs) and all(
            n.id == k for k, n in enumerate(self.nodes)
        ):
            order = list(range(len(self.nodes)))
        else:
            from rlx.ir.verify import topo_sort

            order = topo_sort(self)
        effects = [k for k in order if self.nodes[k].op.effect]
        if not effects:
            return order
        return _place_effects(self, order, effects)

    def copy(self, name: str | None = None) -> Graph:
        """A copy of the graph (same nodes, outputs and symbol bounds), optionally renamed."""
        g = Graph(name or self.name)
        g.nodes = list(self.nodes)
        g.outputs = list(self.outputs)
        g.sym_bounds = dict(self.sym_bounds)
        return g

    # ---- the seed's module entry points (Graph::define, Graph::hir, g.module()) ------

    @staticmethod
    def define(
        name: str,
        build: Callable[[HirModule], HirNodeId | Iterable[HirNodeId]],
        policy: FusionPolicy | None = None,
    ) -> GraphModule:
        """The seed's ``Graph::define``: ``build(hir)`` on a fresh HirModule ``name``; its
        return value (a node id or several) becomes the outputs. Returns the HIR-stage
        GraphModule that :meth:`GraphModule.define` returns."""
        from rlx.ir.module import GraphModule

        if policy is None:
            return GraphModule.define(name, build)
        return GraphModule.define(name, build, policy)

    @staticmethod
    def hir(name: str, policy: FusionPolicy | None = None) -> GraphModule:
        """The seed's ``Graph::hir``: an empty HIR-stage GraphModule named ``name``, as
        :meth:`GraphModule.hir` returns."""
        from rlx.ir.module import GraphModule

        return GraphModule.hir(name) if policy is None else GraphModule.hir(name, policy)

    def module(self) -> GraphModule:
        """The seed's ``g.module()``: this graph (not a copy) as a MIR-stage GraphModule,
        as :meth:`GraphModule.from_graph` returns."""
        from rlx.ir.module import GraphModule

        return GraphModule.from_graph(self)

    # ---- checking, printing, hashing ----------------------------------------------

    def verify(self) -> Graph:
        """Raise VerifyError naming the first malformed node; return self when sound."""
        from rlx.ir.verify import verify

        verify(self)
        return self

    def inspect(self) -> str:
        """A jaxpr-like listing: one line per node, then the outputs."""
        from rlx.ir.printer import format_graph

        return format_graph(self)

    def __str__(self) -> str:
        return self.inspect()

    def to_html(self, path: str | None = None, **kw: Any) -> str:
        """One self-contained HTML page of this graph (blocks, shapes, dtypes, source
        lines, the memory plan as a timeline); written to ``path`` when given. Options:
        :func:`rlx.viz.graph_to_html` (``bindings``, ``engine``, ``expand``)."""
        from rlx.viz import graph_to_html

        return graph_to_html(self, path, **kw)

    def __repr__(self) -> str:
        return (
            f"<Graph {self.name!r}: {len(self.nodes)} nodes, "
            f"inputs={self.input_names}, outputs={self.outputs}>"
        )

    def fingerprint(self) -> str:
        """Structural sha256 over ops (every attribute by its full content), edges, shapes,
        outputs and bounds (not names of the graph or source lines): equal graphs give
        equal fingerprints, and graphs that differ anywhere give different ones."""
        return _graph_digest(self, {})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return (
            self.nodes == other.nodes
            and self.outputs == other.outputs
            and self.sym_bounds == other.sym_bounds
        )

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    # ---- evaluation (reference interpreter) ------------------------------------

    def evaluate(
        self,
        inputs: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> list[np.ndarray]:
        """Verify the graph, then run the NumPy reference interpreter on ``inputs`` and
        ``params`` (name -> array); returns one array per output. A malformed graph raises
        VerifyError before anything runs."""
        from rlx.backends.reference import evaluate

        self.verify()
        return evaluate(self, inputs or {}, params or {})


def _place_effects(g: Graph, order: list[NodeId], effects: list[NodeId]) -> list[NodeId]:
    """``order`` with each effect node moved right after its anchor (``topo_order``)."""
    from rlx.ops.core import Param

    last = set(effects)
    base = [k for k in order if k not in last]
    pos = {k: i for i, k in enumerate(base)}
    readers = g.consumers()
    read_by_effects = {i for e in effects for i in g.nodes[e].inputs[1:]}
    after: dict[int, list[NodeId]] = {}
    tail: list[NodeId] = []
    prev: dict[NodeId, int] = {}  # param -> anchor of the previous effect writing it
    for e in effects:
        ins = g.nodes[e].inputs
        t = ins[0] if ins else None
        if t is None or not isinstance(g.nodes[t].op, Param) or t in read_by_effects:
            tail.append(e)
            continue
        at = max([pos[i] for i in ins if i in pos] + [prev.get(t, -1)])
        stack, seen = [t], {t}
        while stack:  # the param's readers, and the readers of its views
            for c in readers[stack.pop()]:
                if c in seen or c in last:
                    continue
                seen.add(c)
                at = max(at, pos[c])
                if g.nodes[c].op.view:
                    stack.append(c)
        prev[t] = at
        after.setdefault(at, []).append(e)
    out = list(after.get(-1, []))
    for i, k in enumerate(base):
        out.append(k)
        out.extend(after.get(i, []))
    return out + tail


# ---- fingerprint helpers ---------------------------------------------------------------
# An attribute becomes a "canonical tree": nested tuples whose first item is a type tag and
# whose leaves are None, bool, int, str or bytes. repr() of such a tree is injective (Python
# could parse it back), so hashing the reprs hashes the full content. Nothing is
# abbreviated: constants by their bytes, floats by their bits (-0.0 != 0.0, NaN payloads
# kept), sub-graphs by their own fingerprint (memoized for one call), dataclasses field by
# field, enums by class and member.


def _graph_digest(g: Graph, memo: dict[int, str]) -> str:
    """The fingerprint of ``g``; ``memo`` maps id(sub-graph) -> its fingerprint for the
    duration of one top-level call (graphs are mutable, so nothing is kept across calls)."""
    h = hashlib.sha256()
    for n in g.nodes:
        key = (n.id, _canon(n.op, memo), n.inputs, _shape_key(n.shape))
        h.update(repr(key).encode())
    bounds = tuple(sorted(g.sym_bounds.items()))
    h.update(repr((tuple(g.outputs), bounds)).encode())
    return h.hexdigest()


def _shape_key(s: Shape) -> tuple[Any, ...]:
    return ("S", s.dtype.value, tuple(_dim_key(d) for d in s.dims))


def _dim_key(d: Any) -> Any:
    if type(d) is int:
        return d
    if type(d) is Sym:
        return ("y", d.coeff, tuple((str(n), int(p)) for n, p in d.terms))
    return ("?", _canon(d, {}))


def _float_bits(v: float) -> int:
    return int.from_bytes(struct.pack("<d", v), "little")


_KINDS: dict[type, str] = {}  # type -> how _canon encodes it, decided once per type
_FIELDS: dict[type, tuple[str, ...]] = {}


def _kind(t: type) -> str:
    kind = _KINDS.get(t)
    if kind is not None:
        return kind
    if t in (type(None), int, str, bool):
        kind = "leaf"
    elif t in (float, tuple, Shape, Sym, bytes, complex, list):
        kind = t.__name__
    elif issubclass(t, Graph):
        kind = "graph"
    elif issubclass(t, enum.Enum):
        kind = "enum"
    elif dataclasses.is_dataclass(t):
        kind = "dataclass"
        _FIELDS[t] = tuple(f.name for f in dataclasses.fields(t))
    elif issubclass(t, np.generic):
        kind = "scalar"
    elif issubclass(t, np.ndarray):
        kind = "array"
    elif issubclass(t, frozenset | set):
        kind = "set"
    else:
        kind = "other"
    _KINDS[t] = kind
    return kind


def _canon(v: Any, memo: dict[int, str]) -> Any:
    """The canonical tree of attribute value ``v`` (see above)."""
    t = type(v)
    kind = _KINDS.get(t) or _kind(t)
    if kind == "leaf":
        return v
    if kind == "dataclass":  # ops and the dataclasses they hold: field by field
        fields = tuple((k, _canon(getattr(v, k), memo)) for k in _FIELDS[t])
        return ("d", t.__module__, t.__qualname__, fields)
    if kind == "enum":
        return ("e", t.__module__, t.__qualname__, v._name_)
    if kind == "float":
        return ("f", _float_bits(v))
    if kind == "tuple":
        return ("t", *[_canon(x, memo) for x in v])
    if kind == "Shape":
        return _shape_key(v)
    if kind == "Sym":
        return _dim_key(v)
    if kind == "graph":
        fp = memo.get(id(v))
        if fp is None:
            fp = memo[id(v)] = _graph_digest(v, memo)
        return ("g", fp)
    if kind == "bytes":
        return ("b", v) if len(v) <= 64 else ("h", len(v), hashlib.sha256(v).digest())
    if kind == "complex":
        return ("j", _float_bits(v.real), _float_bits(v.imag))
    if kind == "scalar":
        return ("n", v.dtype.str, v.tobytes())
    if kind == "array":
        a = np.ascontiguousarray(v)
        return ("a", a.dtype.str, a.shape, hashlib.sha256(a.tobytes()).digest())
    if kind == "set":
        return ("s", tuple(sorted(repr(_canon(x, memo)) for x in v)))
    if kind == "list":
        return ("l", *[_canon(x, memo) for x in v])
    # a user type we know nothing of: its repr and its hash (equal values hash equal)
    return ("o", t.__module__, t.__qualname__, repr(v), hash(v))
