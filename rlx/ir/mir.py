"""MIR: the tensor DAG. In: ops and edges from a builder, HIR lowering or a file.
Out: a verified graph of :class:`Node` with outputs, printable and fingerprinted.

Nodes are frozen; a graph only grows (passes build a new graph). Node ids are indices
into ``graph.nodes``; every builder call infers the node's shape with the op's rule, or
checks a given shape against it, and records the user line that built the node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import RlxError, ShapeError, VerifyError
from rlx.ir import source
from rlx.ir.source import SourceLoc
from rlx.ops.base import Op
from rlx.shape import Shape, Sym

__all__ = ["Node", "Graph", "NodeId"]

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
        loc = source.capture()
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
        if max is not None and max < min:
            raise ShapeError(f"symbolic dim {name!r}: max {max} < min {min}")
        self.sym_bounds[name] = (min, max)
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
        """Node ids in a dependency-respecting order (insertion order when it is one)."""
        if all(i < n.id for n in self.nodes for i in n.inputs) and all(
            n.id == k for k, n in enumerate(self.nodes)
        ):
            return list(range(len(self.nodes)))
        from rlx.ir.verify import topo_sort

        return topo_sort(self)

    def copy(self, name: str | None = None) -> Graph:
        """A copy of the graph (same nodes, outputs and symbol bounds), optionally renamed."""
        g = Graph(name or self.name)
        g.nodes = list(self.nodes)
        g.outputs = list(self.outputs)
        g.sym_bounds = dict(self.sym_bounds)
        return g

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

    def __repr__(self) -> str:
        return (
            f"<Graph {self.name!r}: {len(self.nodes)} nodes, "
            f"inputs={self.input_names}, outputs={self.outputs}>"
        )

    def fingerprint(self) -> str:
        """Structural sha256 over ops, edges, shapes, outputs and bounds (not names of
        the graph or source lines): equal graphs give equal fingerprints."""
        h = hashlib.sha256()
        for n in self.nodes:
            h.update(repr((n.id, _op_key(n.op), n.inputs, n.shape)).encode())
        h.update(repr((tuple(self.outputs), sorted(self.sym_bounds.items()))).encode())
        return h.hexdigest()

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


def _op_key(op: Op) -> Any:
    from rlx.ops.core import ConstValue

    attrs = []
    for k, v in op.attrs().items():
        if isinstance(v, Graph):
            v = v.fingerprint()
        elif isinstance(v, ConstValue):  # its repr elides the data: hash the bytes
            v = (v.dims, v.dtype, hashlib.sha256(v.data).hexdigest())
        elif isinstance(v, tuple) and any(isinstance(x, Graph) for x in v):
            v = tuple(x.fingerprint() if isinstance(x, Graph) else x for x in v)
        attrs.append((k, v))
    return (op.mnemonic, tuple(attrs))
