"""The int8 GEMM's tile paths (rlx/backends/cpu/native/csrc/qgemm*.c) on every ISA path
this CPU runs (VNNI512, AVX2, plain C; on aarch64 NEON, SDOT, SMMLA): every count of real
rows in the last row tile (the 12 / 8 / 4 / 2-row VNNI kernels, the 6 / 4 / 2-row AVX2
ones, the 8 / 6 / 4 / 2-row SMMLA, 8 / 4 / 2-row SDOT and 4 / 2-row NEON ones), K with and without a
ragged last 4-byte group and 16-lane vector, K long enough for several K slices (the
sums then carry over from one slice to the next), full and ragged column panels through
the tile epilogue (bias, activation, residual), and the dynamic per-row quantization
fused into the A packing (s8 and u8, f32 and bf16 rows, a row holding NaN) against a
NumPy quantizer and an int64 NumPy product written here."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from rlx.backends.cpu import native

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

ISAS = native.supported_isas()
ROWS = [*range(1, 14), 16, 25]


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-native"))


def quantize_rows(x: np.ndarray, mode: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The oracle quantizer, in f32 NumPy: mode 0 s8 with scale max|x| / 127, mode 1 u8
    with scale (max(0, max x) - min(0, min x)) / 255 and zero point rint(-min / scale);
    a zero row takes scale 1. Returns (q int64, scales f32, zero points int64)."""
    x = x.astype(np.float32)
    if mode == 0:
        scale = np.abs(x).max(axis=1) / np.float32(127)
        zp = np.zeros(len(x), np.int64)
    else:
        lo = np.minimum(x.min(axis=1), np.float32(0))
        hi = np.maximum(x.max(axis=1), np.float32(0))
        scale = (hi - lo) / np.float32(255)
    scale = np.where(scale == 0, np.float32(1), scale).astype(np.float32)
    if mode == 1:
        zp = np.clip(np.rint(-lo / scale), 0, 255).astype(np.int64)
    q = np.rint(x / scale[:, None]).astype(np.int64) + zp[:, None]
    q = np.clip(q, -128, 127) if mode == 0 else np.clip(q, 0, 255)
    return q, scale, zp


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize(("k", "n"), [(3, 32), (16, 33), (37, 64), (1100, 40)])
def test_dynamic_rows_every_tail(isa, mode, k, n):
    """Accumulators exact for every row count of the last tile, K tails and slices."""
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(k * 7 + n + mode)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = lib.pack(w)
    for m in ROWS:
        x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1))).astype(np.float32)
        x[m // 2] += 3.0  # an asymmetric row: a u8 zero point far from 128
        c = np.empty((m, n), np.int32)
        rs, rz = np.empty(m, np.float32), np.empty(m, np.int32)
        lib.run(x, packed, n, mode=mode, out_i32=c, row_scale=rs, row_zp=rz)
        q, scale, zp = quantize_rows(x, mode)
        np.testing.assert_array_equal(rs, scale, err_msg=f"m={m}")
        np.testing.assert_array_equal(rz, zp, err_msg=f"m={m}")
        np.testing.assert_array_equal(c, (q - zp[:, None]) @ w.astype(np.int64), f"m={m}")


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("n", [32, 64, 45])
@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_tile_epilogue(isa, n, act):
    """f32 outputs through the tile epilogue: f32(acc) * (row scale * w scale) + bias,
    the activation, + residual, against NumPy within f32 rounding."""
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(n)
    k = 70
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = lib.pack(w)
    ws = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    for m in (1, 5, 12, 16, 29):
        x = rng.standard_normal((m, k)).astype(np.float32)
        res = rng.standard_normal((m, n)).astype(np.float32)
        y = np.empty((m, n), np.float32)
        lib.run(x, packed, n, mode=0, w_scales=ws, bias=bias, act=act, residual=res, out_f32=y)
        q, scale, _ = quantize_rows(x, 0)
        acc = (q @ w.astype(np.int64)).astype(np.float64)
        ref = acc * (scale[:, None].astype(np.float64) * ws) + bias
        if act == "relu":
            ref = np.maximum(ref, 0)
        elif act == "gelu":
            from scipy.special import erf

            ref = 0.5 * ref * (1 + erf(ref / np.sqrt(2)))
        np.testing.assert_allclose(y, ref + res, rtol=2e-5, atol=2e-5, err_msg=f"m={m}")


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
def test_bf16_rows_and_a_nan_row(isa):
    """bf16 rows widened then quantized like f32 rows; a row holding NaN gives NaN
    outputs and leaves the other rows of its tile exact."""
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(5)
    m, k, n = 13, 50, 33
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[3, 7] = np.nan
    xb = x.astype(ml_dtypes.bfloat16)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    ws = np.full(n, 0.01, np.float32)
    y = np.empty((m, n), np.float32)
    lib.run(xb, lib.pack(w), n, mode=1, w_scales=ws, out_f32=y)
    assert np.isnan(y[3]).all()
    good = np.arange(m) != 3
    q, scale, zp = quantize_rows(xb.astype(np.float32)[good], 1)
    acc = (q - zp[:, None]) @ w.astype(np.int64)
    ref = acc.astype(np.float32) * (scale[:, None] * ws)
    np.testing.assert_allclose(y[good], ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("unsigned", [False, True])
def test_static_rows_every_tail(isa, unsigned):
    """int8 / uint8 activations (the s8 + 128 shift, a zero point) packed straight into
    the tile, exact for every row count and a ragged K, at the saturation corner: every
    activation at its extreme against weights of -128 (8-bit) and -64 (the AVX2 7-bit
    kernel)."""
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(int(unsigned))
    k, n = 45, 40
    for lim in (128, 64):
        w = np.full((k, n), -lim, np.int8)
        w[::3] = rng.integers(-lim, lim, (len(w[::3]), n), dtype=np.int8)
        packed = lib.pack(w)
        for m in ROWS:
            if unsigned:
                a = np.full((m, k), 255, np.uint8)
                zp = 7
            else:
                a = np.full((m, k), -128, np.int8)
                zp = -3
            a[:, ::5] = rng.integers(0 if unsigned else -128, 128, (m, len(a[0, ::5])))
            c = np.empty((m, n), np.int32)
            lib.run(a, packed, n, a_zero_point=zp, out_i32=c)
            ref = (a.astype(np.int64) - zp) @ w.astype(np.int64)
            np.testing.assert_array_equal(c, ref, err_msg=f"m={m} lim={lim}")


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("mode", [2, 3])
@pytest.mark.parametrize("k", [5, 37, 64])
def test_static_f32_rows_quantized_in_the_packing(isa, mode, k):
    """f32 rows quantized with one scale and zero point (mode 2: to int8, 3: to uint8)
    straight into the tile: clip(rint(x / scale) + zp) with NaN at the zero point and
    +-inf saturated, the accumulator exact against NumPy, every row count."""
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(k + mode)
    n, scale = 21, np.float32(0.037)
    zp, lo, hi = (-5, -128, 127) if mode == 2 else (131, 0, 255)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = lib.pack(w)
    for m in ROWS:
        x = (rng.standard_normal((m, k)) * 4).astype(np.float32)
        x[0, : min(k, 3)] = [np.nan, np.inf, -np.inf][: min(k, 3)]
        c = np.empty((m, n), np.int32)
        lib.run(x, packed, n, a_zero_point=zp, a_scale=float(scale), mode=mode, out_i32=c)
        t = np.rint(x / scale)
        q = np.clip(np.where(np.isnan(t), 0, t) + zp, lo, hi).astype(np.int64)
        np.testing.assert_array_equal(c, (q - zp) @ w.astype(np.int64), f"m={m}")
