"""The small-batch path of the native DequantMatMul kernel (csrc/dqgemm_small.c: 2 <= M <=
16 rows, batched decode) for every build target this CPU runs, against NumPy f64
matmuls of weights decoded by ``gguf.quants`` (and by hand for Int8Block / Int4Block):
every M from 2 to 16 and the first tiled size after, K spanning several decode steps with
a tail, N odd (a weight row without a pair), 1 and 2 threads. Within the f32 accumulation
bound of test_quant_dequant.check_close."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.dqgemm import SMALL_MAX_M, dqgemm_lib, small_batch
from rlx.formats import schemes as S
from tests.cpu.kernels.test_quant_dequant import check_close, make_weight

pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

# the four vector-decoded schemes (Gemma-3 GGUF files use them), and two decoded by the
# scalar block decoder
SCHEMES = [S.GgufQ8_0(), S.GgufQ5_0(), S.GgufQ4K(), S.GgufQ6K(), S.GgufQ4_0(), S.Int8Block(32)]


@pytest.mark.parametrize("target", cpu.runnable_targets(), ids=lambda t: t.value)
@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
def test_small_batches_match_f64(target, scheme) -> None:
    lib = dqgemm_lib(target)
    rng = np.random.default_rng(abs(hash((str(scheme), target.value))) % 2**32)
    n, k = 23, 2304  # 9 K-quant blocks / 72 32-blocks: three decode steps of <= 1024
    ws, w = make_weight(scheme, n, k, rng)
    for m in range(2, SMALL_MAX_M + 2):
        x = rng.standard_normal((m, k)).astype(np.float32)
        out = np.full((m, n), np.nan, np.float32)
        lib.gemm(scheme, x, ws, out, num_threads=1 + m % 2)
        check_close(out, x, w)


def test_which_sizes_take_the_small_path() -> None:
    for target in cpu.runnable_targets():
        lib = dqgemm_lib(target)
        # the portable target (SSE2) keeps the GEMV / tiled paths; the aarch64 targets
        # (4 NEON lanes, dqgemm_neon.h) take it as AVX2 / AVX-512 do
        on = lib.lanes >= 8 or target in cpu.targets_of(cpu.Arch.AARCH64)
        got = [small_batch(lib, S.GgufQ4K(), m) for m in (1, 2, 16, 17)]
        assert got == [False, on, on, False], target
        got = [small_batch(lib, S.Int8Block(32), m) for m in (2, 3, 4, 16)]
        assert got == [False, False, on, on], target
