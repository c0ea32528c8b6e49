"""Placing the boxes of a DAG. In: node keys with their sizes and the edges between them.
Out: a :class:`Layout`: each box's top-left corner, each edge's polyline, the extent.

Two engines. :func:`layered` is our own Sugiyama-style layout: longest-path layers (a
source sits just above its first reader), a virtual point per layer an edge crosses,
barycentric ordering sweeps to reduce crossings, then x positions pulled towards the
mean of each node's neighbours while keeping order and spacing. :func:`dot_layout` asks
graphviz's ``dot`` (``-Tplain``) for the positions and routes when ``dot`` is installed
(``shutil.which("dot")``); :func:`layout` picks it, else the layered one.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Box", "Layout", "layered", "dot_layout", "parse_plain", "layout", "has_dot"]

Key = Hashable
_SWEEPS = 6
_PLACE_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class Box:
    """A placed node: top-left ``(x, y)`` and size."""

    x: float
    y: float
    w: float
    h: float

    @property
    def cx(self) -> float:
        return self.x + self.w / 2


@dataclass
class Layout:
    """Boxes by key, edge polylines by ``(src, dst)`` (from src's bottom to dst's top),
    and the total width and height."""

    boxes: dict[Key, Box]
    routes: dict[tuple[Key, Key], list[tuple[float, float]]]
    width: float
    height: float
    engine: str = "layered"


def has_dot() -> bool:
    """Whether graphviz's ``dot`` is on the PATH."""
    return shutil.which("dot") is not None


def layout(
    keys: Sequence[Key],
    sizes: Mapping[Key, tuple[float, float]],
    edges: Sequence[tuple[Key, Key]],
    *,
    engine: str = "auto",
    hgap: float = 22.0,
    vgap: float = 30.0,
) -> Layout:
    """Lay out with ``dot`` when ``engine`` is ``"dot"``, or ``"auto"`` and dot is
    installed (falling back to :func:`layered` if dot fails); else :func:`layered`."""
    if engine == "dot" or (engine == "auto" and has_dot()):
        try:
            return dot_layout(keys, sizes, edges, hgap=hgap, vgap=vgap)
        except (OSError, subprocess.SubprocessError, ValueError):
            if engine == "dot":
                raise
    return layered(keys, sizes, edges, hgap=hgap, vgap=vgap)


# ---- the layered layout -------------------------------------------------------------


def _layers(keys: Sequence[Key], edges: Sequence[tuple[Key, Key]]) -> dict[Key, int]:
    """Longest path from the sources (``keys`` are in a topological order); then every
    source moves down to just above its first reader."""
    preds: dict[Key, list[Key]] = {k: [] for k in keys}
    succs: dict[Key, list[Key]] = {k: [] for k in keys}
    for s, d in edges:
        preds[d].append(s)
        succs[s].append(d)
    layer: dict[Key, int] = {}
    for k in keys:
        layer[k] = max((layer[p] + 1 for p in preds[k]), default=0)
    for k in keys:
        if not preds[k] and succs[k]:
            layer[k] = max(0, min(layer[s] for s in succs[k]) - 1)
    return layer


