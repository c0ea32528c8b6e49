"""The native int8 GEMM's dynamic (per-row) activation quantization and its fused f32
epilogue, on every ISA path this CPU runs, against a NumPy re-implementation of the
published method written here (ONNX DynamicQuantizeLinear for u8; symmetric max-abs / 127
for s8; round half to even in f32), never rlx's own reference: row scales and zero points
bit for bit, the int32 accumulator exactly (int64 NumPy), and every epilogue (bias, relu,
erf GELU (SciPy's erf), tanh GELU, SiLU, residual) within float tolerance."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erf

from rlx.backends.cpu import native

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

ISAS = native.supported_isas()
F = np.float32


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-native"))


def method(x: np.ndarray, unsigned: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row dynamic quantization, one row at a time in f32 (q int64, scale, zp)."""
    qs, scales, zps = [], [], []
    for row in x.astype(F):
        finite = bool(np.isfinite(row).all())
        if unsigned:
            lo = min(F(0), row.min(initial=F(0)))
            hi = max(F(0), row.max(initial=F(0)))
            scale = F(F(hi - lo) / F(255))
        else:
            scale = F(np.abs(row).max(initial=F(0)) / F(127))
        if not finite or not np.isfinite(scale):
            qs.append(np.zeros(row.shape, np.int64))
            scales.append(F(np.nan))
            zps.append(0)
            continue
        if scale == 0:
            scale = F(1)
        zp = int(np.clip(np.rint(F(-lo) / scale), 0, 255)) if unsigned else 0
        lo_q, hi_q = (0, 255) if unsigned else (-128, 127)
        q = np.clip(np.rint(row / scale).astype(np.int64) + zp, lo_q, hi_q)
        qs.append(q)
        scales.append(scale)
        zps.append(zp)
    return np.array(qs).reshape(x.shape), np.array(scales, F), np.array(zps, np.int64)


def act_ref(y: np.ndarray, act: str | None) -> np.ndarray:
    y64 = y.astype(np.float64)
    if act == "relu":
        return np.maximum(y64, 0)
    if act == "gelu":
        return 0.5 * y64 * (1 + erf(y64 / np.sqrt(2)))
    if act == "gelu_tanh":
        return 0.5 * y64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (y64 + 0.044715 * y64**3)))
    if act == "silu":
        return y64 / (1 + np.exp(-y64))
    return y64


def run(lib, x, w, unsigned, **kw):
    m, n = x.shape[0], w.shape[1]
    y = np.empty((m, n), F)
    c = np.empty((m, n), np.int32)
    rs, rz = np.empty(m, F), np.empty(m, np.int32)
    ws = kw.pop("w_scales", np.full(n, 0.01, F))
    lib.run(x, lib.pack(w), n, mode=int(unsigned), w_scales=ws, out_f32=y, row_scale=rs,
            row_zp=rz, **kw)  # fmt: skip
    lib.run(x, lib.pack(w), n, mode=int(unsigned), out_i32=c)
    return y, c, rs, rz


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("unsigned", [False, True], ids=["s8", "u8"])
@settings(max_examples=15, deadline=None)
@given(
    m=st.integers(1, 26),
    k=st.integers(1, 140),
    n=st.integers(1, 67),
    spread=st.floats(1e-3, 1e3),
    shift=st.floats(-2, 2),
    seed=st.integers(0, 2**16),
)
def test_row_quantization_and_accumulator(isa, unsigned, m, k, n, spread, shift, seed):
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(seed)
    x = ((rng.standard_normal((m, k)) + shift) * spread).astype(F)
    x[rng.random(m) < 0.2] = 0.0  # zero rows take scale 1
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    y, c, rs, rz = run(lib, x, w, unsigned)
    q, scale, zp = method(x, unsigned)
    np.testing.assert_array_equal(rs, scale)
    np.testing.assert_array_equal(rz, zp)
    acc = (q - zp[:, None]) @ w.astype(np.int64)
    np.testing.assert_array_equal(c, acc)
    np.testing.assert_array_equal(y, acc.astype(F) * (scale[:, None] * F(0.01)))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("unsigned", [False, True], ids=["s8", "u8"])
def test_every_epilogue(isa, act, unsigned):
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(7)
    m, k, n = 29, 77, 51  # ragged edges in every dim
    x = (rng.standard_normal((m, k)) * 2).astype(F)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    ws = rng.uniform(5e-4, 5e-3, n).astype(F)
    bias = rng.standard_normal(n).astype(F)
    res = rng.standard_normal((m, n)).astype(F)
    y, _, _, _ = run(lib, x, w, unsigned, w_scales=ws, bias=bias, act=act, residual=res)
    q, scale, zp = method(x, unsigned)
    acc = (q - zp[:, None]) @ w.astype(np.int64)
    pre = acc.astype(F) * (scale[:, None] * ws) + bias
    want = act_ref(pre, act) + res
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
def test_bf16_rows_equal_their_f32_widening(isa):
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(8)
    x16 = rng.standard_normal((13, 70)).astype(ml_dtypes.bfloat16)
    w = rng.integers(-128, 128, (70, 9), dtype=np.int8)
    for unsigned in (False, True):
        y16 = run(lib, x16, w, unsigned, act="silu")[0]
        y32 = run(lib, x16.astype(F), w, unsigned, act="silu")[0]
        np.testing.assert_array_equal(y16, y32)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_non_finite_rows_give_nan_and_leave_other_rows_alone(isa, act):
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 40)).astype(F)
    x[1, 3], x[2, 0], x[4, 39] = np.nan, np.inf, -np.inf
    w = rng.integers(-128, 128, (40, 11), dtype=np.int8)
    y, _, rs, _ = run(lib, x, w, False, act=act, bias=np.ones(11, F))
    bad = [1, 2, 4]
    assert np.isnan(rs[bad]).all() and np.isnan(y[bad]).all()
    good = [0, 3, 5]
    assert np.isfinite(y[good]).all()
    ref, _, _, _ = run(lib, x[good], w, False, act=act, bias=np.ones(11, F))
    np.testing.assert_array_equal(y[good], ref)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
def test_activation_tails_stay_finite_and_accurate(isa):
    """Large |y| (exp arguments beyond +-88): the epilogue's exp is clamped, not NaN."""
    lib = native.qgemm_lib(isa)
    k, n = 4, 8
    x = np.array([[1.0, 0.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0]], F)
    w = np.zeros((k, n), np.int8)
    w[0] = [127, 100, 50, 10, 1, -1, -50, -128]
    ws = np.full(n, 2.0, F)  # y up to +-256
    for act in ("gelu", "gelu_tanh", "silu"):
        y, c, rs, _ = run(lib, x, w, False, act=act, w_scales=ws)
        pre = c.astype(F) * (rs[:, None] * ws)
        np.testing.assert_allclose(y, act_ref(pre, act), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("unsigned", [False, True], ids=["s8", "u8"])
def test_quantize_rows_is_the_method(isa, unsigned):
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(10)
    x = (rng.standard_normal((9, 83)) * 5).astype(F)
    x[2] = 0.0
    x[5, 1] = np.inf
    q, s, z = lib.quantize_rows(x, int(unsigned))
    wq, ws, wz = method(x, unsigned)
    assert q.dtype == (np.uint8 if unsigned else np.int8)
    np.testing.assert_array_equal(q.astype(np.int64), wq)
    np.testing.assert_array_equal(s, ws)
    np.testing.assert_array_equal(z, wz)
