"""The native int8 GEMM's integer accumulator, exact against int64 NumPy on every ISA path
this CPU runs (AVX-512 VNNI, AVX2, plain C; on aarch64 NEON, SDOT, SMMLA): static int8 / uint8 activations with any zero
point, ragged shapes (K not a multiple of 4 or 64, M = 1, odd N), the AVX2 saturation corner
(uint8 255 x int8 -128 in every pair, where vpmaddubsw's int16 pair sum would saturate),
strided weight packing, and identical results on 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx.backends.cpu import native
from rlx.errors import InputError

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

ISAS = native.supported_isas()


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-native"))


def acc64(a: np.ndarray, zp: int, w: np.ndarray) -> np.ndarray:
    """The oracle: ``(a - zp) @ w`` in int64."""
    return (a.astype(np.int64) - zp) @ w.astype(np.int64)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 30),
    k=st.integers(1, 150),
    n=st.integers(1, 70),
    unsigned=st.booleans(),
    zp=st.integers(0, 255),
    seed=st.integers(0, 2**16),
)
def test_static_accumulator_is_exact(isa, m, k, n, unsigned, zp, seed):
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(seed)
    if unsigned:
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    else:
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        zp -= 128
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    c = np.empty((m, n), np.int32)
    lib.run(a, lib.pack(w), n, a_zero_point=zp, out_i32=c, num_threads=2)
    np.testing.assert_array_equal(c, acc64(a, zp, w))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize(("k", "n"), [(1, 1), (3, 5), (63, 33), (65, 17), (130, 1), (384, 47)])
def test_saturation_corners_are_exact(isa, k, n):
    """u8 255 against s8 -128 and s8 -128 against s8 -128 in every k pair / quad: the
    largest pair sums (2 * 255 * 128 = 65280 > 32767) any 8-bit kernel meets."""
    lib = native.qgemm_lib(isa)
    w = np.full((k, n), -128, np.int8)
    w[:, ::2] = 127
    for a, zp in (
        (np.full((7, k), 255, np.uint8), 0),
        (np.full((7, k), -128, np.int8), 0),
        (np.full((7, k), -128, np.int8), 127),
        (np.full((7, k), 0, np.uint8), 255),
    ):
        c = np.empty((7, n), np.int32)
        y = np.empty((7, n), np.float32)
        lib.run(
            a,
            lib.pack(w),
            n,
            a_zero_point=zp,
            w_scales=np.ones(n, np.float32),
            out_i32=c,
            out_f32=y,
            num_threads=1,
        )
        want = acc64(a, zp, w)
        np.testing.assert_array_equal(c, want)
        np.testing.assert_array_equal(y, want.astype(np.float32))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize(("m", "k", "n"), [(1, 1100, 33), (61, 2050, 70), (300, 520, 9)])
def test_long_k_and_many_row_blocks_are_exact(isa, m, k, n):
    """K over several L1 slices (K = 1100, 2050 > 512) and M over several L2 blocks."""
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(k)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    c = np.empty((m, n), np.int32)
    lib.run(a, lib.pack(w), n, a_zero_point=77, out_i32=c, num_threads=2)
    np.testing.assert_array_equal(c, acc64(a, 77, w))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
def test_strided_packing_equals_packing_a_copy(isa):
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(3)
    wt = rng.integers(-128, 128, (19, 45), dtype=np.int8)  # [N, K]: use its transpose
    a = rng.integers(-128, 128, (9, 45), dtype=np.int8)
    c1, c2 = np.empty((9, 19), np.int32), np.empty((9, 19), np.int32)
    lib.run(a, lib.pack_strided(wt.T), 19, out_i32=c1)
    lib.run(a, lib.pack(np.ascontiguousarray(wt.T)), 19, out_i32=c2)
    np.testing.assert_array_equal(c1, acc64(a, 0, wt.T))
    np.testing.assert_array_equal(c1, c2)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize(("m", "k"), [(200, 300), (260, 384), (40, 8192)])
def test_two_threads_give_the_same_bits(isa, m, k):
    """Rows split between the threads (M large; K = 384 takes AMX where granted) or the
    panels split after all rows are quantized (M small): the same bits as one thread."""
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(4)
    n = 170  # M*N*K above the 2-thread threshold
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = lib.pack(w)
    ws = rng.uniform(0.001, 0.01, n).astype(np.float32)
    outs = []
    for t in (1, 2):
        y = np.empty((m, n), np.float32)
        lib.run(x, packed, n, mode=1, w_scales=ws, act="gelu", out_f32=y, num_threads=t)
        outs.append(y)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_bad_arguments_are_input_errors_naming_the_array():
    lib = native.qgemm_lib()
    w = np.zeros((8, 4), np.int8)
    packed = lib.pack(w)
    x = np.zeros((3, 8), np.float32)
    y = np.full((3, 4), 7.0, np.float32)
    with pytest.raises(InputError, match="out_f32 needs w_scales"):
        lib.run(x, packed, 4, out_f32=y)
    with pytest.raises(InputError, match=r"bias must be C-contiguous float32 \[4\]"):
        lib.run(x, packed, 4, w_scales=np.ones(4, np.float32), bias=np.ones(5, np.float32))
    with pytest.raises(InputError, match="act must be one of"):
        lib.run(x, packed, 4, act="tanh")
    with pytest.raises(InputError, match=r"not a \[9, 4\] weight"):
        lib.run(np.zeros((3, 9), np.float32), packed, 4)
    with pytest.raises(InputError, match="activations must be"):
        lib.run(np.zeros((3, 8), np.float64), packed, 4)
    assert (y == 7.0).all()  # nothing was written


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize(
    ("m", "k", "n"), [(1, 64, 5), (16, 128, 32), (17, 384, 33), (47, 1536, 70)]
)
def test_amx_tiles_equal_the_vector_path(isa, m, k, n):
    """K a multiple of 64 takes AMX-INT8 tiles where the CPU grants them (``has_amx``):
    exact against int64, and the fused f32 epilogue bit for bit the vector path's."""
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(m * k)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = lib.pack(w)
    x = (rng.standard_normal((m, k)) * 4).astype(np.float32)
    ws = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
    got = {}
    for amx in (True, False):
        c = np.empty((m, n), np.int32)
        lib.run(a, packed, n, a_zero_point=200, out_i32=c, num_threads=2, amx=amx)
        np.testing.assert_array_equal(c, acc64(a, 200, w))
        y = np.empty((m, n), np.float32)
        lib.run(x, packed, n, mode=1, w_scales=ws, act="gelu", out_f32=y, num_threads=2, amx=amx)
        got[amx] = y
    np.testing.assert_array_equal(got[True], got[False])
    if isa is not native.Isa.VNNI512:
        assert not lib.has_amx


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
def test_empty_operands(isa):
    """M = 0 writes nothing; K = 0 gives the epilogue of a zero accumulator (the bias)."""
    lib = native.qgemm_lib(isa)
    ones = np.ones(5, np.float32)
    y = np.empty((0, 5), np.float32)
    lib.run(np.ones((0, 64), np.float32), lib.pack(np.ones((64, 5), np.int8)), 5, mode=1,
            w_scales=ones, out_f32=y)  # fmt: skip
    y = np.full((3, 5), 7.0, np.float32)
    lib.run(np.ones((3, 0), np.float32), lib.pack(np.ones((0, 5), np.int8)), 5, mode=0,
            w_scales=ones, bias=2 * ones, act="relu", out_f32=y)  # fmt: skip
    np.testing.assert_array_equal(y, np.full((3, 5), 2.0, np.float32))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("k", [384, 1540])
