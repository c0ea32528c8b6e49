"""The fused transformer blocks (``rlx/ops/blocks.py``: fused_attention_block,
fused_transformer_layer) against PyTorch: ``nn.TransformerEncoderLayer`` (post-norm and
``norm_first``, gelu / relu, with and without biases, a key-padding mask) and
``nn.MultiheadAttention``, with the same weights; the reference interpreter and the
compiled kernel (the decomposition's own kernels) both."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlx
from rlx.errors import ShapeError
from rlx.ops.blocks import FusedAttentionBlock, FusedTransformerLayer
from rlx.ops.nn import MaskKind
from rlx.ops.unary_kinds import UnaryKind
from rlx.runtime.session import Session

W_NAMES = ("wq", "wk", "wv", "wo", "w_up", "w_down", "ln1_g", "ln1_b", "ln2_g", "ln2_b")
B_NAMES = ("bq", "bk", "bv", "bo", "b_up", "b_down")


def layer_values(rng, h: int, inter: int, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights by input name ([in, out] matrices, layer norm gammas near 1)."""
    dims = {"wq": (h, h), "wk": (h, h), "wv": (h, h), "wo": (h, h), "w_up": (h, inter),
            "w_down": (inter, h), "bq": (h,), "bk": (h,), "bv": (h,), "bo": (h,),
            "b_up": (inter,), "b_down": (h,)}  # fmt: skip
    v = {k: rng.standard_normal(d) * 0.3 for k, d in dims.items()}
    v |= {k: 1 + 0.2 * rng.standard_normal(h) for k in ("ln1_g", "ln2_g")}
    v |= {k: 0.2 * rng.standard_normal(h) for k in ("ln1_b", "ln2_b")}
    return {k: a.astype(dtype) for k, a in v.items()}


def torch_layer(v: dict, h: int, heads: int, inter: int, pre: bool, act: str, bias: bool,
                eps: float, dtype=torch.float32) -> torch.nn.TransformerEncoderLayer:  # fmt: skip
    """``nn.TransformerEncoderLayer`` holding the weights ``v`` (dropout 0, eval)."""
    layer = torch.nn.TransformerEncoderLayer(
        h, heads, inter, dropout=0.0, activation=act, batch_first=True, norm_first=pre,
        layer_norm_eps=eps, bias=bias, dtype=dtype,
    ).eval()  # fmt: skip
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dtype)  # noqa: E731
    sa = layer.self_attn
    with torch.no_grad():
        sa.in_proj_weight.copy_(t(np.concatenate([v["wq"].T, v["wk"].T, v["wv"].T])))
        sa.out_proj.weight.copy_(t(v["wo"].T))
        layer.linear1.weight.copy_(t(v["w_up"].T))
        layer.linear2.weight.copy_(t(v["w_down"].T))
        for i, n in ((1, "norm1"), (2, "norm2")):
            getattr(layer, n).weight.copy_(t(v[f"ln{i}_g"]))
            if bias:
                getattr(layer, n).bias.copy_(t(v[f"ln{i}_b"]))
        if bias:
            sa.in_proj_bias.copy_(t(np.concatenate([v["bq"], v["bk"], v["bv"]])))
            sa.out_proj.bias.copy_(t(v["bo"]))
            layer.linear1.bias.copy_(t(v["b_up"]))
            layer.linear2.bias.copy_(t(v["b_down"]))
    return layer


