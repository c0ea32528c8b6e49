"""The single-row f32 group GEMVs of interleaved weights added for the K-quants and Q5_0
(``csrc/dqgemm_rows_gguf.c``: ``group_q2_k``, ``group_q3_k``, ``group_q5_k``, and
``group_q5_0`` on AVX-512 too, beside ``group_q4_k`` / ``group_q6_k``; one pass over a
group of R rows sharing each X load) and the row-by-row kernels of the same layouts (plain weights, the N % R tail rows), for every
build target this CPU runs x R in {1 (plain), 4, 8} x 1 and 2 threads, with N leaving tail
rows, K of several blocks and X of mixed scales, the bf16 dot-product GEMV off
(RLX_DQ_BF16=0, so the AVX-512 build runs its f32 kernels too). Against the f64 product of
the weights ``gguf.quants`` decodes, within the f32 accumulation bound of
test_quant_dequant.check_close."""

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


@pytest.mark.parametrize("target", cpu.runnable_targets(), ids=lambda t: t.value)
@pytest.mark.parametrize("name", ["Q5_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_group_gemv_matches_f64(monkeypatch, target, name) -> None:
    monkeypatch.setenv("RLX_DQ_BF16", "0")
    scheme = S.GGUF_SCHEMES[name]()
    lib = dqgemm_lib(target)
    rng = np.random.default_rng(zlib.crc32(f"{name}{target.value}groupk".encode()))
    n, k = 8 * 5 + 7, 5 * 256  # tails for R = 4 and 8; five K-quant blocks per row
    (packed,), w = make_weight(scheme, n, k, rng)
    # X of mixed magnitudes: a wrong sub-block scale or min term shows above the bound
    x = (rng.standard_normal((1, k)) * np.exp(rng.uniform(-3, 3, (1, k)))).astype(np.float32)
    for r in (1, 4, 8):
        ws = (packed if r == 1 else repack(scheme, packed, n, k, r),)
        for threads in (1, 2):
            out = np.full((1, n), np.nan, np.float32)
            lib.gemm(scheme, x, ws, out, num_threads=threads, act="f32", rows=r)
            check_close(out, x, w)
