"""Pass protocol and per-pass records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from rlx.ir.mir import Graph

__all__ = ["Pass", "PassRecord"]


class Pass(Protocol):
    """A graph-to-graph rewrite with a name. ``notes`` lists what the last run changed
    (and, for what it did not, why)."""

    name: str

    def run(self, graph: Graph) -> Graph: ...


@dataclass
class PassRecord:
    """What one pass did: timing, node counts, and its notes."""

    name: str
    seconds: float
    nodes_before: int
    nodes_after: int
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        n = f"{self.nodes_before}->{self.nodes_after} nodes"
        return f"{self.name:<28} {self.seconds * 1e3:8.2f} ms  {n}" + (
            "  " + "; ".join(self.notes[:3]) if self.notes else ""
        )
