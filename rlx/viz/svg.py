"""The graph as SVG. In: a :class:`~rlx.viz.model.View`. Out: :class:`GraphSvg`: one SVG
with a group per block (a collapsed summary box and the expanded drawing of its nodes,
laid out by :mod:`rlx.viz.layout`), the block rows the page stacks them in, the edges
between blocks, and the fusion-group colours.

Inside an expanded block, a value made in another block appears as a small dashed
*ghost* box naming it, so a block reads on its own; between blocks the page draws one
edge per pair of blocks in adjacent rows. The page's script places the blocks (rows
stacked top to bottom, centred) whenever one is expanded or collapsed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

from rlx.ir.lir import format_bytes
from rlx.viz.layout import Layout, layout
from rlx.viz.model import View, ViewNode

__all__ = ["GraphSvg", "render_graph", "group_colours", "tint", "NODE_W", "NODE_H"]

NODE_W, NODE_H = 224.0, 44.0
GHOST_H = 24.0
PAD, HEADER = 14.0, 30.0
COLLAPSED_W, COLLAPSED_H = 260.0, 64.0

_KNOWN_COLOURS = {
    "fused_matmul_bias_act": "#4e79a7",
    "attention": "#f28e2b",
    "elementwise_region": "#59a14f",
    "fused_residual_layer_norm": "#b07aa1",
    "fused_residual_rms_norm": "#e15759",
    "fused_swiglu": "#76b7b2",
}
_PALETTE = ("#edc948", "#ff9da7", "#9c755f", "#86bcb6", "#d4a6c8", "#8cd17d", "#bab0ac")


@dataclass
class BlockInfo:
    """One block's geometry: expanded and collapsed sizes, row and order in its row."""

    name: str
    index: int
    row: int
    ew: float
    eh: float
    nodes: int
    expanded: bool = False


@dataclass
class GraphSvg:
    """The SVG text plus what the page script needs."""

    svg: str
    blocks: list[BlockInfo]
    block_edges: list[tuple[int, int]]
    colours: dict[str, str]
    engine: str
    group_counts: dict[str, int] = field(default_factory=dict)


def tint(colour: str, amount: float = 0.16) -> str:
    """``colour`` (``#rrggbb``) mixed with white: ``amount`` of the colour."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    mix = [round(255 - (255 - c) * amount) for c in (r, g, b)]
    return "#" + "".join(f"{c:02x}" for c in mix)


def group_colours(view: View) -> dict[str, str]:
    """Fusion group -> colour (known groups keep theirs; others in order of appearance)."""
    out: dict[str, str] = {}
    k = 0
    for n in view.nodes.values():
        if n.group and n.group not in out:
            if n.group in _KNOWN_COLOURS:
                out[n.group] = _KNOWN_COLOURS[n.group]
            else:
                out[n.group] = _PALETTE[k % len(_PALETTE)]
                k += 1
    return out


def _block_rows(view: View, edges: list[tuple[int, int]]) -> list[int]:
    """Longest-path row of each block over the block DAG (forward edges only); a block
    that no earlier block feeds goes below the one before it."""
    preds: dict[int, list[int]] = {}
    for a, b in edges:
        if a < b:
            preds.setdefault(b, []).append(a)
    row = [0] * len(view.blocks)
    for i in range(1, len(row)):
        ps = preds.get(i)
        row[i] = max(row[a] + 1 for a in ps) if ps else row[i - 1] + 1
    return row


def render_graph(view: View, *, engine: str = "auto", expand_all: bool | None = None) -> GraphSvg:
    """Lay out every block and emit the SVG (see the module docstring). ``expand_all``:
    the initial state (default: expanded when the graph is small or has one block)."""
    colours = group_colours(view)
    bindex = {b: i for i, b in enumerate(view.blocks)}
    bedges: set[tuple[int, int]] = set()
    for s, d in view.edges:
        a, b = bindex[view.nodes[s].block], bindex[view.nodes[d].block]
        if a != b:
            bedges.add((a, b))
    block_edges = sorted(bedges)
    rows = _block_rows(view, block_edges)
    if expand_all is None:
        expand_all = len(view.blocks) <= 2 or len(view.nodes) <= 40
    parts: list[str] = []
    infos: list[BlockInfo] = []
    engines = set()
    for i, b in enumerate(view.blocks):
        members = view.block_nodes(b)
        lay, ghosts = _block_layout(view, b, members, engine)
        engines.add(lay.engine)
        ew = max(lay.width + 2 * PAD, COLLAPSED_W)
        eh = lay.height + HEADER + 2 * PAD
        info = BlockInfo(b, i, rows[i], ew, eh, len(members), expanded=expand_all)
        infos.append(info)
        parts.append(_block_svg(view, info, members, lay, ghosts, colours))
    counts: dict[str, int] = {}
    for n in view.nodes.values():
        if n.group:
            counts[n.group] = counts.get(n.group, 0) + 1
    svg = (
        '<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="800" height="600">'
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" class="arrowhead"/></marker></defs>'
        '<g id="block-edges"></g>' + "".join(parts) + "</svg>"
    )
    eng = "dot" if engines == {"dot"} else "layered"
    return GraphSvg(svg, infos, block_edges, colours, eng, counts)


def _block_layout(
    view: View, block: str, members: list[int], engine: str
) -> tuple[Layout, dict[int, str]]:
    """Layout of one block: its nodes plus a ghost per value read from another block."""
    inside = set(members)
    sigil = "%" if view.stage == "MIR" else "#"
    ghosts: dict[int, str] = {}
    edges: list[tuple[object, object]] = []
    for s, d in view.edges:
        if d in inside:
            if s in inside:
                edges.append((s, d))
            else:
                src = view.nodes[s]
                name = src.title if src.op == "input" else f"{sigil}{src.id} {src.op}"
                ghosts[s] = f"{name} · {src.block}"
                edges.append((("g", s), d))
    keys: list[object] = [("g", s) for s in sorted(ghosts)] + list(members)
    sizes = {
        k: (_ghost_width(ghosts[k[1]]), GHOST_H) if isinstance(k, tuple) else (NODE_W, NODE_H)
        for k in keys
    }
    return layout(keys, sizes, edges, engine=engine), ghosts


def _ghost_width(text: str) -> float:
    """A ghost box as wide as its text (monospace 11px), at most a node's width."""
    return min(NODE_W, 24.0 + 6.7 * len(text))


