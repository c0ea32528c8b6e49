"""The decode GEMV (M = 1) of the native DequantMatMul kernel for every GGUF scheme rlx
runs, on every build target this CPU runs (the fused rows of csrc/dqgemm_rows.c and
dqgemm_rows_gguf.c on AVX2 / AVX-512, the block decoder on the portable target), against
NumPy f64 products of weights decoded by ``gguf.quants``: one block, odd block counts (the
two-block loops' tails), K = 2048, N = 1 and odd N, 1 and 2 threads, and signed offsets
(Q4_1 / Q5_1 mins below zero, as llama.cpp writes them: w = d q + m cancels). Within the
f32 accumulation bound of test_quant_dequant.check_close; and every batch path (M = 1, 2, 5,
17, 64) with f32 and int8 activations (q8_bound)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.dqgemm import dqgemm_lib
from rlx.formats import schemes as S
from tests.cpu.kernels.test_quant_dequant import check_close, check_q8, make_weight

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

NAMES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def _signed_min_weight(scheme: S.QuantScheme, n: int, k: int, rng: np.random.Generator):
    """make_weight with the f16 min of every Q4_1 / Q5_1 block (bytes 2-3) negated where
    a coin says so, decoded again by gguf.quants."""
    (packed,), _ = make_weight(scheme, n, k, rng)
    cls = type(scheme)
    b = packed.reshape(-1, cls.block_bytes)
    if cls.gguf_name in ("Q4_1", "Q5_1"):
        b[:, 3] |= (rng.integers(0, 2, len(b)) << 7).astype(np.uint8)
    w = gguf.quants.dequantize(b, getattr(gguf.GGMLQuantizationType, cls.gguf_name))
    return (packed,), np.asarray(w, np.float32).reshape(n, k)


@pytest.mark.parametrize("target", cpu.runnable_targets(), ids=lambda t: t.value)
@pytest.mark.parametrize("name", NAMES)
def test_gemv_matches_f64(target, name) -> None:
    scheme = S.GGUF_SCHEMES[name]()
    lib = dqgemm_lib(target)
    rng = np.random.default_rng(abs(hash((name, target.value))) % 2**32)
    qk = scheme.block_size
    blocks = (1, 3, 2048 // qk) if qk == 256 else (1, 3, 9, 2048 // qk)
    for nblk in blocks:
        k = nblk * qk
        for n, threads in ((1, 1), (7, 2), (37, 1)):
            ws, w = _signed_min_weight(scheme, n, k, rng)
            x = rng.standard_normal((1, k)).astype(np.float32)
            out = np.full((1, n), np.nan, np.float32)
            lib.gemm(scheme, x, ws, out, num_threads=threads)
            check_close(out, x, w)


@pytest.mark.parametrize("target", cpu.runnable_targets(), ids=lambda t: t.value)
def test_gemv_rows_wider_than_a_thread_chunk(target) -> None:
    """N large enough that both threads take dynamic chunks of rows (prefetch across row
    boundaries), for a 32-weight and a 256-weight layout with a min term."""
    lib = dqgemm_lib(target)
    rng = np.random.default_rng(7)
    for scheme in (S.GgufQ4_1(), S.GgufQ5K(), S.GgufQ2K()):
        n, k = 613, 2048  # over 256 KB of packed weight: two threads run
        ws, w = _signed_min_weight(scheme, n, k, rng)
        x = rng.standard_normal((1, k)).astype(np.float32)
        out = np.full((1, n), np.nan, np.float32)
        lib.gemm(scheme, x, ws, out, num_threads=2)
        check_close(out, x, w)


@pytest.mark.parametrize("target", cpu.runnable_targets(), ids=lambda t: t.value)
@pytest.mark.parametrize("name", NAMES)
def test_every_batch_path_both_activations(target, name) -> None:
    """M = 1, 2, 5, 17, 64 (the GEMV, small-batch and tiled paths) with f32 activations
    within the f32 bound and with int8 ones within q8_bound, N odd (13: no multiple of a
    row group), K = 2 super-blocks (odd block counts of the 32-weight layouts: 17)."""
    scheme = S.GGUF_SCHEMES[name]()
    lib = dqgemm_lib(target)
    rng = np.random.default_rng(zlib.crc32(f"{name}{target.value}".encode()))
    k = 512 if scheme.block_size == 256 else 17 * 32
    n = 13
    ws, w = _signed_min_weight(scheme, n, k, rng)
    for m in (1, 2, 5, 17, 64):
        x = rng.standard_normal((m, k)).astype(np.float32)
        for act, check in (("f32", check_close), ("q8", check_q8)):
            out = np.full((m, n), np.nan, np.float32)
            lib.gemm(scheme, x, ws, out, num_threads=2, act=act)
            check(out, x, w)
