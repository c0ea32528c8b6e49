"""The register-tiled small-batch group kernel (``csrc/dqgemm_small.c``: 3 weight rows x
8 / 4 X rows of accumulators, the vector decoders, the transposing reduction) on the GGUF
layouts it decodes with vector code (Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, Q4_K, Q6_K) and one it
decodes with the scalar block decoder (Q2_K), for every build target this CPU runs x
M in {2, 3, 5, 8, 16} x weights plain and interleaved (R of the target) x 1 and 2 threads,
with N leaving tail rows for both the interleaving and the 3-row tile, and K spanning two
decode steps of 2048 weights with a tail. Against NumPy f64 products of the weights
``gguf.quants`` decodes, within the f32 accumulation bound of test_quant_dequant.check_close.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.dqgemm import dqgemm_lib, repack, repack_rows, small_batch
from rlx.formats import schemes as S
from tests.cpu.kernels.test_quant_dequant import check_close, make_weight

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

VECTOR = ["Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q5_1", "Q4_K", "Q6_K"]
MS = (2, 3, 5, 8, 16)


@pytest.mark.parametrize("target", cpu.runnable_targets(), ids=lambda t: t.value)
@pytest.mark.parametrize("name", [*VECTOR, "Q2_K"])
def test_group_kernel_matches_f64(target, name) -> None:
    scheme = S.GGUF_SCHEMES[name]()
    lib = dqgemm_lib(target)
    rng = np.random.default_rng(zlib.crc32(f"{name}{target.value}small".encode()))
    r_target = repack_rows(target)
    n = 3 * r_target + 5  # tails: n % R rows plain, n % 3 rows in a short tile
    k = 2304 if scheme.block_size == 256 else 2048 + 3 * 32  # two decode steps
    (packed,), w = make_weight(scheme, n, k, rng)
    for r in (1, r_target):
        ws = (packed if r == 1 else repack(scheme, packed, n, k, r),)
        for m in MS:
            x = rng.standard_normal((m, k)).astype(np.float32)
            for threads in (1, 2):
                out = np.full((m, n), np.nan, np.float32)
                lib.gemm(scheme, x, ws, out, num_threads=threads, rows=r)
                check_close(out, x, w)


def test_vector_decoded_layouts_take_the_path_from_two_rows() -> None:
    for target in cpu.runnable_targets():
        lib = dqgemm_lib(target)
        on = lib.lanes >= 8  # the portable target (SSE2) keeps the GEMV / tiled paths
        for name in VECTOR:
            got = [small_batch(lib, S.GGUF_SCHEMES[name](), m) for m in (1, 2, 16, 17)]
            assert got == [False, on, on, False], (target, name)
        assert small_batch(lib, S.GgufQ2K(), 3) is False
        assert small_batch(lib, S.GgufQ2K(), 4) is on