def padding(b: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(key padding, True = pad: the last sequence keeps 2 tokens; rlx's additive mask
    [B, 1, 1, S] of it, as rlx.models.hf builds it)."""
    pad = np.zeros((b, s), bool)
    pad[-1, 2:] = True
    return pad, np.where(pad, -1e30, 0.0).reshape(b, 1, 1, s).astype(np.float32)


@pytest.mark.parametrize("pre", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize(("act", "bias"), [("gelu", True), ("relu", True), ("gelu", False)])
def test_layer_matches_torch_encoder_layer(pre, act, bias):
    b, s, h, heads, inter, eps = 2, 5, 16, 4, 24, 1e-5
    rng = np.random.default_rng(0)
    v = layer_values(rng, h, inter)
    if not bias:  # torch's bias=False layer norms have no beta either
        v |= {"ln1_b": np.zeros(h, np.float32), "ln2_b": np.zeros(h, np.float32)}
    x = rng.standard_normal((b, s, h)).astype(np.float32)
    pad, mask = padding(b, s)
    g = rlx.Graph("layer")
    xi, mi = g.input("x", x.shape), g.input("mask", mask.shape)
    ws = [g.param(n, v[n].shape) for n in W_NAMES]
    bs = [g.param(n, v[n].shape) for n in B_NAMES] if bias else None
    kind = UnaryKind.GELU if act == "gelu" else UnaryKind.RELU
    y = g.fused_transformer_layer(xi, ws, bs, heads, h // heads, (eps, eps), kind,
                                  mask_input=mi, pre_norm=pre)  # fmt: skip
    g.set_outputs([y])
    params = {n: v[n] for n in (*W_NAMES, *(B_NAMES if bias else ()))}
    layer = torch_layer(v, h, heads, inter, pre, act, bias, eps)
    with torch.no_grad():
        want = layer(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(pad)).numpy()
    feed = {"x": x, "mask": mask}
    np.testing.assert_allclose(g.evaluate(feed, params)[0], want, rtol=1e-5, atol=1e-5)
    cg = Session().compile(g, params=params)
    np.testing.assert_allclose(cg.run(feed)[0], want, rtol=1e-5, atol=1e-5)
    assert "fused_transformer_layer" in str(cg.report())


@pytest.mark.parametrize("mask", ["padding", "causal", "none"])
def test_attention_block_matches_torch_multihead_attention(mask):
    b, s, h, heads = 3, 6, 12, 3
    rng = np.random.default_rng(1)
    v = layer_values(rng, h, 4)
    x = rng.standard_normal((b, s, h)).astype(np.float32)
    pad, additive = padding(b, s)
    mha = torch_layer(v, h, heads, 4, False, "relu", True, 1e-5).self_attn
    g = rlx.Graph("block")
    xi = g.input("x", x.shape)
    ws = [g.constant(v[n]) for n in W_NAMES[:4]]
    bs = [g.constant(v[n]) for n in B_NAMES[:4]]
    feed, kw, tkw = {"x": x}, {}, {}
    if mask == "padding":
        feed["mask"] = additive
        kw = {"mask_input": g.input("mask", additive.shape)}
        tkw = {"key_padding_mask": torch.from_numpy(pad)}
    elif mask == "causal":
        kw = {"mask": MaskKind.causal()}
        tkw = {"attn_mask": torch.triu(torch.ones(s, s, dtype=torch.bool), 1)}
    g.set_outputs([g.fused_attention_block(xi, ws, bs, heads, h // heads, **kw)])
    xt = torch.from_numpy(x)
    with torch.no_grad():
        want = mha(xt, xt, xt, need_weights=False, **tkw)[0].numpy()
    np.testing.assert_allclose(g.evaluate(feed)[0], want, rtol=1e-5, atol=1e-5)
    got = Session().compile(g).run(feed)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_kernel_equals_the_unfused_graph_bit_for_bit():
    """The block's kernel runs the decomposition's kernels: the same bits as compiling
    the decomposition itself (f32, a symbolic batch and sequence, two sizes)."""
    from rlx.ops.blocks import expand

    rng = np.random.default_rng(2)
    h, heads, inter = 16, 2, 32
    v = layer_values(rng, h, inter)
    op = FusedTransformerLayer(heads, h // heads, 1e-12, 1e-12, UnaryKind.GELU, True,
                               MaskKind.custom())  # fmt: skip
    graphs = []
    for fused in (True, False):
        g = rlx.Graph("sym")
        bt, sq = g.sym("batch"), g.sym("seq")
        xi, mi = g.input("x", (bt, sq, h)), g.input("mask", (bt, 1, 1, sq))
        ins = [xi, *(g.param(n, v[n].shape) for n in (*W_NAMES, *B_NAMES)), mi]
        g.set_outputs([g.apply(op, ins) if fused else expand(op, g, ins)])
        graphs.append(Session().compile(g, params=v))
    for b, s in ((1, 3), (2, 7)):
        x = rng.standard_normal((b, s, h)).astype(np.float32)
        feed = {"x": x, "mask": padding(b, s)[1]}
        np.testing.assert_array_equal(graphs[0].run(feed)[0], graphs[1].run(feed)[0])


def test_shape_rules_name_the_input_and_what_they_expected():
    g = rlx.Graph("bad")
    x = g.input("x", (1, 4, 8))
    w = [g.input(f"w{i}", (8, 8)) for i in range(4)]
    with pytest.raises(ShapeError, match=r"wq must be \[8, 6\] \(H=8, heads 2 x 3\)"):
        g.apply(FusedAttentionBlock(2, 3, False), [x, *w])
    with pytest.raises(ShapeError, match=r"expected 9 inputs, got 5"):
        g.apply(FusedAttentionBlock(2, 4, True), [x, *w])
    ffn = [g.input("up", (8, 5)), g.input("down", (4, 8))]
    lns = [g.input(f"ln{i}", (8,)) for i in range(4)]
    with pytest.raises(ShapeError, match=r"w_down must be \[5, 8\]"):
        g.apply(FusedTransformerLayer(2, 4, has_bias=False), [x, *w, *ffn, *lns])


def test_blocks_and_moe_ops_save_and_load():
    """The four ops of this change round-trip through rlx's file format (their enums,
    mask kinds and quant schemes by name)."""
    from rlx.formats import schemes as S
    from rlx.ir.serialize import dumps, loads

    g = rlx.Graph("s")
    x, m = g.input("x", (2, 3, 8)), g.input("m", (2, 1, 1, 3))
    ws = [g.param(f"w{i}", s) for i, s in enumerate([(8, 8)] * 4 + [(8, 16), (16, 8)])]
    ln = [g.param(f"l{i}", (8,)) for i in range(4)]
    y = g.fused_transformer_layer(x, [*ws, *ln], None, 2, 4, activation=UnaryKind.RELU,
                                  mask_input=m, pre_norm=True)  # fmt: skip
    a = g.fused_attention_block(x, ws[:4], None, 2, 4, MaskKind.causal())
    t, ids, p = g.input("t", (4, 256)), g.input("i", (4,), "i64"), g.param("p", (3, 5, 272), "u8")
    d = g.dequant_grouped_matmul(t, S.GgufQ8_0(), p, ids)
    g.set_outputs([y, a, d, g.dequant_moe_weights(S.GgufQ8_0(), p)])
    back = loads(dumps(g))[0]
    assert [n.op for n in back.nodes] == [n.op for n in g.nodes]
    assert [n.shape for n in back.nodes] == [n.shape for n in g.nodes]