def layered(
    keys: Sequence[Key],
    sizes: Mapping[Key, tuple[float, float]],
    edges: Sequence[tuple[Key, Key]],
    *,
    hgap: float = 22.0,
    vgap: float = 30.0,
) -> Layout:
    """The layered layout of the DAG (``keys`` in topological order; edges go from an
    earlier key to a later one: others are ignored)."""
    index = {k: i for i, k in enumerate(keys)}
    edges = [(s, d) for s, d in edges if index[s] < index[d]]
    layer = _layers(keys, edges)
    nlayers = max(layer.values(), default=-1) + 1
    # virtual points: an edge over several layers gets one per layer it crosses
    chain: dict[tuple[Key, Key], list[Key]] = {}
    width: dict[Key, float] = {k: sizes[k][0] for k in keys}
    rows: list[list[Key]] = [[] for _ in range(nlayers)]
    for k in keys:
        rows[layer[k]].append(k)
    up: dict[Key, list[Key]] = {k: [] for k in keys}
    down: dict[Key, list[Key]] = {k: [] for k in keys}
    for s, d in edges:
        path: list[Key] = [s]
        for li in range(layer[s] + 1, layer[d]):
            v = ("~", s, d, li)
            width[v] = 0.0
            up[v], down[v] = [], []
            rows[li].append(v)
            path.append(v)
        path.append(d)
        for a, b in zip(path, path[1:], strict=False):
            down[a].append(b)
            up[b].append(a)
        chain[(s, d)] = path
    _order(rows, up, down)
    xs = _place(rows, up, down, width, hgap)
    row_h = [max((sizes[k][1] for k in r if k in sizes), default=0.0) for r in rows]
    ys, y = [], 0.0
    for h in row_h:
        ys.append(y)
        y += h + vgap
    boxes = {}
    for li, r in enumerate(rows):
        for k in r:
            if k in sizes:
                w, h = sizes[k]
                boxes[k] = Box(xs[k] - w / 2, ys[li] + (row_h[li] - h) / 2, w, h)
    routes = {}
    for (s, d), path in chain.items():
        pts = [(boxes[s].cx, boxes[s].y + boxes[s].h)]
        for v in path[1:-1]:
            li = v[3]
            pts.append((xs[v], ys[li] + row_h[li] / 2))
        pts.append((boxes[d].cx, boxes[d].y))
        routes[(s, d)] = pts
    right = [b.x + b.w for b in boxes.values()] + [x for pts in routes.values() for x, _ in pts]
    total_w = max(right, default=0.0)
    return Layout(boxes, routes, total_w, max(y - vgap, 0.0))


def _order(
    rows: list[list[Key]], up: Mapping[Key, list[Key]], down: Mapping[Key, list[Key]]
) -> None:
    """Barycentric sweeps: each row sorted by the mean position of its neighbours in the
    row above (down sweeps) or below (up sweeps); the order with fewest crossings wins."""
    best = [list(r) for r in rows]
    best_cross = _crossings(rows, down)
    for sweep in range(_SWEEPS):
        rng = range(1, len(rows)) if sweep % 2 == 0 else range(len(rows) - 2, -1, -1)
        nbrs = up if sweep % 2 == 0 else down
        for li in rng:
            ref = rows[li - 1] if sweep % 2 == 0 else rows[li + 1]
            pos = {k: i for i, k in enumerate(ref)}
            keyed = []
            for i, k in enumerate(rows[li]):
                ns = [pos[n] for n in nbrs[k] if n in pos]
                keyed.append((sum(ns) / len(ns) if ns else float(i), i, k))
            keyed.sort(key=lambda t: (t[0], t[1]))
            rows[li] = [k for _, _, k in keyed]
        c = _crossings(rows, down)
        if c < best_cross:
            best, best_cross = [list(r) for r in rows], c
    rows[:] = best


def _crossings(rows: list[list[Key]], down: Mapping[Key, list[Key]]) -> int:
    total = 0
    for li in range(len(rows) - 1):
        pos = {k: i for i, k in enumerate(rows[li + 1])}
        pairs = sorted((i, pos[d]) for i, k in enumerate(rows[li]) for d in down[k] if d in pos)
        ends = [b for _, b in pairs]
        for a in range(len(ends)):  # inversions (rows are small: quadratic is fine)
            for b in range(a + 1, len(ends)):
                if ends[a] > ends[b] and pairs[a][0] != pairs[b][0]:
                    total += 1
    return total


def _place(
    rows: list[list[Key]],
    up: Mapping[Key, list[Key]],
    down: Mapping[Key, list[Key]],
    width: Mapping[Key, float],
    gap: float,
) -> dict[Key, float]:
    """Centre x of every key: rows packed in order, then each row pulled towards its
    neighbours' mean, keeping the order and ``gap`` between boxes."""
    xs: dict[Key, float] = {}
    for r in rows:
        x = 0.0
        for k in r:
            xs[k] = x + width[k] / 2
            x += width[k] + gap
    for rnd in range(_PLACE_ROUNDS):
        order = range(len(rows)) if rnd % 2 == 0 else range(len(rows) - 1, -1, -1)
        nbrs = up if rnd % 2 == 0 else down
        for li in order:
            r = rows[li]
            want = []
            for k in r:
                ns = [xs[n] for n in nbrs[k]] or [xs[n] for n in (down if rnd % 2 == 0 else up)[k]]
                want.append(sum(ns) / len(ns) if ns else xs[k])
            _fit(r, want, width, gap, xs)
    lo = min((xs[k] - width[k] / 2 for k in xs), default=0.0)
    return {k: v - lo for k, v in xs.items()}


