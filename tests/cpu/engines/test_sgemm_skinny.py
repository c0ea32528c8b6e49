"""Skinny products on rlx's packed sgemm (native/csrc/sgemm.c): the last micro-panel of a
row block runs a 2-, 4- or 8-row kernel when fewer than MR rows remain; a block of 1 or 2
rows runs 4 column panels at once. Oracle: NumPy
float64 matmul (bound ``2 K eps32 (|a| @ |b|)``) for M = 1 .. max(33, 2 MR + 9), N with a
tail of 3 columns past whole panels, K of 99 or several K blocks plus 5; and a row's bits must not depend on how
many rows share the call (the panel that computes it), on every runnable target, with and
without K blocks and epilogues."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.sgemm import sgemm_lib

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

EPS = float(np.finfo(np.float32).eps)


@pytest.fixture(params=cpu.runnable_targets(), ids=lambda t: t.value)
def lib(request):
    return sgemm_lib(request.param)


@pytest.mark.parametrize("act", [None, "gelu"])
@pytest.mark.parametrize("long_k", [False, True])
@pytest.mark.parametrize("panels", [2, 9])  # 9: M <= 2 runs 4 panels at once, then 4, then 1
def test_every_row_count_matches_float64_and_keeps_its_bits(lib, act, long_k, panels) -> None:
    rng = np.random.default_rng(5)
    k = 2 * lib.kc + 5 if long_k else 99  # several K blocks: partial sums through the output
    n = panels * lib.nr + 3
    a = rng.standard_normal((max(33, 2 * lib.mr + 9), k)).astype(np.float32)  # M = 1 .. 33+
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    packed = lib.pack_b(b)
    full = np.empty((a.shape[0], n), np.float32)
    lib.gemm(a, packed, full, bias=bias, act=None)
    want = a.astype(np.float64) @ b + bias
    bound = 2 * k * EPS * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    assert np.all(np.abs(full - want) <= bound + 1e-5)
    if act is not None:
        lib.gemm(a, packed, full, bias=bias, act=act)
    for m in range(1, a.shape[0] + 1):
        out = np.full((m, n), np.nan, np.float32)
        lib.gemm(a[:m], packed, out, bias=bias, act=act)
        np.testing.assert_array_equal(out, full[:m], err_msg=f"m={m}")
