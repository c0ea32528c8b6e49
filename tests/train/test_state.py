"""The ``assign`` effect op and the ``barrier`` (rlx/ops/state.py) on the CPU backend:
params written in place when the compiled graph runs, after every reader."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.errors import ShapeError
from rlx.ops.state import Assign, Barrier
from rlx.options import CompileOptions

RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)


def _run3(g: rlx.Graph, params: dict, feed: dict, options=None) -> list[list[np.ndarray]]:
    cg = rlx.Session("cpu").compile(g, options, params=params)
    return [cg.run(feed) for _ in range(3)]


@pytest.mark.parametrize("options", [None, RAW], ids=["optimized", "raw"])
def test_assign_p_plus_one_advances_every_run(options):
    g = rlx.Graph("acc")
    p = g.param("p", (3,))
    g.assign(p, g.add(p, 1.0))
    g.set_outputs([g.mul(p, g.input("x", (3,)))])
    start = np.array([0.5, -1.0, 2.0], np.float32)
    kept = start.copy()
    outs = _run3(g, {"p": start}, {"x": np.ones(3, np.float32)}, options)
    for k, (y,) in enumerate(outs):
        np.testing.assert_array_equal(y, kept + k)  # each run reads the value before it
    np.testing.assert_array_equal(start, kept)  # the caller's array is never written


def test_every_reader_sees_the_old_value_within_the_run():
    """Readers built after the assign (in insertion order) still run before it."""
    g = rlx.Graph("readers")
    p = g.param("p", (2, 2))
    x = g.input("x", (2, 2))
    a = g.mul(p, x)
    g.assign(p, g.mul(p, 3.0))
    b = g.add(p, x)
    c = g.matmul(x, p)
    g.set_outputs([a, b, c])
    p0 = np.arange(4, dtype=np.float32).reshape(2, 2)
    x0 = np.full((2, 2), 2.0, np.float32)
    for k, (ga, gb, gc) in enumerate(_run3(g, {"p": p0}, {"x": x0})):
        pk = p0 * 3.0**k
        np.testing.assert_array_equal(ga, pk * x0)
        np.testing.assert_array_equal(gb, pk + x0)
        np.testing.assert_allclose(gc, x0 @ pk, rtol=1e-6)


def test_packed_weight_sees_the_new_value_next_run():
    """The SGEMM packs its weight once per param change: an assign is one."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((64, 48)).astype(np.float32)
    x0 = rng.standard_normal((16, 64)).astype(np.float32)
    d = rng.standard_normal((64, 48)).astype(np.float32)
    g = rlx.Graph("mm")
    w = g.param("w", (64, 48))
    x = g.input("x", (16, 64))
    g.assign(w, g.add(w, g.constant(d)))
    g.set_outputs([g.matmul(x, w)])
    for k, (y,) in enumerate(_run3(g, {"w": w0}, {"x": x0})):
        want = x0.astype(np.float64) @ (w0 + k * d).astype(np.float64)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_param_given_read_only_gets_private_storage_and_caller_array_is_kept():
    arr = np.ones(4, np.float32)
    arr.flags.writeable = False  # kept in place by set_param until the first write
    g = rlx.Graph("ro")
    p = g.param("p", (4,))
    g.assign(p, g.mul(p, 2.0))
    g.set_outputs([g.add(p, g.input("x", (4,)))])
    outs = _run3(g, {"p": arr}, {"x": np.zeros(4, np.float32)})
    assert [float(o[0][0]) for o in outs] == [1.0, 2.0, 4.0]
    np.testing.assert_array_equal(arr, np.ones(4, np.float32))


def test_set_param_after_assign_wins():
    g = rlx.Graph("reset")
    p = g.param("p", ())
    g.assign(p, g.add(p, 1.0))
    g.set_outputs([g.add(p, g.input("x", ()))])
    cg = rlx.Session("cpu").compile(g, params={"p": np.float32(0)})
    x = {"x": np.float32(0)}
    assert [float(cg.run(x)[0]) for _ in range(2)] == [0.0, 1.0]
    cg.set_param("p", np.float32(10))
    assert [float(cg.run(x)[0]) for _ in range(2)] == [10.0, 11.0]


def test_reference_interpreter_returns_the_token_and_changes_nothing():
    g = rlx.Graph("ref")
    p = g.param("p", (2,))
    t = g.assign(p, g.add(p, 1.0))
    g.set_outputs([t, p])
    params = {"p": np.zeros(2, np.float32)}
    tok, pv = g.evaluate({}, params)
    assert tok.shape == (0,) and tok.dtype == np.float32
    np.testing.assert_array_equal(pv, 0.0)
    np.testing.assert_array_equal(params["p"], 0.0)
    assert g.nodes[t].op == Assign() and Assign.effect and not Assign.pure


def test_assign_survives_dce_when_nothing_reads_it():
    g = rlx.Graph("dce")
    p = g.param("p", (2,))
    g.assign(p, g.add(p, 1.0))
    g.set_outputs([g.input("x", (2,))])
    cg = rlx.Session("cpu").compile(g, params={"p": np.zeros(2, np.float32)})
    assert any(isinstance(n.op, Assign) for n in cg.graph.nodes)


