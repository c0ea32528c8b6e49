"""QuantLowering: Q/DQ-bracketed matmuls become qmatmul; the rest is reported with a
reason. Lowered graphs are checked against the fake-quant graph (reference interpreter)
and compiled with the native kernel."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.backends.cpu import native
from rlx.dtype import DType
from rlx.errors import CompileError
from rlx.ops.linalg import MatMul
from rlx.ops.quant import QMatMul, Quantize
from rlx.options import CompileOptions
from rlx.quant.lower import QuantLowering, quantize_weight
from rlx.quant.record import CalibrationEntry, insert_q_dq

RNG = np.random.default_rng(0)
W = RNG.standard_normal((32, 24)).astype(np.float32)
B = RNG.standard_normal(24).astype(np.float32)
X = RNG.standard_normal((2, 5, 32)).astype(np.float32)


def linear_graph(bias: bool = True) -> tuple[rlx.Graph, int, int]:
    g = rlx.Graph("lin")
    x = g.input("x", (2, 5, 32))
    w = g.param("w", (32, 24))
    b = g.param("b", (24,)) if bias else None
    g.set_outputs([g.relu(g.linear(x, w, b))])
    return g, x, w


def only(g: rlx.Graph, params: dict) -> dict:
    """The params ``g`` still has (folded weights are dropped by the lowering)."""
    return {k: v for k, v in params.items() if k in g.param_names}


def compile_run(g: rlx.Graph, params: dict, **opts) -> np.ndarray:
    c = rlx.Session("cpu").compile(
        g, CompileOptions(use_cache=False, **opts), params=only(g, params)
    )
    return c.run({"x": X})[0]


@pytest.mark.parametrize("dtype", [DType.I8, DType.U8])
def test_lowered_matches_fake_quant_graph(dtype):
    g, x, w = linear_graph()
    wq, ws = quantize_weight(W)
    zp = 3 if dtype is DType.I8 else 130
    record = {
        x: CalibrationEntry.per_tensor(0.02, zp, dtype),
        w: CalibrationEntry.per_channel(1, ws),
    }
    fake = insert_q_dq(g, record)
    params = {"w": W, "b": B}
    lower = QuantLowering(params)
    low = lower.run(fake).verify()
    assert [d.lowered for d in lower.decisions] == [True]
    assert "bias folded" in lower.notes[0] and "per-channel" in lower.notes[0]
    (qm,) = low.find(QMatMul)
    assert qm.op.has_bias and qm.op.w_scales == ws and qm.op.x_zero_point == zp
    assert not low.find(MatMul)
    want = fake.evaluate({"x": X}, params)[0]
    assert (
        low.param_names == ["b"] and "dropped params folded into i8 constants: ['w']" in lower.notes
    )
    ref = low.evaluate({"x": X}, only(low, params))[0]
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(compile_run(low, params), ref, rtol=1e-6, atol=1e-6)


def test_plain_param_weight_is_quantized_at_lowering():
    g, x, _ = linear_graph(bias=False)
    fake = insert_q_dq(g, {x: CalibrationEntry.per_tensor(0.03)})
    for per_channel, n_scales in ((True, 24), (False, 1)):
        lower = QuantLowering({"w": W}, per_channel=per_channel)
        low = lower.run(fake)
        (qm,) = low.find(QMatMul)
        assert len(qm.op.w_scales) == n_scales and not qm.op.has_bias
        assert "weight quantized now" in lower.notes[0]
        out = compile_run(low, {"w": W})
        float_out = g.evaluate({"x": X}, {"w": W})[0]
        assert np.abs(out - float_out).max() < 0.1 * np.abs(float_out).max()


def test_weight_quantized_at_run_time_without_params():
    g, x, w = linear_graph()
    _, ws = quantize_weight(W)
    fake = insert_q_dq(
        g, {x: CalibrationEntry.per_tensor(0.02), w: CalibrationEntry.per_channel(1, ws)}
    )
    lower = QuantLowering()
    low = lower.run(fake)
    (qm,) = low.find(QMatMul)
    assert isinstance(low.nodes[qm.inputs[1]].op, Quantize)
    assert "quantized at run time" in lower.notes[0]
    params = {"w": W, "b": B}
    np.testing.assert_allclose(
        compile_run(low, params), fake.evaluate({"x": X}, params)[0], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    ("record", "params", "reason"),
    [
        (
            lambda x, w: {x: CalibrationEntry.per_channel(2, [0.1] * 32)},
            {"w": W},
            "per channel; qmatmul needs a per-tensor",
        ),
        (
            lambda x, w: {
                x: CalibrationEntry.per_tensor(0.1),
                w: CalibrationEntry.per_channel(0, [0.1] * 32),
            },
            {"w": W},
            "per input channel",
        ),
        (
            lambda x, w: {
                x: CalibrationEntry.per_tensor(0.1),
                w: CalibrationEntry.per_tensor(0.1, 2),
            },
            {"w": W},
            "non-zero zero point",
        ),
        (lambda x, w: {x: CalibrationEntry.per_tensor(0.1)}, {}, "has no value at compile time"),
        (lambda x, w: {}, {"w": W}, "not dequantize(quantize(x))"),
    ],
)
def test_not_lowered_reasons(record, params, reason):
    g, x, w = linear_graph()
    fake = insert_q_dq(g, record(x, w))
    lower = QuantLowering(params)
    out = lower.run(fake)
    assert out is fake
    (d,) = lower.decisions
    assert not d.lowered and d.weight == "w" and reason in d.reason
    assert "kept in float" in lower.notes[0]


def test_native_unavailable_uses_exact_blas_fallback(monkeypatch):
    g, x, _ = linear_graph()
    low = QuantLowering({"w": W}).run(insert_q_dq(g, {x: CalibrationEntry.per_tensor(0.02, -4)}))
    params = {"w": W, "b": B}
    ref = low.evaluate({"x": X}, only(low, params))[0]

    def no_gcc(isa=None):
        raise CompileError("native kernels need gcc, which is not on PATH")

    monkeypatch.setattr(native, "qgemm_lib", no_gcc)
    c = rlx.Session("cpu").compile(low, CompileOptions(use_cache=False), params=only(low, params))
    np.testing.assert_allclose(c.run({"x": X})[0], ref, rtol=1e-6, atol=1e-6)
    assert "blas" in str(c.report())


def test_param_weight_change_repacks():
    g = rlx.Graph("rt")
    x = g.input("x", (4, 16), "i8")
    w = g.param("w", (16, 8), "i8")
    g.set_outputs([g.qmatmul(x, w, x_scale=1.0, w_scales=1.0)])
    xv = RNG.integers(-128, 128, (4, 16)).astype(np.int8)
    w1 = RNG.integers(-128, 128, (16, 8)).astype(np.int8)
    c = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False), params={"w": w1})
    np.testing.assert_array_equal(
        c.run({"x": xv})[0], (xv.astype(np.int64) @ w1).astype(np.float32)
    )
    w2 = RNG.integers(-128, 128, (16, 8)).astype(np.int8)
    c.set_param("w", w2)
    np.testing.assert_array_equal(
        c.run({"x": xv})[0], (xv.astype(np.int64) @ w2).astype(np.float32)
    )


@pytest.mark.parametrize(
    ("axis", "scales", "zps", "dtype"),
    [
        (None, (0.07,), (3,), DType.I8),
        (None, (0.05,), (128,), DType.U8),
        (1, tuple(np.linspace(0.01, 0.2, 5)), tuple(range(-2, 3)), DType.I8),
        (2, (0.5,) * 32, (0,) * 32, DType.I16),
    ],
)
def test_quantize_dequantize_kernels_match_reference(axis, scales, zps, dtype):
    g = rlx.Graph("qdq")
    x = g.input("x", (2, 5, 32))
    q = g.quantize(x, scales, zps, axis=axis if axis != 2 else -1, dtype=dtype)
    g.set_outputs([q, g.dequantize(q, scales, zps, axis=axis)])
    xv = X * 3.0
    xv[0, 0, :4] = [np.nan, np.inf, -np.inf, 0.5 * scales[0]]
    want = g.evaluate({"x": xv})
    got = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False)).run({"x": xv})
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_expand_fused_matmuls_keeps_semantics():
    from rlx.ops.elementwise import UnaryKind
    from rlx.ops.fused import FusedMatMulBiasAct, FusedSwiGLU
    from rlx.quant.lower import ExpandFusedMatMuls

    g = rlx.Graph("fused")
    x = g.input("x", (2, 5, 32))
    w, b = g.param("w", (32, 24)), g.param("b", (24,))
    y = g.apply(FusedMatMulBiasAct(UnaryKind.GELU, True), [x, w, b])
    wg, wu = g.param("wg", (24, 16)), g.param("wu", (24, 16))
    g.set_outputs(
        [g.apply(FusedSwiGLU(), [y, wg, wu]), g.apply(FusedMatMulBiasAct(None, False), [x, w])]
    )
    params = {"w": W, "b": B, "wg": W[:24, :16], "wu": W[8:, 8:]}
    p = ExpandFusedMatMuls()
    out = p.run(g).verify()
    assert not out.find(FusedMatMulBiasAct) and not out.find(FusedSwiGLU)
    assert len(out.find(MatMul)) == 4 and len(p.notes) == 3
    for a, e in zip(out.evaluate({"x": X}, params), g.evaluate({"x": X}, params)):
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-6)
    assert p.run(out) is out and p.notes == []


def test_lowering_without_matmul_says_so():
    g = rlx.Graph("none")
    g.set_outputs([g.relu(g.input("x", (3,)))])
    lower = QuantLowering()
    assert lower.run(g) is g and lower.notes == ["no matmul in the graph"]


def test_quantize_weight_error_is_within_half_a_step():
    wq, scales = quantize_weight(W)
    assert wq.dtype == np.int8 and np.abs(wq).max() <= 127 and len(scales) == 24
    err = np.abs(wq.astype(np.float32) * np.asarray(scales, np.float32) - W)
    assert (err <= np.asarray(scales) / 2 + 1e-7).all()
    zq, zs = quantize_weight(np.zeros((4, 3), np.float32), per_channel=False)
    assert zs == (1.0,) and not zq.any()
