"""The layered layout: every box placed, boxes of one row never overlap, every edge runs
downwards from its source's bottom to its target's top, and barycentric ordering removes
crossings a plain insertion order has; ``dot -Tplain`` text parses into the same shape
of result. Random DAGs (hypothesis) check the geometric rules."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.viz import layout as layout_mod
from rlx.viz.layout import Layout, layered, layout, parse_plain

GAP = 22.0


def _check(lay: Layout, keys: list[int], edges: list[tuple[int, int]], gap: float = GAP) -> None:
    assert set(lay.boxes) == set(keys)
    boxes = list(lay.boxes.values())
    for i, a in enumerate(boxes):  # plain pairwise check, independent of the rows
        assert a.x >= -1e-6 and a.y >= -1e-6
        assert a.x + a.w <= lay.width + 1e-6 and a.y + a.h <= lay.height + 1e-6
        for b in boxes[i + 1 :]:
            overlap_y = a.y < b.y + b.h and b.y < a.y + a.h
            if overlap_y:
                assert a.x + a.w + gap - 1e-6 <= b.x or b.x + b.w + gap - 1e-6 <= a.x
    for s, d in edges:
        src, dst = lay.boxes[s], lay.boxes[d]
        assert src.y + src.h < dst.y  # downwards
        pts = lay.routes[(s, d)]
        assert pts[0] == pytest.approx((src.x + src.w / 2, src.y + src.h))
        assert pts[-1] == pytest.approx((dst.x + dst.w / 2, dst.y))
        ys = [y for _, y in pts]
        assert ys == sorted(ys)


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[int], list[tuple[int, int]]]:
    n = draw(st.integers(1, 18))
    edges = set()
    for d in range(1, n):
        for s in draw(st.lists(st.integers(0, d - 1), max_size=3)):
            edges.add((s, d))
    return list(range(n)), sorted(edges)


@given(dags(), st.integers(40, 220))
def test_layered_geometry_on_random_dags(
    dag: tuple[list[int], list[tuple[int, int]]], w: int
) -> None:
    keys, edges = dag
    sizes = {k: (float(w if k % 2 else 60), 30.0 + (k % 3) * 8) for k in keys}
    _check(layered(keys, sizes, edges), keys, edges)


def test_ordering_removes_a_crossing() -> None:
    # a -> d and b -> c, declared so that insertion order crosses them: c sits left of d
    # under b, d under a; the sweeps must uncross (0 crossings is reachable).
    keys = ["a", "b", "c", "d"]
    edges = [("a", "d"), ("b", "c")]
    lay = layered(keys, {k: (50.0, 20.0) for k in keys}, edges)
    ax, bx, cx, dx = (lay.boxes[k].cx for k in keys)
    assert (ax < bx) == (dx < cx)


def test_a_long_edge_bends_through_each_row_it_crosses() -> None:
    keys = [0, 1, 2, 3]
    edges = [(0, 1), (1, 2), (2, 3), (0, 3)]
    lay = layered(keys, {k: (80.0, 30.0) for k in keys}, edges)
    _check(lay, keys, edges)
    assert len(lay.routes[(0, 3)]) == 4  # start, two virtual points, end
    assert lay.engine == "layered"


def test_a_source_sits_just_above_its_first_reader() -> None:
    # 'late' is read only by the last node: it is placed one row above it, not in row 0
    keys = ["a", "b", "c", "late"]
    edges = [("a", "b"), ("b", "c"), ("late", "c")]
    lay = layered(["a", "b", "late", "c"], {k: (40.0, 20.0) for k in keys}, edges)
    assert lay.boxes["late"].y == lay.boxes["b"].y


PLAIN = """graph 1 2.5 3
node n0 1.25 2.5 2 0.5 "" solid box black lightgrey
node n1 1.25 0.5 2 0.5 "" solid box black lightgrey
edge n0 n1 4 1.25 2.25 1.25 1.75 1.25 1.25 1.25 0.75 solid black
stop
"""


def test_parse_plain_flips_y_and_scales_to_pixels() -> None:
    sizes = {"a": (144.0, 36.0), "b": (144.0, 36.0)}
    lay = parse_plain(PLAIN, {"n0": "a", "n1": "b"}, sizes)
    assert lay.engine == "dot" and (lay.width, lay.height) == (180.0, 216.0)
    a, b = lay.boxes["a"], lay.boxes["b"]
    assert (a.x, a.y) == (18.0, 216.0 - 180.0 - 18.0) and (b.x, b.y) == (18.0, 216.0 - 36 - 18)
    assert lay.routes[("a", "b")][0] == (90.0, a.y + 36) and lay.routes[("a", "b")][-1] == (
        90.0,
        b.y,
    )
    with pytest.raises(ValueError, match="no 'graph' line"):
        parse_plain("stop\n", {}, {})


def test_engine_layered_never_calls_dot() -> None:
    lay = layout([1, 2], {1: (10.0, 10.0), 2: (10.0, 10.0)}, [(1, 2)], engine="layered")
    assert lay.engine == "layered"


@pytest.mark.skipif(  # .ci/run installs graphviz: under CI a missing dot fails here
    __import__("shutil").which("dot") is None and __import__("os").environ.get("CI") != "true",
    reason="graphviz dot is not installed (apt-get install graphviz)",
)
def test_dot_engine_when_installed() -> None:
    keys = [0, 1, 2]
    edges = [(0, 1), (0, 2), (1, 2)]
    lay = layout(keys, {k: (80.0, 30.0) for k in keys}, edges, engine="dot")
    assert lay.engine == "dot"
    for s, d in edges:
        assert lay.boxes[s].y < lay.boxes[d].y


FAKE_DOT = r"""#!{python}
# A stand-in for graphviz dot -Tplain: one node per rank, top to bottom, straight edges.
import re, sys
text = sys.stdin.read()
assert sys.argv[1:] == ["-Tplain"]
nodes = re.findall(r"^  (n\d+) \[width=([\d.]+), height=([\d.]+)\];$", text, re.M)
edges = re.findall(r"^  (n\d+) -> (n\d+);$", text, re.M)
h = 1.0 * len(nodes)
print(f"graph 1 3 {{h}}")
y = {{}}
for i, (n, w, ht) in enumerate(nodes):
    y[n] = h - 0.5 - i
    print(f"node {{n}} 1.5 {{y[n]}} {{w}} {{ht}} \"\" solid box black lightgrey")
for a, b in edges:
    print(f"edge {{a}} {{b}} 4 1.5 {{y[a]}} 1.5 {{y[a] - 0.3}} 1.5 {{y[b] + 0.3}} 1.5 {{y[b]}} solid black")
print("stop")
"""


def test_dot_engine_through_a_stand_in(tmp_path, monkeypatch) -> None:
    exe = tmp_path / "dot"
    exe.write_text(FAKE_DOT.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert layout_mod.has_dot()
    keys = ["a", ("g", 1), "c"]
    edges = [("a", "c"), (("g", 1), "c")]
    lay = layout(keys, {k: (72.0, 36.0) for k in keys}, edges)  # auto: dot is found
    assert lay.engine == "dot" and set(lay.boxes) == set(keys)
    assert lay.boxes["a"].y < lay.boxes[("g", 1)].y < lay.boxes["c"].y
    assert len(lay.routes[("a", "c")]) == 4  # start, two control points, end

    g = rlx.Graph("small")
    x = g.input("x", (2,))
    g.set_outputs([g.tanh(g.exp(x))])
    html = g.to_html()
    assert "layout: graphviz dot" in html and " C" in html