def test_assign_bad_target_and_value_raise_naming_them():
    g = rlx.Graph("bad")
    p = g.param("p", (2,))
    x = g.input("x", (2,))
    with pytest.raises(ShapeError, match=r"assign: the target %1 must be a param"):
        g.assign(x, p)
    with pytest.raises(ShapeError, match=r"assign.*value f32\[3\].*param's shape.*f32\[2\]"):
        g.assign(p, g.input("y", (3,)))
    with pytest.raises(ShapeError, match=r"assign.*value i32\[2\]"):
        g.assign(p, g.input("z", (2,), "i32"))


def test_barrier_is_identity_and_keeps_cse_from_merging():
    g = rlx.Graph("bar")
    x = g.input("x", (4,))
    a = g.exp(x)
    b = g.exp(g.barrier(x))
    g.set_outputs([a, b])
    cg = rlx.Session("cpu").compile(g)
    exps = [n for n in cg.graph.nodes if n.op.mnemonic == "unary"]
    assert len(exps) == 2  # CSE did not merge exp(x) and exp(barrier(x))
    xv = np.linspace(-1, 1, 4).astype(np.float32)
    ga, gb = cg.run({"x": xv})
    np.testing.assert_array_equal(ga, gb)
    np.testing.assert_allclose(ga, np.exp(xv), rtol=1e-6)
    assert Barrier.view and not Barrier.pure


def _adam_loop(p, g, m, v, lr, t, b1, b2, eps, wd, decoupled):
    """One Adam / AdamW step element by element in Python floats (f64): the oracle."""
    p, m, v = p.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
    out = []
    for i in range(p.size):
        pi, gi = p.flat[i], float(g.flat[i])
        if decoupled:
            pi *= 1.0 - lr * wd
        else:
            gi += wd * pi
        mi = b1 * m.flat[i] + (1.0 - b1) * gi
        vi = b2 * v.flat[i] + (1.0 - b2) * gi * gi
        denom = (vi**0.5) / (1.0 - b2**t) ** 0.5 + eps
        out.append((pi - lr / (1.0 - b1**t) * mi / denom, mi, vi))
    return [np.array([o[j] for o in out]).reshape(p.shape) for j in range(3)]


@pytest.mark.parametrize(
    "dtype,n,decoupled,native",
    [
        ("f32", 40000, True, True),  # over the parallel threshold: OpenMP chunks
        ("f32", 37, False, True),
        ("f64", 37, True, True),
        ("f32", 37, True, False),  # native kernels off: the NumPy formula
    ],
)
def test_adam_update_writes_p_m_v_in_place_like_the_formula(dtype, n, decoupled, native):
    from rlx.ops.state import AdamUpdate

    g = rlx.Graph("adam")
    p, m, v = (g.param(k, (n,), dtype) for k in ("p", "m", "v"))
    grad = g.input("g", (n,), dtype)
    lr, step = g.input("lr", (), "f64"), g.input("t", (), "f64")
    wd = 0.1
    tok = g.adam_update(p, grad, m, v, lr, step, beta1=0.8, beta2=0.99, eps=1e-6,
                        weight_decay=wd, decoupled=decoupled)  # fmt: skip
    g.set_outputs([tok])
    rng = np.random.default_rng(n)
    npdt = np.float32 if dtype == "f32" else np.float64
    state = {k: rng.standard_normal(n).astype(npdt) for k in "pm"}
    state["v"] = rng.random(n).astype(npdt)
    kept = {k: a.copy() for k, a in state.items()}
    cg = rlx.Session("cpu").compile(g, CompileOptions(native=native), params=state)
    assert any(isinstance(nd.op, AdamUpdate) for nd in cg.graph.nodes)
    cur = [kept[k].astype(np.float64) for k in "pmv"]
    for t in (1.0, 2.0):
        gv = rng.standard_normal(n).astype(npdt)
        (out,) = cg.run({"g": gv, "lr": np.float64(0.01), "t": np.float64(t)})
        assert out.shape == (0,)
        cur = _adam_loop(*cur[:1], gv, *cur[1:], 0.01, t, 0.8, 0.99, 1e-6, wd, decoupled)
        tol = 1e-5 if dtype == "f32" else 1e-12
        for k, want in zip("pmv", cur):
            have = np.array(cg._params[k])  # the live param store
            np.testing.assert_allclose(have, want, rtol=tol, atol=tol, err_msg=k)
    for k in "pmv":  # the caller's arrays are never written
        np.testing.assert_array_equal(state[k], kept[k])


def test_adam_update_bad_inputs_raise_naming_them():
    g = rlx.Graph("bad")
    p, m, v = (g.param(k, (2,)) for k in "pmv")
    x = g.input("x", (2,))
    lr, t = g.input("lr", (), "f64"), g.input("t", (), "f64")
    with pytest.raises(ShapeError, match=r"adam_update: m %\d+ must be a param"):
        g.adam_update(p, x, x, v, lr, t)
    with pytest.raises(ShapeError, match=r"adam_update.*gradient f32\[3\].*param's shape"):
        g.adam_update(p, g.input("y", (3,)), m, v, lr, t)
    with pytest.raises(ShapeError, match=r"adam_update.*lr must be an f64 scalar"):
        g.adam_update(p, x, m, v, g.input("l2", ()), t)
