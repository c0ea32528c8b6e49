"""A picture of a graph: one self-contained HTML file (inline CSS, script and SVG).

In: a MIR :class:`~rlx.ir.mir.Graph` (or a GraphModule), or a
:class:`~rlx.runtime.compiled.CompiledGraph`. Out: the HTML text, also written to
``path`` when given. ``graph.to_html()``, ``compiled.to_html()`` and
``rlx inspect MODEL --html out.html`` call these.

The page shows the nodes (op, name, shape, dtype, the precision auto mixed precision
chose, source line) grouped in blocks by parameter name (collapsed by default on large
graphs, click to expand), fused kernels coloured by fusion group with a legend, and the
memory plan as a timeline of buffers with the peak marked. Layout: graphviz ``dot`` when
installed, else rlx's own layered layout (:mod:`rlx.viz.layout`). Parts: ``model``
(what is drawn), ``layout``, ``svg`` (the graph), ``memory`` (the timeline), ``html``
and ``assets`` (the page).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlx.errors import RlxError
from rlx.ir.lir import BufferPlan
from rlx.ir.mir import Graph
from rlx.viz.html import render_page, write_page
from rlx.viz.model import View, build_view

if TYPE_CHECKING:
    from rlx.runtime.compiled import CompiledGraph

__all__ = ["graph_to_html", "compiled_to_html", "View", "build_view"]


def _lower_bounds(graph: Graph) -> dict[str, int]:
    names: set[str] = set()
    for n in graph.nodes:
        names |= n.shape.symbols
    return {s: graph.sym_bounds.get(s, (1, None))[0] for s in sorted(names)}


def graph_to_html(
    graph: Any,
    path: str | Path | None = None,
    *,
    bindings: Mapping[str, int] | None = None,
    engine: str = "auto",
    expand: bool | None = None,
) -> str:
    """The page of a MIR graph or GraphModule as built (before the compile pipeline).
    The memory plan is the planner's for this graph at ``bindings`` (default: every
    symbol at its lower bound); an LIR GraphModule shows its own plan. ``engine``:
    ``"auto"`` | ``"dot"`` | ``"layered"``; ``expand``: open every block (default: only
    on small graphs). Returns the HTML; writes it to ``path`` when given."""
    plan: BufferPlan | None = None
    g = graph
    if not isinstance(graph, Graph):  # a GraphModule
        lir = graph.as_lir()
        g = graph.into_graph()
        plan = lir.plan if lir is not None else None
    binds = dict(bindings) if bindings is not None else _lower_bounds(g)
    notes: list[str] = []
    if plan is None:
        from rlx.backends.cpu.planner import plan_memory

        try:
            plan = plan_memory(g, binds)
        except RlxError as e:
            notes.append(f"no memory plan: {e}")
    view = build_view(g, "MIR", plan=plan)
    meta = [f"plan at {_fmt(binds)}"] if plan is not None and binds else []
    html = render_page(view, engine=engine, expand=expand, meta=meta + notes)
    return write_page(html, path)


def compiled_to_html(
    compiled: CompiledGraph,
    path: str | Path | None = None,
    *,
    engine: str = "auto",
    expand: bool | None = None,
) -> str:
    """The page of a compiled graph after the pipeline: the optimized graph with its
    fused kernels, each node's precision and kernel, the memory plan of the most recent
    run (or of the compile-time shape), the fusion report and the pass records."""
    program = compiled.program
    report = compiled.report()
    kernels = {}
    for k in report.kernels:
        text = k.kind.value
        if k.notes:
            text += f" ({k.notes[0]})"
        kernels[k.node] = text
    plan = report.plan
    view = build_view(
        program.graph,
        "compiled",
        plan=plan,
        source=program.source,
        kernels=kernels,
        folded=program.hoisted,
    )
    view.name = program.source.name
    policy = compiled.options.precision
    meta = [
        f"precision {policy if policy is not None else 'always_f32'}",
        f"{compiled.num_threads} thread(s)",
    ]
    if plan.bindings:
        meta.append(f"plan at {_fmt(plan.bindings)}")
    fusion = program.result.fusion_report
    reports = [
        ("Fusion report", str(fusion) if fusion is not None else ""),
        ("Compile passes", program.result.pass_report()),
        ("Kernel schedule", str(report)),
    ]
    html = render_page(view, engine=engine, expand=expand, reports=reports, meta=meta)
    return write_page(html, path)


def _fmt(bindings: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in bindings.items()) or "static shapes"
