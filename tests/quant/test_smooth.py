"""SmoothQuant (rlx.quantize(smooth_alpha=...)) against a NumPy re-implementation of the
published formula (Xiao et al. 2023): s_j = max|X_j|^alpha / max|W_j|^(1-alpha), X/s and
s*W, with 1/s folded into the layer norm before the layers, into the linear before them,
or inserted as a per-channel scale. The smoothed float graph equals the original."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.errors import QuantizationError
from rlx.ops.elementwise import Binary, BinaryKind
from rlx.ops.norm import LayerNorm
from rlx.passes.pipeline import to_mir
from rlx.quant.api import quantize
from rlx.quant.layers import find_layers
from rlx.quant.smooth import smooth_graph

H, F = 32, 48
RNG = np.random.default_rng(5)
OUTLIERS = [3, 17]  # channels of the norm output with 40x larger values


def params() -> dict[str, np.ndarray]:
    p = {
        "ln_g": (1.0 + 0.1 * RNG.standard_normal(H)).astype(np.float32),
        "ln_b": (0.1 * RNG.standard_normal(H)).astype(np.float32),
    }
    p["ln_g"][OUTLIERS] = 40.0
    for name, shape in {
        "wq": (H, H),
        "wk": (H, H),
        "w1": (H, F),
        "w2": (F, H),
        "w3": (H, H),
    }.items():
        p[name] = (RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    p["b1"] = (0.1 * RNG.standard_normal(F)).astype(np.float32)
    p["b2"] = (0.1 * RNG.standard_normal(H)).astype(np.float32)
    return p


P = params()


def block() -> rlx.Graph:
    """ln -> (q, k, residual); q -> linear(w1, b1) -> linear(w2, b2) -> gelu -> w3."""
    g = rlx.Graph("smooth_block")
    x = g.input("x", (4, 8, H))
    n = g.layer_norm(x, g.param("ln_g", (H,)), g.param("ln_b", (H,)), 1e-5)
    q = g.matmul(n, g.param("wq", (H, H)))
    k = g.matmul(n, g.param("wk", (H, H)))
    h = g.linear(q, g.param("w1", (H, F)), g.param("b1", (F,)))
    y = g.gelu(g.linear(h, g.param("w2", (F, H)), g.param("b2", (H,))))
    out = g.add(g.add(g.matmul(y, g.param("w3", (H, H))), k), n)
    g.set_outputs([out])
    return g


def data(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, 8, H)).astype(np.float32)} for _ in range(n)]


def np_taps(batches) -> dict[str, np.ndarray]:
    """NumPy forward: per-channel max |X_j| of each layer input over the batches."""
    from scipy.special import erf

    amax: dict[str, np.ndarray] = {}
    for b in batches:
        x = b["x"].astype(np.float64)
        mu = x.mean(-1, keepdims=True)
        n = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * P["ln_g"] + P[
            "ln_b"
        ]
        q = n @ P["wq"]
        h = q @ P["w1"] + P["b1"]
        z = h @ P["w2"] + P["b2"]
        y = 0.5 * z * (1 + erf(z / np.sqrt(2)))
        for name, v in {"n": n, "q": q, "h": h, "y": y}.items():
            m = np.abs(v).reshape(-1, v.shape[-1]).max(0)
            amax[name] = m if name not in amax else np.maximum(amax[name], m)
    return amax


def np_scales(x_amax: np.ndarray, ws: list[np.ndarray], alpha: float) -> np.ndarray:
    w_amax = np.max([np.abs(w).max(1) for w in ws], axis=0)
    return x_amax**alpha / w_amax ** (1 - alpha)


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_scales_follow_the_published_formula(alpha):
    cal = data(3, seed=1)
    r = quantize(block(), cal, params=P, smooth_alpha=alpha, rank_layers=False)
    amax = np_taps(cal)
    smoothed = r.report.smoothing
    # the norm output feeds wq and wk: one s for both, from both weights
    assert "folded into layer_norm" in smoothed["wq"] and "folded into layer_norm" in smoothed["wk"]
    s = np_scales(amax["n"], [P["wq"], P["wk"]], alpha)
    for name in ("wq", "wk"):
        got = r.params.get(name)
        if got is None:  # folded into an i8 constant: the float graph keeps the smoothed value
            got = SMOOTHED[alpha][name]
        np.testing.assert_allclose(got, s[:, None] * P[name], rtol=2e-5, atol=1e-7)
    # the outlier channels get the largest scales
    assert set(np.argsort(-s)[:2]) == set(OUTLIERS)


def _smooth_only(alpha: float):
    """smooth_graph on the float block with the NumPy statistics (no quantization)."""
    g = to_mir(block())
    layers, _ = find_layers(g, P)
    amax = np_taps(data(3, seed=1))
    name_of_tap = {"wq": "n", "wk": "n", "w1": "q", "w2": "h", "w3": "y"}
    stats = {ly.act: amax[name_of_tap[ly.name]].astype(np.float32) for ly in layers}
    return g, layers, smooth_graph(g, layers, P, stats, alpha)


SMOOTHED = {a: _smooth_only(a)[2].params for a in (0.5, 0.8)}


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_smoothed_float_graph_equals_the_original(alpha):
    g, layers, sm = _smooth_only(alpha)
    amax = np_taps(data(3, seed=1))
    done = [n for n, t in sm.info.items() if t.startswith("smooth")]
    assert {"wq", "wk"} <= set(done)
    for ly in layers:  # every smoothed weight is s * W with the formula's s (group-wide)
        if ly.name not in done:
            continue
        tap = {"wq": "n", "wk": "n", "w1": "q", "w2": "h", "w3": "y"}[ly.name]
        group = [P[n] for n in ("wq", "wk")] if tap == "n" else [P[ly.name]]
        s = np_scales(amax[tap], group, alpha)
        want = s[:, None] * P[ly.name]
        if ly.name == "w1" and "w2" in done:  # w2's 1/s went into w1's output columns
            want = want / np_scales(amax["h"], [P["w2"]], alpha)[None, :]
        np.testing.assert_allclose(sm.params[ly.name], want, rtol=2e-5, atol=1e-7)
    for b in data(2, seed=7):
        want = g.evaluate(b, P)[0]
        got = sm.graph.evaluate(b, sm.params)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max())
    # the norm keeps no extra op on the matmul path: its gamma / beta are divided by s,
    # and the residual reading the norm gets norm * s
    lns = sm.graph.find(LayerNorm)
    assert len(lns) == 1
    muls = [n for n in sm.graph.find(Binary) if n.op.fn is BinaryKind.MUL]
    assert any(lns[0].id in n.inputs for n in muls)


def test_fold_targets():
    _, _, sm = _smooth_only(0.8)
    info = sm.info
    assert "folded into layer_norm" in info["wq"]
    if info["w2"].startswith("smooth"):  # h = linear(q, w1, b1): folded into w1 / b1
        assert "folded into the linear" in info["w2"]
        np.testing.assert_allclose(
            sm.params["b1"],
            P["b1"] / np_scales(np_taps(data(3, 1))["h"], [P["w2"]], 0.8),
            rtol=2e-5,
        )
    if info["w3"].startswith("smooth"):  # gelu output: nothing to fold into
        assert "inserted" in info["w3"]


def test_smoothing_helps_static_int8_on_outlier_channels():
    cal, ev = data(4, seed=1), data(2, seed=3)
    plain = quantize(block(), cal, params=P, eval_data=ev, rank_layers=False, asymmetric=False)
    smooth = quantize(
        block(), cal, params=P, eval_data=ev, rank_layers=False, asymmetric=False, smooth_alpha=0.5
    )
    assert smooth.report.worst.relative < 0.8 * plain.report.worst.relative  # 0.018 vs 0.024
    assert "smooth alpha=0.5" in smooth.report.methods["wq"]
    assert "smooth_alpha=0.5" in str(smooth.report)


def test_bad_alpha_and_missing_data():
    with pytest.raises(QuantizationError, match="smooth_alpha must be a number in"):
        quantize(block(), data(1, 1), params=P, smooth_alpha=1.5)
    with pytest.raises(QuantizationError, match="smooth_alpha needs calibration_data"):
        quantize(block(), None, params=P, activations="dynamic", smooth_alpha=0.5)
