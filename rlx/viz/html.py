"""The self-contained HTML page. In: a :class:`~rlx.viz.model.View` and text to show
(fusion report, pass records, notes). Out: one HTML string with inline CSS, script and
SVG (no network access): a header, a toolbar (search, expand / collapse all, zoom), the
graph, a side panel (fusion-group legend, precision, the selected node's details), the
memory plan timeline and the reports.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from pathlib import Path

from rlx.ir.lir import format_bytes
from rlx.viz.assets import CSS, JS
from rlx.viz.memory import timeline_svg
from rlx.viz.model import View
from rlx.viz.svg import COLLAPSED_H, COLLAPSED_W, GraphSvg, render_graph

__all__ = ["render_page", "write_page"]

_NEUTRAL = ("#98a6b8", "#bcc7d4")  # unfused buffers: blocks alternate between two tones
_INPUT = "#c9d4e1"


def _legend_fusion(view: View, colours: dict[str, str], counts: dict[str, int]) -> str:
    if not colours:
        why = (
            "No fused kernels in this graph."
            if view.stage != "MIR"
            else "No fusion yet: this is the graph before the compile pipeline "
            "(compiled.to_html() shows the fused kernels)."
        )
        return f'<ul class="legend" id="legend-fusion"><li class="empty">{escape(why)}</li></ul>'
    items = []
    for g, c in colours.items():
        ops = sum(len(n.fused) for n in view.nodes.values() if n.group == g)
        items.append(
            f'<li class="legend-item" data-group="{escape(g)}" title="click to highlight">'
            f'<span class="sw" style="background:{c}"></span><span class="g">{escape(g)}</span>'
            f'<span class="n" title="{counts.get(g, 0)} kernels fusing {ops} ops">'
            f"{counts.get(g, 0)} · {ops} ops</span></li>"
        )
    return '<ul class="legend" id="legend-fusion">' + "".join(items) + "</ul>"


def _legend_precision(view: View) -> str:
    counts: dict[str, int] = {}
    for n in view.nodes.values():
        if n.dtype in ("f32", "f16", "bf16", "f64") and n.op != "input":
            counts[n.dtype] = counts.get(n.dtype, 0) + 1
    casts = sum(1 for n in view.nodes.values() if n.op == "cast")
    items = [
        f'<li><span class="sw" style="background:{"#f0b429" if d in ("bf16", "f16") else "#d5dbe3"}">'
        f'</span><span>{escape(d)}</span><span class="n">{c} node{"s" if c != 1 else ""}</span></li>'
        for d, c in sorted(counts.items())
    ]
    if casts:
        items.append(
            f'<li><span class="sw"></span><span>casts</span><span class="n">{casts}</span></li>'
        )
    if not items:
        items.append('<li class="empty">No floating-point nodes.</li>')
    return '<ul class="legend" id="legend-precision">' + "".join(items) + "</ul>"


def _data(view: View, gs: GraphSvg) -> str:
    """The JSON the page script reads (blocks, block edges, node facts)."""
    bindex = {b.name: b.index for b in gs.blocks}
    nodes = {
        str(n.id): {
            "t": n.title,
            "op": n.op,
            "s": n.shape,
            "d": n.dtype,
            "p": n.precision,
            "src": n.source,
            "g": n.group,
            "f": list(n.fused),
            "k": n.kernel,
            "sl": n.slot,
            "r": list(n.reads),
            "b": bindex[n.block],
            "o": n.output,
            "q": n.name.lower(),
        }
        for n in view.nodes.values()
    }
    data = {
        "blocks": [
            {
                "i": b.index,
                "name": b.name,
                "row": b.row,
                "ew": b.ew,
                "eh": b.eh,
                "expanded": b.expanded,
            }
            for b in gs.blocks
        ],
        "block_edges": [list(e) for e in gs.block_edges],
        "collapsed": [COLLAPSED_W, COLLAPSED_H],
        "nodes": nodes,
    }
    text = json.dumps(data, separators=(",", ":"))  # nothing in it can end the script
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(
    view: View,
    *,
    engine: str = "auto",
    expand: bool | None = None,
    reports: Sequence[tuple[str, str]] = (),
    meta: Sequence[str] = (),
) -> str:
    """The page (see the module docstring). ``reports``: (title, text) sections shown
    folded; ``meta``: extra facts for the header line."""
    gs = render_graph(view, engine=engine, expand_all=expand)
    graph_svg = gs.svg
    fused = sum(gs.group_counts.values())
    head = [view.stage, f"{len(view.nodes)} nodes", f"{len(view.blocks)} blocks"]
    if fused:
        head.append(f"{fused} fused kernels")
    mem_html = '<p class="empty">No memory plan (the graph could not be planned).</p>'
    bars = 0
    if view.plan is not None and view.graph is not None:
        colour_of, label_of = {}, {}
        bindex = {b: i for i, b in enumerate(view.blocks)}
        for n in view.nodes.values():  # fused: the group's colour; else a tone per block
            tone = _NEUTRAL[bindex[n.block] % 2]
            colour_of[n.id] = (
                gs.colours[n.group] if n.group else _INPUT if n.op == "input" else tone
            )
            label_of[n.id] = n.title
        svg, bars = timeline_svg(view.graph, view.plan, colour_of, label_of)
        plan = view.plan
        head.append(f"arena {format_bytes(plan.arena_bytes)}")
        summary = escape(plan.summary()).replace("\n", "<br>")
        mem_html = (
            f"<p>{bars} buffer{'s' if bars != 1 else ''} in the working region; each bar spans "
            f"the steps from the node that writes it to its last reader, at its offset in the "
            f"arena (fused kernels in their group's colour, other nodes' blocks in two "
            f"alternating greys; hover for the node, click to show it). Params and "
            f"constants ({escape(format_bytes(plan.persistent_bytes))}) sit in the persistent "
            f'region, not drawn.</p><p class="mono">{summary}</p>'
            f'<div id="memory-scroll">{svg}</div>'
        )
    head += list(meta)
    folded = "".join(
        f'<details class="pane"><summary>{escape(t)}</summary><pre>{escape(x)}</pre></details>'
        for t, x in reports
        if x
    )
    engine_note = "graphviz dot" if gs.engine == "dot" else "rlx layered layout"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(view.name)} · rlx graph</title>
<style>{CSS}</style></head>
<body>
<header><h1>{escape(view.name)}</h1><span class="meta" id="meta">{escape(" · ".join(head))}</span></header>
<div class="toolbar">
<input id="search" type="search" placeholder="Find a node: name, op or %id (Enter: next)" autocomplete="off">
<span class="count" id="search-count"></span>
<button id="expand-all" type="button">Expand all</button>
<button id="collapse-all" type="button">Collapse all</button>
<span class="spacer"></span>
<button id="zoom-out" type="button" title="zoom out">−</button>
<span id="zoom-level">100%</span>
<button id="zoom-in" type="button" title="zoom in">+</button>
<button id="zoom-fit" type="button" title="fit the width of the pane">Fit</button>
</div>
<main>
<section id="graph-pane"><div id="graph-scroll">{graph_svg}</div></section>
<aside>
<section><h2>Fusion groups</h2>{_legend_fusion(view, gs.colours, gs.group_counts)}</section>
<section><h2>Precision</h2>{_legend_precision(view)}</section>
<section><h2>Node</h2><div id="details"><span class="empty">Click a node.</span></div></section>
</aside>
</main>
<section class="pane" id="memory-pane" data-buffers="{bars}"><h2>Memory plan</h2>{mem_html}</section>
{folded}
<footer>rlx graph view · layout: {engine_note} · blocks group nodes by parameter name;
click a block to expand or collapse it, a node for its details, a dashed box to jump to
the block that makes the value.</footer>
<script type="application/json" id="rlx-data">{_data(view, gs)}</script>
<script>{JS}</script>
</body></html>
"""


def write_page(html: str, path: str | Path | None) -> str:
    """Write ``html`` to ``path`` (UTF-8) when given; return ``html``."""
    if path is not None:
        Path(path).write_text(html, encoding="utf-8")
    return html
