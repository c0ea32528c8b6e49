"""``rlx.quantize(reduce_range=...)``: 7-bit weights ([-64, 64], ONNX Runtime's
reduce_range) for the AVX2 int8 GEMM's vpmaddubsw kernel. The weights and scales against
NumPy (max |W[:, n]| / 64), the AVX2 GEMM on them exact against a NumPy int64 product,
a whole dynamic model under RLX_ISA=avx2 against a NumPy re-implementation, the auto
choice per target (7 bits on AVX2 only) and the argument checks."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.native.cpu import Isa, Target
from rlx.errors import QuantizationError
from rlx.ops.qmatmul import DynamicQMatMul
from rlx.quant.api import quantize
from rlx.quant.lower import default_reduce_range, quantize_weight

RNG = np.random.default_rng(7)
P = {
    "w0": (RNG.standard_normal((48, 40)) / 5).astype(np.float32),
    "b0": (0.1 * RNG.standard_normal(40)).astype(np.float32),
    "w1": (RNG.standard_normal((40, 16)) / 6).astype(np.float32),
}
TARGETS = native.runnable_targets()
needs_gcc = pytest.mark.skipif(not native.available(), reason="gcc is not installed")


def model() -> rlx.Graph:
    """relu(x @ w0 + b0) @ w1."""
    g = rlx.Graph("rr")
    x = g.input("x", (5, 48))
    h = g.relu(g.linear(x, g.param("w0", (48, 40)), g.param("b0", (40,))))
    g.set_outputs([g.matmul(h, g.param("w1", (40, 16)))])
    return g


def np_weight7(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column symmetric 7-bit weights from the rule: scale max |W[:, n]| / 64."""
    s = (np.abs(w).max(0) / np.float32(64)).astype(np.float32)
    return np.clip(np.rint(w / s), -64, 64), s


def np_rows_u8(x: np.ndarray) -> np.ndarray:
    """Dequantized per-row u8 quantization (ONNX DynamicQuantizeLinear per row)."""
    lo = np.minimum(x.min(1, keepdims=True), 0)
    hi = np.maximum(x.max(1, keepdims=True), 0)
    s = (hi - lo) / np.float32(255)
    s[s == 0] = 1
    z = np.clip(np.rint(-lo / s), 0, 255)
    return (np.clip(np.rint(x / s) + z, 0, 255) - z) * s


def test_quantize_weight_reduce_range() -> None:
    w = P["w0"]
    q, s = quantize_weight(w, reduce_range=True)
    want_q, want_s = np_weight7(w)
    np.testing.assert_allclose(s, want_s, rtol=1e-7)
    np.testing.assert_array_equal(q, want_q)
    assert np.abs(q).max() == 64
    q8, _ = quantize_weight(w)
    assert np.abs(q8).max() == 127


@needs_gcc
@pytest.mark.skipif(Target.AVX2 not in TARGETS, reason="no AVX2 on this CPU")
def test_avx2_gemm_on_7bit_weights_is_exact(monkeypatch, tmp_path_factory) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-native"))
    monkeypatch.setenv("RLX_ISA", "avx2")
    lib = native.qgemm_lib(Isa.AVX2)
    rng = np.random.default_rng(0)
    for m, k, n in ((1, 384, 384), (16, 384, 1536), (7, 37, 21)):
        w, _ = quantize_weight(rng.standard_normal((k, n)).astype(np.float32), reduce_range=True)
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        a[0, :] = -128  # the saturation corner of vpmaddubsw: u8 255 after the shift
        packed = lib.pack(w)
        assert lib.takes_7bit(packed, k, n)
        out = np.empty((m, n), np.int32)
        lib.gemm(a, packed, n, a_zero_point=-5, out_i32=out)
        np.testing.assert_array_equal(out, (a.astype(np.int64) + 5) @ w.astype(np.int64))


@needs_gcc
@pytest.mark.skipif(Target.AVX2 not in TARGETS, reason="no AVX2 on this CPU")
def test_dynamic_model_with_7bit_weights_on_avx2(monkeypatch) -> None:
    monkeypatch.setenv("RLX_ISA", "avx2")
    r = quantize(model(), None, params=P, activations="dynamic")  # auto: 7 bits on AVX2
    assert r.weight_bits == 7
    ops = r.graph.find(DynamicQMatMul)
    assert len(ops) == 2
    for node in ops:
        wq = r.graph.nodes[node.inputs[1]].op.value.array()
        w = P["w0"] if wq.shape == (48, 40) else P["w1"]
        want_q, want_s = np_weight7(w)
        np.testing.assert_array_equal(wq, want_q)
        np.testing.assert_allclose(node.op.w_scales, want_s, rtol=1e-6)
    x = np.random.default_rng(1).standard_normal((5, 48)).astype(np.float32)
    got = r.compiled.run({"x": x})[0]

    def lin(a: np.ndarray, w: np.ndarray) -> np.ndarray:
        q, s = np_weight7(w)
        return np_rows_u8(a).astype(np.float64) @ (q * s)

    h = np.maximum(lin(x, P["w0"]) + P["b0"], 0)
    want = lin(h.astype(np.float32), P["w1"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.value)
def test_auto_choice_per_target(monkeypatch, target) -> None:
    """None picks 7 bits exactly where the int8 GEMM is the AVX2 one (no VNNI)."""
    monkeypatch.setenv("RLX_ISA", target.value)
    spec = native.target_spec(target)
    want = target is not Target.PORTABLE and not spec.vnni
    assert default_reduce_range() is want
    r = quantize(model(), None, params=P, activations="dynamic", rank_layers=False)
    assert r.weight_bits == (7 if want else 8)
    wmax = max(
        np.abs(r.graph.nodes[n.inputs[1]].op.value.array()).max()
        for n in r.graph.find(DynamicQMatMul)
    )
    assert wmax == (64 if want else 127)
    forced = quantize(
        model(), None, params=P, activations="dynamic", rank_layers=False, reduce_range=not want
    )
    assert forced.weight_bits == (8 if want else 7)


def test_static_reduce_range_and_bad_values() -> None:
    cal = [
        {"x": np.random.default_rng(s).standard_normal((5, 48)).astype(np.float32)} for s in (0, 1)
    ]
    r = quantize(model(), cal, params=P, reduce_range=True, rank_layers=False)
    assert r.weight_bits == 7
    for name, (_, w_entry) in r.record.items():
        np.testing.assert_allclose(w_entry.scales, np_weight7(P[name])[1], rtol=1e-6)
    with pytest.raises(QuantizationError, match="reduce_range must be True, False or None"):
        quantize(model(), None, params=P, activations="dynamic", reduce_range=1)  # type: ignore[arg-type]
