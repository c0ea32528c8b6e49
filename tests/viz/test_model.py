"""What the page draws: block names from param names, every node of a decoder layer in
its layer's block, large blocks split, params and constants folded into their readers,
fused kernels and their groups read off the compiled graph, and the precision auto mixed
precision chose (bf16) on each retyped node."""

from __future__ import annotations

import re

import pytest

import rlx
from rlx.models import synthetic
from rlx.ops.core import Constant, Input, Param
from rlx.passes.precision import PrecisionPolicy
from rlx.viz.model import INPUTS, block_of_name, build_view
from tests.viz.conftest import small_decoder


@pytest.mark.parametrize(
    ("name", "block"),
    [
        ("encoder.layer.3.attention.self.query.weight", "encoder.layer.3"),
        ("layer7.mlp.up.weight", "layer7"),
        ("layers.0.fc.weight", "layers.0"),
        ("embeddings.word_embeddings.weight", "embeddings"),
        ("final_norm.gamma", "final_norm"),
        ("h.11.attn.c_attn.weight", "h.11"),
        ("w", None),
    ],
)
def test_block_of_name(name: str, block: str | None) -> None:
    assert block_of_name(name) == block


def _params_read(g: rlx.Graph, nid: int) -> set[str]:
    return {g.nodes[i].op.name for i in g.nodes[nid].inputs if isinstance(g.nodes[i].op, Param)}


def test_decoder_nodes_sit_in_their_layer(decoder_graph: rlx.Graph) -> None:
    g = decoder_graph
    view = build_view(g, "MIR")
    assert view.blocks[:2] == [INPUTS, "layer0"] and view.blocks[-1] == "final_norm"
    assert view.blocks[1:5] == [f"layer{i}" for i in range(4)]
    drawn = {n.id for n in g.nodes if not isinstance(n.op, (Param, Constant))}
    assert set(view.nodes) == drawn  # params and constants are folded, not drawn
    for nid, vn in view.nodes.items():
        names = _params_read(g, nid)
        if names:  # a node reading a layer's weight is in that layer's block
            prefixes = {re.match(r"(layer\d+|final_norm)", p).group(1) for p in names}
            assert prefixes == {vn.block}
            assert all(f"param {p}" in " ".join(vn.reads) for p in names)
            assert all(p in vn.name for p in names)  # a search for the weight finds it
        if isinstance(g.nodes[nid].op, Input):
            assert vn.block == INPUTS and vn.title == g.nodes[nid].op.name
    # every layer holds the same number of nodes (the decoder repeats one layer)
    sizes = {len(view.block_nodes(f"layer{i}")) for i in range(4)}
    assert len(sizes) == 1
    # edges join drawn nodes only, in the graph's direction
    for s, d in view.edges:
        assert s in g.nodes[d].inputs and s in view.nodes and d in view.nodes


def test_large_blocks_are_split_into_parts() -> None:
    g = rlx.Graph("chain")  # no params: one block named after the graph, then parts
    x = g.input("x", (4,))
    for _ in range(30):
        x = g.tanh(x)
    g.set_outputs([x])
    view = build_view(g, "MIR", limit=12)
    assert view.blocks == [INPUTS, "chain [1/3]", "chain [2/3]", "chain [3/3]"]
    assert [len(view.block_nodes(b)) for b in view.blocks[1:]] == [10, 10, 10]
    assert view.nodes[x].output == 0


def test_compiled_view_fusion_groups(decoder_compiled) -> None:
    c = decoder_compiled
    p = c.program
    view = build_view(p.graph, "compiled", plan=c.memory_plan, source=p.source)
    want = {}
    for n in p.graph.nodes:  # the oracle: nodes that replaced more than one user node
        if n.loc is not None and len(n.loc.fused) > 1:
            want[n.id] = (n.op.mnemonic, len(n.loc.fused))
    got = {i: (v.group, len(v.fused)) for i, v in view.nodes.items() if v.group}
    assert got == want and want
    groups = {g for g, _ in want.values()}
    assert {"attention", "fused_swiglu"} <= groups
    # compiled nodes keep the block of the user node they came from
    for v in view.nodes.values():
        if v.group == "fused_swiglu":
            assert re.fullmatch(r"layer\d", v.block)
        assert v.slot.startswith("[")  # every drawn node has its arena slot


def test_bf16_precision_is_shown_per_node() -> None:
    g = small_decoder(layers=1)
    opts = rlx.CompileOptions(precision=PrecisionPolicy.AutoMixedBf16, num_threads=1)
    c = rlx.Session("cpu").compile(g, params=synthetic.random_params(g), options=opts)
    p = c.program
    view = build_view(p.graph, "compiled", source=p.source, folded=p.hoisted)
    narrow = {i for i, v in view.nodes.items() if v.precision == "bf16"}
    want = {i for i in view.nodes if p.graph.nodes[i].dtype.value == "bf16"}
    assert narrow == want and len(narrow) > 5
    assert not set(view.nodes) & set(p.hoisted)  # the weights' casts are folded
    html = c.to_html()
    assert html.count('class="badge-text"') == len(narrow)
