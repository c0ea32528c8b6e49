"""Every GGUF block scheme (legacy Q4_0..Q8_0 and the K-quants Q2_K..Q6_K) decoded
bit-exactly against ``gguf.quants`` (llama.cpp's own Python reference) on
hypothesis-drawn blocks, plus the layout facts and DequantMatMul's byte-count checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.errors import QuantizationError, ShapeError
from rlx.formats.gguf import BLOCK_BYTES, check_packed, dequantize_blocks, dequantize_rows
from rlx.formats.schemes import (
    GGUF_SCHEMES,
    GgufQ2K,
    GgufQ3K,
    GgufQ4_0,
    GgufQ4_1,
    GgufQ5_0,
    GgufQ5_1,
    GgufQ8_0,
)
from tests.quant.gguf_blocks import F16_FIELDS, set_f16_scales

gguf = pytest.importorskip("gguf")

DECODABLE = sorted(F16_FIELDS)  # gguf 0.19 has no Q8_K decoder (tests/quant/test_gguf.py)

finite_f16 = st.integers(0, 0xFFFF).filter(lambda h: (h >> 10) & 0x1F != 0x1F)


@st.composite
def blocks(draw, name: str) -> np.ndarray:
    """Random rows of blocks: any bytes, with every f16 scale finite (not nan / inf)."""
    cls = GGUF_SCHEMES[name]
    bb = cls.block_bytes
    rows = draw(st.integers(1, 3))
    per_row = draw(st.integers(1, 3))
    raw = draw(st.binary(min_size=rows * per_row * bb, max_size=rows * per_row * bb))
    b = np.frombuffer(raw, np.uint8).copy().reshape(rows * per_row, bb)
    for off in F16_FIELDS[name]:
        h = np.asarray(draw(st.lists(finite_f16, min_size=len(b), max_size=len(b))), "<u2")
        b[:, off : off + 2] = h.view(np.uint8).reshape(-1, 2)
    return b.reshape(rows, per_row * bb)


@pytest.mark.parametrize("name", DECODABLE)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_bit_exact_vs_gguf(name, data):
    packed = data.draw(blocks(name))
    ours = dequantize_rows(GGUF_SCHEMES[name](), packed)
    with np.errstate(all="ignore"):
        theirs = gguf.quants.dequantize(packed, getattr(gguf.GGMLQuantizationType, name))
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    # bit-exact: same f32 bit patterns (huge f16 scales may overflow to inf in both)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize(
    ("cls", "bb", "qk", "bits", "ggml"),
    [
        (GgufQ4_0, 18, 32, 45, 2),
        (GgufQ4_1, 20, 32, 50, 3),
        (GgufQ5_0, 22, 32, 55, 6),
        (GgufQ5_1, 24, 32, 60, 7),
        (GgufQ8_0, 34, 32, 85, 8),
        (GgufQ2K, 84, 256, 26, 10),
        (GgufQ3K, 110, 256, 34, 11),
    ],
)
def test_layout_facts_match_gguf(cls, bb, qk, bits, ggml):
    s = cls()
    qt = gguf.GGMLQuantizationType(ggml)
    assert qt.name == cls.gguf_name and GGUF_SCHEMES[qt.name] is cls
    assert gguf.GGML_QUANT_SIZES[qt] == (qk, bb) == (s.block_size, BLOCK_BYTES[cls])
    assert s.is_gguf and s.num_inputs() == 2 and s.bits_per_elem_x10 == bits
    assert abs(bb * 8 / qk * 10 - bits) < 1  # bits per weight, scales included
    assert s == cls() and hash(s) == hash(cls()) and str(s) == cls.__name__


def test_q4_0_and_q5_0_by_hand():
    b = np.zeros((1, 18), np.uint8)
    b[0, 0:2] = np.asarray([0.5], "<f2").view(np.uint8)
    b[0, 2] = 0xF3  # element 0 = 3, element 16 = 15
    y = dequantize_blocks(GgufQ4_0(), b)
    assert y[0] == 0.5 * (3 - 8) and y[16] == 0.5 * (15 - 8) and y[1] == 0.5 * -8
    b5 = np.zeros((1, 22), np.uint8)
    b5[0, 0:2] = np.asarray([2.0], "<f2").view(np.uint8)
    b5[0, 2:6] = np.asarray([1 << 17], "<u4").view(np.uint8)  # fifth bit of element 17
    b5[0, 7] = 0x10  # qs[1]: element 1 low = 0, element 17 high nibble = 1
    y5 = dequantize_blocks(GgufQ5_0(), b5)
    assert y5[17] == 2.0 * ((1 | 16) - 16) and y5[1] == 2.0 * -16


def test_q3_k_offset_bit_by_hand():
    b = np.zeros((1, 110), np.uint8)
    b[0, 108:110] = np.asarray([1.0], "<f2").view(np.uint8)
    b[0, 96:104] = 0x11  # low 4 bits of every scale = 1; high 2 bits 0 -> scale 1 - 32
    b[0, 0] = 0x01  # hmask bit 0 of byte 0 -> element 0 has no -4 offset
    b[0, 32] = 0x02  # qs[0] bits 0..1 = 2 -> element 0; bits 2..3 = 0 -> element 32
    y = dequantize_blocks(GgufQ3K(), b)
    assert y[0] == -31 * 2 and y[32] == -31 * (0 - 4) and y[1] == -31 * -4


@pytest.mark.parametrize("cls", [GgufQ8_0, GgufQ4_0, GgufQ3K], ids=lambda c: c.__name__)
def test_dequant_matmul_wrong_byte_count(cls):
    s = cls()
    k = 2 * s.block_size
    g = rlx.Graph()
    x = g.input("x", (1, k))
    w = g.param("w_packed", (3, 2 * cls.block_bytes + 1), "u8")
    with pytest.raises(ShapeError, match=f"needs packed \\[N, {2 * cls.block_bytes}\\]"):
        g.dequant_matmul(x, s, w)
    bad_k = g.input("x2", (1, s.block_size + 1))
    good = g.param("w_ok", (3, cls.block_bytes), "u8")
    with pytest.raises(ShapeError, match=f"divisible by {s.block_size}"):
        g.dequant_matmul(bad_k, s, good)


def test_check_packed_names_the_tensor():
    with pytest.raises(QuantizationError, match="'blk.0.ffn_up.weight'.*Q8_0.*\\[3, 68\\]"):
        check_packed(GgufQ8_0(), np.zeros((3, 67), np.uint8), 3, 64, "blk.0.ffn_up.weight")
    with pytest.raises(QuantizationError, match="'w'.*u8"):
        check_packed(GgufQ8_0(), np.zeros((3, 68), np.int8), 3, 64, "w")
    check_packed(GgufQ8_0(), np.zeros((3, 68), np.uint8), 3, 64, "w")  # fine: no error


def test_decode_rejects_partial_block():
    with pytest.raises(QuantizationError, match="34-byte blocks"):
        dequantize_blocks(GgufQ8_0(), np.zeros(35, np.uint8))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K"])
def test_dequant_matmul_reference_and_compiled(name, monkeypatch):
    # the exact f32 kernel (batch < 4 would take the int8-activation path by default,
    # tests/cpu/kernels/test_quant_dequant_q8.py checks that one within its bound)
    monkeypatch.setenv("RLX_DQ_ACT", "f32")
    cls = GGUF_SCHEMES[name]
    n, k = 5, 512
    rng = np.random.default_rng(3)
    packed = rng.integers(0, 256, (n * k // cls.qk, cls.block_bytes), dtype=np.uint8)
    set_f16_scales(packed, name, rng)
    packed = packed.reshape(n, -1)
    g = rlx.Graph("gguf")
    x = g.input("x", (2, k))
    g.set_outputs([g.dequant_matmul(x, cls(), g.constant(packed))])
    xv = rng.standard_normal((2, k)).astype(np.float32)
    w = gguf.quants.dequantize(packed, getattr(gguf.GGMLQuantizationType, name))
    want = xv.astype(np.float64) @ w.astype(np.float64).T
    (ref,) = g.evaluate({"x": xv})
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-4)
    (got,) = rlx.Session("cpu").compile(g).run({"x": xv})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
