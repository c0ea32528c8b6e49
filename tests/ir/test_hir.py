"""HIR blocks lowered under both fusion policies, checked against NumPy and each other."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import erf

from rlx.dtype import DType
from rlx.errors import LowerError, ShapeError
from rlx.ir.hir import FusionPolicy, HirModule
from rlx.ops.control import Scan
from rlx.ops.core import Input, Param
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind
from rlx.ops.fused import FusedMatMulBiasAct, FusedResidualRmsNorm, FusedSwiGLU
from rlx.ops.linalg import MatMul
from rlx.ops.movement import Concat
from rlx.ops.nn import Attention, Conv, MaskKind, Rope
from rlx.ops.norm import RmsNorm
from rlx.ops.quant import DequantMatMul, GgufQ8K, Int4Block, Int8Block, Int8BlockAsym
from rlx.ops.recurrent import GatedDeltaNet, gated_delta_rule

FUSED = (
    FusedMatMulBiasAct,
    FusedSwiGLU,
    FusedResidualRmsNorm,
    Attention,
    Rope,
    RmsNorm,
    DequantMatMul,
    GatedDeltaNet,
    Conv,
)


# ---- NumPy twins of the blocks -----------------------------------------------------


def silu(x):
    return x / (1.0 + np.exp(-x))


def rms(x, gamma, beta=None, eps=1e-6):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma
    return y if beta is None else y + beta


def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_attention(q, k, v, h, d, hkv, allowed=None, add=None, scale=None):
    b, sq, _ = q.shape
    skv = k.shape[1]
    qh = q.reshape(b, sq, h, d).transpose(0, 2, 1, 3)
    kh = k.reshape(b, skv, hkv, d).transpose(0, 2, 1, 3)
    vh = v.reshape(b, skv, hkv, d).transpose(0, 2, 1, 3)
    out = np.zeros((b, h, sq, d))
    for hh in range(h):
        kv = hh // (h // hkv)
        s = qh[:, hh] @ kh[:, kv].transpose(0, 2, 1) * (scale or 1 / math.sqrt(d))
        if add is not None:
            s = s + np.broadcast_to(add, (b, h, sq, skv))[:, hh]
        if allowed is not None:
            s = np.where(allowed, s, -np.inf)
        out[:, hh] = softmax(s) @ vh[:, kv]
    return out.transpose(0, 2, 1, 3).reshape(b, sq, h * d)


def np_rope(x, cos, sin, d, r):
    b, s, hd = x.shape
    xh = x.reshape(b, s, hd // d, d).copy()
    half = r // 2
    a, c = xh[..., :half].copy(), xh[..., half:r].copy()
    cs, sn = cos[None, :, None, :], sin[None, :, None, :]
    xh[..., :half] = a * cs - c * sn
    xh[..., half:r] = c * cs + a * sn
    return xh.reshape(b, s, hd)


# ---- the block table ---------------------------------------------------------------


@dataclass
class Case:
    name: str
    build: Callable[[HirModule], object]
    expect: Callable[[dict], list[np.ndarray]]
    direct_ops: tuple[type, ...]  # must appear when lowered DIRECT
    fusable_keeps: tuple[type, ...] = ()  # fused ops FUSABLE keeps on purpose
    data: dict[str, Callable[[np.random.Generator, tuple], np.ndarray]] | None = None


def _linear(m):
    x = m.input("x", (2, 3, 8))
    w = m.param("w", (8, 6))
    b = m.param("b", (6,))
    return m.linear(x, w, b, UnaryKind.SILU, out_shape=(2, 3, 6))


def _linear_nobias(m):
    x = m.input("x", (4, 8))
    return m.linear(x, m.param("w", (8, 5)))


def _pair(m):
    x = m.input("x", (2, 3, 8))
    return m.shared_linear_pair(x, m.param("w1", (8, 4)), m.param("w2", (8, 6)))


def _swiglu(m):
    x = m.input("x", (2, 3, 8))
    up, gate, down = m.param("up", (8, 16)), m.param("gate", (8, 16)), m.param("down", (16, 8))
    return m.swiglu_ffn(x, up, gate, down, out_shape=(2, 3, 8))


def _res_rms(m):
    x, r = m.input("x", (2, 3, 8)), m.input("r", (2, 3, 8))
    return m.residual_rms_norm(x, r, m.param("gamma", (8,)), m.param("beta", (8,)), eps=1e-5)


def _rms(m):
    x = m.input("x", (2, 3, 8))
    return m.rms_norm(x, m.param("gamma", (8,)), eps=1e-5)


def _attn(mask_kind, hkv=2, custom=False):
    def build(m):
        q = m.input("q", (2, 4, 16))
        k = m.input("k", (2, 6, hkv * 4))
        v = m.input("v", (2, 6, hkv * 4))
        mask = m.input("mask", (1, 1, 4, 6)) if custom else None
        return m.attention(
            q, k, v, mask, num_heads=4, head_dim=4, mask_kind=mask_kind, num_kv_heads=hkv
        )

    def expect(f):
        allowed = mask_kind.allowed(4, 6) if mask_kind is not None else None
        return [np_attention(f["q"], f["k"], f["v"], 4, 4, hkv, allowed, f.get("mask"))]

    return build, expect


def _rope(n_rot):
    def build(m):
        x = m.input("x", (2, 3, 16))
        return m.rope(x, m.input("cos", (3, n_rot // 2)), m.input("sin", (3, n_rot // 2)), 8, n_rot)

    return build, lambda f: [np_rope(f["x"], f["cos"], f["sin"], 8, n_rot)]


def _dwconv(wdims):
    def build(m):
        x = m.input("x", (2, 5, 4))
        pad = m.input("pad", (2, 2, 4))
        return m.depthwise_conv1d_causal(x, m.param("w", wdims), pad, 3)

    def expect(f):
        p = np.concatenate([f["pad"], f["x"]], axis=1)
        w = f["w"].reshape(4, 3)
        return [sum(p[:, j : j + 5, :] * w[:, j] for j in range(3))]

    return build, expect


def _int8(scheme, asym):
    def build(m):
        x = m.input("x", (3, 64))
        w = m.param("wq", (6, 64), DType.I8)
        s = m.param("scale", (6, 64 // 32))
        z = m.param("zp", (6, 64 // 32), DType.I32)
        return m.dequant_matmul(x, w, s, z, scheme)

    def expect(f):
        q = f["wq"].astype(np.float64).reshape(6, 2, 32) - f["zp"][:, :, None]
        return [f["x"] @ (q * f["scale"][:, :, None]).reshape(6, 64).T]

    zp = (
        (lambda r, s: r.integers(-4, 5, s).astype(np.int32))
        if asym
        else (lambda r, s: np.zeros(s, np.int32))
    )
    return build, expect, {"zp": zp}


def _int4(m):
    x = m.input("x", (3, 64))
    w = m.param("wq", (6, 32), DType.U8)
    return m.dequant_matmul(
        x, w, m.param("scale", (6, 2)), m.param("zp", (6, 2), DType.I32), Int4Block(32)
    )


def _int4_expect(f):
    wq = f["wq"].astype(np.int64)
    q = np.stack([wq & 15, wq >> 4], axis=-1).reshape(6, 64).astype(np.float64)
    q = (q.reshape(6, 2, 32) - f["zp"][:, :, None]) * f["scale"][:, :, None]
    return [f["x"] @ q.reshape(6, 64).T]


def _q8k_bytes(r, shape):
    n, cols = shape
    blocks = np.zeros((n * cols // 292, 292), np.uint8)
    blocks[:, 0:4] = r.uniform(0.01, 0.1, (len(blocks), 1)).astype("<f4").view(np.uint8)
    blocks[:, 4:260] = r.integers(-128, 128, (len(blocks), 256)).astype(np.int8).view(np.uint8)
    return blocks.reshape(n, cols)


def _gguf(m):
    x = m.input("x", (2, 256))
    return m.dequant_matmul(x, m.param("packed", (4, 292), DType.U8), scheme=GgufQ8K())


def _gguf_expect(f):
    b = f["packed"]
    d = np.ascontiguousarray(b[:, 0:4]).view("<f4").astype(np.float64)
    w = d * b[:, 4:260].view(np.int8)
    return [f["x"] @ w.T]


def _gdn_inputs(m, t=5):
    shp = {
        "q": (2, t, 2, 3),
        "k": (2, t, 2, 3),
        "v": (2, t, 2, 4),
        "g": (2, t, 2),
        "beta": (2, t, 2),
    }
    return [m.input(n, s) for n, s in shp.items()]


def _gdn(m):
    return m.gated_delta_net(*_gdn_inputs(m), state_size=3, out_shape=(2, 5, 2, 4))


def _gdn_carry(m):
    ins = _gdn_inputs(m)
    return m.gated_delta_net_carry(*ins, m.input("state", (2, 2, 3, 4)), state_size=3)


def _gdn_data():
    return {
        "k": lambda r, s: (lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True))(
            r.standard_normal(s)
        ),
        "g": lambda r, s: -r.uniform(0, 1, s),
        "beta": lambda r, s: r.uniform(0, 1, s),
    }


def _gdn_expect(f, carry):
    o, st = gated_delta_rule(
        *(f[n].astype(np.float64) for n in ("q", "k", "v", "g", "beta")),
        state=f.get("state"),
    )
    return [o, st] if carry else [o]


def _mir_hatch(m):
    x = m.input("x", (3, 4))
    y = m.mir(Unary(UnaryKind.TANH), [x])
    return m.linear(y, m.param("w", (4, 2)))


_causal_b, _causal_e = _attn(MaskKind.causal())
_none_b, _none_e = _attn(MaskKind.none(), hkv=4)
_sw_b, _sw_e = _attn(MaskKind.sliding_window(2), hkv=1)
_custom_b, _custom_e = _attn(MaskKind.custom(), custom=True)
_rope_full_b, _rope_full_e = _rope(8)
_rope_part_b, _rope_part_e = _rope(4)
_dw_b, _dw_e = _dwconv((4, 1, 1, 3))
_dw2_b, _dw2_e = _dwconv((4, 3))
_i8_b, _i8_e, _i8_d = _int8(Int8Block(32), False)
_i8a_b, _i8a_e, _i8a_d = _int8(Int8BlockAsym(32), True)

CASES = [
    Case("linear", _linear, lambda f: [silu(f["x"] @ f["w"] + f["b"])], (FusedMatMulBiasAct,)),
    Case("linear_nobias", _linear_nobias, lambda f: [f["x"] @ f["w"]], (FusedMatMulBiasAct,)),
    Case(
        "shared_linear_pair",
        _pair,
        lambda f: [f["x"] @ f["w1"], f["x"] @ f["w2"]],
        (FusedMatMulBiasAct,),
    ),
    Case(
        "swiglu_ffn",
        _swiglu,
        lambda f: [(silu(f["x"] @ f["gate"]) * (f["x"] @ f["up"])) @ f["down"]],
        (FusedSwiGLU,),
    ),
    Case(
        "residual_rms_norm",
        _res_rms,
        lambda f: [rms(f["x"] + f["r"], f["gamma"], f["beta"], 1e-5)],
        (FusedResidualRmsNorm,),
    ),
    Case("rms_norm", _rms, lambda f: [rms(f["x"], f["gamma"], None, 1e-5)], (RmsNorm,)),
    Case("attention_causal_gqa", _causal_b, _causal_e, (Attention,)),
    Case("attention_none", _none_b, _none_e, (Attention,)),
    Case("attention_sliding_mqa", _sw_b, _sw_e, (Attention,)),
    Case("attention_custom", _custom_b, _custom_e, (Attention,)),
    Case("rope", _rope_full_b, _rope_full_e, (Rope,)),
    Case("rope_partial", _rope_part_b, _rope_part_e, (Rope,)),
    Case("depthwise_conv1d_causal", _dw_b, _dw_e, (Conv,)),
    Case("depthwise_conv1d_causal_ck", _dw2_b, _dw2_e, (Conv,)),
    Case("dequant_int8", _i8_b, _i8_e, (DequantMatMul,), data=_i8_d),
    Case("dequant_int8_asym", _i8a_b, _i8a_e, (DequantMatMul,), data=_i8a_d),
    Case(
        "dequant_int4",
        _int4,
        _int4_expect,
        (DequantMatMul,),
        data={"zp": lambda r, s: np.full(s, 8, np.int32)},
    ),
    Case(
        "dequant_gguf_q8k",
        _gguf,
        _gguf_expect,
        (DequantMatMul,),
        (DequantMatMul,),
        {"packed": _q8k_bytes},
    ),
    Case(
        "gated_delta_net", _gdn, lambda f: _gdn_expect(f, False), (GatedDeltaNet,), data=_gdn_data()
    ),
    Case(
        "gated_delta_net_carry",
        _gdn_carry,
        lambda f: _gdn_expect(f, True),
        (GatedDeltaNet,),
        data=_gdn_data(),
    ),
    Case(
        "mir_escape_hatch", _mir_hatch, lambda f: [np.tanh(f["x"]) @ f["w"]], (FusedMatMulBiasAct,)
    ),
]


def _module(case: Case) -> HirModule:
    m = HirModule(case.name)
    out = case.build(m)
    m.set_outputs(out)
    return m


def _feed(graph, case: Case, rng) -> tuple[dict, dict]:
    inputs, params = {}, {}
    special = case.data or {}
    for n in graph.nodes:
        if not isinstance(n.op, (Input, Param)):
            continue
        dims = n.shape.concrete()
        name = n.op.name
        if name in special:
            a = special[name](rng, dims)
        elif name == "scale":
            a = rng.uniform(0.01, 0.1, dims)
        elif n.shape.dtype is DType.I8:
            a = rng.integers(-128, 128, dims)
        elif n.shape.dtype is DType.U8:
            a = rng.integers(0, 256, dims)
        elif n.shape.dtype is DType.I32:
            a = rng.integers(-3, 4, dims)
        else:
            a = rng.standard_normal(dims)
        a = np.asarray(a).astype(n.shape.dtype.np)
        (inputs if isinstance(n.op, Input) else params)[name] = a
    return inputs, params


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_block_lowers_to_same_numbers_under_both_policies(case: Case):
    m = _module(case)
    direct = m.lower_to_mir(FusionPolicy.DIRECT).verify()
    fusable = m.lower_to_mir(FusionPolicy.FUSABLE).verify()
    rng = np.random.default_rng(0)
    inputs, params = _feed(direct, case, rng)
    want = case.expect({**inputs, **params})
    got_d = direct.evaluate(inputs, params)
    got_f = fusable.evaluate(inputs, params)
    assert len(got_d) == len(got_f) == len(want)
    for d, f, w in zip(got_d, got_f, want, strict=True):
        assert d.shape == f.shape == w.shape
        np.testing.assert_allclose(d, w, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(f, w, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(d, f, rtol=2e-4, atol=2e-4)
    for op in case.direct_ops:
        assert direct.find(op), f"DIRECT graph of {case.name} lacks {op.__name__}"
    present = [type(n.op).__name__ for n in fusable.nodes if isinstance(n.op, FUSED)]
    assert all(
        isinstance(n.op, case.fusable_keeps) for n in fusable.nodes if isinstance(n.op, FUSED)
    ), present
    # weights keep their param names
    assert sorted(direct.param_names) == sorted(fusable.param_names) == sorted(params)


def test_gated_delta_net_fusable_is_a_scan():
    m = _module(next(c for c in CASES if c.name == "gated_delta_net_carry"))
    g = m.lower_to_mir(FusionPolicy.FUSABLE)
    assert len(g.find(Scan)) == 2 and not g.find(GatedDeltaNet)


def test_linear_fused_is_fused_under_both_policies():
    m = HirModule("lf")
    x = m.input("x", (2, 4))
    y = m.linear_fused(x, m.param("w", (4, 3)), m.param("b", (3,)), UnaryKind.RELU)
    m.set_outputs(y)
    rng = np.random.default_rng(1)
    f = {"x": rng.standard_normal((2, 4)).astype(np.float32)}
    p = {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
    }
    want = np.maximum(f["x"] @ p["w"] + p["b"], 0)
    for policy in FusionPolicy:
        g = m.lower_to_mir(policy)
        assert g.find(FusedMatMulBiasAct) and not g.find(MatMul)
        np.testing.assert_allclose(g.evaluate(f, p)[0], want, rtol=1e-5, atol=1e-6)


def test_fusable_linear_is_a_primitive_chain():
    m = _module(CASES[0])
    g = m.lower_to_mir(FusionPolicy.FUSABLE)
    assert [n.op.mnemonic for n in g.nodes[3:]] == ["matmul", "binary", "unary"]


def test_named_scopes_prefix_params_and_survive_lowering():
    m = HirModule("model")
    x = m.input("x", (2, 8))

    def layer(h: HirModule) -> int:
        def attn(a: HirModule) -> int:
            return a.linear(x, a.param("wq", (8, 8)))

        y = h.named("attn", attn)
        return h.rms_norm(y, h.param("norm", (8,)))

    out = m.named("layer0", layer)
    m.set_outputs(out)
    assert m.node(out).name == "layer0"
    assert m.node(out - 2).name == "layer0.attn"
    assert "# layer0.attn" in m.inspect()
    for policy in FusionPolicy:
        g = m.lower_to_mir(policy)
        assert sorted(g.param_names) == ["layer0.attn.wq", "layer0.norm"]
        assert g.input_names == ["x"]
    with pytest.raises(ShapeError, match="already used"):
        m.named("layer0", lambda h: h.param("norm", (8,)))


def test_shape_errors_name_block_tensor_and_user_line():
    m = HirModule("bad")
    x = m.input("x", (2, 8))
    w = m.param("w", (6, 4))
    with pytest.raises(ShapeError) as ei:
        m.named("proj", lambda h: h.linear(x, w))
    msg = str(ei.value)
    assert "linear block %2 (proj)" in msg and "8 features" in msg and "test_hir.py" in msg
    w2 = m.param("w2", (8, 4))
    with pytest.raises(ShapeError, match=r"given out_shape f32\[2,5\].*f32\[2,4\]"):
        m.linear(x, w2, out_shape=(2, 5))
    with pytest.raises(ShapeError, match="not a node"):
        m.linear(x, 99)
    with pytest.raises(ShapeError, match=r"q must be \[B, Sq, H\*D\], got f32\[2,8\]"):
        m.attention(x, x, x, num_heads=1, head_dim=8)
    x3 = m.input("x3", (2, 3, 8))
    with pytest.raises(ShapeError, match="needs a mask input"):
        m.attention(x3, x3, x3, num_heads=1, head_dim=8, mask_kind=MaskKind.custom())
    with pytest.raises(ShapeError, match="needs scale and zp") as ei:
        m.dequant_matmul(x, w2, scheme=Int8Block(32))
    assert "test_hir.py" in str(ei.value)
    assert len(m) == 4  # failed builders leave no node behind


@pytest.mark.parametrize("mask", [MaskKind.causal(), MaskKind.sliding_window(2)])
def test_symbolic_seq_attention_masks_lower_under_both_policies(mask: MaskKind):
    """FUSABLE builds a causal / windowed mask for symbolic lengths from position counters
    (the fused op aligns it to the end); both policies give the same numbers."""
    m = HirModule("sym")
    q = m.input("q", (1, "sq", 8))
    kv = m.input("kv", (1, "skv", 4))
    y = m.attention(q, kv, kv, num_heads=2, head_dim=4, num_kv_heads=1, mask_kind=mask)
    m.set_outputs(y)
    direct = m.lower_to_mir(FusionPolicy.DIRECT).verify()
    fusable = m.lower_to_mir(FusionPolicy.FUSABLE).verify()
    assert not fusable.find(Attention)
    rng = np.random.default_rng(0)
    for sq, skv in ((3, 5), (4, 4), (1, 6)):
        f = {
            "q": rng.standard_normal((1, sq, 8)).astype(np.float32),
            "kv": rng.standard_normal((1, skv, 4)).astype(np.float32),
        }
        np.testing.assert_allclose(
            fusable.evaluate(f)[0], direct.evaluate(f)[0], rtol=1e-5, atol=1e-5
        )


def test_lower_error_names_hir_node_and_line(monkeypatch: pytest.MonkeyPatch):
    from rlx.ir import hir_lower
    from rlx.ir.hir_blocks import RmsNormBlock

    m = HirModule("m")
    x = m.input("x", (2, 8))
    m.set_outputs(m.rms_norm(x, m.param("g", (8,)), eps=1e-5))

    def refuse(ctx, node, ins):
        raise ShapeError("rms_norm: no way")

    monkeypatch.setitem(hir_lower._LOWERINGS, RmsNormBlock, refuse)
    with pytest.raises(LowerError) as ei:
        m.lower_to_mir(FusionPolicy.FUSABLE)
    msg = str(ei.value)
    assert "cannot lower rms_norm block %2 under FUSABLE: rms_norm: no way" in msg
    assert "test_hir.py" in msg and ei.value.node == 2
    with pytest.raises(LowerError, match="no outputs"):
        HirModule("empty").lower_to_mir()
    with pytest.raises(LowerError, match="fusion policy must be a FusionPolicy"):
        m.lower_to_mir("direct")


def test_depthwise_conv_needs_static_channels():
    m = HirModule("m")
    with pytest.raises(ShapeError, match="channels C of input f32\\[1,4,c\\] must be static"):
        m.depthwise_conv1d_causal(
            m.input("x", (1, 4, "c")), m.param("w", ("c", 3)), m.input("p", (1, 2, "c")), 3
        )


def test_lowered_nodes_carry_the_hir_source_line():
    m = _module(CASES[0])
    g = m.lower_to_mir(FusionPolicy.FUSABLE)
    hir_line = m.node(m.outputs[0]).loc.line
    assert {n.loc.line for n in g.nodes[3:]} == {hir_line}


def test_inspect_lists_blocks():
    m = _module(CASES[0])
    text = m.inspect()
    assert "hir linear(x: f32[2,3,8]) policy=direct {" in text
    assert "%3:f32[2,3,6] = linear[activation=silu, has_bias=True] %0 %1 %2" in text
    assert "return %3" in text
    assert "FUSABLE" in repr(m.with_fusion_policy(FusionPolicy.FUSABLE))


@given(
    lead=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    k=st.integers(1, 6),
    n=st.integers(1, 6),
    act=st.sampled_from([None, UnaryKind.RELU, UnaryKind.GELU, UnaryKind.TANH]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_linear_property_both_policies(lead, k, n, act, bias, seed):
    m = HirModule("prop")
    x = m.input("x", (*lead, k))
    w = m.param("w", (k, n))
    b = m.param("b", (n,)) if bias else None
    m.set_outputs(m.linear(x, w, b, act))
    rng = np.random.default_rng(seed)
    f = {"x": rng.standard_normal((*lead, k)).astype(np.float32)}
    p = {"w": rng.standard_normal((k, n)).astype(np.float32)}
    if bias:
        p["b"] = rng.standard_normal(n).astype(np.float32)
    y = f["x"].astype(np.float64) @ p["w"] + (p["b"] if bias else 0)
    fns = {None: lambda v: v, UnaryKind.RELU: lambda v: np.maximum(v, 0), UnaryKind.TANH: np.tanh}
    fns[UnaryKind.GELU] = lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2)))
    want = fns[act](y)
    for policy in FusionPolicy:
        (got,) = m.lower_to_mir(policy).evaluate(f, p)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _decoder_layer(m: HirModule) -> int:
    """A pre-norm GQA decoder layer made of blocks, every weight under layer0.*."""
    x = m.input("x", (1, 5, 16))
    cos, sin = m.input("cos", (5, 2)), m.input("sin", (5, 2))

    def layer(h: HirModule) -> int:
        def attn(a: HirModule) -> int:
            n = a.rms_norm(x, a.param("norm", (16,)))
            q = a.rope(a.linear(n, a.param("wq", (16, 16))), cos, sin, 4, 4)
            k, v = a.shared_linear_pair(n, a.param("wk", (16, 8)), a.param("wv", (16, 8)))
            o = a.attention(
                q,
                a.rope(k, cos, sin, 4, 4),
                v,
                num_heads=4,
                head_dim=4,
                num_kv_heads=2,
                mask_kind=MaskKind.causal(),
            )
            return a.linear(o, a.param("wo", (16, 16)))

        y = h.named("attn", attn)
        n2 = h.residual_rms_norm(y, x, h.param("norm2", (16,)))
        ffn = h.named(
            "mlp",
            lambda f: f.swiglu_ffn(
                n2, f.param("up", (16, 32)), f.param("gate", (16, 32)), f.param("down", (32, 16))
            ),
        )
        return h.mir(Binary(BinaryKind.ADD), [ffn, n2])

    return m.named("layer0", layer)


def test_decoder_layer_agrees_across_policies():
    m = HirModule("decoder")
    m.set_outputs(_decoder_layer(m))
    direct = m.lower_to_mir(FusionPolicy.DIRECT).verify()
    fusable = m.lower_to_mir(FusionPolicy.FUSABLE).verify()
    assert all(name.startswith("layer0.") for name in direct.param_names)
    assert sorted(direct.param_names) == sorted(fusable.param_names)
    assert not [n for n in fusable.nodes if isinstance(n.op, FUSED)]
    rng = np.random.default_rng(3)
    inputs, params = _feed(direct, CASES[0], rng)
    ang = rng.uniform(0, 3, (5, 2)).astype(np.float32)
    inputs["cos"], inputs["sin"] = np.cos(ang), np.sin(ang)
    params = {k: (v * 0.3).astype(np.float32) for k, v in params.items()}
    (d,) = direct.evaluate(inputs, params)
    (f,) = fusable.evaluate(inputs, params)
    assert np.isfinite(d).all()
    np.testing.assert_allclose(d, f, rtol=1e-4, atol=1e-4)
    # and against NumPy, block by block
    P, x = params, inputs["x"].astype(np.float64)
    n = rms(x, P["layer0.attn.norm"])
    q = np_rope(n @ P["layer0.attn.wq"], inputs["cos"], inputs["sin"], 4, 4)
    k = np_rope(n @ P["layer0.attn.wk"], inputs["cos"], inputs["sin"], 4, 4)
    o = np_attention(q, k, n @ P["layer0.attn.wv"], 4, 4, 2, MaskKind.causal().allowed(5, 5))
    n2 = rms(o @ P["layer0.attn.wo"] + x, P["layer0.norm2"])
    h = silu(n2 @ P["layer0.mlp.gate"]) * (n2 @ P["layer0.mlp.up"])
    np.testing.assert_allclose(d, h @ P["layer0.mlp.down"] + n2, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("policy", list(FusionPolicy))
@pytest.mark.parametrize("ksz", [1, 2, 4])
def test_depthwise_conv1d_causal_with_symbolic_seq(policy: FusionPolicy, ksz: int):
    """concat(left_pad, x) has length seq + K - 1, which no symbolic dim expresses: the
    lowering splits the sum into a left-padded conv of x plus the pad's share gathered onto
    the first K-1 rows, exact for every seq (also seq < K - 1)."""
    m = HirModule("dw_sym")
    x = m.input("x", ("batch", "seq", 3))
    pad = m.input("pad", ("batch", ksz - 1, 3))
    m.set_outputs(m.depthwise_conv1d_causal(x, m.param("w", (3, 1, ksz)), pad, ksz))
    g = m.lower_to_mir(policy).verify()
    assert not g.find(Concat)
    assert [str(d) for d in g.shape(g.outputs[0]).dims] == ["batch", "seq", "3"]
    rng = np.random.default_rng(ksz)
    w = rng.standard_normal((3, 1, ksz)).astype(np.float32)
    for seq in (1, 2, 3, 6):
        xv = rng.standard_normal((2, seq, 3)).astype(np.float32)
        pv = rng.standard_normal((2, ksz - 1, 3)).astype(np.float32)
        p = np.concatenate([pv, xv], axis=1)
        want = sum(p[:, j : j + seq, :] * w[:, 0, j] for j in range(ksz))
        (got,) = g.evaluate({"x": xv, "pad": pv}, {"w": w})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
