"""The int8 GEMM's splits over two threads (rlx/backends/cpu/native/csrc/qgemm_run.c) on
every ISA path this CPU runs, with the 2-thread threshold lowered
(``rlx_qgemm_set_mt_min``) so that small shapes take them: the column split (few row
tiles, enough column panels: each thread packs every row and claims panels), the old
shared split (few row tiles and few panels) and the row split. Each is checked against
an int64 NumPy product written here (accumulators, row scales and zero points) and,
for the f32 epilogue, for the same bits as one thread."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.cpu import native

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

ISAS = native.supported_isas()


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-native"))


@pytest.fixture
def any_size_on_two_threads():
    """Every GEMM of the test takes the 2-thread paths; the built-in threshold after.
    (A second thread that comes late makes the next column splits run on one thread: the
    tests clear that count before each 2-thread run.)"""
    libs = [native.qgemm_lib(isa) for isa in ISAS]
    for lib in libs:
        lib.lib.rlx_qgemm_set_mt_min(1.0)
    yield
    for lib in libs:
        lib.lib.rlx_qgemm_set_mt_min(0.0)


def quantize_rows_u8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The oracle u8 per-row quantizer in f32 NumPy: scale (max(0, max x) - min(0, min
    x)) / 255 (1 for a zero row), zero point rint(-min / scale). Returns (q int64,
    scales f32, zero points int64)."""
    lo = np.minimum(x.min(axis=1), np.float32(0))
    hi = np.maximum(x.max(axis=1), np.float32(0))
    scale = ((hi - lo) / np.float32(255)).astype(np.float32)
    scale = np.where(scale == 0, np.float32(1), scale).astype(np.float32)
    zp = np.clip(np.rint(-lo / scale), 0, 255).astype(np.int64)
    q = np.clip(np.rint(x / scale[:, None]).astype(np.int64) + zp[:, None], 0, 255)
    return q, scale, zp


# (m, k, n): column split (1 and 7 row tiles, panels odd and ragged), few panels
# (the shared split), many row tiles (the row split), a K with several K slices
SHAPES = [
    (1, 384, 384),
    (16, 384, 1536),
    (16, 1536, 384),
    (5, 37, 200),
    (84, 70, 97),
    (16, 64, 40),
    (30, 20, 1),
    (200, 96, 64),
]


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_two_thread_splits_equal_the_oracle_and_one_thread(isa, m, k, n, any_size_on_two_threads):
    """Accumulators, row scales and zero points equal the int64 NumPy oracle on 2
    threads; the f32 epilogue (bias, GELU, residual) gives the same bits as 1 thread."""
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(m * 31 + k + n)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1))).astype(np.float32)
    x[m // 2] += 2.0  # an asymmetric row
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = lib.pack(w)
    c = np.empty((m, n), np.int32)
    rs, rz = np.empty(m, np.float32), np.empty(m, np.int32)
    lib.lib.rlx_qgemm_set_solo_calls(0)  # no back-off left from a late thread before
    lib.run(x, packed, n, mode=1, out_i32=c, row_scale=rs, row_zp=rz, num_threads=2)
    q, scale, zp = quantize_rows_u8(x)
    np.testing.assert_array_equal(rs, scale)
    np.testing.assert_array_equal(rz, zp)
    np.testing.assert_array_equal(c, (q - zp[:, None]) @ w.astype(np.int64))

    ws = rng.uniform(0.001, 0.01, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    outs = []
    for t in (1, 2):
        y = np.empty((m, n), np.float32)
        kw = dict(w_scales=ws, bias=bias, act="gelu", residual=res, out_f32=y)
        lib.lib.rlx_qgemm_set_solo_calls(0)
        lib.run(x, packed, n, mode=1, num_threads=t, **kw)
        outs.append(y)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
def test_static_int8_rows_on_the_column_split(isa, any_size_on_two_threads):
    """int8 activations with a zero point (no quantization) on the column split: the
    int64 NumPy product."""
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(7)
    m, k, n = 12, 300, 260
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    c = np.empty((m, n), np.int32)
    lib.lib.rlx_qgemm_set_solo_calls(0)
    lib.run(a, lib.pack(w), n, a_zero_point=-3, out_i32=c, num_threads=2)
    np.testing.assert_array_equal(c, (a.astype(np.int64) + 3) @ w.astype(np.int64))


def test_the_threshold_setter_restores_the_built_in_value():
    """``rlx_qgemm_set_mt_min(v)`` returns the previous value; ``v <= 0`` restores the
    built-in one."""
    lib = native.qgemm_lib()
    built_in = lib.lib.rlx_qgemm_set_mt_min(5.0)
    assert built_in > 1.0
    assert lib.lib.rlx_qgemm_set_mt_min(0.0) == 5.0
    assert lib.lib.rlx_qgemm_set_mt_min(0.0) == built_in


def test_solo_calls_after_a_late_thread_count_down_and_stay_exact(any_size_on_two_threads):
    """``rlx_qgemm_set_solo_calls(n)``: the next ``n`` column splits run on one thread
    (what a late second thread sets), each one counted down, with the oracle's result."""
    lib = native.qgemm_lib()
    rng = np.random.default_rng(11)
    m, k, n = 16, 96, 256
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = lib.pack(w)
    q, _, zp = quantize_rows_u8(x)
    lib.lib.rlx_qgemm_set_solo_calls(3)
    for _ in range(2):
        c = np.empty((m, n), np.int32)
        lib.run(x, packed, n, mode=1, out_i32=c, num_threads=2)
        np.testing.assert_array_equal(c, (q - zp[:, None]) @ w.astype(np.int64))
    assert lib.lib.rlx_qgemm_set_solo_calls(0) == 1
