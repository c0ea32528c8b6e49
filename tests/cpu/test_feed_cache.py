"""The checked-feed cache of ``CompiledGraph.run``: a feed whose names, dtypes and dims
passed the full check once skips it on later runs. These tests change one thing after a
signature is cached and expect the same InputError as a fresh CompiledGraph gives, the
cache left as it was, and NumPy's results from the runs around the bad one."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.errors import InputError
from rlx.options import CompileOptions
from rlx.runtime.session import Session

W = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5) / 7


def numpy_mlp(x: np.ndarray, w: np.ndarray = W) -> np.ndarray:
    return np.tanh(x.astype(np.float32)) @ w + np.float32(1.0)


def mlp(name: str, check_finite: bool = False) -> rlx.CompiledGraph:
    g = rlx.Graph(name)
    b = g.sym("batch", max=8)
    x = g.input("x", (b, 4))
    w = g.param("w", (4, 3))
    g.set_outputs([g.add(g.matmul(g.tanh(x), w), 1.0)])
    opts = CompileOptions(use_cache=False, check_finite=check_finite, max_shape_plans=2)
    return Session("cpu").compile(g, opts, params={"w": W})


def x_of(batch: int, seed: int = 0, dtype: type = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 4)).astype(dtype)


def check(cg: rlx.CompiledGraph, x: np.ndarray, w: np.ndarray = W) -> None:
    (y,) = cg.run({"x": x})
    np.testing.assert_allclose(y, numpy_mlp(x, w), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("feed", "match"),
    [
        ({"x": x_of(3, dtype=np.float64)}, r"input 'x': expected dtype f32.*given float64"),
        ({"x": x_of(3).astype(np.int32)}, r"input 'x': expected dtype f32.*given int32"),
        ({"x": np.ones((3, 5), np.float32)}, r"input 'x': expected .*dim 1 is 5, expected 4"),
        ({"x": np.ones((3, 4, 1), np.float32)}, r"input 'x': expected rank 2"),
        ({"x": np.ones((9, 4), np.float32)}, r"'batch' = 9 is outside its declared bounds"),
        ({"x": x_of(3), "y": x_of(3)}, r"unknown input\(s\) \['y'\]"),
        ({}, r"missing input\(s\) \['x'\]"),
        ({"y": x_of(3)}, r"unknown input\(s\) \['y'\]"),
    ],
)
def test_a_bad_feed_after_a_cached_signature_gets_the_full_check(feed, match) -> None:
    cg = mlp("feed_bad")
    good = x_of(3)
    check(cg, good)
    check(cg, good)  # the second run takes the cached signature
    feeds, plans = dict(cg._feeds), cg.shape_plans
    with pytest.raises(InputError, match=match):
        cg.run(feed)
    fresh = mlp("feed_bad_fresh")  # no cached signature: the same error
    with pytest.raises(InputError, match=match):
        fresh.run(feed)
    assert cg._feeds == feeds and cg.shape_plans == plans  # the bad feed changed nothing
    check(cg, x_of(3, seed=1))


def test_new_shapes_and_lossless_conversions_beside_cached_signatures() -> None:
    cg = mlp("feed_shapes")
    for batch in (1, 2, 1, 5, 2, 7, 1):  # more bindings than max_shape_plans keeps
        check(cg, x_of(batch, seed=batch))
    check(cg, x_of(2, dtype=np.float16))  # converted losslessly, never cached
    check(cg, x_of(2, seed=3)[:, ::-1].copy()[:, ::-1])  # a strided view of the right dtype
    check(cg, np.asfortranarray(x_of(2, seed=4)))
    assert all(len(sig) == 1 and sig[0][1] == 4 for sig in cg._feeds)


def test_same_dict_object_with_new_values() -> None:
    cg = mlp("feed_same_dict")
    feed = {"x": x_of(2)}
    for seed in range(3):
        feed["x"] = x_of(2, seed=seed)
        (y,) = cg.run(feed)
        np.testing.assert_allclose(y, numpy_mlp(feed["x"]), rtol=1e-5, atol=1e-6)


def test_check_finite_still_checks_values_after_a_cached_signature() -> None:
    cg = mlp("feed_finite", check_finite=True)
    check(cg, x_of(3))
    check(cg, x_of(3, seed=1))
    bad = x_of(3)
    bad[1, 2] = np.nan
    with pytest.raises(InputError, match=r"input 'x': 1 non-finite value.*index \(1, 2\)"):
        cg.run({"x": bad})
    check(cg, x_of(3, seed=2))


def test_param_changes_reach_runs_with_a_cached_signature() -> None:
    cg = mlp("feed_param")
    check(cg, x_of(3))
    check(cg, x_of(3))
    w2 = W[::-1].copy() * 2
    cg.set_param("w", w2)
    check(cg, x_of(3, seed=5), w2)
    with pytest.raises(InputError, match=r"param 'w'"):
        cg.set_param("w", np.ones((4, 4), np.float32))
    check(cg, x_of(3, seed=6), w2)


def test_unset_param_is_reported_on_every_run_until_set() -> None:
    g = rlx.Graph("feed_unset")
    x = g.input("x", (2, 4))
    w = g.param("w", (4, 3))
    g.set_outputs([g.add(g.matmul(g.tanh(x), w), 1.0)])
    cg = Session("cpu").compile(g, CompileOptions(use_cache=False))
    feed = {"x": x_of(2)}
    for _ in range(2):
        with pytest.raises(InputError, match=r"param\(s\) \['w'\] never set"):
            cg.run(feed)
    cg.set_param("w", W)
    check(cg, x_of(2))
    check(cg, x_of(2, seed=1))


def test_an_input_no_output_reads_is_still_checked() -> None:
    g = rlx.Graph("feed_unused")
    x = g.input("x", (2, 3))
    g.input("unused", (2, 3))
    g.set_outputs([g.mul(x, 2.0)])
    cg = Session("cpu").compile(g, CompileOptions(use_cache=False))
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(2):
        (y,) = cg.run({"x": a, "unused": a})
        np.testing.assert_array_equal(y, a * 2)
    with pytest.raises(InputError, match=r"missing input\(s\) \['unused'\]"):
        cg.run({"x": a})
    with pytest.raises(InputError, match=r"input 'unused': expected dtype f32"):
        cg.run({"x": a, "unused": a.astype(np.float64)})
    with pytest.raises(InputError, match=r"unknown input\(s\) \['other'\]"):
        cg.run({"x": a, "other": a})
    with pytest.raises(InputError, match=r"input 'x': expected dtype f32"):
        cg.run({"x": a.astype(np.float64), "unused": a})
