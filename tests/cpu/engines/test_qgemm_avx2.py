"""The AVX2 int8 GEMM's two micro-kernels (rlx/backends/cpu/native/csrc/qgemm.c, path 1),
built for both the AVX2 and the AVX512 target: the vpmaddubsw kernel taken for 7-bit
weights ([-64, 64]) and the vpmaddwd kernel for any other 8-bit weight, each exact against
a NumPy int64 product (static int8 / uint8 activations with zero points, f32 rows
quantized per row in the prologue against a NumPy quantizer written here), at the
saturation corners of vpmaddubsw (u8 255 against +-64 in every pair), and the f32
epilogue against NumPy. The peak probes of both targets report the instructions the
kernels use."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx.backends.cpu import native
from rlx.backends.cpu.native.cpu import Isa, Target
from rlx.backends.cpu.native.peak import PeakKind, measure_lowp_peak

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

TARGETS = [t for t in (Target.AVX2, Target.AVX512) if t in native.runnable_targets()]


@pytest.fixture(params=TARGETS, ids=lambda t: t.value)
def lib(request, monkeypatch, tmp_path_factory):
    """The AVX2 int8 GEMM built for one target (RLX_ISA forced to it)."""
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-native"))
    monkeypatch.setenv("RLX_ISA", request.param.value)
    return native.qgemm_lib(Isa.AVX2)


def acc64(a: np.ndarray, zp: int, w: np.ndarray) -> np.ndarray:
    """The oracle: ``(a - zp) @ w`` in int64."""
    return (a.astype(np.int64) - zp) @ w.astype(np.int64)


def quantize_rows_s8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric int8 quantization in f32 NumPy (scale max|x| / 127, a zero row
    scale 1, q = clip(rint(x / scale), -128, 127)): the dynamic GEMM's documented rule."""
    amax = np.max(np.abs(x), axis=1).astype(np.float32)
    scale = (amax / np.float32(127.0)).astype(np.float32)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(x / scale[:, None]), -128, 127).astype(np.int8)
    return q, scale


@pytest.mark.parametrize(("lim", "narrow"), [(64, True), (65, False), (128, False)])
def test_the_kernel_follows_the_weight_range(lib, lim, narrow) -> None:
    k, n = 37, 21
    w = np.random.default_rng(lim).integers(-lim + 1, lim, (k, n), dtype=np.int8)
    w[5, 3] = -lim if lim <= 128 else w[5, 3]
    assert lib.takes_7bit(lib.pack(w), k, n) is narrow


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    m=st.integers(1, 20),
    k=st.integers(1, 140),
    n=st.integers(1, 40),
    unsigned=st.booleans(),
    zp=st.integers(0, 255),
    seven=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_static_accumulator_is_exact_on_both_kernels(lib, m, k, n, unsigned, zp, seven, seed):
    """(the fixture only selects a built library: nothing in it changes between inputs)"""
    rng = np.random.default_rng(seed)
    if unsigned:
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    else:
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        zp -= 128
    lo, hi = (-64, 65) if seven else (-128, 128)
    w = rng.integers(lo, hi, (k, n), dtype=np.int8)
    packed = lib.pack(w)
    assert lib.takes_7bit(packed, k, n) == bool(np.all(np.abs(w.astype(int)) <= 64))
    c = np.empty((m, n), np.int32)
    lib.run(a, packed, n, a_zero_point=zp, out_i32=c, num_threads=2)
    np.testing.assert_array_equal(c, acc64(a, zp, w))


@pytest.mark.parametrize(("k", "n"), [(1, 1), (4, 16), (7, 17), (130, 33), (384, 48)])
@pytest.mark.parametrize("wv", [64, -64, 127, -128])
def test_saturation_corners_are_exact(lib, k, n, wv) -> None:
    """u8 255 against the weight extreme in every pair: 2 * 255 * 64 = 32640 is the
    largest pair sum the vpmaddubsw kernel meets (it saturates above 32767); 127 / -128
    go to the vpmaddwd kernel."""
    a = np.full((7, k), 255, np.uint8)
    w = np.full((k, n), wv, np.int8)
    c = np.empty((7, n), np.int32)
    lib.run(a, lib.pack(w), n, out_i32=c)
    np.testing.assert_array_equal(c, acc64(a, 0, w))
    a8 = np.full((7, k), -128, np.int8)
    lib.run(a8, lib.pack(w), n, out_i32=c)
    np.testing.assert_array_equal(c, acc64(a8, 0, w))


@pytest.mark.parametrize("seven", [True, False])
def test_dynamic_rows_and_epilogue_match_numpy(lib, seven) -> None:
    rng = np.random.default_rng(3)
    m, k, n = 13, 200, 35
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[4] = 0.0  # a zero row: scale 1
    lo, hi = (-64, 65) if seven else (-128, 128)
    w = rng.integers(lo, hi, (k, n), dtype=np.int8)
    packed = lib.pack(w)
    q, scale = quantize_rows_s8(x)
    c = np.empty((m, n), np.int32)
    rs = np.empty(m, np.float32)
    lib.run(x, packed, n, mode=0, out_i32=c, row_scale=rs)
    np.testing.assert_array_equal(c, acc64(q, 0, w))
    np.testing.assert_array_equal(rs, scale)
    ws = rng.uniform(0.001, 0.01, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    y = np.empty((m, n), np.float32)
    lib.run(x, packed, n, mode=0, w_scales=ws, bias=bias, act="relu", out_f32=y)
    want = np.maximum(acc64(q, 0, w) * (scale[:, None] * ws[None, :]).astype(np.float64) + bias, 0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_peak_probes_name_the_kernels_instructions(lib) -> None:
    target = native.selected_target()
    p8 = measure_lowp_peak(PeakKind.INT8, 1, seconds=0.004, tries=2)
    p16 = measure_lowp_peak(PeakKind.INT16, 1, seconds=0.004, tries=2)
    bf = measure_lowp_peak(PeakKind.BF16, 1, seconds=0.004, tries=2)
    assert p16.available and p16.instruction == "vpmaddwd ymm" and p16.gops > 0
    assert p8.available and p8.gops > 0
    if target is Target.AVX2:
        assert p8.instruction == "vpmaddubsw + vpmaddwd ymm" and p8.macs_per_instruction == 32
        assert not bf.available and bf.gops == 0.0
        assert "no bf16" in bf.describe()
    elif native.target_spec(target).vnni:
        assert p8.instruction == "vpdpbusd zmm" and p8.macs_per_instruction == 64
