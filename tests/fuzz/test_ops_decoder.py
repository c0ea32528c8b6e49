"""Differential fuzzing of the decoder's fused ops (``rlx/ops/decoder.py``; harness.py:
reference interpreter and compiled graph, every precision policy and native target)
against PyTorch in float64: ``rope_norm`` as ``F.rms_norm`` per head then the rotation of
torch_oracles.rope with the table rows at the positions; ``norm_add`` as
``residual + F.rms_norm``. Out-of-range positions are an InputError."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.dtype import DType
from rlx.errors import InputError
from rlx.ops.base import OpKind
from rlx.ops.decoder import NormAdd, RopeNorm

from . import torch_oracles as T
from .harness import SEEDS, Tol, check, examples, leaves

F32 = np.float32
TOL = Tol(2e-5, 4e-3, 3e-2)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


@examples(14)
@given(
    s=st.integers(1, 5),
    heads=st.integers(1, 3),
    dims=st.sampled_from([(2, 2), (8, 6), (16, 16), (64, 32)]),
    interleaved=st.booleans(),
    normed=st.booleans(),
    seed=SEEDS,
)
def test_rope_norm_matches_torch(s, heads, dims, interleaved, normed, seed) -> None:
    head_dim, n_rot = dims
    rng = np.random.default_rng(seed)
    rows = 9
    ang = rng.uniform(0, 6, (rows, n_rot // 2))
    feeds = {
        "x": (rng.standard_normal((1, s, heads * head_dim)) * 2).astype(F32),
        "cos": np.cos(ang).astype(F32),
        "sin": np.sin(ang).astype(F32),
    }
    if normed:
        feeds["w"] = rng.standard_normal(head_dim).astype(F32)
    pos = rng.integers(0, rows, s).astype(np.int64)
    g = rlx.Graph("rope_norm")
    ids, inputs, params = leaves(g, feeds, ())
    p = g.input("pos", (s,), DType.I64)
    inputs["pos"] = pos
    x, c, sn = ids["x"], ids["cos"], ids["sin"]
    args = [x, c, sn, p] + ([ids["w"]] if normed else [])
    g.set_outputs([g.apply(RopeNorm(head_dim, n_rot, interleaved, 1e-6), args)])

    def oracle(rnd):
        t = {n: T.t64(rnd(a)) for n, a in feeds.items()}
        xh = t["x"].reshape(1, s, heads, head_dim)
        if normed:
            xh = F.rms_norm(xh, (head_dim,), weight=t["w"], eps=1e-6)
        idx = torch.as_tensor(pos)
        y = T.rope(xh.reshape(1, s, heads * head_dim), t["cos"][idx], t["sin"][idx],
                   head_dim, n_rot, interleaved)  # fmt: skip
        return [_np(y)]

    check(g, inputs, params, oracle, [OpKind.REDUCTION], TOL, "max")


@examples(10)
@given(
    rows=st.sampled_from([(1,), (3,), (2, 2)]),
    d=st.sampled_from([1, 5, 16, 100]),
    eps=st.sampled_from([1e-6, 0.1]),
    seed=SEEDS,
)
def test_norm_add_matches_torch(rows, d, eps, seed) -> None:
    rng = np.random.default_rng(seed)
    shape = (*rows, d)
    feeds = {
        "x": (rng.standard_normal(shape) * 3).astype(F32),
        "w": rng.standard_normal(d).astype(F32),
        "r": rng.standard_normal(shape).astype(F32),
    }
    g = rlx.Graph("norm_add")
    ids, inputs, params = leaves(g, feeds, ())
    g.set_outputs([g.apply(NormAdd(eps), [ids["x"], ids["w"], ids["r"]])])

    def oracle(rnd):
        t = {n: T.t64(rnd(a)) for n, a in feeds.items()}
        return [_np(t["r"] + F.rms_norm(t["x"], (d,), weight=t["w"], eps=eps))]

    check(g, inputs, params, oracle, [OpKind.REDUCTION], TOL, "max")


@pytest.mark.parametrize("native", [True, False])
def test_rope_norm_position_outside_the_tables_is_named(native) -> None:
    g = rlx.Graph("rope_norm_bad")
    x = g.input("x", (1, 2, 4))
    c, sn = g.input("cos", (3, 2)), g.input("sin", (3, 2))
    p = g.input("pos", (2,), DType.I64)
    g.set_outputs([g.rope_norm(x, c, sn, p, None, 4, 4)])
    run = rlx.Session("cpu").compile(g, rlx.CompileOptions(native=native))
    feed = {"x": np.ones((1, 2, 4), F32), "cos": np.ones((3, 2), F32),
            "sin": np.zeros((3, 2), F32), "pos": np.array([0, 3])}  # fmt: skip
    with pytest.raises(
        InputError, match=r"rope_norm: position 3 is outside the rotary tables of 3 rows"
    ):
        run.run(feed)
