"""The native bf16 / f16 weight product (``csrc/half_linear.c`` through
``rlx.backends.cpu.native.half_linear``) on every target this CPU runs (``RLX_ISA``
avx512 / avx2 / portable, each built into a temporary cache) and every SIMD level a
build holds. Oracle: NumPy float64 products of the exactly widened 16-bit weights; the
kernel must be within the f32 accumulation bound ``(K + 1) 2^-24 sum |x| |w|``."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import half_linear as hl
from rlx.errors import InputError
from rlx.models.llm import lowp

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

TARGETS = native.runnable_targets()


@pytest.fixture(params=TARGETS, ids=[t.value for t in TARGETS])
def lib(request, monkeypatch, tmp_path_factory) -> hl.HalfLinearLib:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-native"))
    monkeypatch.setenv("RLX_ISA", request.param.value)
    assert native.selected_target() is request.param
    out = hl.half_linear_lib()
    want = {native.Target.AVX512: 2, native.Target.AVX2: 1, native.Target.PORTABLE: 0}
    want |= {native.Target.NEON: 3, native.Target.DOTPROD: 3, native.Target.I8MM: 3}
    assert out.max_level == want[request.param]
    return out


def _oracle(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    k = x.shape[1]
    return x64 @ w64.T, (np.abs(x64) @ np.abs(w64).T) * (k + 1) * 2.0**-24


def _rand(rng: np.random.Generator, shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    return (rng.standard_normal(shape) * rng.uniform(0.01, 3.0)).astype(dt)


SHAPES = [(1, 1, 1), (1, 7, 5), (3, 33, 77), (2, 130, 1024), (5, 64, 17), (70, 21, 1000)]


@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_within_the_f32_accumulation_bound_at_every_level(lib, dt, m, n, k) -> None:
    rng = np.random.default_rng(m * 1000 + n + k)
    x, w = _rand(rng, (m, k), np.dtype(np.float32)), _rand(rng, (n, k), dt)
    want, bound = _oracle(x, w)
    for level in lib.levels:
        for threads in (1, 2):
            got = lib.linear(x, w, threads=threads, level=level)
            assert got.dtype == np.float32 and got.shape == (m, n)
            err = np.abs(got - want)
            assert (err <= bound).all(), (level, threads, float((err / bound).max()))


@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
def test_strided_rows_and_thread_counts_agree_bitwise(lib, dt) -> None:
    """Row strides wider than K (views of larger arrays, as a fused projection's rows
    are), and every thread count giving the same bits (one thread computes each output)."""
    rng = np.random.default_rng(7)
    xb = _rand(rng, (6, 300), np.dtype(np.float32))
    wb = _rand(rng, (300, 260), dt)
    x, w = xb[:, 11:211], wb[3:280, 40:240]  # 6 x 277 x 200: above the one-thread size
    out = np.full((6, 300), np.nan, np.float32)
    got = lib.linear(x, w, out=out[:, 5:282], threads=1)
    want, bound = _oracle(np.ascontiguousarray(x), np.ascontiguousarray(w))
    assert (np.abs(got - want) <= bound).all()
    assert np.isnan(out[:, :5]).all() and np.isnan(out[:, 282:]).all()  # nothing else written
    for threads in (2, 3, 8):
        again = lib.linear(x, w, threads=threads)
        np.testing.assert_array_equal(again, got)


@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
def test_special_values_follow_float64(lib, dt) -> None:
    """Subnormal weights widen exactly; inf and NaN weights give what float64 gives."""
    tiny = np.finfo(dt).smallest_subnormal
    rng = np.random.default_rng(3)
    k = 40
    w = np.zeros((6, k), dt)
    w[0] = tiny * np.arange(1, k + 1)
    w[1] = _rand(rng, (k,), dt)
    w[1, 17] = np.inf
    w[2, 3] = np.nan
    w[3] = -w[1]
    w[4, 39] = -np.inf
    w[5] = _rand(rng, (k,), dt)
    x = np.abs(_rand(rng, (2, k), np.dtype(np.float32))) + 0.5
    want, bound = _oracle(x, w)
    for level in lib.levels:
        got = lib.linear(x, w, level=level)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        fin = np.isfinite(want)
        np.testing.assert_array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)])
        assert (np.abs(got[fin] - want[fin]) <= bound[fin]).all()
        assert got[0, 0] > 0  # the subnormal row is not flushed to zero


def test_empty_contraction_gives_zeros(lib) -> None:
    got = lib.linear(np.ones((2, 0), np.float32), np.ones((3, 0), BF16))
    np.testing.assert_array_equal(got, np.zeros((2, 3), np.float32))


def test_bad_operands_are_input_errors(lib) -> None:
    x = np.ones((2, 8), np.float32)
    w = np.ones((3, 8), BF16)
    with pytest.raises(InputError, match="w must be bfloat16 or float16, given float32"):
        lib.linear(x, w.astype(np.float32))
    with pytest.raises(InputError, match="x must be float32, given float64"):
        lib.linear(x.astype(np.float64), w)
    with pytest.raises(InputError, match="x has K = 8, w has 4 columns"):
        lib.linear(x, w[:, :4].copy())
    with pytest.raises(InputError, match="w must have contiguous rows"):
        lib.linear(x[:, :4], np.ones((3, 8), BF16)[:, ::2])
    with pytest.raises(InputError, match=r"out must be \[2, 3\], given \[3, 2\]"):
        lib.linear(x, w, out=np.empty((3, 2), np.float32))
    with pytest.raises(InputError, match="x must be a 2-D array, given 1-D"):
        lib.linear(np.ones(8, np.float32), w)


@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
def test_the_decoders_op_runs_the_native_kernel(lib, dt) -> None:
    """``rlx.models.llm.lowp.half_linear`` (the custom op's body) takes [..., K]
    activations to the native kernel; its NumPy panel path (no library) agrees within
    the same bound."""
    rng = np.random.default_rng(11)
    x, w = _rand(rng, (2, 3, 96), np.dtype(np.float32)), _rand(rng, (50, 96), dt)
    want, bound = _oracle(x.reshape(6, 96), w)
    with lowp.use_threads(2):
        got = lowp.half_linear(x, w)
    np.testing.assert_array_equal(got.reshape(6, 50), lib.linear(x.reshape(6, 96), w))
    panel = lowp.half_linear(x, w, native=False).reshape(6, 50)
    for y in (got.reshape(6, 50), panel):
        assert (np.abs(y - want) <= bound).all()
