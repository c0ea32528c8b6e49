"""Regression: the 1-thread measurement of native vs BLAS GEMM (``engines/sgemm.py``
``weight_matmul``'s ``make``) must keep its packed weight alive while the native call
holds its raw address. It passed ``lib.pack_b(tb)`` straight into ``gemm_args``, so the
packed buffer was freed before the timed call: a use-after-free that segfaulted once the
allocator returned the pages (seen after ``torch.export`` had run in the process)."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from rlx import CompileOptions, Graph, Session
from rlx.backends.cpu.engines import sgemm as ksgemm
from rlx.backends.cpu.native import sgemm as nsgemm


def test_measured_native_gemm_keeps_its_packed_weight_alive(monkeypatch):
    packed: list[weakref.ref] = []
    pack_b = nsgemm.SgemmLib.pack_b

    def recording_pack_b(self, b, out=None, threads=1):
        r = pack_b(self, b, out, threads)
        packed.append(weakref.ref(r))
        return r

    alive: list[bool] = []

    def choose(key, make, threads, invariant=False, *, small=False):
        packed.clear()
        native, _blas = make()
        gc.collect()
        alive.extend(r() is not None for r in packed)
        native()  # runs on the buffer it was given
        return True, "test"

    monkeypatch.setattr(nsgemm.SgemmLib, "pack_b", recording_pack_b)
    monkeypatch.setattr(ksgemm, "choose", choose)
    g = Graph("mm")
    x = g.input("x", (3, 64))
    w = g.param("w", (64, 48))
    g.set_outputs([g.matmul(x, w)])
    rng = np.random.default_rng(0)
    wv = rng.standard_normal((64, 48), dtype=np.float32)
    xv = rng.standard_normal((3, 64), dtype=np.float32)
    opts = CompileOptions(num_threads=1, use_cache=False)
    (y,) = Session("cpu").compile(g, opts, params={"w": wv}).run({"x": xv})
    np.testing.assert_allclose(y, xv @ wv, rtol=1e-5, atol=1e-5)
    assert alive and all(alive)
