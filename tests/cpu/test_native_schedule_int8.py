"""The int8 GEMM kernels in the native schedule (rlx/backends/cpu/engines/qgemm.py): a
dynamic_qmatmul on a constant weight describes its C call (``native_call``), so a chain
of them with layer norms runs as one C loop, and gives exactly what the Python closure
schedule (the oracle) gives, on 1 and 2 threads; a weight that is not a constant keeps
the Python call (it may change between runs)."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.native.schedule import Segment, native_call
from rlx.options import CompileOptions
from rlx.runtime.session import Session

pytestmark = pytest.mark.skipif(not native.available(), reason="needs gcc")

RNG = np.random.default_rng(3)
K, N = 48, 40
W1 = RNG.integers(-128, 128, (K, N), dtype=np.int8)
W2 = RNG.integers(-128, 128, (N, K), dtype=np.int8)
S1 = RNG.uniform(1e-3, 1e-2, N).astype(np.float32)
S2 = RNG.uniform(1e-3, 1e-2, K).astype(np.float32)


def chain() -> rlx.Graph:
    g = rlx.Graph("int8_chain_sched")
    x = g.input("x", (2, 7, K))
    gamma, beta = g.param("g", (K,)), g.param("b", (K,))
    h = g.dynamic_qmatmul(x, g.constant(W1), S1, mode="u8")
    y = g.dynamic_qmatmul(h, g.constant(W2), S2, residual=x, mode="s8")
    y = g.layer_norm(y, gamma, beta, 1e-5)
    g.set_outputs([g.layer_norm(g.add(y, x), gamma, beta, 1e-5)])
    return g


@pytest.mark.parametrize("threads", [1, 2])
def test_int8_chain_runs_as_one_c_loop_with_identical_results(threads: int) -> None:
    g = chain()
    ps = {"g": RNG.random(K, np.float32), "b": RNG.random(K, np.float32)}
    feed = {"x": RNG.standard_normal((2, 7, K)).astype(np.float32)}
    got, exs = {}, {}
    for on in (False, True):
        opts = CompileOptions(use_cache=False, num_threads=threads, native_schedule=on)
        cg = Session("cpu").compile(g, opts, params=ps)
        got[on] = cg.run(feed)[0]
        exs[on] = cg._executor_any()
    np.testing.assert_array_equal(got[True], got[False])
    ex = exs[True]
    qk = [
        k for e, k in zip(ex.kernel_entries, ex.schedule, strict=True) if e.op == "dynamic_qmatmul"
    ]
    assert len(qk) == 2 and all(native_call(k) is not None for k in qk)
    assert [type(f) for f in ex.fast] == [Segment]
    np.testing.assert_allclose(got[True], g.evaluate(feed, ps)[0], rtol=1e-3, atol=1e-3)


def test_a_weight_that_is_an_input_stays_a_python_call() -> None:
    g = rlx.Graph("int8_input_weight")
    x = g.input("x", (3, K))
    w = g.input("w", (K, N), "i8")
    g.set_outputs([g.dynamic_qmatmul(x, w, S1, mode="s8")])
    cg = Session("cpu").compile(g, CompileOptions(use_cache=False, num_threads=1))
    feed = {"x": RNG.standard_normal((3, K)).astype(np.float32), "w": W1}
    a = cg.run(feed)[0]
    feed2 = {"x": feed["x"], "w": W1 // 2}
    b = cg.run(feed2)[0]
    np.testing.assert_allclose(a, g.evaluate(feed)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b, g.evaluate(feed2)[0], rtol=1e-5, atol=1e-5)
    ex = cg._executor_any()
    (k,) = [
        k for e, k in zip(ex.kernel_entries, ex.schedule, strict=True) if e.op == "dynamic_qmatmul"
    ]
    assert native_call(k) is None
