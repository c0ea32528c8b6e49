"""The MoE ops (``rlx/ops/moe.py``: dequant_grouped_matmul, dequant_moe_weights) and the
MoE block (``g.moe_block``, ``rlx/ops/compose/moe.py``) against PyTorch: a torch
reference of the same block written here on the gguf-py-dequantized weights
(``gguf.quants.dequantize``), and ``transformers``' ``MixtralSparseMoeBlock`` with those
weights loaded into it. Q8_0 stacks are ``gguf.quants.quantize`` of random experts; Q4_K
stacks (gguf-py cannot quantize them) are random blocks with sane f16 super-block scales.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

import rlx
from rlx.errors import InputError, ShapeError
from rlx.formats import schemes as S
from rlx.ops.moe import DequantGroupedMatMul, DequantMoEWeights
from rlx.runtime.session import Session

SCHEMES = {"Q8_0": S.GgufQ8_0(), "Q4_K": S.GgufQ4K()}


def packed_stack(rng: np.random.Generator, name: str, e: int, n: int, k: int) -> np.ndarray:
    """A u8 [E, N, row_bytes] expert stack in GGUF type ``name``."""
    if name == "Q8_0":
        w = rng.standard_normal((e, n, k)).astype(np.float32) * np.float32(0.05)
        return np.stack([quants.quantize(w[i], GGMLQuantizationType.Q8_0) for i in range(e)])
    blocks = rng.integers(0, 256, (e, n, k // 256, 144), dtype=np.uint8)
    for off in (0, 2):  # d and dmin, f16
        d = rng.uniform(1e-4, 3e-4, (e, n, k // 256)).astype("<f2")
        blocks[..., off : off + 2] = d[..., None].view(np.uint8).reshape(e, n, k // 256, 2)
    return blocks.reshape(e, n, -1)


def decoded(name: str, packed: np.ndarray) -> np.ndarray:
    """gguf-py's f32 decoding of every expert: [E, N, K]."""
    t = GGMLQuantizationType[name]
    return np.stack([quants.dequantize(p, t) for p in packed]).astype(np.float32)


