"""The precision report: what the auto-mixed-precision pass decided for each node.

In: the decisions :class:`~rlx.passes.precision.AutoMixedPrecision` records while it
rewrites a graph. Out: a :class:`PrecisionReport` (``amp.report``,
``CompileResult.precision_report``, the ``precision:`` section of ``compiled.report()``
and so of ``rlx inspect``): one :class:`NodePrecision` per node of the graph the pass
received (inputs, params and constants left out), with the dtype it runs at and why.

A control-flow node (``if``, ``while``, ``scan``) keeps its f32 interface; the decisions
for its sub-graphs sit under it, one :class:`BodyPrecision` per sub-graph, named by the
op's field (``then_branch``, ``else_branch``, ``cond``, ``body``), and nest as the
control flow nests. An ``elementwise_region`` lists its body the same way. Look one up
with ``report.body(parent, "then_branch")``, ``parent`` the user's node id of the
control-flow node (the ``%5`` of ``%5 if (model.py:12)``). The text form::

    precision auto_mixed_bf16: 4 narrowed, 0 kept f32, 8 casts
      %3 if (m.py:12)                              f32   sub-graphs: interface kept
        then_branch 'g.then' (3 casts)
          %2 matmul (m.py:12)                      bf16  narrowed
        else_branch 'g.else' (3 casts)
          %2 matmul (m.py:12)                      bf16  narrowed
          %3 tanh (m.py:12)                        bf16  narrowed
      %5 add (m.py:13)                             bf16  narrowed

A body node's ``%id`` is its id in its sub-graph (the graph the user built as the body).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlx.dtype import DType
from rlx.errors import CompileError
from rlx.ops.base import OpKind

if TYPE_CHECKING:
    from rlx.passes.precision import PrecisionPolicy

__all__ = ["Decision", "NodePrecision", "BodyPrecision", "PrecisionReport"]


class Decision(enum.Enum):
    """What the pass did with one node."""

    NARROWED = "narrowed"  # runs at the policy's narrow dtype
    POLICY_F32 = "f32 by policy"  # the policy keeps this op kind in f32
    KEPT_F32 = "kept f32"  # the policy wanted it narrow; ``reason`` says why not
    NOT_F32 = "not f32"  # not an f32 value (int, bool, f64, already narrow): untouched
    SUBGRAPHS = "sub-graphs"  # control flow: interface dtypes kept, its bodies rewritten


@dataclass(frozen=True, slots=True)
class NodePrecision:
    """One node: ``node`` is the user's node id (``Node.loc.node``; the node's own id in
    the graph the pass received when it has no provenance), ``dtype`` what it runs at
    after the pass, ``bodies`` its sub-graphs' decisions."""

    node: int
    label: str
    kind: OpKind
    dtype: DType
    decision: Decision
    reason: str = ""
    bodies: tuple[BodyPrecision, ...] = ()


@dataclass(frozen=True, slots=True)
class BodyPrecision:
    """The decisions inside one sub-graph: ``role`` is the op's field holding it
    (``then_branch``, ``body``, ...), ``graph`` the sub-graph's name, ``casts`` the casts
    the pass inserted in it (its boundary casts included)."""

    role: str
    graph: str
    nodes: tuple[NodePrecision, ...]
    casts: int


def _find(nodes: tuple[NodePrecision, ...], node: int, where: str) -> NodePrecision:
    for n in nodes:
        if n.node == node:
            return n
    raise CompileError(
        f"precision report: no node %{node} in {where}; expected one of {[n.node for n in nodes]}"
    )


@dataclass(frozen=True, slots=True)
class PrecisionReport:
    """Every decision of one run of the pass (see the module docstring); ``casts`` counts
    the top-level graph's inserted casts, each body's are in its ``BodyPrecision``."""

    policy: PrecisionPolicy
    nodes: tuple[NodePrecision, ...] = ()
    casts: int = 0

    def node(self, node: int) -> NodePrecision:
        """The top-level decision for the user's node ``node``; CompileError if absent."""
        return _find(self.nodes, node, "the graph")

    def body(self, parent: int, role: str) -> BodyPrecision:
        """The decisions in sub-graph ``role`` of top-level node ``parent``."""
        n = self.node(parent)
        for b in n.bodies:
            if b.role == role:
                return b
        raise CompileError(
            f"precision report: node {n.label} has no sub-graph {role!r}; expected one of "
            f"{[b.role for b in n.bodies]}"
        )

    def walk(self) -> Iterator[tuple[tuple[str, ...], NodePrecision]]:
        """Every decision, bodies included: (path, node), the path naming the enclosing
        sub-graphs (``("%5 if (m.py:12)", "then_branch")``, empty at the top level)."""
        todo: list[tuple[tuple[str, ...], NodePrecision]] = [((), n) for n in self.nodes]
        todo.reverse()
        while todo:
            path, n = todo.pop()
            yield path, n
            for b in reversed(n.bodies):
                todo.extend(((*path, n.label, b.role), m) for m in reversed(b.nodes))

    def count(self, decision: Decision) -> int:
        """How many nodes, bodies included, got ``decision``."""
        return sum(1 for _, n in self.walk() if n.decision is decision)

    @property
    def total_casts(self) -> int:
        """Inserted casts, bodies included."""
        return self.casts + sum(b.casts for _, n in self.walk() for b in n.bodies)

    def summary(self) -> str:
        return (
            f"precision {self.policy}: {self.count(Decision.NARROWED)} narrowed, "
            f"{self.count(Decision.KEPT_F32)} kept f32, {self.total_casts} casts"
        )

    def __str__(self) -> str:
        lines = [self.summary()]
        if not self.nodes:
            return lines[0] + " (nothing to do)"
        _render(self.nodes, 1, lines)
        return "\n".join(lines)


def _render(nodes: tuple[NodePrecision, ...], depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    for n in nodes:
        what = n.decision.value + (f": {n.reason}" if n.reason else "")
        name = f"{pad}{n.label}"  # never cut: reports name nodes by their full label
        lines.append(f"{name:<46} {n.dtype.value:<5} {what}")
        for b in n.bodies:
            lines.append(f"{pad}  {b.role} {b.graph!r} ({b.casts} casts)")
            _render(b.nodes, depth + 2, lines)
