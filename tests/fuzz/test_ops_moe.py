"""Differential fuzzing (harness.py: reference interpreter and compiled graph, every
precision policy and native target) of the mixture-of-experts ops on GGUF-packed expert
stacks, against oracles written here:

* ``dequant_grouped_matmul``: every expert decoded by ``gguf.quants.dequantize`` (Q8_K,
  which it lacks: ``d * q``, test_ops_packed.py), then a per-row f64 product with the
  expert the row names;
* ``dequant_moe_weights``: the same decoding, transposed to ``[E, K, N]``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.ops.base import OpKind
from rlx.ops.moe import DequantGroupedMatMul, DequantMoEWeights

from .harness import SEEDS, Tol, check, examples
from .test_ops_packed import GGUF, MM_TOL, _decode_gguf, _packed_gguf

F32 = np.float32


def _stack(
    rng: np.random.Generator, scheme, e: int, n: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(packed u8 [E, N, row_bytes], decoded f64 [E, N, K])."""
    packed = np.stack([_packed_gguf(rng, scheme, n, k) for _ in range(e)])
    return packed, np.stack([_decode_gguf(scheme, p) for p in packed])


@examples(8)
@given(scheme=st.sampled_from(GGUF), data=st.data(), seed=SEEDS)
def test_dequant_grouped_matmul_matches_gguf_decoding(scheme, data, seed) -> None:
    scheme = scheme()
    rng = np.random.default_rng(seed)
    e, n = data.draw(st.integers(1, 4)), data.draw(st.sampled_from([1, 5, 16]))
    k = scheme.qk * data.draw(st.integers(1, 2))
    m = data.draw(st.sampled_from([1, 2, 7, 20]))
    packed, dec = _stack(rng, scheme, e, n, k)
    x = rng.standard_normal((m, k)).astype(F32)
    ids = rng.integers(0, e, m).astype(data.draw(st.sampled_from([np.int32, np.int64])))
    g = rlx.Graph("dequant_grouped_matmul")
    xi = g.input("x", (m, k))
    ii = g.input("ids", (m,), "i32" if ids.dtype == np.int32 else "i64")
    g.set_outputs([g.apply(DequantGroupedMatMul(scheme), [xi, g.constant(packed), ii])])
    w_rows = dec[ids]  # [M, N, K]: each row's expert
    scale = 1.0 + np.einsum("mk,mnk->mn", np.abs(x.astype(np.float64)), np.abs(w_rows))
    oracle = lambda rnd: [np.einsum("mk,mnk->mn", rnd(x), w_rows)]  # noqa: E731
    check(g, {"x": x, "ids": ids}, {}, oracle, [OpKind.COMPUTE], MM_TOL, [scale])


@examples(6)
@given(scheme=st.sampled_from(GGUF), data=st.data(), seed=SEEDS)
def test_dequant_moe_weights_matches_gguf_decoding(scheme, data, seed) -> None:
    scheme = scheme()
    rng = np.random.default_rng(seed)
    e, n = data.draw(st.integers(1, 3)), data.draw(st.sampled_from([1, 4]))
    packed, dec = _stack(rng, scheme, e, n, scheme.qk * data.draw(st.integers(1, 2)))
    g = rlx.Graph("dequant_moe_weights")
    p = g.param("packed", packed.shape, "u8")
    g.set_outputs([g.apply(DequantMoEWeights(scheme), [p])])
    want = dec.transpose(0, 2, 1)
    check(g, {}, {"packed": packed}, [want], [OpKind.COMPUTE], Tol(1e-7, 1e-7, 1e-7))