def _path(pts: list[tuple[float, float]], dx: float, dy: float, spline: bool = False) -> str:
    """SVG path data through ``pts`` shifted by ``(dx, dy)``: ``spline``: the points are
    cubic Bezier control points (dot's, ``3k + 1`` of them); else a smooth curve with
    vertical tangents through each point."""
    (x0, y0), rest = pts[0], pts[1:]
    d = [f"M{x0 + dx:.1f},{y0 + dy:.1f}"]
    if spline and len(rest) % 3 == 0:
        for k in range(0, len(rest), 3):
            c = " ".join(f"{x + dx:.1f},{y + dy:.1f}" for x, y in rest[k : k + 3])
            d.append(f"C{c}")
        return " ".join(d)
    px, py = x0, y0
    for x, y in rest:
        m = (y - py) / 2
        d.append(
            f"C{px + dx:.1f},{py + m + dy:.1f} {x + dx:.1f},{y - m + dy:.1f} {x + dx:.1f},{y + dy:.1f}"
        )
        px, py = x, y
    return " ".join(d)


def _fit(text: str, width: float, char: float = 6.6) -> str:
    n = int(width / char)
    return text if len(text) <= n else text[: max(n - 1, 1)] + "…"


def _node_svg(n: ViewNode, x: float, y: float, colours: dict[str, str], sigil: str) -> str:
    """One node box; ``sigil``: ``%`` for a user graph's ids, ``#`` for a compiled one's."""
    classes = ["node"]
    style = ""
    if n.group:
        classes.append("fused")
        c = colours[n.group]
        style = f' style="--g:{c};--gt:{tint(c)}"'
    if n.precision:
        classes.append("narrow")
    if n.output is not None:
        classes.append("out")
    if n.op == "input":
        classes.append("input")
    tip = [n.title, f"{n.op}  {n.shape}"]
    if n.group:
        tip.append(f"fused {n.group}: " + ", ".join(n.fused))
    if n.source:
        tip.append(n.source)
    head = n.title if n.op == "input" else n.op
    nid = "" if n.op == "input" else f"{sigil}{n.id}"
    out = [
        f'<g class="{" ".join(classes)}" id="n-{n.id}" data-id="{n.id}" '
        f'data-name="{escape(n.name)}" transform="translate({x:.1f},{y:.1f})"{style}>',
        f"<title>{escape(chr(10).join(tip))}</title>",
        f'<rect class="box" width="{NODE_W}" height="{NODE_H}" rx="6"/>',
    ]
    if n.group:
        out.append(f'<rect class="stripe" width="6" height="{NODE_H}" rx="3"/>')
    room = NODE_W - 28 - 6.5 * len(nid)
    out.append(f'<text x="12" y="18" class="op">{escape(_fit(head, room, 7.0))}</text>')
    if nid:
        out.append(f'<text x="{NODE_W - 8}" y="18" class="nid" text-anchor="end">{nid}</text>')
    out.append(
        f'<text x="12" y="35" class="shape">{escape(_fit(n.shape, NODE_W - 56, 6.2))}</text>'
    )
    if n.precision:
        out.append(
            f'<rect class="badge" x="{NODE_W - 40}" y="25" width="32" height="14" rx="7"/>'
            f'<text x="{NODE_W - 24}" y="35.5" class="badge-text" text-anchor="middle">'
            f"{escape(n.precision)}</text>"
        )
    elif n.output is not None:
        out.append(
            f'<text x="{NODE_W - 8}" y="35" class="out-tag" text-anchor="end">out {n.output}</text>'
        )
    out.append("</g>")
    return "".join(out)


