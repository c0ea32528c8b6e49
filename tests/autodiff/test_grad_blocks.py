"""Derivatives of the fused transformer blocks (FusedTransformerLayer, FusedAttentionBlock:
the decomposition's rules) against torch.autograd of ``nn.TransformerEncoderLayer`` in
f64, and their batching rule (vmap of x folded into the block's batch) against a loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlx
from rlx.autodiff import grad, jvp, vmap
from tests.ops.test_blocks import B_NAMES, W_NAMES, layer_values, padding, torch_layer

H, HEADS, INTER = 8, 2, 12


def _layer_graph(pre: bool, probe: np.ndarray) -> rlx.Graph:
    g = rlx.Graph("layer")
    x = g.input("x", (2, 4, H), "f64")
    m = g.input("mask", (2, 1, 1, 4), "f64")
    ws = [g.input(n, _SHAPES[n], "f64") for n in W_NAMES]
    bs = [g.input(n, _SHAPES[n], "f64") for n in B_NAMES]
    y = g.fused_transformer_layer(x, ws, bs, HEADS, H // HEADS, (1e-5, 1e-5), mask_input=m,
                                  pre_norm=pre)  # fmt: skip
    g.set_outputs([g.sum(g.mul(y, g.constant(probe)))])
    return g


_SHAPES = {k: v.shape for k, v in layer_values(np.random.default_rng(0), H, INTER).items()}


@pytest.mark.parametrize("pre", [False, True], ids=["post_norm", "pre_norm"])
def test_fused_transformer_layer_gradients_match_torch_autograd(pre):
    rng = np.random.default_rng(3)
    v = layer_values(rng, H, INTER, np.float64)
    x = rng.standard_normal((2, 4, H))
    probe = rng.standard_normal((2, 4, H))
    pad, mask = padding(2, 4)
    g = _layer_graph(pre, probe)
    names = ["x", *W_NAMES, *B_NAMES]
    feed = {"x": x, "mask": mask.astype(np.float64), **v}
    got = grad(g, names).evaluate(feed, {})
    layer = torch_layer(v, H, HEADS, INTER, pre, "gelu", True, 1e-5, torch.float64)
    xt = torch.from_numpy(x).requires_grad_(True)
    out = layer(xt, src_key_padding_mask=torch.from_numpy(pad))
    (out * torch.from_numpy(probe)).sum().backward()
    sa = layer.self_attn
    wq, wk, wv = sa.in_proj_weight.grad.chunk(3)
    bq, bk, bv = sa.in_proj_bias.grad.chunk(3)
    want = {"x": xt.grad, "wq": wq.T, "wk": wk.T, "wv": wv.T, "wo": sa.out_proj.weight.grad.T,
            "w_up": layer.linear1.weight.grad.T, "w_down": layer.linear2.weight.grad.T,
            "ln1_g": layer.norm1.weight.grad, "ln1_b": layer.norm1.bias.grad,
            "ln2_g": layer.norm2.weight.grad, "ln2_b": layer.norm2.bias.grad, "bq": bq,
            "bk": bk, "bv": bv, "bo": sa.out_proj.bias.grad, "b_up": layer.linear1.bias.grad,
            "b_down": layer.linear2.bias.grad}  # fmt: skip
    for name, a in zip(names, got, strict=True):
        np.testing.assert_allclose(a, want[name].numpy(), rtol=1e-9, atol=1e-11, err_msg=name)


def test_fused_attention_block_jvp_matches_torch_func_jvp():
    rng = np.random.default_rng(4)
    v = layer_values(rng, H, INTER, np.float64)
    x, tx = rng.standard_normal((2, 4, H)), rng.standard_normal((2, 4, H))
    g = rlx.Graph("block")
    xi = g.input("x", (2, 4, H), "f64")
    ws = [g.constant(v[n]) for n in W_NAMES[:4]]
    bs = [g.constant(v[n]) for n in B_NAMES[:4]]
    g.set_outputs([g.fused_attention_block(xi, ws, bs, HEADS, H // HEADS)])
    _, tangent = jvp(g, ["x"]).evaluate({"x": x, "t_x": tx}, {})
    t = {k: torch.from_numpy(a) for k, a in v.items()}
    d = H // HEADS

    def f(a: torch.Tensor) -> torch.Tensor:  # the block in torch ops (SDPA has no forward AD)
        q, k, w = (
            (a @ t[f"w{c}"] + t[f"b{c}"]).view(2, 4, HEADS, d).transpose(1, 2) for c in "qkv"
        )
        p = torch.softmax(q @ k.transpose(-1, -2) / d**0.5, -1)
        return (p @ w).transpose(1, 2).reshape(2, 4, H) @ t["wo"] + t["bo"]

    _, want = torch.func.jvp(f, (torch.from_numpy(x),), (torch.from_numpy(tx),))
    np.testing.assert_allclose(tangent, want.detach().numpy(), rtol=1e-9, atol=1e-11)


def test_vmap_folds_x_into_the_block_batch():
    """vmap over a leading axis of x: one block over V*B sequences (the op's batch rule),
    equal to the block applied to each slice."""
    rng = np.random.default_rng(5)
    v = layer_values(rng, H, INTER)
    g = rlx.Graph("block")
    xi = g.input("x", (2, 4, H))
    mi = g.input("mask", (2, 1, 1, 4))
    ws = [g.constant(v[n]) for n in W_NAMES]
    bs = [g.constant(v[n]) for n in B_NAMES]
    g.set_outputs([g.fused_transformer_layer(xi, ws, bs, HEADS, H // HEADS, mask_input=mi)])
    batched = vmap(g, {"x": 0, "mask": None}, size=3)
    assert [n.op.mnemonic for n in batched.nodes].count("fused_transformer_layer") == 1
    xs = rng.standard_normal((3, 2, 4, H)).astype(np.float32)
    mask = padding(2, 4)[1]
    got = batched.evaluate({"x": xs, "mask": mask}, {})[0]
    for i in range(3):
        want = g.evaluate({"x": xs[i], "mask": mask}, {})[0]
        np.testing.assert_allclose(got[i], want, rtol=1e-6, atol=1e-6)