def _fit(
    row: list[Key], want: list[float], width: Mapping[Key, float], gap: float, xs: dict[Key, float]
) -> None:
    """Positions as close to ``want`` as order and spacing allow (mean of a left-to-right
    and a right-to-left packing)."""
    n = len(row)
    left = list(want)
    for i in range(1, n):
        need = left[i - 1] + (width[row[i - 1]] + width[row[i]]) / 2 + gap
        left[i] = max(left[i], need)
    right = list(want)
    for i in range(n - 2, -1, -1):
        need = right[i + 1] - (width[row[i + 1]] + width[row[i]]) / 2 - gap
        right[i] = min(right[i], need)
    mid = [(a + b) / 2 for a, b in zip(left, right, strict=True)]
    for i in range(1, n):  # the mean of two valid packings is valid; guard rounding
        need = mid[i - 1] + (width[row[i - 1]] + width[row[i]]) / 2 + gap
        mid[i] = max(mid[i], need)
    for k, x in zip(row, mid, strict=True):
        xs[k] = x


# ---- graphviz dot -------------------------------------------------------------------


def dot_layout(
    keys: Sequence[Key],
    sizes: Mapping[Key, tuple[float, float]],
    edges: Sequence[tuple[Key, Key]],
    *,
    hgap: float = 22.0,
    vgap: float = 30.0,
    timeout: float = 30.0,
) -> Layout:
    """Positions and edge routes from ``dot -Tplain`` (sizes in pixels, 72 per inch)."""
    exe = shutil.which("dot")
    if exe is None:
        raise OSError("graphviz 'dot' is not installed")
    names = {k: f"n{i}" for i, k in enumerate(keys)}
    lines = [
        "digraph g {",
        f"  graph [rankdir=TB, nodesep={hgap / 72:.3f}, ranksep={vgap / 72:.3f}];",
        '  node [shape=box, fixedsize=true, label=""];',
    ]
    for k in keys:
        w, h = sizes[k]
        lines.append(f"  {names[k]} [width={w / 72:.4f}, height={h / 72:.4f}];")
    for s, d in edges:
        lines.append(f"  {names[s]} -> {names[d]};")
    lines.append("}")
    res = subprocess.run(
        [exe, "-Tplain"],
        input="\n".join(lines),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    back = {v: k for k, v in names.items()}
    return parse_plain(res.stdout, back, sizes)


def parse_plain(
    text: str, keys: Mapping[str, Key], sizes: Mapping[Key, tuple[float, float]]
) -> Layout:
    """A :class:`Layout` from graphviz ``-Tplain`` text (y grows upwards there, in
    inches); ``keys`` maps dot node names back to keys. ValueError on malformed text."""
    height = 0.0
    centres: dict[Key, tuple[float, float]] = {}
    raw_routes: list[tuple[str, str, list[tuple[float, float]]]] = []
    width = 0.0
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "graph":
            width, height = float(f[2]) * 72, float(f[3]) * 72
        elif f[0] == "node":
            centres[keys[f[1]]] = (float(f[2]) * 72, float(f[3]) * 72)
        elif f[0] == "edge":
            n = int(f[3])
            pts = [(float(f[4 + 2 * i]) * 72, float(f[5 + 2 * i]) * 72) for i in range(n)]
            raw_routes.append((f[1], f[2], pts))
    if not height:
        raise ValueError("dot -Tplain output has no 'graph' line")
    boxes = {}
    for k, (cx, cy) in centres.items():
        w, h = sizes[k]
        boxes[k] = Box(cx - w / 2, height - cy - h / 2, w, h)
    routes = {}
    for s, d, pts in raw_routes:
        a, b = keys[s], keys[d]
        flipped = [(x, height - y) for x, y in pts]
        routes[(a, b)] = [
            (boxes[a].cx, boxes[a].y + boxes[a].h),
            *flipped[1:-1],
            (boxes[b].cx, boxes[b].y),
        ]
    return Layout(boxes, routes, width, height, engine="dot")