def test_every_row_count_is_exact_and_keeps_its_row_values(isa, k):
    """Every M from 1 to 29 (the short last row tiles: 8-, 4- and 2-row VNNI
    kernels, 6 / 4 / 2 rows on AVX2), K over several slices: the int32 accumulator equals
    int64 NumPy, dynamic f32 rows give the f32 result of the full product row for row."""
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(k)
    n = 67
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = lib.pack(w)
    a = rng.integers(-128, 128, (29, k), dtype=np.int8)  # 12 + 12 + 5 rows (VNNI)
    x = rng.standard_normal((a.shape[0], k)).astype(np.float32)
    ws = rng.uniform(0.001, 0.01, n).astype(np.float32)
    full = np.empty((a.shape[0], n), np.float32)
    lib.run(x, packed, n, mode=1, w_scales=ws, out_f32=full)
    for m in range(1, a.shape[0] + 1):
        c = np.empty((m, n), np.int32)
        lib.run(a[:m], packed, n, a_zero_point=3, out_i32=c)
        np.testing.assert_array_equal(c, acc64(a[:m], 3, w), err_msg=f"m={m}")
        y = np.empty((m, n), np.float32)
        lib.run(x[:m], packed, n, mode=1, w_scales=ws, out_f32=y)
        np.testing.assert_array_equal(y, full[:m], err_msg=f"m={m}")
