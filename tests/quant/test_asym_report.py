"""Static activations: asymmetric u8 with a zero point chosen per tensor when it lowers
the error (the oracle: NumPy min / max of what calibration saw); the accuracy report's
content; ``accuracy_budget`` picking the cheapest static / dynamic / float mix; conv2d
lowered to qconv2d (checked against a NumPy convolution of the dequantized operands)."""

from __future__ import annotations

import functools

import numpy as np

import rlx
from rlx.dtype import DType
from rlx.ops.linalg import MatMul
from rlx.ops.nn import Conv
from rlx.ops.qconv import QConv2d
from rlx.ops.qmatmul import DynamicQMatMul
from rlx.ops.quant import QMatMul
from rlx.quant.api import quantize as _quantize

# 8-bit weights ([-127, 127]) on every target: these tests check that method against NumPy
# (the 7-bit default of the AVX2 target has its own tests, test_reduce_range.py)
quantize = functools.partial(_quantize, reduce_range=False)

RNG = np.random.default_rng(8)
P = {
    "w_in": (RNG.standard_normal((16, 32)) / 4).astype(np.float32),
    "w_pos": (RNG.standard_normal((32, 8)) / 6).astype(np.float32),
    "w_sym": (RNG.standard_normal((16, 8)) / 4).astype(np.float32),
}


def model() -> rlx.Graph:
    """relu(x @ w_in) @ w_pos (a one-sided input) + x @ w_sym (a symmetric input)."""
    g = rlx.Graph("asym")
    x = g.input("x", (12, 16))
    h = g.relu(g.matmul(x, g.param("w_in", (16, 32))))
    g.set_outputs(
        [g.add(g.matmul(h, g.param("w_pos", (32, 8))), g.matmul(x, g.param("w_sym", (16, 8))))]
    )
    return g


def data(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((12, 16)).astype(np.float32)} for _ in range(n)]


def test_u8_with_zero_point_for_one_sided_inputs():
    cal = data(3, seed=1)
    r = quantize(model(), cal, params=P, rank_layers=False)
    x = np.concatenate([b["x"] for b in cal])
    h = np.maximum(x @ P["w_in"], 0)
    a_pos, _ = r.record["w_pos"]
    a_sym, _ = r.record["w_sym"]
    # relu output: range [0, max]: u8, zero point 0, scale max / 255
    assert a_pos.dtype is DType.U8 and a_pos.zero_points == (0,)
    np.testing.assert_allclose(a_pos.scales[0], h.max() / 255, rtol=1e-5)
    # x ~ N(0, 1): symmetric, s8 (u8's step is not 10% smaller)
    assert a_sym.dtype is DType.I8 and a_sym.zero_points == (0,)
    np.testing.assert_allclose(a_sym.scales[0], np.abs(x).max() / 127, rtol=1e-5)
    assert "u8 asymmetric (zero point 0)" in r.report.methods["w_pos"]
    assert "s8 symmetric" in r.report.methods["w_sym"]


def test_shifted_input_gets_a_nonzero_zero_point_and_a_lower_error():
    cal = [{"x": b["x"] + 1.5} for b in data(3, seed=2)]  # mostly positive
    # measured on the calibration data: inputs beyond the calibrated range would saturate
    # u8's tighter range first and blur what the step size does
    auto = quantize(model(), cal, params=P, eval_data=cal, rank_layers=False)
    sym = quantize(model(), cal, params=P, eval_data=cal, rank_layers=False, asymmetric=False)
    a, _ = auto.record["w_sym"]
    x = np.concatenate([b["x"] for b in cal])
    lo, hi = min(x.min(), 0.0), max(x.max(), 0.0)
    assert a.dtype is DType.U8
    np.testing.assert_allclose(a.scales[0], (hi - lo) / 255, rtol=1e-5)
    assert a.zero_points[0] == int(np.rint(-lo / ((hi - lo) / 255))) > 0
    assert auto.report.worst.relative < sym.report.worst.relative
    forced = quantize(model(), data(2, 1), params=P, rank_layers=False, asymmetric=True)
    assert all(e[0].dtype is DType.U8 for e in forced.record.values())
    # the integer op reads u8 with the zero point: exact against NumPy fake quantization
    qm = [n.op for n in auto.graph.find(QMatMul) if n.op.x_zero_point]
    assert len(qm) == 2 and {op.x_zero_point for op in qm} == {a.zero_points[0]}  # w_in, w_sym
    xb = cal[0]["x"]
    s, z = np.float32(a.scales[0]), a.zero_points[0]
    xd = (np.clip(np.rint(xb / s) + z, 0, 255) - z) * s
    ws = np.abs(P["w_sym"]).max(0) / np.float32(127)
    wd = np.clip(np.rint(P["w_sym"] / ws), -127, 127) * ws
    sym_path = xd.astype(np.float64) @ wd
    one = quantize(model(), cal, params=P, exclude=["w_in", "w_pos"], rank_layers=False)
    np.testing.assert_allclose(
        one.compiled.run(cal[0])[0] - np.maximum(xb @ P["w_in"], 0) @ P["w_pos"],
        sym_path,
        rtol=1e-4,
        atol=1e-4 * np.abs(sym_path).max(),
    )


