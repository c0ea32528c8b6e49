"""The memory plan as a timeline. In: a graph and its :class:`~rlx.ir.lir.BufferPlan`.
Out: the working-region buffers with their lifetimes (:func:`buffers`) and an SVG of
them (:func:`timeline_svg`): x is the schedule (one step per node that runs), y the
offset in the arena's working region; each buffer is a bar from the step that defines
it to its last read, as tall as its size. The peak (the working region's size) is a
dashed line, and the step where the most bytes are live is marked.

A buffer is an owned slot (not a view, not an in-place result) above the persistent
region, of at least one byte; its lifetime is derived here from the schedule and the
graph's edges (views and in-place results extend the buffer they alias; graph outputs
and kept-alive nodes live to the end). Params, constants and the prologue live in the
persistent region and are summed, not drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from rlx.ir.lir import BufferPlan, format_bytes
from rlx.ir.mir import Graph, NodeId
from rlx.ops.core import Input

__all__ = ["Buffer", "buffers", "live_bytes", "plot_width", "timeline_svg"]

_W = 1120.0  # the plot area's width in px, at least (see plot_width)
_STEP_PX = 2.5  # the narrowest step: longer schedules make a wider plot that scrolls
_H = 300.0
_LEFT, _TOP, _BOTTOM = 74.0, 40.0, 34.0


@dataclass(frozen=True, slots=True)
class Buffer:
    """One working buffer: owner node, arena offset (from the working region's start),
    bytes, first and last step (indices into the run steps), member nodes."""

    node: NodeId
    offset: int
    nbytes: int
    first: int
    last: int
    members: tuple[NodeId, ...]


def _owner(plan: BufferPlan, nid: NodeId) -> NodeId:
    seen = 0
    while seen <= len(plan.slots):
        s = plan.slots[nid]
        nxt = s.view_of if s.view_of is not None else s.inplace_of
        if nxt is None:
            return nid
        nid, seen = nxt, seen + 1
    raise AssertionError("alias cycle in a buffer plan")  # pragma: no cover


def buffers(graph: Graph, plan: BufferPlan) -> tuple[list[Buffer], list[NodeId]]:
    """The working buffers (sorted by first step, then offset) and the run steps: the
    scheduled nodes outside the persistent region, whose indices the lifetimes use."""
    base = plan.persistent_bytes
    steps = [n for n in plan.schedule if plan.slots[n].offset >= base or _is_input(graph, n)]
    step_of: dict[NodeId, int] = {}
    k = -1
    for nid in plan.schedule:  # a node in the persistent region maps to the step before it
        if k + 1 < len(steps) and steps[k + 1] == nid:
            k += 1
        step_of[nid] = max(k, 0)
    end = max(len(steps) - 1, 0)
    first: dict[NodeId, int] = {}
    last: dict[NodeId, int] = {}
    members: dict[NodeId, list[NodeId]] = {}
    owner = {nid: _owner(plan, nid) for nid in plan.schedule}
    for nid in plan.schedule:
        o = owner[nid]
        at = 0 if _is_input(graph, nid) else step_of[nid]
        first[o] = min(first.get(o, at), at)
        last[o] = max(last.get(o, at), at)
        members.setdefault(o, []).append(nid)
        for i in graph.nodes[nid].inputs:
            oi = owner[i]
            last[oi] = max(last.get(oi, step_of[nid]), step_of[nid])
    for nid in (*graph.outputs, *plan.keep_alive):
        last[owner[nid]] = end
    out = []
    for o, ms in members.items():
        s = plan.slots[o]
        if s.offset < base or s.nbytes <= 0:
            continue
        out.append(Buffer(o, s.offset - base, s.nbytes, first[o], last[o], tuple(ms)))
    out.sort(key=lambda b: (b.first, b.offset, b.node))
    return out, steps


def _is_input(graph: Graph, nid: NodeId) -> bool:
    return isinstance(graph.nodes[nid].op, Input)


def plot_width(nsteps: int) -> float:
    """The plot area's width in px for a schedule of ``nsteps`` run steps."""
    return max(_W, _STEP_PX * nsteps)


def live_bytes(bufs: list[Buffer], nsteps: int, alignment: int = 1) -> list[int]:
    """Bytes live at each run step, each buffer rounded up to ``alignment`` (the plan's:
    then the largest value is the plan's lower bound)."""
    delta = [0] * (nsteps + 1)
    for b in bufs:
        size = -(-b.nbytes // alignment) * alignment
        delta[b.first] += size
        delta[b.last + 1] -= size
    out, run = [], 0
    for d in delta[:nsteps]:
        run += d
        out.append(run)
    return out


def timeline_svg(
    graph: Graph, plan: BufferPlan, colour_of: dict[int, str], label_of: dict[int, str]
) -> tuple[str, int]:
    """The timeline SVG and the number of bars (``colour_of`` / ``label_of``: node id ->
    fill colour / name, for the buffer owners)."""
    bufs, steps = buffers(graph, plan)
    nsteps = max(len(steps), 1)
    peak = max(plan.peak_bytes, max((b.offset + b.nbytes for b in bufs), default=0), 1)
    pw = plot_width(nsteps)
    sx = pw / nsteps
    sy = _H / peak
    live = live_bytes(bufs, nsteps, plan.alignment)
    top_step = max(range(nsteps), key=lambda i: live[i]) if bufs else 0
    total_w, total_h = _LEFT + pw + 16, _TOP + _H + _BOTTOM
    parts = [
        f'<svg id="memory" xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" '
        f'height="{total_h:.0f}" viewBox="0 0 {total_w:.0f} {total_h:.0f}" role="img" '
        f'aria-label="memory plan timeline">',
        f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{_H}" class="mem-bg"/>',
    ]
    step = _nice_bytes(peak / 4)
    k = 0
    while k * step <= peak * 1.0001:  # y axis: offsets in the working region
        y = _TOP + _H - k * step * sy
        parts.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        )
        parts.append(
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" class="axis" text-anchor="end">'
            f"{escape(_short_bytes(k * step))}</text>"
        )
        k += 1
    tick = max(1, _nice(nsteps / 10))
    for s in range(0, nsteps + 1, tick):
        x = _LEFT + s * sx
        parts.append(
            f'<text x="{x:.1f}" y="{_TOP + _H + 16:.1f}" class="axis" text-anchor="middle">{s}</text>'
        )
    parts.append(
        f'<text x="{_LEFT + pw / 2:.1f}" y="{total_h - 3:.1f}" class="axis-title" '
        f'text-anchor="middle">schedule step (nodes that run)</text>'
    )
    # live bytes as a faint area behind the bars
    pts = [f"{_LEFT:.1f},{_TOP + _H:.1f}"]
    for i, v in enumerate(live):
        y = _TOP + _H - v * sy
        pts += [f"{_LEFT + i * sx:.1f},{y:.1f}", f"{_LEFT + (i + 1) * sx:.1f},{y:.1f}"]
    pts.append(f"{_LEFT + nsteps * sx:.1f},{_TOP + _H:.1f}")
    parts.append(f'<polygon points="{" ".join(pts)}" class="live"/>')
    for b in bufs:
        x = _LEFT + b.first * sx
        w = max((b.last - b.first + 1) * sx, 1.5)
        h = max(b.nbytes * sy, 1.0)
        y = _TOP + _H - (b.offset + b.nbytes) * sy
        name = label_of.get(b.node, f"#{b.node}")
        tip = (
            f"{name}\n[{b.offset}, +{b.nbytes}] {format_bytes(b.nbytes)} in the working "
            f"region\nlive steps {b.first}..{b.last}"
        )
        if len(b.members) > 1:
            tip += f"\nshared by {len(b.members)} nodes (views / in place)"
        parts.append(
            f'<rect class="buf" data-node="{b.node}" x="{x:.2f}" y="{y:.2f}" '
            f'width="{w:.2f}" height="{h:.2f}" fill="{colour_of.get(b.node, "#8da0cb")}">'
            f"<title>{escape(tip)}</title></rect>"
        )
    py = _TOP + _H - plan.peak_bytes * sy
    parts.append(f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{py:.1f}" y2="{py:.1f}" class="peak"/>')
    parts.append(
        f'<text x="{_LEFT + pw}" y="{_TOP - 12}" class="peak-label" text-anchor="end">'
        f"- - peak (working region) {escape(format_bytes(plan.peak_bytes))}, lower bound "
        f"{escape(format_bytes(plan.lower_bound_bytes))}</text>"
    )
    if bufs:
        mx = _LEFT + (top_step + 0.5) * sx
        parts.append(
            f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{_TOP - 6}" y2="{_TOP + _H}" class="peak-step"/>'
        )
        who = label_of.get(steps[top_step], f"#{steps[top_step]}") if steps else ""
        parts.append(
            f'<text x="{_LEFT}" y="{_TOP - 12}" class="peak-label" id="peak-step">'
            f"most bytes live: {escape(format_bytes(live[top_step]))} at step {top_step} "
            f"({escape(who)}) ┆</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts), len(bufs)


def _nice_bytes(x: float) -> float:
    """A round byte step near ``x`` (1, 2, 2.5 or 5 times a power of ten, in B, KiB,
    MiB or GiB)."""
    unit = 1.0
    for u in (1024.0, 1024.0**2, 1024.0**3):
        if x >= u:
            unit = u
    m = x / unit
    base = 1.0
    while base * 10 <= m:
        base *= 10
    for f in (1, 2, 2.5, 5, 10):
        if f * base >= m:
            return max(f * base * unit, 1.0)
    return m * unit  # pragma: no cover


def _short_bytes(n: float) -> str:
    """``262144 -> '256 KiB'``: a byte count without trailing zeros."""
    for unit, size in (("GiB", 1024.0**3), ("MiB", 1024.0**2), ("KiB", 1024.0)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n:.0f} B"


def _nice(x: float) -> int:
    """A round tick spacing near ``x``."""
    for m in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000):
        if m >= x:
            return m
    return int(x)
