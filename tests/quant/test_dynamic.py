"""rlx.quantize(activations="dynamic"): every eligible matmul becomes one dynamic_qmatmul
(per-row activation scales at run time, per-channel symmetric weights), no calibration
runs, and the result equals a NumPy re-implementation of the method (ONNX
DynamicQuantizeLinear per row for u8, max-abs / 127 per row for s8)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import rlx
import rlx.quant.calibrate as calibrate_mod
from rlx.errors import QuantizationError
from rlx.ops.linalg import MatMul
from rlx.ops.qmatmul import DynamicQMatMul
from rlx.ops.quant import QMatMul, Quantize
from rlx.quant.api import quantize as _quantize

# 8-bit weights ([-127, 127]) on every target: these tests check that method against NumPy
# (the 7-bit default of the AVX2 target has its own tests, test_reduce_range.py)
quantize = functools.partial(_quantize, reduce_range=False)

RNG = np.random.default_rng(3)
DIMS = [24, 40, 16]
P = {
    "w0": (RNG.standard_normal((24, 40)) / 5).astype(np.float32),
    "b0": (0.1 * RNG.standard_normal(40)).astype(np.float32),
    "w1": (RNG.standard_normal((40, 16)) / 6).astype(np.float32),
    "w_side": (RNG.standard_normal((24, 16)) / 5).astype(np.float32),
}


def model() -> rlx.Graph:
    """gelu(x @ w0 + b0) @ w1 + x @ w_side, plus one activation x activation matmul
    (not a layer: stays float)."""
    g = rlx.Graph("dyn")
    x = g.input("x", (2, 6, 24))
    h = g.gelu(g.linear(x, g.param("w0", (24, 40)), g.param("b0", (40,))))
    y = g.add(g.matmul(h, g.param("w1", (40, 16))), g.matmul(x, g.param("w_side", (24, 16))))
    gram = g.matmul(y, g.transpose(y, (0, 2, 1)))
    g.set_outputs([y, gram])
    return g


def batch(seed: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((2, 6, 24)).astype(np.float32)
    x[0, 1] *= 30.0  # one loud token: per-row scales keep the others' precision
    return {"x": x}


def np_rows(x: np.ndarray, mode: str) -> np.ndarray:
    """Dequantized per-row quantization of x [M, K], written from the published rules."""
    x = x.astype(np.float32)
    if mode == "s8":
        s = np.abs(x).max(1, keepdims=True) / np.float32(127)
        s[s == 0] = 1
        return np.clip(np.rint(x / s), -128, 127) * s
    lo = np.minimum(x.min(1, keepdims=True), 0)
    hi = np.maximum(x.max(1, keepdims=True), 0)
    s = (hi - lo) / np.float32(255)
    s[s == 0] = 1
    z = np.clip(np.rint(-lo / s), 0, 255)
    return (np.clip(np.rint(x / s) + z, 0, 255) - z) * s


def np_weight(w: np.ndarray) -> np.ndarray:
    s = np.abs(w).max(0, keepdims=True) / np.float32(127)
    return np.clip(np.rint(w / s), -127, 127) * s


def np_model(x: np.ndarray, mode: str) -> np.ndarray:
    from scipy.special import erf

    def lin(a, w):
        a2 = a.reshape(-1, a.shape[-1])
        return (np_rows(a2, mode).astype(np.float64) @ np_weight(w)).reshape(*a.shape[:-1], -1)

    z = lin(x, P["w0"]) + P["b0"]
    h = 0.5 * z * (1 + erf(z / np.sqrt(2)))
    return lin(h, P["w1"]) + lin(x, P["w_side"])


@pytest.fixture
def no_calibration(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("dynamic quantization must not calibrate")

    monkeypatch.setattr(calibrate_mod, "calibrate", refuse)


@pytest.mark.parametrize("mode", ["u8", "s8"])
def test_every_layer_becomes_one_dynamic_op(mode, no_calibration):
    r = quantize(model(), None, params=P, activations="dynamic", dynamic_mode=mode)
    g = r.graph
    ops = g.find(DynamicQMatMul)
    assert len(ops) == 3 and {op.op.mode.value for op in ops} == {mode}
    assert not g.find(Quantize) and not g.find(QMatMul)
    assert len(g.find(MatMul)) == 1  # the activation x activation gram matrix stays float
    assert sorted(g.param_names) == ["b0"]  # f32 weights live on as i8 constants only
    rep = r.report
    assert rep.activations == "dynamic" and rep.calibration_batches == 0
    assert set(rep.methods.values()) == {f"dynamic {mode} per-row activations"}
    by_shape = {w.shape: w for k, w in P.items() if k.startswith("w")}  # distinct shapes
    for node in ops:  # per-channel symmetric weights: scale max |W[:, n]| / 127
        wq = g.nodes[node.inputs[1]].op.value.array()
        w = by_shape[wq.shape]
        np.testing.assert_allclose(node.op.w_scales, np.abs(w).max(0) / 127, rtol=1e-6)
        np.testing.assert_array_equal(wq, np.clip(np.rint(w / (np.abs(w).max(0) / 127)), -127, 127))


@pytest.mark.parametrize("mode", ["u8", "s8"])
def test_matches_numpy_reimplementation(mode, no_calibration):
    r = quantize(model(), None, params=P, activations="dynamic", dynamic_mode=mode)
    for seed in (1, 2):
        b = batch(seed)
        got = r.compiled.run(b)[0]
        want = np_model(b["x"], mode)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_dynamic_beats_static_on_outlier_tokens():
    cal = [batch(s) for s in range(3)]
    dyn = quantize(model(), cal, params=P, activations="dynamic", rank_layers=False)
    sta = quantize(model(), cal, params=P, rank_layers=False)
    assert dyn.report.eval_batches == 3 and dyn.report.calibration_batches == 0
    assert dyn.report.worst.relative < 0.5 * sta.report.worst.relative


def test_without_data_the_error_is_unmeasured_and_budget_refused():
    r = quantize(model(), None, params=P, activations="dynamic")
    assert r.report.eval_batches == 0 and not r.report.worst.measured
    assert "unmeasured" in str(r.report)
    with pytest.raises(QuantizationError, match="accuracy_budget needs evaluation batches"):
        quantize(model(), None, params=P, activations="dynamic", accuracy_budget=0.1)
    with pytest.raises(QuantizationError, match="static activations needs calibration_data"):
        quantize(model(), None, params=P)
    with pytest.raises(QuantizationError, match="activations must be one of"):
        quantize(model(), None, params=P, activations="per_token")
    with pytest.raises(QuantizationError, match="dynamic_mode must be 's8' or 'u8'"):
        quantize(model(), None, params=P, activations="dynamic", dynamic_mode="u4")


def test_transposed_weights_and_dot_general_become_layers(no_calibration):
    """matmul(x, transpose(W)) (ONNX Gemm transB) and dot_general with a weight are
    quantized as linears; the batched activation x activation dot_general stays float."""
    from rlx.ops.linalg import DotGeneral
    from rlx.ops.movement import Transpose

    rng = np.random.default_rng(4)
    p = {
        "wt": (rng.standard_normal((16, 24)) / 5).astype(np.float32),  # [N, K]
        "w2": (rng.standard_normal((24, 8)) / 5).astype(np.float32),  # [K, N]
        "w3": (rng.standard_normal((8, 24)) / 5).astype(np.float32),  # [N, K]
    }
    g = rlx.Graph("gemm")
    x = g.input("x", (6, 24))
    y1 = g.matmul(x, g.transpose(g.param("wt", (16, 24))))
    y2 = g.dot_general(x, g.param("w2", (24, 8)), ((1,), (0,)))
    y3 = g.dot_general(x, g.param("w3", (8, 24)), ((1,), (1,)))
    xb = g.reshape(x, (2, 3, 24))
    gram = g.dot_general(xb, xb, ((2,), (2,)), ((0,), (0,)))
    g.set_outputs([y1, y2, y3, gram])
    r = quantize(g, None, params=p, activations="dynamic", dynamic_mode="s8")
    assert len(r.graph.find(DynamicQMatMul)) == 3 and not r.graph.find(Transpose)
    assert len(r.graph.find(DotGeneral)) == 1  # the gram matrix
    assert sorted(r.report.quantized) == ["w2", "w3.T", "wt.T"]
    (why,) = r.report.float_compute.values()  # the gram matrix, said in the report
    assert "both operands are activations" in why and "float compute:" in str(r.report)
    from rlx.ops.qmatmul import DynamicQBatchMatMul

    rp = quantize(g, None, params=p, activations="dynamic", activation_products=True)
    (gram_q,) = rp.graph.find(DynamicQBatchMatMul)  # x x^T: the transposed product
    assert gram_q.op.transpose_b and not rp.graph.find(DotGeneral)
    xv = rng.standard_normal((6, 24)).astype(np.float32)
    xv3 = xv.reshape(2, 3, 24)
    rq = np_rows(xv3.reshape(-1, 24), "s8").reshape(2, 3, 24).astype(np.float64)
    want = rq @ rq.swapaxes(-1, -2)  # rows of x^T's columns are x's rows: same quantization
    np.testing.assert_allclose(rp.compiled.run({"x": xv})[3], want, rtol=1e-4, atol=1e-3)
    xv = rng.standard_normal((6, 24)).astype(np.float32)
    outs = r.compiled.run({"x": xv})
    xq = np_rows(xv, "s8").astype(np.float64)
    for got, w in zip(outs[:3], (p["wt"].T, p["w2"], p["w3"].T), strict=True):
        want = xq @ np_weight(np.ascontiguousarray(w))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def np_softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention_model() -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(6)
    p = {f"w{r}": (rng.standard_normal((16, 16)) / 4).astype(np.float32) for r in "qkv"}
    g = rlx.Graph("attn")
    x = g.input("x", (2, 5, 16))
    m = g.input("mask", (2, 1, 1, 5))
    q, k, v = (g.matmul(x, g.param(f"w{r}", (16, 16))) for r in "qkv")
    g.set_outputs([g.attention(q, k, v, 4, 4, mask_input=m)])
    return g, p


def attention_inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.zeros((2, 1, 1, 5), np.float32)
    mask[1, ..., 3:] = -1e9  # the second sentence has two padding tokens
    return {"x": rng.standard_normal((2, 5, 16)).astype(np.float32), "mask": mask}


def np_attention(x: np.ndarray, mask: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    """u8 per-row linears, then s8 rows x s8 columns for q k^T (scale 1/2 folded into k's
    scales) and u8 probability rows x s8 columns of v, written from the method."""

    def lin(a, w):
        return (np_rows(a.reshape(-1, 16), "u8").astype(np.float64) @ np_weight(w)).reshape(
            2, 5, 16
        )

    def heads(t):
        return t.astype(np.float32).reshape(2, 5, 4, 4).transpose(0, 2, 1, 3)

    def rows(t, mode):  # per row of the last axis, any leading dims
        return np_rows(t.reshape(-1, t.shape[-1]), mode).reshape(t.shape)

    q, k, v = (heads(lin(x, p[f"w{r}"])) for r in "qkv")
    kq = rows(k, "s8") * np.float32(0.5)
    s = rows(q, "s8").astype(np.float64) @ kq.swapaxes(-1, -2) + mask
    probs = np_softmax(s).astype(np.float32)
    vq = rows(v.swapaxes(-1, -2), "s8").swapaxes(-1, -2)
    o = rows(probs, "u8").astype(np.float64) @ vq
    return o.transpose(0, 2, 1, 3).reshape(2, 5, 16)


def test_attention_products_become_integer():
    from rlx.ops.nn import Attention
    from rlx.ops.qmatmul import DynamicQBatchMatMul

    g, p = attention_model()
    plain = quantize(g, None, params=p, activations="dynamic")
    assert len(plain.graph.find(Attention)) == 1 and len(plain.report.float_compute) == 1
    r = quantize(g, None, params=p, activations="dynamic", activation_products=True)
    assert not r.graph.find(Attention) and len(r.graph.find(DynamicQBatchMatMul)) == 2
    assert len(r.graph.find(DynamicQMatMul)) == 3 and not r.report.float_compute
    ((label, how),) = r.report.products.items()
    assert "attention" in label and "q k^T" in how and "integer product:" in str(r.report)
    for seed in (1, 2):
        b = attention_inputs(seed)
        want = np_attention(b["x"], b["mask"], p)
        got = r.compiled.run(b)[0]
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


def test_budget_turns_the_products_back_to_float_first():
    g, p = attention_model()
    ev = [attention_inputs(s) for s in (3, 4)]
    kw = dict(params=p, eval_data=ev, activations="dynamic", rank_layers=False)
    without = quantize(g, ev, **kw).report.worst.relative
    with_products = quantize(g, ev, activation_products=True, **kw).report.worst.relative
    assert with_products > without
    budget = (with_products + without) / 2
    r = quantize(g, ev, activation_products=True, accuracy_budget=budget, **kw)
    rep = r.report
    assert rep.budget_met and not rep.products and not rep.kept_float
    (why,) = rep.float_compute.values()
    assert "kept in float to meet the accuracy budget" in why
