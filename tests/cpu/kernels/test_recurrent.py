"""The gated delta net kernel (``kernels/recurrent.py``) against an independent loop over
the recurrence, every result kind, with and without a carried state, without per-run
allocation."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx import DType
from rlx.backends.cpu.dispatch import KernelKind
from rlx.ops.recurrent import GdnResult, gated_delta_rule
from tests.cpu.kernels.checks import (
    SESSION,
    schedule_allocations,
)

RNG = np.random.default_rng(11)


def _gdn_inputs(dtype, b=2, t=5, h=3, dk=4, dv=6):
    k = RNG.standard_normal((b, t, h, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return {
        "q": RNG.standard_normal((b, t, h, dk)).astype(dtype),
        "k": k.astype(dtype),
        "v": RNG.standard_normal((b, t, h, dv)).astype(dtype),
        "g": -RNG.random((b, t, h)).astype(dtype),
        "beta": RNG.random((b, t, h)).astype(dtype),
        "state": RNG.standard_normal((b, h, dk, dv)).astype(dtype),
    }


def _gdn_loop(q, k, v, g, beta, state):
    """The recurrence per (batch, head), one step at a time, in f64."""
    b, t, h, dk = k.shape
    o = np.zeros(v.shape)
    s_all = np.array(state, np.float64)
    for bi in range(b):
        for hi in range(h):
            s = s_all[bi, hi]
            for i in range(t):
                s = np.exp(g[bi, i, hi]) * s
                kt = k[bi, i, hi].astype(np.float64)
                s = s + np.outer(kt, beta[bi, i, hi] * (v[bi, i, hi] - s.T @ kt))
                o[bi, i, hi] = s.T @ q[bi, i, hi] / np.sqrt(dk)
            s_all[bi, hi] = s
    return o, s_all


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("returns", list(GdnResult))
@pytest.mark.parametrize("carry", [True, False])
def test_gated_delta_net_kernel(dtype, returns, carry):
    feed = _gdn_inputs(dtype)
    if not carry:
        del feed["state"]

    def build(g, q, k, v, g_, beta, state=None):
        return g.gated_delta_net(q, k, v, g_, beta, state, returns=returns)

    gr = rlx.Graph("gdn")
    ids = {n: gr.input(n, a.shape, DType.from_numpy(a.dtype)) for n, a in feed.items()}
    gr.set_outputs(
        [build(gr, ids["q"], ids["k"], ids["v"], ids["g"], ids["beta"], ids.get("state"))]
    )
    cg = SESSION.compile(gr)
    (got,) = cg.run(feed)
    (ref,) = gr.evaluate(feed)
    assert {k.kind for k in cg.report().kernels} == {KernelKind.BLAS}
    st0 = feed.get("state", np.zeros((2, 3, 4, 6)))
    o, s = _gdn_loop(*(feed[n].astype(np.float64) for n in ("q", "k", "v", "g", "beta")), st0)
    want = s if returns is GdnResult.FINAL_STATE else o
    tol = 2e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol)
    ref_o, ref_s = gated_delta_rule(
        *(feed[n] for n in ("q", "k", "v", "g", "beta")), feed.get("state")
    )
    assert got.shape == (ref_s if returns is GdnResult.FINAL_STATE else ref_o).shape
    assert schedule_allocations(cg, feed) < 4096
