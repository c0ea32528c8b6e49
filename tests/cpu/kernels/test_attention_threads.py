"""The native attention (rlx/backends/cpu/native/csrc/attention.c) on 2 threads: a
NumPy softmax-attention written here is the oracle, and the result has the same bits as
1 thread (the tasks do not depend on the team size), at a short sequence (the MiniLM
1x16 shape) and a longer one; ``rlx_attention_set_solo_calls(n)`` (what a late second
thread sets: the next calls on one thread) counts down and keeps those results."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native.attention import attention_lib

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")


def oracle(q: np.ndarray, k: np.ndarray, v: np.ndarray, h: int, d: int) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v per head, in float64."""
    b, sq, _ = q.shape
    skv = k.shape[1]
    qh = q.reshape(b, sq, h, d).transpose(0, 2, 1, 3).astype(np.float64)
    kh = k.reshape(b, skv, h, d).transpose(0, 2, 1, 3).astype(np.float64)
    vh = v.reshape(b, skv, h, d).transpose(0, 2, 1, 3).astype(np.float64)
    s = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ vh).transpose(0, 2, 1, 3).reshape(b, sq, h * d)


@pytest.mark.parametrize(("b", "s", "h", "d"), [(1, 16, 12, 32), (2, 100, 4, 64)])
def test_two_threads_equal_the_oracle_and_one_thread(b, s, h, d):
    lib = attention_lib()
    rng = np.random.default_rng(s)
    q, k, v = (rng.standard_normal((b, s, h * d)).astype(np.float32) for _ in range(3))
    outs = []
    for t in (1, 2):
        out = np.empty_like(q)
        lib.lib.rlx_attention_set_solo_calls(0)  # no back-off left from a late thread
        kw = dict(num_heads=h, num_kv_heads=h, head_dim=d, scale=1 / np.sqrt(d))
        lib.run(q, k, v, out, num_threads=t, **kw)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[1], oracle(q, k, v, h, d), rtol=1e-4, atol=1e-5)


def test_solo_calls_count_down_and_stay_exact():
    lib = attention_lib()
    rng = np.random.default_rng(5)
    b, s, h, d = 1, 16, 12, 32
    q, k, v = (rng.standard_normal((b, s, h * d)).astype(np.float32) for _ in range(3))
    want = oracle(q, k, v, h, d)
    lib.lib.rlx_attention_set_solo_calls(3)
    for _ in range(2):
        out = np.empty_like(q)
        kw = dict(num_heads=h, num_kv_heads=h, head_dim=d, scale=1 / np.sqrt(d))
        lib.run(q, k, v, out, num_threads=2, **kw)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    assert lib.lib.rlx_attention_set_solo_calls(0) == 1
