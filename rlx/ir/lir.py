"""LIR: a MIR graph plus its buffer plan. In: a graph and the planner's decisions.
Out: :class:`LirModule`, which the CPU executor turns into a flat schedule of kernels.

The plan puts every node's output in one byte arena (offsets are absolute, 64-byte
aligned). The arena has two regions::

    [0, persistent_bytes)              params and constants, never reused
    [persistent_bytes, arena_bytes)    inputs and intermediates, reused over time

A slot is one of three things: an owned buffer; a *view* (``view_of``: the node whose
bytes it reinterprets, e.g. a reshape, same offset and size); or an *in-place* result
(``inplace_of``: the input whose slot it took over because that input died at this node).
``view_of`` always names the node that owns the bytes (never another view). An in-place
node's kernel gets its output and that input as the same memory: it must read each
element before writing it (NumPy ufuncs with ``out=`` do). Graph inputs may be
overwritten in place after their last read, so they are copied in before every run.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from rlx.errors import RlxError
from rlx.ir.mir import Graph, NodeId

__all__ = ["BufferSlot", "BufferPlan", "LirModule", "PlanStrategy", "format_bytes"]


class PlanStrategy(enum.Enum):
    """The offset heuristic that produced a plan (see rlx/backends/cpu/planner.py)."""

    GREEDY_BY_SIZE = "greedy_by_size"
    GREEDY_BY_BREADTH = "greedy_by_breadth"
    BEST_FIT_IN_ORDER = "best_fit_in_order"


def format_bytes(n: int) -> str:
    """Human-readable byte count: ``1536 -> '1.5 KiB'``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class BufferSlot:
    """Where node ``node``'s output lives: ``arena[offset : offset + nbytes]``."""

    node: NodeId
    offset: int
    nbytes: int
    view_of: NodeId | None = None
    inplace_of: NodeId | None = None

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    @property
    def owns_bytes(self) -> bool:
        """False for views: they alias another slot's bytes and allocate nothing."""
        return self.view_of is None

    def describe(self) -> str:
        text = f"[{self.offset}, +{self.nbytes}]"
        if self.view_of is not None:
            text += f" view of %{self.view_of}"
        if self.inplace_of is not None:
            text += f" in place of %{self.inplace_of}"
        return text


@dataclass(frozen=True, slots=True)
class BufferPlan:
    """The arena layout of one graph for one set of symbol bindings.

    arena_bytes: total arena size (persistent region + working region).
    slots: node id -> :class:`BufferSlot`, for every node of the graph.
    schedule: node ids in execution order.
    alignment: every offset is a multiple of it.
    naive_bytes: working bytes if every non-view node had its own buffer (no reuse).
    lower_bound_bytes: the most working bytes live at any one schedule step; no packing
        of these lifetimes can use less.
    bindings: the symbol values the sizes were computed with.
    persistent_bytes: size of the params/constants region at the start of the arena.
    strategy: the offset heuristic that produced this plan.
    keep_alive: nodes besides the outputs whose bytes stay intact to the end.
    """

    arena_bytes: int
    slots: Mapping[NodeId, BufferSlot] = field(hash=False)
    schedule: tuple[NodeId, ...]
    alignment: int = 64
    naive_bytes: int = 0
    lower_bound_bytes: int = 0
    bindings: Mapping[str, int] = field(default_factory=dict, hash=False)
    persistent_bytes: int = 0
    strategy: PlanStrategy | None = None
    keep_alive: tuple[NodeId, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "slots", MappingProxyType(dict(self.slots)))
        object.__setattr__(self, "bindings", MappingProxyType(dict(self.bindings)))

    def __reduce__(self) -> tuple[type[BufferPlan], tuple[object, ...]]:
        # mapping proxies do not pickle or deepcopy: rebuild from plain dicts
        values = [getattr(self, f.name) for f in fields(self)]
        return (
            BufferPlan,
            tuple(dict(v) if isinstance(v, MappingProxyType) else v for v in values),
        )

    @property
    def peak_bytes(self) -> int:
        """Size of the working (reused) region: the planner's figure of merit."""
        return self.arena_bytes - self.persistent_bytes

    @property
    def ratio(self) -> float:
        """peak / lower bound (1.0 is optimal for the given lifetimes)."""
        return self.peak_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 1.0

    def slot(self, node: NodeId) -> BufferSlot:
        """The slot of ``node``; RlxError naming the node when it has none."""
        try:
            return self.slots[node]
        except KeyError:
            raise RlxError(
                f"buffer plan has no slot for node %{node} (plan covers {len(self.slots)} nodes)",
                node=node,
            ) from None

    def offset(self, node: NodeId) -> int:
        return self.slot(node).offset

    def summary(self) -> str:
        """One paragraph: arena, peak, naive, lower bound, ratio, strategy."""
        saved = self.naive_bytes / self.peak_bytes if self.peak_bytes else 1.0
        views = sum(1 for s in self.slots.values() if s.view_of is not None)
        inplace = sum(1 for s in self.slots.values() if s.inplace_of is not None)
        lines = [
            f"arena {format_bytes(self.arena_bytes)} = persistent "
            f"{format_bytes(self.persistent_bytes)} + working {format_bytes(self.peak_bytes)}",
            f"peak {format_bytes(self.peak_bytes)}, naive {format_bytes(self.naive_bytes)} "
            f"({saved:.2f}x smaller), lower bound {format_bytes(self.lower_bound_bytes)} "
            f"(peak/lower bound {self.ratio:.3f})",
            f"{len(self.slots)} slots, {views} views, {inplace} in place, "
            f"{self.alignment}-byte alignment, strategy {self.strategy.value if self.strategy else '-'}",
        ]
        if self.bindings:
            lines.append("bindings " + ", ".join(f"{k}={v}" for k, v in self.bindings.items()))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


@dataclass(frozen=True, slots=True)
class LirModule:
    """A MIR graph together with its buffer plan: the backend's input."""

    graph: Graph
    plan: BufferPlan

    def inspect(self) -> str:
        """The graph listing, each node annotated with its ``[offset, +size]``, then the
        plan summary."""
        from rlx.ir.printer import format_graph

        lines = format_graph(self.graph).split("\n")
        out: list[str] = []
        node_lines = iter(range(len(self.graph.nodes)))
        nid = next(node_lines, None)
        for line in lines:
            if nid is not None and line.startswith(f"  %{nid}:"):
                slot = self.plan.slots.get(nid)
                if slot is not None:
                    line = f"{line:<56}  {slot.describe()}"
                nid = next(node_lines, None)
            out.append(line)
        out.append("# " + self.plan.summary().replace("\n", "\n# "))
        return "\n".join(out)

    def __str__(self) -> str:
        return self.inspect()
