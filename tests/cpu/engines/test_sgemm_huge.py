"""Packed sgemm weights from 128 KB on are carved from 2 MB-page mappings
(``native/sgemm.py`` ``aligned_empty(huge=True)``, ``pack_b`` / ``HugeArena``): each array must be 64-byte
aligned, disjoint from the others, survive the arena moving to a new mapping, and a GEMM on
a weight packed there must match NumPy's float64 product."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import sgemm as nsgemm

EPS = float(np.finfo(np.float32).eps)


def _mapped(x: np.ndarray) -> bool:
    """Whether ``x`` views an mmap (np.frombuffer's base is a memoryview of it)."""
    return isinstance(getattr(x.base, "obj", None), mmap.mmap)


def _span(x: np.ndarray) -> tuple[int, int]:
    return x.ctypes.data, x.ctypes.data + x.nbytes


def test_arena_arrays_are_aligned_disjoint_and_outlive_their_mapping() -> None:
    arena = nsgemm.HugeArena(chunk=4 << 20)
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        assert arena.take(1000) is None
        return
    sizes = [1000, 300_000, 17, 700_000, 2_000_000, 5]  # the 2M-element one: its own mapping
    arrays = []
    for i, n in enumerate(sizes):
        x = arena.take(n)
        assert x is not None and x.shape == (n,) and x.dtype == np.float32
        assert x.ctypes.data % 64 == 0 and x.flags.writeable
        x[:] = i
        arrays.append(x)
    spans = sorted(_span(x) for x in arrays)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    for i, x in enumerate(arrays):
        assert np.all(x == i)


def test_aligned_empty_takes_the_arena_from_the_threshold() -> None:
    small = nsgemm.aligned_empty(nsgemm.HUGE_MIN_BYTES // 4 - 1, huge=True)
    big = nsgemm.aligned_empty(nsgemm.HUGE_MIN_BYTES // 4, huge=True)
    plain = nsgemm.aligned_empty(nsgemm.HUGE_MIN_BYTES // 4)  # per-shape buffers: NumPy
    for x in (small, big, plain):
        assert x.ctypes.data % 64 == 0
    assert isinstance(small.base, np.ndarray) and isinstance(plain.base, np.ndarray)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert _mapped(big)


@pytest.mark.skipif(not native.available(), reason="gcc is not installed")
def test_gemm_on_a_weight_packed_in_the_arena_matches_float64() -> None:
    lib = nsgemm.sgemm_lib()
    rng = np.random.default_rng(3)
    k, n, m = 384, 1536 + 5, 16
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    packed = lib.pack_b(b)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert _mapped(packed)
    out = np.empty((m, n), np.float32)
    lib.gemm(a, packed, out)
    want = a.astype(np.float64) @ b
    bound = 2 * k * EPS * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    assert np.all(np.abs(out - want) <= bound + 1e-6)
