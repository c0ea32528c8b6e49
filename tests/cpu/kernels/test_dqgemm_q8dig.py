"""The exact Q8_0 decode GEMV on AVX-512 VNNI (``csrc/dqgemm_q8dig.c``: the activation as
integer digits with an exponent per 4 inputs, ``vpdpbusd``; blocks whose digits would lose
too much fall back to the f32 kernel's arithmetic) against NumPy f64 products of the weights ``gguf.quants`` decodes,
within the f32 accumulation bound of test_quant_dequant.check_close: K 32 (the smallest
Q8_0 allows), 64, 640 and 2048, N with tails (not multiples of R), plain and interleaved
layouts, 1 and 2 threads (identical bits), and adversarial activations: a large entry
against a zero weight code in every row next to entries 2^-1 .. 2^-40 of it (the case
where digits relative to the block's largest entry would break the bound), zeros,
denormals, tiny and huge values, +-FLT_MAX against zero codes, +-inf and NaN (as the f32
kernels: RLX_DQ_Q8_DIGITS=0 gives the f32 group kernel, compared bit for bit where every
block falls back)."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.dqgemm import dqgemm_lib, repack
from rlx.formats import schemes as S
from tests.cpu.kernels.test_quant_dequant import check_close, make_weight

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

FLAGS = cpu.cpu_flags()
HAS_DIG = (
    "avx512_bf16" in FLAGS
    and "avx512_vnni" in FLAGS
    and cpu.Target.AVX512 in cpu.runnable_targets()
)
needs_dig = pytest.mark.skipif(not HAS_DIG, reason="this CPU has no avx512_vnni / avx512_bf16")
Q8 = S.GgufQ8_0()


def _decode(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    blocks = packed.reshape(-1, 34)
    w = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
    return np.asarray(w, np.float32).reshape(n, k)


def _run(x, packed, n, k, rows, threads, monkeypatch, digits="1"):
    monkeypatch.setenv("RLX_DQ_Q8_DIGITS", digits)
    lib = dqgemm_lib(cpu.Target.AVX512)
    assert lib.uses_bf16(Q8, 1, "f32")
    ws = (packed if rows == 1 else repack(Q8, packed, n, k, rows),)
    out = np.full((1, n), np.nan, np.float32)
    lib.gemm(Q8, x, ws, out, num_threads=threads, rows=rows)
    return out


@needs_dig
def test_q8dig_matches_f64_and_threads_agree(monkeypatch) -> None:
    """K 32 / 64 / 640 / 2048, N with tails, R 1 / 4 / 8: within the bound; 1 and 2
    threads give the same bits; on normal activations the digit path differs from the f32
    group kernel (so it ran) and both are within the bound."""
    rng = np.random.default_rng(7)
    for k in (32, 64, 640, 2048):
        for n, rows in ((13, 8), (37, 4), (1029, 8), (21, 1)):
            (packed,), w = make_weight(Q8, n, k, rng)
            x = rng.standard_normal((1, k)).astype(np.float32)
            one = _run(x, packed, n, k, rows, 1, monkeypatch)
            check_close(one, x, w)
            np.testing.assert_array_equal(_run(x, packed, n, k, rows, 2, monkeypatch), one)
            f32 = _run(x, packed, n, k, rows, 1, monkeypatch, digits="0")
            check_close(f32, x, w)
            if rows > 1 and n >= 37 and k >= 640:  # at K 32 a block often falls back
                assert (one != f32).any(), (k, n, rows)
            if rows == 1:  # plain layout: the f32 kernel either way
                np.testing.assert_array_equal(one, f32)


def _outlier_x(k: int, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """Per 32-block: entry 5 is +-1e3, the rest standard normal times 1e3 ratio."""
    x = rng.standard_normal((1, k)) * 1e3 * ratio
    x[0, 5::32] = 1e3 * rng.choice([-1.0, 1.0], k // 32)
    return x.astype(np.float32)


@needs_dig
@pytest.mark.parametrize("k", [32, 640, 2048])
def test_q8dig_large_entry_against_zero_codes(k, monkeypatch) -> None:
    """The largest entry of every block (input 5, in the digit group of inputs 4 .. 7)
    meets a zero code in every row, the others are 2^-1 .. 2^-40 of it: the bound then
    counts only the small entries' products, which digits relative to the group's largest
    would truncate; blocks past the threshold fall back, and every result stays within the
    bound (1 and 2 threads equal)."""
    rng = np.random.default_rng(k)
    n = 45
    (packed,), _ = make_weight(Q8, n, k, rng)
    packed.reshape(n, k // 32, 34)[:, :, 2 + 5] = 0  # code 0 at input 5 of every block
    w = _decode(packed, n, k)
    assert (w[:, 5::32] == 0).all()
    for p in range(1, 41, 3):
        x = _outlier_x(k, 2.0**-p, rng)
        got = _run(x, packed, n, k, 8, 1, monkeypatch)
        check_close(got, x, w)
        np.testing.assert_array_equal(_run(x, packed, n, k, 8, 2, monkeypatch), got)


def _kind(kind: str, k: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((1, k))
    if kind == "zeros":
        x[0, rng.random(k) < 0.5] = 0.0
    elif kind == "all_zero":
        x[:] = 0.0
    elif kind == "tiny":
        x *= 1e-30  # digits with a small exponent
    elif kind == "tinier":
        x *= 1e-37  # under 2^-103: every block falls back
    elif kind == "denormal":
        x[0, ::3] *= 1e-40
    elif kind == "huge":
        x *= 1e35
    elif kind == "spread":
        x *= 10.0 ** rng.uniform(-20, 20, (1, k))
    elif kind == "integers":  # exact digits
        x = rng.integers(-1000, 1000, (1, k)).astype(np.float64)
    return x.astype(np.float32)


KINDS = ["zeros", "all_zero", "tiny", "tinier", "denormal", "huge", "spread", "integers"]


@needs_dig
@pytest.mark.parametrize("kind", KINDS)
def test_q8dig_adversarial_activations(kind, monkeypatch) -> None:
    """Zeros, an all-zero x, tiny, denormal, huge, widely spread and integer activations at
    K 32 and 640: within the bound and finite; where every block must fall back (1e-37,
    denormals in every block) the bits are the f32 group kernel's."""
    rng = np.random.default_rng(len(kind))
    for k in (32, 640):
        n = 29
        (packed,), w = make_weight(Q8, n, k, rng)
        x = _kind(kind, k, rng)
        got = _run(x, packed, n, k, 8, 1, monkeypatch)
        assert np.isfinite(got).all()
        check_close(got, x, w)
        if kind in ("tinier", "denormal"):
            f32 = _run(x, packed, n, k, 8, 1, monkeypatch, digits="0")
            np.testing.assert_array_equal(got, f32)
        if kind == "all_zero":
            assert (got == 0).all()


