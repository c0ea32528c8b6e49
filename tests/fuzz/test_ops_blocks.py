"""Differential fuzzing (harness.py: reference interpreter and compiled graph, every
precision policy and native target) of the fused transformer blocks against PyTorch in
float64 on the operands rounded to the policy's precision:

* ``fused_transformer_layer``: ``nn.TransformerEncoderLayer`` (post-norm or
  ``norm_first``, gelu / relu, a key-padding mask), the weights copied into it;
* ``fused_attention_block``: its ``self_attn`` (``nn.MultiheadAttention``).

Weights arrive as inputs, params or frozen params (folded into constants).
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.ops.base import OpKind
from rlx.ops.blocks import FusedAttentionBlock, FusedTransformerLayer
from rlx.ops.nn import MaskKind
from rlx.ops.unary_kinds import UnaryKind
from tests.ops.test_blocks import B_NAMES, W_NAMES, layer_values, torch_layer

from .harness import SEEDS, WEIGHTS, Tol, check, examples, leaves

# f32 per unit of the output's largest |value|; narrow policies round every step
TOL = Tol(2e-5, 3e-2, 2.5e-1)


def _case(data, seed: int, layer: bool):
    rng = np.random.default_rng(seed)
    b, s = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 5))
    heads, d = data.draw(st.sampled_from([(1, 4), (2, 4), (3, 2)]))
    h, inter = heads * d, data.draw(st.sampled_from([4, 10]))
    v = layer_values(rng, h, inter)
    x = rng.standard_normal((b, s, h)).astype(np.float32)
    pad = np.zeros((b, s), bool)
    pad[0, data.draw(st.integers(1, s)) :] = True  # the first sequence is padded
    mask = np.where(pad, -1e30, 0.0).reshape(b, 1, 1, s).astype(np.float32)
    return v, x, pad, mask, (h, heads, inter)


@examples(6)
@given(data=st.data(), pre=st.booleans(), act=st.sampled_from(["gelu", "relu"]),
       weights=WEIGHTS, seed=SEEDS)  # fmt: skip
def test_fused_transformer_layer_matches_torch(data, pre, act, weights, seed) -> None:
    v, x, pad, mask, (h, heads, inter) = _case(data, seed, True)
    names = (*W_NAMES, *B_NAMES)
    g = rlx.Graph("fused_transformer_layer")
    ids, inputs, params = leaves(g, {"x": x, "mask": mask, **{n: v[n] for n in names}},
                                 names if weights != "inputs" else ())  # fmt: skip
    kind = UnaryKind.GELU if act == "gelu" else UnaryKind.RELU
    op = FusedTransformerLayer(heads, h // heads, 1e-5, 1e-5, kind, True, MaskKind.custom(), pre)
    g.set_outputs([g.apply(op, [ids["x"], *(ids[n] for n in names), ids["mask"]])])

    def oracle(rnd):
        layer = torch_layer({n: rnd(a) for n, a in v.items()}, h, heads, inter, pre, act, True,
                            1e-5, torch.float64)  # fmt: skip
        with torch.no_grad():
            y = layer(torch.from_numpy(rnd(x)), src_key_padding_mask=torch.from_numpy(pad))
        return [y.numpy()]

    check(g, inputs, params, oracle, [OpKind.COMPUTE], TOL, "max",
          freeze_params=weights == "frozen")  # fmt: skip


@examples(6)
@given(data=st.data(), bias=st.booleans(), weights=WEIGHTS, seed=SEEDS)
def test_fused_attention_block_matches_torch(data, bias, weights, seed) -> None:
    v, x, pad, mask, (h, heads, inter) = _case(data, seed, False)
    names = (*W_NAMES[:4], *(B_NAMES[:4] if bias else ()))
    g = rlx.Graph("fused_attention_block")
    ids, inputs, params = leaves(g, {"x": x, "mask": mask, **{n: v[n] for n in names}},
                                 names if weights != "inputs" else ())  # fmt: skip
    op = FusedAttentionBlock(heads, h // heads, bias, MaskKind.custom())
    g.set_outputs([g.apply(op, [ids["x"], *(ids[n] for n in names), ids["mask"]])])
    if not bias:
        v = v | {n: np.zeros_like(v[n]) for n in B_NAMES[:4]}

    def oracle(rnd):
        mha = torch_layer({n: rnd(a) for n, a in v.items()}, h, heads, inter, False, "relu",
                          True, 1e-5, torch.float64).self_attn  # fmt: skip
        xt = torch.from_numpy(rnd(x))
        with torch.no_grad():
            return [
                mha(xt, xt, xt, key_padding_mask=torch.from_numpy(pad), need_weights=False)[
                    0
                ].numpy()
            ]

    check(g, inputs, params, oracle, [OpKind.DATA_MOVEMENT], TOL, "max",
          freeze_params=weights == "frozen")  # fmt: skip