def _block_svg(
    view: View,
    info: BlockInfo,
    members: list[int],
    lay: Layout,
    ghosts: dict[int, str],
    colours: dict[str, str],
) -> str:
    b = info.name
    nodes = [view.nodes[m] for m in members]
    fused = [n for n in nodes if n.group]
    sub = [f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"]
    if fused:
        sub.append(f"{len(fused)} fused")
    pb = view.param_bytes.get(b)
    if pb:
        sub.append(f"{format_bytes(pb)} params")
    narrow = sum(1 for n in nodes if n.precision)
    if narrow:
        sub.append(f"{narrow} narrow")
    shown = "" if info.expanded else ' style="display:none"'
    hidden = ' style="display:none"' if info.expanded else ""
    out = [
        f'<g class="block" id="b-{info.index}" data-block="{escape(b)}" data-index="{info.index}">',
        f'<g class="collapsed" data-toggle="{info.index}"{hidden}>',
        f"<title>{escape(b)}: click to expand</title>",
        f'<rect class="block-box" width="{COLLAPSED_W}" height="{COLLAPSED_H}" rx="9"/>',
        f'<text x="14" y="24" class="block-title">{escape(_fit(b, COLLAPSED_W - 48, 7.4))}</text>',
        f'<text x="{COLLAPSED_W - 14}" y="24" class="chev" text-anchor="end">+</text>',
        f'<text x="14" y="43" class="block-sub">{escape(" · ".join(sub))}</text>',
    ]
    # a strip with one segment per node of the block, coloured by its fusion group
    if nodes:
        seg = (COLLAPSED_W - 28) / len(nodes)
        for k, n in enumerate(nodes):
            fill = colours[n.group] if n.group else "#d5dbe3"
            out.append(
                f'<rect x="{14 + k * seg:.2f}" y="51" width="{max(seg - 0.6, 0.6):.2f}" '
                f'height="5" fill="{fill}"/>'
            )
    out.append("</g>")
    out.append(f'<g class="expanded"{shown}>')
    out.append(
        f'<rect class="block-frame" width="{info.ew:.1f}" height="{info.eh:.1f}" rx="10"/>'
        f'<g class="block-header" data-toggle="{info.index}"><title>{escape(b)}: click to '
        f'collapse</title><rect class="block-head-bg" width="{info.ew:.1f}" height="{HEADER}" '
        f'rx="10"/><text x="14" y="20" class="block-title">{escape(b)}</text>'
        f'<text x="{info.ew - 14:.1f}" y="20" class="chev" text-anchor="end">−</text>'
        f'<text x="{info.ew - 34:.1f}" y="20" class="block-sub" text-anchor="end">'
        f"{escape(' · '.join(sub))}</text></g>"
    )
    dx, dy = PAD + (info.ew - 2 * PAD - lay.width) / 2, HEADER + PAD
    for (s, _d), pts in lay.routes.items():
        cls = "edge ghost-edge" if isinstance(s, tuple) else "edge"
        path = _path(pts, dx, dy, spline=lay.engine == "dot")
        out.append(f'<path class="{cls}" d="{path}" marker-end="url(#arrow)"/>')
    for key, box in lay.boxes.items():
        if isinstance(key, tuple):
            src = key[1]
            out.append(
                f'<g class="ghost" data-ref="{src}" transform="translate({box.x + dx:.1f},'
                f'{box.y + dy:.1f})"><title>{escape(ghosts[src])} (made in another block: '
                f'click to go there)</title><rect class="ghost-box" width="{box.w}" '
                f'height="{box.h}" rx="12"/><text x="{box.w / 2}" y="16" class="ghost-text" '
                f'text-anchor="middle">{escape(_fit(ghosts[src], box.w - 16, 6.2))}</text></g>'
            )
        else:
            sigil = "%" if view.stage == "MIR" else "#"
            out.append(_node_svg(view.nodes[key], box.x + dx, box.y + dy, colours, sigil))
    out.append("</g></g>")
    return "".join(out)