@needs_dig
def test_q8dig_flt_max_against_zero_codes(monkeypatch) -> None:
    """+-FLT_MAX times a zero code adds 0 (the block falls back: its other entries are far
    below FLT_MAX), K 32 and 640."""
    rng = np.random.default_rng(5)
    for k in (32, 640):
        n = 13
        (packed,), _ = make_weight(Q8, n, k, rng)
        packed[:, 2 + 5] = 0
        packed[:, 2 + 9] = 0
        w = _decode(packed, n, k)
        x = rng.standard_normal((1, k)).astype(np.float32)
        x[0, 5] = np.finfo(np.float32).max
        x[0, 9] = -np.finfo(np.float32).max
        got = _run(x, packed, n, k, 8, 1, monkeypatch)
        assert np.isfinite(got).all()
        check_close(got, x, w)


@needs_dig
def test_q8dig_non_finite_activations(monkeypatch) -> None:
    """+-inf gives the f64 product's +-inf or NaN per row, NaN gives NaN, bit for bit what
    the f32 group kernel gives (the block with the non-finite entry falls back), K 32 and
    2048."""
    rng = np.random.default_rng(17)
    for k in (32, 2048):
        n = 21
        (packed,), w = make_weight(Q8, n, k, rng)
        packed[3, 2 + 3] = 0  # a zero code against the inf: NaN in row 3
        w = _decode(packed, n, k)
        for v in (np.inf, -np.inf):
            x = rng.standard_normal((1, k)).astype(np.float32)
            x[0, 3] = v
            with np.errstate(invalid="ignore"):
                want = x.astype(np.float64) @ w.astype(np.float64).T
            got = _run(x, packed, n, k, 8, 1, monkeypatch)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            fin = ~np.isnan(want)
            np.testing.assert_array_equal(got[fin], want[fin])
            np.testing.assert_array_equal(got, _run(x, packed, n, k, 8, 1, monkeypatch, "0"))
        x[0, 3] = np.nan
        assert np.isnan(_run(x, packed, n, k, 8, 1, monkeypatch)).all()


def test_q8dig_flag_values(monkeypatch) -> None:
    """RLX_DQ_Q8_DIGITS follows rlx.config's flag rules: on by default, off / 0 off, any
    other word a ConfigError naming the variable."""
    from rlx.backends.cpu.native.dqgemm import q8_digits
    from rlx.errors import ConfigError

    monkeypatch.delenv("RLX_DQ_Q8_DIGITS", raising=False)
    assert q8_digits()
    for v, want in (("0", False), (" Off", False), ("1", True), ("ON", True)):
        monkeypatch.setenv("RLX_DQ_Q8_DIGITS", v)
        assert q8_digits() is want
    monkeypatch.setenv("RLX_DQ_Q8_DIGITS", "maybe")
    with pytest.raises(ConfigError, match="RLX_DQ_Q8_DIGITS"):
        q8_digits()
