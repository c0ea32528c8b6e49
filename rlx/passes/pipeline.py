"""CompilePipeline: the one path every ``Session.compile`` takes.

In: a Graph (MIR) or GraphModule (HIR is lowered first). Out: a CompileResult with the
optimized MIR graph, a record per pass, and the fusion report.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.ir.mir import Graph
from rlx.passes.base import Pass, PassRecord
from rlx.runtime.options import CompileOptions, VerifyMode

__all__ = ["CompilePipeline", "CompileResult", "default_passes"]


@dataclass
class CompileResult:
    """The optimized graph plus what each pass did."""

    graph: Graph
    records: list[PassRecord] = field(default_factory=list)
    fusion_report: Any = None

    def pass_report(self) -> str:
        return "\n".join(str(r) for r in self.records)


def default_passes(options: CompileOptions, params: Mapping[str, np.ndarray] | None = None) -> list[Pass]:
    """The standard pass list for ``options`` (cleanup, fusion, precision)."""
    return []


class CompilePipeline:
    """Run a list of passes, verifying as ``options.verify`` says and recording each."""

    def __init__(
        self,
        options: CompileOptions | None = None,
        passes: Sequence[Pass] | None = None,
        params: Mapping[str, np.ndarray] | None = None,
    ):
        self.options = options or CompileOptions()
        self.passes = list(passes) if passes is not None else default_passes(self.options, params)

    def run(self, graph: Any) -> CompileResult:
        graph = to_mir(graph)
        graph.verify()
        records: list[PassRecord] = []
        for p in self.passes:
            if p.name in self.options.disabled_passes:
                continue
            before = len(graph)
            t0 = time.perf_counter()
            graph = p.run(graph)
            dt = time.perf_counter() - t0
            if self.options.verify is VerifyMode.EACH_PASS:
                graph.verify()
            records.append(PassRecord(p.name, dt, before, len(graph), list(getattr(p, "notes", []))))
        if self.options.verify is VerifyMode.END:
            graph.verify()
        return CompileResult(graph, records)


def to_mir(obj: Any) -> Graph:
    """A Graph as is; a GraphModule lowered to its MIR graph."""
    if isinstance(obj, Graph):
        return obj
    into = getattr(obj, "into_graph", None)
    if into is not None:
        return into()
    from rlx.errors import CompileError

    raise CompileError(f"cannot compile a {type(obj).__name__}; expected a Graph or GraphModule")