def torch_moe(x, router, wg, wu, wd, top_k: int, renormalize: bool) -> np.ndarray:
    """The block in torch, f32: softmax router, top-k, silu(gate) * up, down, weighted sum."""
    xt = torch.from_numpy(x)
    probs = torch.softmax(xt @ torch.from_numpy(router).T, dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(xt)
    g, u, d = (torch.from_numpy(a) for a in (wg, wu, wd))
    for t in range(xt.shape[0]):
        for j in range(top_k):
            e = int(ids[t, j])
            h = torch.nn.functional.silu(g[e] @ xt[t]) * (u[e] @ xt[t])
            out[t] += w[t, j] * (d[e] @ h)
    return out.numpy()


def _block(name: str, t: int, h: int, inter: int, e: int, top_k: int, renorm: bool, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, h)).astype(np.float32)
    router = (rng.standard_normal((e, h)) * 0.2).astype(np.float32)
    stacks = [packed_stack(rng, name, e, inter, h), packed_stack(rng, name, e, inter, h),
              packed_stack(rng, name, e, h, inter)]  # fmt: skip
    g = rlx.Graph("moe")
    xi = g.input("x", (t, h))
    ids = [g.param(n, s.shape, "u8") for n, s in zip(("gate", "up", "down"), stacks, strict=True)]
    out = g.moe_block(xi, g.param("router", router.shape), *ids, SCHEMES[name], top_k, renorm)
    g.set_outputs([out])
    params = dict(zip(("gate", "up", "down"), stacks, strict=True)) | {"router": router}
    return g, x, params, router, [decoded(name, s) for s in stacks]


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K"])
@pytest.mark.parametrize(("tokens", "top_k"), [(1, 1), (1, 2), (5, 2), (16, 1), (33, 2)])
def test_moe_block_matches_torch(name, tokens, top_k):
    """The compiled block (native dequant GEMMs per selected expert) and the reference
    interpreter equal the torch block within 1e-5 (f32), Mixtral's renormalized routing."""
    g, x, params, router, (wg, wu, wd) = _block(name, tokens, 256, 256, 4, top_k, True, tokens)
    want = torch_moe(x, router, wg, wu, wd, top_k, True)
    assert np.abs(want).max() > 0.05  # a block that does something
    got = Session().compile(g, params=params).run({"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ref = g.evaluate({"x": x}, params)[0]
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K"])
def test_moe_block_without_renormalization_matches_torch(name):
    """Qwen-MoE's default (norm_topk_prob=False): the top-k softmax weights as they are."""
    g, x, params, router, (wg, wu, wd) = _block(name, 6, 256, 256, 5, 2, False, 7)
    want = torch_moe(x, router, wg, wu, wd, 2, False)
    got = Session().compile(g, params=params).run({"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K"])
def test_moe_block_matches_transformers_mixtral(name):
    """``MixtralSparseMoeBlock`` of transformers with the dequantized experts loaded."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    e, h, inter, top_k = 4, 256, 256, 2
    g, x, params, router, (wg, wu, wd) = _block(name, 7, h, inter, e, top_k, True, 3)
    cfg = MixtralConfig(hidden_size=h, intermediate_size=inter, num_local_experts=e,
                        num_experts_per_tok=top_k, hidden_act="silu")  # fmt: skip
    block = MixtralSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(router))
        block.experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([wg, wu], axis=1)))
        block.experts.down_proj.copy_(torch.from_numpy(wd))
        want = block(torch.from_numpy(x)[None])[0].numpy()
    got = Session().compile(g, params=params).run({"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_shape_rules_name_what_they_expected():
    g = rlx.Graph("bad")
    x = g.input("x", (3, 256))
    ids = g.input("ids", (3,), "i64")
    with pytest.raises(ShapeError, match=r"hold K=512"):
        g.apply(DequantGroupedMatMul(S.GgufQ8_0()), [x, g.input("w", (2, 4, 544), "u8"), ids])
    with pytest.raises(ShapeError, match=r"expert_idx must be an integer \[M\] = \[3\]"):
        g.apply(DequantGroupedMatMul(S.GgufQ8_0()), [x, g.input("v", (2, 4, 272), "u8"), x])
    with pytest.raises(ShapeError, match=r"needs a GGUF block scheme"):
        g.apply(DequantMoEWeights(S.Int8Block(32)), [g.input("u", (2, 4, 272), "u8")])
    with pytest.raises(ShapeError, match=r"top_k must be an int in \[1, 2\]"):
        g.moe_block(x, g.input("r", (2, 256)), *(g.input(n, (2, 256, 272), "u8") for n in "abc"),
                    S.GgufQ8_0(), 3)  # fmt: skip


@pytest.mark.parametrize("native", [True, False])
def test_grouped_kernel_rejects_bad_ids_and_decodes_only_selected_experts(native):
    """An id outside [0, E) is an InputError naming it; the kernel (native or not) gives
    the reference's result and its note says the rows are grouped by expert."""
    rng = np.random.default_rng(1)
    packed = packed_stack(rng, "Q8_0", 3, 8, 64 * 4)
    g = rlx.Graph("dgmm")
    x, ids = g.input("x", (4, 256)), g.input("ids", (4,), "i32")
    g.set_outputs([g.dequant_grouped_matmul(x, SCHEMES["Q8_0"], g.constant(packed), ids)])
    cg = Session().compile(g, options=rlx.CompileOptions(native=native))
    xv = rng.standard_normal((4, 256)).astype(np.float32)
    iv = np.array([2, 0, 2, 2], np.int32)
    dec = decoded("Q8_0", packed)
    want = np.stack([dec[e] @ xv[i] for i, e in enumerate(iv)])
    np.testing.assert_allclose(cg.run({"x": xv, "ids": iv})[0], want, rtol=1e-5, atol=1e-5)
    assert "rows grouped by expert" in str(cg.report())
    with pytest.raises(InputError, match=r"expert_idx holds 3, outside \[0, 3\)"):
        cg.run({"x": xv, "ids": np.array([0, 3, 1, 1], np.int32)})


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K"])
def test_moe_block_with_a_shared_expert_matches_transformers_qwen2_moe(name):
    """``Qwen2MoeSparseMoeBlock`` (norm_topk_prob=False: ``renormalize=False``) with the
    dequantized experts loaded; its shared expert and sigmoid gate are ordinary f32 ops
    beside ``g.moe_block``."""
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    e, h, inter, shared, top_k = 4, 256, 256, 32, 2
    g, x, params, router, (wg, wu, wd) = _block(name, 5, h, inter, e, top_k, False, 11)
    rng = np.random.default_rng(12)
    sh = {n: (rng.standard_normal(s) * 0.05).astype(np.float32)
          for n, s in (("sg", (h, shared)), ("su", (h, shared)), ("sd", (shared, h)),
                       ("sgate", (h, 1)))}  # fmt: skip
    (moe,) = g.outputs
    xi = next(n.id for n in g.nodes if n.op.mnemonic == "input" and n.op.name == "x")
    p = {n: g.param(n, a.shape) for n, a in sh.items()}
    ffn = g.matmul(g.mul(g.silu(g.matmul(xi, p["sg"])), g.matmul(xi, p["su"])), p["sd"])
    g.set_outputs([g.add(moe, g.mul(g.sigmoid(g.matmul(xi, p["sgate"])), ffn))])
    cfg = Qwen2MoeConfig(hidden_size=h, moe_intermediate_size=inter, num_experts=e,
                         num_experts_per_tok=top_k, norm_topk_prob=False, hidden_act="silu",
                         shared_expert_intermediate_size=shared)  # fmt: skip
    block = Qwen2MoeSparseMoeBlock(cfg).eval()
    t = torch.from_numpy
    with torch.no_grad():
        block.gate.weight.copy_(t(router))
        block.experts.gate_up_proj.copy_(t(np.concatenate([wg, wu], axis=1)))
        block.experts.down_proj.copy_(t(wd))
        block.shared_expert.gate_proj.weight.copy_(t(sh["sg"].T.copy()))
        block.shared_expert.up_proj.weight.copy_(t(sh["su"].T.copy()))
        block.shared_expert.down_proj.weight.copy_(t(sh["sd"].T.copy()))
        block.shared_expert_gate.weight.copy_(t(sh["sgate"].T.copy()))
        want = block(t(x)[None])[0].numpy()
    got = Session().compile(g, params=params | sh).run({"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