def test_report_says_method_per_layer_and_why_float():
    r = quantize(model(), data(3, 1), params=P, exclude=["w_sym"])
    rep = r.report
    assert rep.quantized == ["w_in", "w_pos"] and rep.kept_float == {
        "w_sym": "excluded by the caller"
    }
    assert set(rep.methods) == {"w_in", "w_pos"}
    text = str(rep)
    assert "per-layer method:" in text and "static minmax" in text
    assert "kept float: w_sym" in text and "excluded by the caller" in text
    assert "per-layer error" in text and len(rep.layers) == 2
    assert rep.method_counts() == {"static s8": 1, "static u8": 1}
    dyn = quantize(model(), data(2, 1), params=P, activations="dynamic", rank_layers=False)
    assert "rlx.quantize (dynamic)" in str(dyn.report)
    assert dyn.report.method_counts() == {"dynamic u8": 3}


def outlier_data(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    out = []
    for b in data(n, seed):
        b["x"][0] *= 60.0  # one loud row per batch: a per-tensor scale crushes the others
        out.append(b)
    return out


def test_budget_prefers_dynamic_over_float():
    cal, ev = outlier_data(3, 1), outlier_data(2, 5)
    static = quantize(model(), cal, params=P, eval_data=ev, rank_layers=False)
    dynamic = quantize(
        model(), cal, params=P, eval_data=ev, activations="dynamic", rank_layers=False
    )
    s_err, d_err = static.report.worst.relative, dynamic.report.worst.relative
    assert d_err < 0.5 * s_err
    budget = (s_err + d_err) / 2
    r = quantize(model(), cal, params=P, eval_data=ev, accuracy_budget=budget)
    rep = r.report
    assert rep.budget_met and rep.worst.relative <= budget
    assert not rep.kept_float  # met without float layers: some moved to dynamic
    modes = {n: t.split()[0] for n, t in rep.methods.items()}
    assert "dynamic" in modes.values() and len(modes) == 3
    n_int = len(r.graph.find(QMatMul)) + len(r.graph.find(DynamicQMatMul))
    assert n_int == 3 and not r.graph.find(MatMul)
    # a budget nothing integer can meet keeps the worst layers in float, says why
    tiny = quantize(model(), cal, params=P, eval_data=ev, accuracy_budget=1e-7)
    assert tiny.report.kept_float and all(
        "accuracy budget" in why for why in tiny.report.kept_float.values()
    )


def conv_model() -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(2)
    p = {
        "k": (rng.standard_normal((6, 3, 3, 3)) / 4).astype(np.float32),
        "kb": (0.1 * rng.standard_normal(6)).astype(np.float32),
    }
    g = rlx.Graph("conv")
    x = g.input("img", (2, 3, 9, 9))
    g.set_outputs([g.conv(x, g.param("k", (6, 3, 3, 3)), g.param("kb", (6,)), stride=2, padding=1)])
    return g, p


def np_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))).astype(np.float64)
    n, _, hh, ww = xp.shape
    oh, ow = (hh - 3) // 2 + 1, (ww - 3) // 2 + 1
    out = np.zeros((n, w.shape[0], oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out + b[None, :, None, None]


def test_conv2d_lowers_to_qconv2d():
    g, p = conv_model()
    cal = [
        {"img": np.random.default_rng(s).standard_normal((2, 3, 9, 9)).astype(np.float32)}
        for s in range(3)
    ]
    r = quantize(g, cal, params=p, rank_layers=False)
    assert len(r.graph.find(QConv2d)) == 1 and not r.graph.find(Conv)
    assert r.report.quantized == ["k"] and "static minmax" in r.report.methods["k"]
    a, w = r.record["k"]
    assert w.axis == 0 and len(w.scales) == 6
    x = cal[0]["img"]
    s, z = a.scales[0], a.zero_points[0]
    lo, hi = (0, 255) if a.dtype is DType.U8 else (-128, 127)
    xd = (np.clip(np.rint(x / np.float32(s)) + z, lo, hi) - z) * np.float32(s)
    ws = np.asarray(w.scales, np.float32)[:, None, None, None]
    wd = np.clip(np.rint(p["k"] / ws), -127, 127) * ws
    want = np_conv(xd, wd, p["kb"])
    got = r.compiled.run({"img": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert r.report.worst.relative < 0.02


def test_conv_under_dynamic_activations():
    """No dynamic integer conv exists: with data the conv is calibrated (static), without
    data it stays float and the report says why."""
    g, p = conv_model()
    g2 = rlx.Graph("conv_mm")
    x = g2.input("img", (2, 3, 9, 9))
    y = g2.conv(x, g2.param("k", (6, 3, 3, 3)), g2.param("kb", (6,)), stride=2, padding=1)
    flat = g2.reshape(y, (2, 6 * 5 * 5))
    g2.set_outputs([g2.matmul(flat, g2.param("w", (150, 4)))])
    p = {**p, "w": (np.random.default_rng(3).standard_normal((150, 4)) / 12).astype(np.float32)}
    cal = [
        {"img": np.random.default_rng(s).standard_normal((2, 3, 9, 9)).astype(np.float32)}
        for s in range(2)
    ]
    with_data = quantize(g2, cal, params=p, activations="dynamic", rank_layers=False)
    assert (
        len(with_data.graph.find(QConv2d)) == 1 and len(with_data.graph.find(DynamicQMatMul)) == 1
    )
    assert (
        with_data.report.methods["k"].startswith("static")
        and with_data.report.calibration_batches == 2
    )
    without = quantize(g2, None, params=p, activations="dynamic")
    assert (
        len(without.graph.find(Conv)) == 1 and "calibration_data" in without.report.kept_float["k"]
    )
