"""The bf16 dot-product decode GEMV (``csrc/dqgemm_bf16dot.c``: exact bf16 parts of the f32
activations, ``vdpbf16ps``) for Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (and its f32
group kernel for Q8_0), against NumPy f64 products of
the weights ``gguf.quants`` decodes, within the f32 accumulation bound of
test_quant_dequant.check_close: K at each scheme's minimum (32 / 256) and at the two-part
threshold (224: three parts, 256: two), N with tails of every row group (1, 7, 13, 37)
plain and interleaved by 4 / 8, 1 and 2 threads, and activations that are standard normal,
tiny (1e-30, 1e-37: parts below bf16's normal range are flushed by the instruction),
denormal, huge (1e35; FLT_MAX, whose rounding to bf16 would overflow, against a zero
code) and spread over 40 decades. Also: the kernel is selected exactly where the CPU has avx512_bf16 (the
AVX-512 target) and RLX_DQ_BF16=0 turns it off."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.dqgemm import dqgemm_lib, repack
from rlx.formats import schemes as S
from tests.cpu.kernels.test_quant_dequant import check_close, make_weight

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

#: the schemes rlx_dq_gemv_bf16 runs (Q8_0 on its f32 group kernel or, with VNNI on
#: interleaved rows, the digit kernel: test_dqgemm_q8dig.py)
BF16_NAMES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
#: the schemes whose min term is applied apart (w = d q + m: m times the sum of X)
MIN_TERM = ("Q4_1", "Q5_1", "Q4_K", "Q5_K")
HAS_BF16 = "avx512_bf16" in cpu.cpu_flags() and cpu.Target.AVX512 in cpu.runnable_targets()
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no avx512_bf16")


def _activations(kind: str, k: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((1, k))
    if kind == "tiny":
        x *= 1e-30
    elif kind == "tinier":
        x *= 1e-37  # h normal, m and l below bf16's normal range
    elif kind == "denormal":
        x[0, ::3] *= 1e-40  # f32 denormals next to normal values
    elif kind == "huge":
        x *= 1e35
    elif kind == "spread":
        x *= 10.0 ** rng.uniform(-20, 20, (1, k))
    return x.astype(np.float32)


def _run(lib, scheme, x, packed, n, k, rows, threads):
    ws = (packed if rows == 1 else repack(scheme, packed, n, k, rows),)
    out = np.full((1, n), np.nan, np.float32)
    lib.gemm(scheme, x, ws, out, num_threads=threads, rows=rows)
    return out


def test_selected_where_the_cpu_has_avx512_bf16(monkeypatch) -> None:
    """bf16_dot is on for the eight schemes on the AVX-512 target exactly when the CPU has
    avx512_bf16, never on AVX2 / portable nor for other schemes; uses_bf16 only at one
    f32 activation row and with RLX_DQ_BF16 on."""
    for target in cpu.runnable_targets():
        lib = dqgemm_lib(target)
        on = target is cpu.Target.AVX512 and HAS_BF16
        for name in S.GGUF_SCHEMES:
            scheme = S.GGUF_SCHEMES[name]()
            assert lib.bf16_dot(scheme) == (on and name in BF16_NAMES), (target, name)
    if not HAS_BF16:
        return
    lib = dqgemm_lib(cpu.Target.AVX512)
    q4k = S.GgufQ4K()
    monkeypatch.delenv("RLX_DQ_BF16", raising=False)
    assert lib.uses_bf16(q4k, 1, "f32")
    assert not lib.uses_bf16(q4k, 2, "f32")
    assert not lib.uses_bf16(q4k, 1, "q8")
    monkeypatch.setenv("RLX_DQ_BF16", "0")
    assert not lib.uses_bf16(q4k, 1, "f32")


@needs_bf16
@pytest.mark.parametrize("name", BF16_NAMES)
def test_bf16_gemv_matches_f64(name) -> None:
    """Every K (minimum, three / two parts, Gemma's 640 / 2048 where the block allows),
    N tails, R in {1, 4, 8}, 1 and 2 threads, on normal activations."""
    scheme = S.GGUF_SCHEMES[name]()
    lib = dqgemm_lib(cpu.Target.AVX512)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    qk = scheme.block_size
    ks = (256, 512, 2048) if qk == 256 else (32, 224, 256, 640)
    for k in ks:
        for n, rows, threads in ((1, 1, 1), (7, 4, 1), (13, 8, 2), (37, 8, 1), (8, 1, 2)):
            (packed,), w = make_weight(scheme, n, k, rng)
            x = _activations("normal", k, rng)
            check_close(_run(lib, scheme, x, packed, n, k, rows, threads), x, w)


@needs_bf16
@pytest.mark.parametrize("name", BF16_NAMES)
@pytest.mark.parametrize("kind", ["tiny", "tinier", "denormal", "huge", "spread"])
def test_bf16_gemv_extreme_activations(name, kind) -> None:
    """Tiny, denormal, huge and widely spread activations at the smallest K (three parts
    on the 32-weight layouts) and at 2048 (two parts), within the same bound."""
    scheme = S.GGUF_SCHEMES[name]()
    lib = dqgemm_lib(cpu.Target.AVX512)
    rng = np.random.default_rng(zlib.crc32(f"{name}{kind}".encode()))
    for k in (scheme.block_size, 2048):
        n = 13
        (packed,), w = make_weight(scheme, n, k, rng)
        x = _activations(kind, k, rng)
        got = _run(lib, scheme, x, packed, n, k, 8, 1)
        assert np.isfinite(got).all()
        check_close(got, x, w)


@needs_bf16
def test_bf16_and_f32_kernels_agree_within_the_bound(monkeypatch) -> None:
    """RLX_DQ_BF16=0 (the f32 FMA kernels) and 1 both within the bound of the same f64
    oracle on a Gemma-shaped Q5_0 weight (K 640) bound once with each setting."""
    scheme = S.GgufQ5_0()
    lib = dqgemm_lib(cpu.Target.AVX512)
    rng = np.random.default_rng(3)
    n, k = 50, 640
    (packed,), w = make_weight(scheme, n, k, rng)
    ws = (repack(scheme, packed, n, k, 8),)
    x = _activations("normal", k, rng)
    for flag in ("0", "1"):
        monkeypatch.setenv("RLX_DQ_BF16", flag)
        assert lib.uses_bf16(scheme, 1, "f32") == (flag == "1")
        out = np.full((1, n), np.nan, np.float32)
        lib.bind(scheme, x, ws, out, rows=8)()
        check_close(out, x, w)


@needs_bf16
def test_bf16_gemv_flt_max_against_zero_codes() -> None:
    """An activation of +-FLT_MAX (bf16 rounding would give inf, so it is truncated) times
    a zero weight code adds 0 (inf * 0 would be NaN): Q4_0, inputs 5 and 9 of block 0 given
    code 8 (w = d (q - 8) = 0) in every row, K = 32 (three parts) and 64."""
    scheme = S.GgufQ4_0()
    lib = dqgemm_lib(cpu.Target.AVX512)
    rng = np.random.default_rng(11)
    for k in (32, 64):
        n = 13
        (packed,), _ = make_weight(scheme, n, k, rng)
        # block 0 of each row: half d at bytes 0-1, qs at 2..17, input l < 16 the low nibble
        packed[:, 2 + 5] = (packed[:, 2 + 5] & 0xF0) | 8
        packed[:, 2 + 9] = (packed[:, 2 + 9] & 0xF0) | 8
        blocks = packed.reshape(-1, type(scheme).block_bytes)
        w = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_0).reshape(n, k)
        assert (w[:, [5, 9]] == 0).all()
        x = _activations("normal", k, rng)
        x[0, 5] = np.finfo(np.float32).max
        x[0, 9] = -np.finfo(np.float32).max
        got = _run(lib, scheme, x, packed, n, k, 8, 1)
        assert np.isfinite(got).all()
        check_close(got, x, np.asarray(w, np.float32))


@needs_bf16
@pytest.mark.parametrize("name", BF16_NAMES)
def test_bf16_gemv_non_finite_activations(name) -> None:
    """An inf activation gives the f64 product's +-inf (or NaN) per row (for a scheme with
    a min term, as in the f32 kernels, the split sums may give NaN instead), a NaN gives
    NaN: K at the scheme's minimum and 2048."""
    scheme = S.GGUF_SCHEMES[name]()
    lib = dqgemm_lib(cpu.Target.AVX512)
    rng = np.random.default_rng(zlib.crc32(f"{name}inf".encode()))
    for k in (scheme.block_size, 2048):
        n = 13
        (packed,), w = make_weight(scheme, n, k, rng)
        x = _activations("normal", k, rng)
        x[0, 3] = np.inf
        with np.errstate(invalid="ignore"):
            want = x.astype(np.float64) @ w.astype(np.float64).T
        got = _run(lib, scheme, x, packed, n, k, 8, 1)
        if name in MIN_TERM:  # inf * (d q) and inf * m apart: inf - inf may be NaN
            assert (np.isnan(got) | (got == want)).all()
        else:
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            fin = ~np.isnan(want)
            np.testing.assert_array_equal(got[fin], want[fin])  # +-inf
        x[0, 3] = np.nan
        assert np.isnan(_run(lib, scheme, x, packed, n, k, 8, 1)).all()
