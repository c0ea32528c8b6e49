"""K-quant decoding vs the ``gguf`` package (llama.cpp's own Python reference) and vs
hand-decoded blocks."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.errors import QuantizationError, ShapeError
from rlx.formats.gguf import BLOCK_BYTES, dequantize_blocks, dequantize_rows, scale_min_k4
from rlx.ops.quant import DequantMatMul, GgufQ4K, GgufQ5K, GgufQ6K, GgufQ8K

SCHEMES = [GgufQ4K(), GgufQ5K(), GgufQ6K(), GgufQ8K()]


def random_blocks(scheme, n_blocks: int, seed: int = 0) -> np.ndarray:
    """Random super-blocks with finite, moderate f16/f32 scale fields."""
    rng = np.random.default_rng(seed)
    bb = BLOCK_BYTES[type(scheme)]
    b = rng.integers(0, 256, (n_blocks, bb), dtype=np.uint8)
    half = lambda v: np.asarray(v, "<f2").view(np.uint8).reshape(n_blocks, 2)  # noqa: E731
    if isinstance(scheme, (GgufQ4K, GgufQ5K)):
        b[:, 0:2] = half(rng.uniform(0.001, 0.05, n_blocks))
        b[:, 2:4] = half(rng.uniform(0.001, 0.05, n_blocks))
    elif isinstance(scheme, GgufQ6K):
        b[:, 208:210] = half(rng.uniform(0.001, 0.05, n_blocks))
    else:
        b[:, 0:4] = (
            np.asarray(rng.uniform(0.001, 0.05, n_blocks), "<f4")
            .view(np.uint8)
            .reshape(n_blocks, 4)
        )
    return b


@pytest.mark.parametrize("scheme", SCHEMES[:3], ids=str)
def test_matches_gguf_package(scheme):
    # gguf 0.19 has no Q8_K decoder: Q8_K is checked by hand in test_q8k_by_hand
    gguf = pytest.importorskip("gguf")
    qtype = {
        GgufQ4K: gguf.GGMLQuantizationType.Q4_K,
        GgufQ5K: gguf.GGMLQuantizationType.Q5_K,
        GgufQ6K: gguf.GGMLQuantizationType.Q6_K,
    }[type(scheme)]
    rows = random_blocks(scheme, 3 * 4, seed=7).reshape(3, -1)  # 3 rows of K = 1024
    ours = dequantize_rows(scheme, rows)
    theirs = gguf.quants.dequantize(rows, qtype)
    assert ours.shape == theirs.shape == (3, 1024)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_scale_min_k4_by_hand():
    s = np.zeros((1, 12), np.uint8)
    s[0, 0] = 0b11_000101  # scale 0 = 5, its top bits feed scale 4
    s[0, 4] = 0b01_000111  # min 0 = 7, top bits feed min 4
    s[0, 8] = 0x3A  # scale 4 low = 0xA, min 4 low = 0x3
    sc, mn = scale_min_k4(s)
    assert sc[0, 0] == 5 and mn[0, 0] == 7
    assert sc[0, 4] == 0xA | (0b11 << 4)
    assert mn[0, 4] == 0x3 | (0b01 << 4)


def test_q8k_by_hand():
    b = np.zeros((1, 292), np.uint8)
    b[0, 0:4] = np.asarray([0.5], "<f4").view(np.uint8)
    b[0, 4:260] = np.arange(-128, 128, dtype=np.int8).view(np.uint8)
    np.testing.assert_array_equal(dequantize_blocks(GgufQ8K(), b), 0.5 * np.arange(-128, 128))


def test_q6k_layout_by_hand():
    b = np.zeros((1, 210), np.uint8)
    b[0, 192:208] = np.arange(1, 17, dtype=np.int8).view(np.uint8)  # scales 1..16
    b[0, 208:210] = np.asarray([1.0], "<f2").view(np.uint8)
    b[0, 0] = 0x21  # ql[0]: low nibble -> y[0], high nibble -> y[64]
    b[0, 128] = 0b11_10_01_00  # qh[0]: bits for y[0], y[32], y[64], y[96]
    y = dequantize_blocks(GgufQ6K(), b)
    assert y[0] == 1 * (0x1 - 32)  # scale index 0
    assert y[32] == 3 * ((1 << 4) - 32)  # scale index 2
    assert y[64] == 5 * ((0x2 | (2 << 4)) - 32)  # scale index 4
    assert y[96] == 7 * ((3 << 4) - 32)  # scale index 6
    assert y[16] == 2 * -32  # second half of the first 32 uses scale index 1


def test_block_count_errors():
    with pytest.raises(QuantizationError, match="whole number of 144-byte"):
        dequantize_blocks(GgufQ4K(), np.zeros(100, np.uint8))


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
def test_dequant_matmul_gguf_reference_and_compiled(scheme, monkeypatch):
    # the exact f32 kernel (batch < 4 would take the int8-activation path by default,
    # tests/cpu/kernels/test_quant_dequant_q8.py checks that one within its bound)
    monkeypatch.setenv("RLX_DQ_ACT", "f32")
    n, k = 5, 512
    packed = random_blocks(scheme, n * k // 256, seed=3).reshape(n, -1)
    g = rlx.Graph("gguf")
    x = g.input("x", (2, k))
    p = g.constant(packed)
    g.set_outputs([g.dequant_matmul(x, scheme, p)])
    xv = np.random.default_rng(0).standard_normal((2, k)).astype(np.float32)
    want = xv @ dequantize_rows(scheme, packed).T
    (ref,) = g.evaluate({"x": xv})
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-5)
    (got,) = rlx.Session("cpu").compile(g).run({"x": xv})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dequant_matmul_gguf_shape_errors():
    g = rlx.Graph("bad")
    x = g.input("x", (2, 512))
    p = g.input("p", (5, 100), "u8")
    with pytest.raises(ShapeError, match=r"needs packed \[N, 288\]"):
        g.apply(DequantMatMul(GgufQ4K()), [x, p])
    x2 = g.input("x2", (2, 300))
    with pytest.raises(ShapeError, match="divisible by 256"):
        g.apply(DequantMatMul(GgufQ4K()), [x2, p])
