"""Import state. In: the rlx Graph being built, the ONNX value names seen so far and the
opsets. Out: for each converter, a :class:`NodeCtx` giving the node's inputs as node ids,
its attributes with defaults, and the *values* of inputs that must be known at import
(shape inputs, axes, scales), folded with rlx's reference interpreter when they are
computed from constants."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import AttributeProto, NodeProto, helper, numpy_helper

from rlx.dtype import DType
from rlx.frontends.onnx.errors import NeedsConstantError, OnnxImportError, OnnxUnsupportedError
from rlx.ir.mir import Graph
from rlx.ops.core import Input, Param
from rlx.shape import Dim, Shape

__all__ = ["ImportState", "NodeCtx", "node_label"]


def node_label(node: NodeProto) -> str:
    """``'name' (Op)`` for errors; an unnamed node is named by its first output."""
    name = node.name or (f"<unnamed, output {node.output[0]!r}>" if node.output else "<unnamed>")
    return f"node {name!r} ({node.domain + '::' if node.domain else ''}{node.op_type})"


@dataclass
class ImportState:
    """The graph under construction and what each ONNX value name maps to: a node id, a
    known constant array (emitted as a Constant on first use), or both."""

    g: Graph
    opsets: Mapping[str, int]
    ids: dict[str, int] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    graph_inputs: set[str] = field(default_factory=set)
    outer: ImportState | None = None  # the enclosing graph's state (If / Loop bodies)
    captured: dict[str, int] = field(default_factory=dict)  # outer name -> operand index
    base: int = 0  # a sub-graph's formal inputs (captures are numbered from here)
    blocking: str | None = None  # the graph input that stopped the last fold()
    syms: dict[str, Any] = field(default_factory=dict)  # name -> SymValue (symbolic.py)
    carriers: dict[str, tuple[int, int]] = field(default_factory=dict)  # symbol -> (id, axis)
    sym_scalars: dict[str, int] = field(default_factory=dict)  # symbol -> its i64 scalar node

    def has(self, name: str) -> bool:
        return (
            name in self.ids
            or name in self.consts
            or name in self.syms
            or (self.outer is not None and self.outer.has(name))
        )

    def node_id(self, name: str) -> int:
        """The node id holding value ``name`` (a Constant node made on first use; an outer
        graph's value becomes a captured input of this sub-graph)."""
        if name in self.ids:
            return self.ids[name]
        c = self.const(name)
        if c is not None:
            self.ids[name] = self.g.constant(c)
            return self.ids[name]
        if name in self.syms:
            from rlx.frontends.onnx.symbolic import materialize

            self.ids[name] = materialize(self, self.syms[name])
            return self.ids[name]
        if self.outer is not None and self.outer.has(name):
            from rlx.frontends.onnx.control import capture

            return capture(self, name)
        raise OnnxImportError(f"value {name!r} is used before it is defined")

    def const(self, name: str) -> np.ndarray | None:
        if name in self.consts:
            return self.consts[name]
        if name not in self.ids and self.outer is not None:
            return self.outer.const(name)
        return None

    def fold(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it depends on constants only (evaluated once with the
        reference interpreter on a copy of its ancestors), else None."""
        c = self.const(name)
        if c is not None or name not in self.ids:
            return c
        nid = self.ids[name]
        order, seen, stack = [], set(), [nid]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            node = self.g.nodes[i]
            if isinstance(node.op, Input):
                self.blocking = node.op.name
                return None
            if isinstance(node.op, Param) or node.op.subgraphs():
                self.blocking = None
                return None
            order.append(i)
            stack.extend(node.inputs)
        sub = Graph("fold")
        remap: dict[int, int] = {}
        for i in sorted(order):
            n = self.g.nodes[i]
            remap[i] = sub.add_node(n.op, [remap[j] for j in n.inputs], n.shape)
        sub.set_outputs([remap[nid]])
        value = sub.evaluate()[0]
        self.consts[name] = value
        return value

    def is_graph_input(self, name: str) -> bool:
        if name in self.graph_inputs:
            return True
        return name not in self.ids and self.outer is not None and self.outer.is_graph_input(name)


class NodeCtx:
    """What a converter sees of one ONNX node: ``ctx.x(i)`` (input i as a node id),
    ``ctx.value(i)`` (input i's array, which must be known at import), ``ctx.attr(name,
    default)``, ``ctx.g`` (the rlx Graph) and ``ctx.opset`` (the node domain's opset)."""

    def __init__(self, st: ImportState, node: NodeProto, opset: int):
        self.st = st
        self.node = node
        self.g: Graph = st.g
        self.opset = opset
        self._attrs = {a.name: a for a in node.attribute}
        self.override: dict[int, int] = {}  # input index -> node id replacing it

    # ---- inputs -----------------------------------------------------------------------
    @property
    def n_in(self) -> int:
        return len(self.node.input)

    def has(self, i: int) -> bool:
        """Input ``i`` is present (not omitted and not the empty name)."""
        return i < len(self.node.input) and self.node.input[i] != ""

    def x(self, i: int) -> int:
        """Input ``i`` as a node id."""
        if not self.has(i):
            raise self.error(f"input {i} is required but missing")
        if i in self.override:
            return self.override[i]
        return self.st.node_id(self.node.input[i])

    def opt(self, i: int) -> int | None:
        return self.x(i) if self.has(i) else None

    def xs(self) -> list[int]:
        return [self.x(i) for i in range(self.n_in) if self.has(i)]

    def shape(self, nid: int) -> Shape:
        return self.g.shape(nid)

    def dtype(self, nid: int) -> DType:
        return self.g.shape(nid).dtype

    def in_shape(self, i: int) -> Shape:
        if i in self.override:
            return self.g.shape(self.override[i])
        name = self.node.input[i]
        if name in self.st.syms:
            return self.st.syms[name].shape
        c = self.st.const(name) if name not in self.st.ids else None
        if c is not None:
            return Shape(c.shape, DType.from_numpy(c.dtype))
        return self.g.shape(self.x(i))

    def is_const(self, i: int) -> bool:
        return self.has(i) and self.st.const(self.node.input[i]) is not None

    def value(self, i: int, what: str = "") -> np.ndarray:
        """The array of input ``i``, which this op needs at import time."""
        name = self.node.input[i]
        v = self.st.fold(name)
        if v is not None:
            return v
        what = what or f"input {i}"
        if name in self.st.syms:
            raise self.unsupported(
                f"{what} ({name!r}) is {self.st.syms[name]}, which depends on symbolic dims; "
                f"this op needs it as numbers (fix the dims with load(..., input_dims=...))"
            )
        dep = self.st.blocking if name in self.st.ids else None
        if dep is not None and dep in self.st.graph_inputs:
            raise NeedsConstantError(
                f"{node_label(self.node)}: {what} ({name!r}) must be known when importing "
                f"(rlx compiles static shapes) and it is computed from graph input {dep!r}; "
                f"pass that input's value in load(..., constant_inputs={{{dep!r}: array}})",
                input_name=dep,
            )
        if self.st.is_graph_input(name):
            raise NeedsConstantError(
                f"{node_label(self.node)}: {what} ({name!r}) must be known when importing "
                f"(rlx compiles static shapes) but it is a graph input; pass its value in "
                f"load(..., constant_inputs={{{name!r}: array}}) or make it an initializer",
                input_name=name,
            )
        raise OnnxUnsupportedError(
            f"{node_label(self.node)}: {what} ({name!r}) is computed at run time; rlx needs "
            f"it when importing (a shape-dependent value that does not fold to a constant)",
            op_type=self.node.op_type,
            domain=self.node.domain,
            opset=self.opset,
        )

    def dims(self, i: int, what: str = "") -> list[Dim]:
        """Input ``i`` (a shape, sizes, bounds) flattened into dims: ints, or symbolic dims
        where it was computed from the shape of a tensor with symbolic dims."""
        v = self.st.syms.get(self.node.input[i]) if self.has(i) else None
        if v is not None:
            from rlx.frontends.onnx.symbolic import dims_of

            return dims_of(v)
        return [*self.ints(i, what)]

    def ints(self, i: int, what: str = "") -> list[int]:
        return [int(v) for v in np.asarray(self.value(i, what)).reshape(-1)]

    # ---- attributes -------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        a = self._attrs.get(name)
        if a is None:
            return default
        if a.type == AttributeProto.TENSOR:
            return numpy_helper.to_array(a.t)
        if a.type == AttributeProto.GRAPH:
            return a.g
        v = helper.get_attribute_value(a)
        if a.type == AttributeProto.STRING:
            return v.decode()
        if a.type == AttributeProto.STRINGS:
            return [s.decode() for s in v]
        if a.type in (AttributeProto.INTS, AttributeProto.FLOATS):
            return list(v)
        return v

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    # ---- errors -----------------------------------------------------------------------
    def unsupported(self, why: str) -> OnnxUnsupportedError:
        return OnnxUnsupportedError(
            f"{node_label(self.node)} (domain {self.node.domain or 'ai.onnx'}, opset "
            f"{self.opset}): {why}",
            op_type=self.node.op_type,
            domain=self.node.domain,
            opset=self.opset,
        )

    def error(self, why: str) -> OnnxImportError:
        return OnnxImportError(f"{node_label(self.node)}: {why}")

    def out_names(self) -> Sequence[str]:
        return self.node.output
