"""The page without a browser: self-contained (no URL but the SVG namespace, no external
script, style or image), the embedded data parses and names every drawn node, the
legend lists the fusion groups, ``Graph.to_html`` / ``GraphModule.to_html`` /
``CompiledGraph.to_html`` write the file they return, and ``rlx inspect --html``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.ops.core import Constant, Param
from tests.cli.conftest import run


def _data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="rlx-data">(.*?)</script>', html, re.S)
    assert m is not None
    return json.loads(m.group(1))


def _self_contained(html: str) -> None:
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    assert not re.search(r"<(link|img|iframe)\b", html)
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert "@import" not in html and "url(http" not in html


def test_graph_page(decoder_graph: rlx.Graph, tmp_path: Path) -> None:
    g = decoder_graph
    path = tmp_path / "g.html"
    html = g.to_html(path)
    assert path.read_text(encoding="utf-8") == html
    _self_contained(html)
    data = _data(html)
    drawn = [n for n in g.nodes if not isinstance(n.op, (Param, Constant))]
    assert sorted(map(int, data["nodes"])) == [n.id for n in drawn]
    for n in drawn:
        assert f'id="n-{n.id}"' in html
    for name in g.input_names:
        assert f'data-name="{name} input inputs"' in html
    names = [b["name"] for b in data["blocks"]]
    assert names[:3] == ["inputs", "layer0", "layer1"]
    assert not any(b["expanded"] for b in data["blocks"])  # 4 layers: collapsed
    assert "No fusion yet" in html  # the graph before the pipeline has no fused kernels
    assert 'id="memory"' in html and "peak (working region)" in html


def test_small_graph_opens_expanded_and_module_page() -> None:
    mm = rlx.GraphModule.mir("tiny")
    x = mm.input("x", (2, 3))
    w = mm.param("w", (3, 4))
    mm.set_outputs([mm.relu(mm.matmul(x, w))])
    html = mm.to_html()
    data = _data(html)
    assert all(b["expanded"] for b in data["blocks"])
    assert "param w: f32[3,4]" in html  # folded into the matmul that reads it
    assert html.count('class="buf"') >= 2


def test_compiled_page(decoder_compiled, tmp_path: Path) -> None:
    c = decoder_compiled
    html = c.to_html(tmp_path / "c.html", expand=True)
    _self_contained(html)
    data = _data(html)
    assert all(b["expanded"] for b in data["blocks"])
    groups = set(re.findall(r'<li class="legend-item" data-group="([^"]+)"', html))
    want = {n.op.mnemonic for n in c.graph.nodes if n.loc is not None and len(n.loc.fused) > 1}
    assert groups == want
    for section in ("Fusion report", "Compile passes", "Kernel schedule"):
        assert f"<summary>{section}</summary>" in html
    assert "fused   attention" in html  # the fusion report's text
    kinds = {v["k"].split(" ")[0] for v in data["nodes"].values() if v["op"] != "input"}
    assert kinds and kinds <= {"native", "blas", "numpy", "reference", "view"}


def test_inspect_writes_the_page(tmp_path: Path) -> None:
    g = rlx.Graph("mlp")
    x = g.input("x", (g.sym("batch"), 16))
    w = g.param("w", (16, 8))
    g.set_outputs([g.tanh(g.matmul(x, w))])
    src = tmp_path / "mlp.rlx"
    rlx.save(g, src, {"w": np.ones((16, 8), np.float32)})
    out = tmp_path / "mlp.html"
    r = run(["inspect", str(src), "--shape", "4", "--no-graph", "--html", str(out)])
    assert r.code == 0, r.err
    assert f"wrote {out}" in r.out
    html = out.read_text(encoding="utf-8")
    _self_contained(html)
    assert "plan at batch=4" in html and "tanh" in html


def test_names_are_escaped_everywhere() -> None:
    g = rlx.Graph("<g & 'n'>")
    x = g.input("</script><script>alert(1)</script>", (2,))
    w = g.param('a<b>."q".w', (2,))
    g.set_outputs([g.add(x, w)])
    html = g.to_html()
    assert html.count("<script") == 2 and html.count("</script>") == 2
    assert "<b>" not in html and "&lt;g &amp; &#x27;n&#x27;&gt;" in html
    data = _data(html)
    assert data["nodes"]["0"]["t"] == "</script><script>alert(1)</script>"


def test_empty_and_input_only_graphs() -> None:
    assert 'id="graph"' in rlx.Graph("empty").to_html()
    g = rlx.Graph("id")
    g.set_outputs([g.input("x", (2,))])
    html = g.to_html()
    assert 'data-name="x input inputs"' in html and html.count('class="buf"') == 1


@pytest.mark.slow
def test_minilm_and_a_24_layer_decoder_stay_collapsed_per_block() -> None:
    from rlx.models import synthetic
    from rlx.models.hf import load
    from tests.models.conftest import minilm_path

    c = load(minilm_path()).compile()
    data = _data(c.to_html())
    names = [b["name"] for b in data["blocks"]]
    assert names[:8] == ["inputs", "embeddings", *(f"encoder.layer.{i}" for i in range(6))]
    assert not any(b["expanded"] for b in data["blocks"])
    per_block = {}
    for v in data["nodes"].values():
        per_block[v["b"]] = per_block.get(v["b"], 0) + 1
    assert len({per_block[i] for i in range(3, 8)}) == 1  # layers 1-5 draw alike
    fused = [n for n in c.graph.nodes if n.loc is not None and len(n.loc.fused) > 1]
    groups = {}
    for v in data["nodes"].values():
        if v["g"]:
            groups[v["g"]] = groups.get(v["g"], 0) + 1
    assert sum(groups.values()) == len(fused) and groups["fused_matmul_bias_act"] == 6 * 6

    g = synthetic.decoder(layers=24)
    data = _data(g.to_html())
    names = [b["name"] for b in data["blocks"]]
    assert names == ["inputs", *(f"layer{i}" for i in range(24)), "final_norm"]
    assert not any(b["expanded"] for b in data["blocks"])
    rows = [b["row"] for b in data["blocks"]]
    assert rows == sorted(rows) and len(set(rows)) == len(rows)  # a chain: one block a row
