"""Row-interleaved (repacked) GGUF weights in the native DequantMatMul kernels
(``csrc/dq_layout.h``, ``native/dqgemm.py``: ``repack``, ``rows=``).

The repacking itself against a NumPy re-ordering of the blocks written here (block b of
row n of group g moves to position (g, b, n % R)), and every kernel path that reads a
weight (the GEMV, the small-batch path, the tiled GEMM, the int8-activation path, the
decoder) on every scheme x every build target this CPU runs x R in {1 (plain), 4, 8} x
M = 1, 2, 5, 17, 64, with N not a multiple of R (tail rows), against the f64 product of
the weights ``gguf.quants`` decodes, within the f32 accumulation bound (and q8_bound for
int8 activations)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.dqgemm import REPACK_ROWS, dqgemm_lib, repack, repack_rows, unrepack
from rlx.errors import InputError
from rlx.formats import schemes as S
from tests.cpu.kernels.test_quant_dequant import check_close, check_q8, make_weight

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

NAMES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def _numpy_interleave(packed: np.ndarray, nb: int, bb: int, r: int) -> np.ndarray:
    """The interleaved bytes, block by block with explicit indices (not the reshape
    ``repack`` uses)."""
    n = packed.shape[0]
    full = n - n % r
    blocks = packed.reshape(n, nb, bb)
    out = []
    for g in range(full // r):
        for b in range(nb):
            for i in range(r):
                out.append(blocks[g * r + i, b])
    for t in range(full, n):
        out.extend(blocks[t])
    return np.concatenate(out).reshape(packed.shape)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("r", [4, 8])
def test_repack_matches_numpy_block_order(name, r) -> None:
    scheme = S.GGUF_SCHEMES[name]()
    cls = type(scheme)
    rng = np.random.default_rng(zlib.crc32(f"{name}{r}".encode()))
    n, k = 19, 3 * scheme.block_size
    (packed,), _ = make_weight(scheme, n, k, rng)
    got = repack(scheme, packed, n, k, r)
    want = _numpy_interleave(packed, 3, cls.block_bytes, r)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(unrepack(scheme, got, n, k, r), packed)


def test_repack_rejects_bad_rows() -> None:
    scheme = S.GgufQ8_0()
    packed = np.zeros((4, 34), np.uint8)
    with pytest.raises(InputError, match="rows must be 4 or 8"):
        repack(scheme, packed, 4, 32, 3)
    lib = dqgemm_lib(cpu.runnable_targets()[0])  # the baseline (portable / neon)
    with pytest.raises(InputError, match="rows"):
        lib.gemm(
            scheme, np.zeros((1, 32), np.float32), (packed,), np.zeros((1, 4), np.float32), rows=2
        )


def test_repack_flag(monkeypatch) -> None:
    from rlx.backends.cpu.native.dqgemm import repack_enabled
    from rlx.errors import ConfigError

    monkeypatch.delenv("RLX_DQ_REPACK", raising=False)
    assert repack_enabled()
    monkeypatch.setenv("RLX_DQ_REPACK", " 0 ")
    assert not repack_enabled()
    monkeypatch.setenv("RLX_DQ_REPACK", "yes")
    assert repack_enabled()
    monkeypatch.setenv("RLX_DQ_REPACK", "sometimes")
    with pytest.raises(ConfigError, match="RLX_DQ_REPACK"):
        repack_enabled()


def test_repack_rows_per_target() -> None:
    assert repack_rows(cpu.Target.AVX512) == 8
    assert repack_rows(cpu.Target.AVX2) == 4
    assert repack_rows(cpu.Target.PORTABLE) == 4
    for arm in cpu.targets_of(cpu.Arch.AARCH64):  # one row per SDOT sum lane
        assert repack_rows(arm) == 4
    assert set(cpu.Target) == set(REPACK_ROWS)


@pytest.mark.parametrize("target", cpu.runnable_targets(), ids=lambda t: t.value)
@pytest.mark.parametrize("name", NAMES)
def test_every_path_on_interleaved_weights(target, name) -> None:
    """R = 1, 4, 8; N = 21 (tail rows for both R) and N = 8 * 37 + 3 at M = 1 (both
    threads, many groups); M = 1, 2, 5, 17, 64 with f32 and int8 activations; the decoder."""
    scheme = S.GGUF_SCHEMES[name]()
    lib = dqgemm_lib(target)
    rng = np.random.default_rng(zlib.crc32(f"{name}{target.value}r".encode()))
    k = 512 if scheme.block_size == 256 else 17 * 32
    for n, ms in ((21, (1, 2, 5, 17, 64)), (299, (1,))):
        (packed,), w = make_weight(scheme, n, k, rng)
        for r in (1, 4, 8):
            ws = (packed if r == 1 else repack(scheme, packed, n, k, r),)
            np.testing.assert_array_equal(lib.decode(scheme, ws, n, k, rows=r), w)
            for m in ms:
                x = rng.standard_normal((m, k)).astype(np.float32)
                for act, check in (("f32", check_close), ("q8", check_q8)):
                    out = np.full((m, n), np.nan, np.float32)
                    lib.gemm(scheme, x, ws, out, num_threads=2, act=act, rows=r)
                    check(out, x, w)
