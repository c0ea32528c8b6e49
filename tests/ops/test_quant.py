"""Quantization ops: shape rules, NumPy semantics (round half to even, saturation,
per-channel), weight schemes, and QMatMul / DequantMatMul against hand-computed values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlx
from rlx.dtype import DType
from rlx.errors import ShapeError
from rlx.ops.quant import (
    Dequantize,
    DequantMatMul,
    FakeQuantize,
    Fp8E4m3,
    Fp8E5m2,
    GgufQ4K,
    GgufQ5K,
    GgufQ6K,
    GgufQ8K,
    Int4Block,
    Int8Block,
    Int8BlockAsym,
    QMatMul,
    Quantize,
    dequantize_weight,
)


def run1(build, **inputs):
    g = rlx.Graph("q")
    ids = {k: g.input(k, v.shape, DType.from_numpy(v.dtype)) for k, v in inputs.items()}
    g.set_outputs([build(g, **ids)])
    return g.evaluate(inputs)[0]


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1000.0, -1000.0, 0.26], np.float32)
    q = run1(lambda g, x: g.quantize(x, 1.0), x=x)
    assert q.dtype == np.int8
    np.testing.assert_array_equal(q, [0, 2, 2, 0, -2, 127, -128, 0])
    q = run1(lambda g, x: g.quantize(x, 0.5, [10], dtype="u8"), x=x)
    np.testing.assert_array_equal(q, [11, 13, 15, 9, 7, 255, 0, 11])


def test_per_channel_quantize_dequantize_by_hand():
    x = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]], np.float32)
    q = run1(lambda g, x: g.quantize(x, [1.0, 2.0, 4.0], [0, 1, -1], axis=1), x=x)
    # 5/2 = 2.5 rounds to 2 (half to even), + zp 1 = 3; 3/4 rounds to 1, + zp -1 = 0
    np.testing.assert_array_equal(q, [[1, 0, 0], [4, 3, -3]])
    d = run1(
        lambda g, x: g.dequantize(
            g.quantize(x, [1.0, 2.0, 4.0], [0, 1, -1], axis=-1),
            [1.0, 2.0, 4.0],
            [0, 1, -1],
            axis=-1,
        ),
        x=x,
    )
    np.testing.assert_array_equal(d, [[1.0, -2.0, 4.0], [4.0, 4.0, -8.0]])
    assert d.dtype == np.float32


@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=1, max_dims=3, max_side=6),
        elements=st.floats(-50, 50, width=32),
    ),
    st.floats(0.01, 2.0),
    st.integers(-20, 20),
)
def test_fake_quantize_equals_dequantize_of_quantize(x, scale, zp):
    fq = run1(lambda g, x: g.fake_quantize(x, scale, [zp]), x=x)
    qdq = run1(lambda g, x: g.dequantize(g.quantize(x, scale, [zp]), scale, [zp]), x=x)
    np.testing.assert_array_equal(fq, qdq)
    want = (np.clip(np.rint(x / np.float32(scale)) + zp, -128, 127) - zp).astype(
        np.float32
    ) * np.float32(scale)
    np.testing.assert_array_equal(fq, want)


def test_fake_quantize_keeps_dtype_and_custom_range():
    x = np.array([-3.0, 0.4, 9.0], np.float64)
    y = run1(lambda g, x: g.fake_quantize(x, 1.0, qmin=-2, qmax=5), x=x)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, [-2.0, 0.0, 5.0])


@pytest.mark.parametrize(
    ("op", "shape", "match"),
    [
        (Quantize(None, (1.0, 2.0), (0, 0)), (4,), "per-tensor needs 1 scale"),
        (Quantize(0, (1.0, 2.0), (0, 0)), (3, 2), "needs 3 scales, got 2"),
        (Quantize(None, (0.0,), (0,)), (3,), "finite and > 0"),
        (Quantize(None, (1.0,), (200,)), (3,), r"zero points must lie in \[-128, 127\]"),
        (Quantize(None, (1.0,), (0, 1)), (3,), "1 scales but 2 zero points"),
        (Quantize(2, (1.0,), (0,)), (3,), "axis 2 out of range"),
        (Quantize(None, (1.0,), (0,), DType.F32), (3,), "dtype must be one of"),
        (FakeQuantize(None, (1.0,), (0,), 5, 5), (3,), "qmin 5 must be < qmax 5"),
    ],
)
def test_shape_rule_errors(op, shape, match):
    g = rlx.Graph("e")
    x = g.input("x", shape)
    with pytest.raises(ShapeError, match=match):
        g.apply(op, [x])


def test_dequantize_needs_integer_input():
    g = rlx.Graph("e")
    x = g.input("x", (3,))
    with pytest.raises(ShapeError, match="input must be one of"):
        g.apply(Dequantize(None, (1.0,), (0,)), [x])
    q = g.input("q", (3,), "i8")
    with pytest.raises(ShapeError, match="input must be float"):
        g.apply(Quantize(None, (1.0,), (0,)), [q])


def test_op_attributes_are_hashable_tuples():
    a = Quantize(None, [0.5], [1])
    b = Quantize(None, (0.5,), (1,))
    assert a == b and hash(a) == hash(b) and isinstance(a.scales, tuple)
    assert "scales=(0.5,)" in str(a)


# ---- schemes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "gguf", "bits", "block", "arity"),
    [
        (Int8Block(64), False, 80, 64, 4),
        (Int8BlockAsym(32), False, 80, 32, 4),
        (Int4Block(32), False, 40, 32, 4),
        (Fp8E4m3(), False, 80, None, 4),
        (Fp8E5m2(), False, 80, None, 4),
        (GgufQ4K(), True, 45, 256, 2),
        (GgufQ5K(), True, 55, 256, 2),
        (GgufQ6K(), True, 66, 256, 2),
        (GgufQ8K(), True, 91, 256, 2),
    ],
)
def test_scheme_facts(scheme, gguf, bits, block, arity):
    assert scheme.is_gguf is gguf
    assert scheme.bits_per_elem_x10 == bits
    assert scheme.block_size == block
    assert scheme.num_inputs() == arity == DequantMatMul(scheme).num_inputs()
    assert hash(scheme) == hash(type(scheme)(*([block] if block and not gguf else [])))


def _weights(scheme, n, k, rng):
    """(inputs, dequantized f32 [N, K]) computed independently of dequantize_weight."""
    if isinstance(scheme, (Fp8E4m3, Fp8E5m2)):
        dt = ml_dtypes.float8_e4m3fn if isinstance(scheme, Fp8E4m3) else ml_dtypes.float8_e5m2
        wq = rng.uniform(-4, 4, (n, k)).astype(dt)
        return [wq, np.array([0.25], np.float32), np.array([0], np.int32)], wq.astype(
            np.float32
        ) * 0.25
    bs = scheme.block_size
    scale = rng.uniform(0.01, 0.1, (n, k // bs)).astype(np.float32)
    s_full = np.repeat(scale, bs, axis=1)
    if isinstance(scheme, Int4Block):
        vals = rng.integers(0, 16, (n, k))
        zp = np.full((n, k // bs), 8, np.int32)
        packed = (vals[:, 0::2] | (vals[:, 1::2] << 4)).astype(np.uint8)
        return [packed, scale, zp], (vals - 8).astype(np.float32) * s_full
    wq = rng.integers(-128, 128, (n, k)).astype(np.int8)
    zp = (
        rng.integers(-5, 5, (n, k // bs))
        if isinstance(scheme, Int8BlockAsym)
        else np.zeros((n, k // bs))
    ).astype(np.int32)
    return [wq, scale, zp], (wq - np.repeat(zp, bs, axis=1)).astype(np.float32) * s_full


@pytest.mark.parametrize(
    "scheme", [Int8Block(16), Int8BlockAsym(32), Int4Block(16), Fp8E4m3(), Fp8E5m2()], ids=str
)
def test_dequant_matmul_block_schemes(scheme):
    rng = np.random.default_rng(1)
    n, k = 6, 64
    ws, w = _weights(scheme, n, k, rng)
    np.testing.assert_array_equal(dequantize_weight(scheme, *ws), w)
    g = rlx.Graph("dq")
    x = g.input("x", (2, 3, k))
    g.set_outputs([g.dequant_matmul(x, scheme, *[g.constant(a) for a in ws])])
    xv = rng.standard_normal((2, 3, k)).astype(np.float32)
    (ref,) = g.evaluate({"x": xv})
    np.testing.assert_allclose(ref, xv @ w.T, rtol=1e-5, atol=1e-5)
    (got,) = rlx.Session("cpu").compile(g).run({"x": xv})
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_dequant_matmul_shape_errors():
    g = rlx.Graph("e")
    x = g.input("x", (2, 64))
    wq = g.input("w", (6, 64), "i8")
    s = g.input("s", (6, 4))
    z = g.input("z", (6, 4), "i32")
    with pytest.raises(ShapeError, match="not a multiple of block size 24"):
        g.apply(DequantMatMul(Int8Block(24)), [x, wq, s, z])
    with pytest.raises(ShapeError, match=r"scale must be f32\[6, 2\]"):
        g.apply(DequantMatMul(Int8Block(32)), [x, wq, s, z])
    with pytest.raises(ShapeError, match="weight must be u8"):
        g.apply(DequantMatMul(Int4Block(16)), [x, wq, s, z])
    assert g.apply(DequantMatMul(Int8Block(16)), [x, wq, s, z]) >= 0


# ---- qmatmul ------------------------------------------------------------------------


def test_qmatmul_by_hand():
    xq = np.array([[1, -2, 3]], np.int8)
    wq = np.array([[1, 0], [2, -1], [0, 4]], np.int8)
    bias = np.array([0.5, -0.5], np.float32)
    g = rlx.Graph("qm")
    x = g.input("x", (1, 3), "i8")
    b = g.input("b", (2,))
    g.set_outputs(
        [g.qmatmul(x, g.constant(wq), x_scale=0.5, w_scales=[1.0, 0.25], x_zero_point=1, bias=b)]
    )
    (y,) = g.evaluate({"x": xq, "b": bias})
    # (x - 1) = [0, -3, 2]; acc = [-6, 11]; * (0.5 * [1, 0.25]) + bias
    np.testing.assert_allclose(y, [[-3.0 + 0.5, 11 * 0.125 - 0.5]])


def test_qmatmul_shape_errors():
    g = rlx.Graph("e")
    x = g.input("x", (2, 4), "i8")
    w = g.input("w", (4, 3), "i8")
    xf = g.input("xf", (2, 4))
    with pytest.raises(ShapeError, match="x_q must be i8 or u8"):
        g.apply(QMatMul(1.0, 0, (1.0,)), [xf, w])
    with pytest.raises(ShapeError, match="w_scales needs 1 or N=3 values, got 2"):
        g.apply(QMatMul(1.0, 0, (1.0, 2.0)), [x, w])
    with pytest.raises(ShapeError, match="x_zero_point 300 outside"):
        g.apply(QMatMul(1.0, 300, (1.0,)), [x, w])
    with pytest.raises(ShapeError, match="contraction dims differ"):
        g.apply(QMatMul(1.0, 0, (1.0,)), [x, g.input("w2", (5, 3), "i8")])


def test_quant_ops_round_trip_through_a_file(tmp_path):
    g = rlx.Graph("s")
    x = g.input("x", (2, 64))
    q = g.quantize(x, 0.1, [2])
    y = g.qmatmul(q, g.constant(np.ones((64, 8), np.int8)), 0.1, [0.5] * 8, 2)
    ws = [np.ones((8, 64), np.int8), np.ones((8, 2), np.float32), np.zeros((8, 2), np.int32)]
    y2 = g.dequant_matmul(x, Int8Block(32), *[g.constant(a) for a in ws])
    x2 = g.input("x2", (2, 256))
    y3 = g.dequant_matmul(x2, GgufQ4K(), g.constant(np.zeros((8, 144), np.uint8)))
    g.set_outputs([y, y2, g.add(y3, g.fake_quantize(y2, [1.0] * 8, axis=1))])
    rlx.save(g, tmp_path / "q.rlx")
    g2, _ = rlx.load(tmp_path / "q.rlx")
    assert g2 == g and g2.fingerprint() == g.fingerprint()
