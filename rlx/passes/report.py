"""Fusion reports: what each fusion pass fused, and why near misses did not fuse.

In: entries appended by the fusion passes while they run. Out: a :class:`FusionReport`
that tests query (``report.fused_of(FusionPattern.ATTENTION)``) and ``str(report)``
prints, one line per entry, in the style of Inductor's ``WhyNoFuse``::

    fused   matmul_bias_act     %5 matmul (m.py:9) + %6 add (m.py:9) + %7 gelu (m.py:9) -> ...
    no fuse matmul_bias_act     %5 matmul (m.py:9) + %6 add (m.py:9): bias shape [4,8] is ...

Nodes are named by the user's graph (``%5 matmul (model.py:42)``, :attr:`Node.label`), not
by the graph the fusion pass received (each pass renumbers): the same name is used by the
kernel schedule of ``compiled.report()`` and by the quantization report. A graph that comes
without that provenance (loaded from a file, built with ``add_node``) gets it from
:func:`with_provenance` when compilation starts.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from rlx import source
from rlx.ir.mir import Graph, op_name

__all__ = ["FusionPattern", "Fused", "NoFuse", "FusionReport", "with_provenance"]


def with_provenance(graph: Graph) -> Graph:
    """``graph`` itself when any node carries provenance (built by ``Graph.apply``, or
    derived from such a graph by passes), else a copy whose every node is stamped with its
    own id and op: this graph is then the user's, and reports name nodes by its ids."""
    if any(n.loc is not None and n.loc.node is not None for n in graph.nodes):
        return graph
    out = graph.copy()
    out.nodes = [
        dataclasses.replace(n, loc=source.stamp(n.loc, n.id, op_name(n.op))) for n in graph.nodes
    ]
    return out


class FusionPattern(enum.Enum):
    """The fusion patterns, in the order the pipeline tries them."""

    GELU = "gelu"
    LAYER_NORM = "layer_norm"
    CROSS_ENTROPY = "cross_entropy"
    ATTENTION = "attention"
    SWIGLU = "swiglu"
    RESIDUAL_NORM = "residual_norm"
    QUANT_EPILOGUE = "quant_epilogue"
    MATMUL_BIAS_ACT = "matmul_bias_act"
    CONV_ACT = "conv_act"
    ATTENTION_BLOCK = "attention_block"
    TRANSFORMER_LAYER = "transformer_layer"
    ELEMENTWISE_REGION = "elementwise_region"


@dataclass(frozen=True, slots=True)
class Fused:
    """One fusion that happened: which nodes became which op."""

    pattern: FusionPattern
    nodes: tuple[int, ...]
    description: str
    into: str

    def __str__(self) -> str:
        return f"fused   {self.pattern.value:<19} {self.description} -> {self.into}"


@dataclass(frozen=True, slots=True)
class NoFuse:
    """A near miss: nodes that looked like a pattern, and the reason they did not fuse."""

    pattern: FusionPattern
    nodes: tuple[int, ...]
    description: str
    reason: str

    def __str__(self) -> str:
        return f"no fuse {self.pattern.value:<19} {self.description}: {self.reason}"


@dataclass
class FusionReport:
    """Every fusion and every near miss of one compile."""

    fused: list[Fused] = field(default_factory=list)
    missed: list[NoFuse] = field(default_factory=list)

    def add_fused(
        self, pattern: FusionPattern, nodes: tuple[int, ...], description: str, into: str
    ) -> None:
        self.fused.append(Fused(pattern, tuple(nodes), description, into))

    def why_no_fuse(
        self, pattern: FusionPattern, nodes: tuple[int, ...], description: str, reason: str
    ) -> None:
        """Record a near miss (the WhyNoFuse of Inductor)."""
        self.missed.append(NoFuse(pattern, tuple(nodes), description, reason))

    def fused_of(self, pattern: FusionPattern) -> list[Fused]:
        return [f for f in self.fused if f.pattern is pattern]

    def missed_of(self, pattern: FusionPattern) -> list[NoFuse]:
        return [m for m in self.missed if m.pattern is pattern]

    def count(self, pattern: FusionPattern) -> int:
        return len(self.fused_of(pattern))

    def summary(self) -> str:
        """One line: fusions per pattern and the number of near misses."""
        parts = [f"{p.value}={self.count(p)}" for p in FusionPattern if self.count(p)]
        return f"fusions: {', '.join(parts) or 'none'}; near misses: {len(self.missed)}"

    def __str__(self) -> str:
        lines = [self.summary()]
        lines += [str(e) for e in self.fused]
        lines += [str(e) for e in self.missed]
        return "\n".join(lines)
