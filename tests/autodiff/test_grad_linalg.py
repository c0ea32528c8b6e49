"""Derivative and batching rules of the linear-algebra ops (MatMul in every NumPy form,
DotGeneral, DenseSolve, BatchedDenseSolve, GroupedMatMul, LoraMatMul).

Oracles: central differences in f64 (``check_vjp`` / ``check_jvp``, also compiled for the
CPU backend), PyTorch autograd for matmul, and for vmap the graph run once per example.
The compiled backward of a two-layer MLP is checked to contract its transposed operands
inside dot_general (no transpose node is left to copy).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.autodiff.batching import vmap
from rlx.autodiff.check import check_jvp, check_vjp
from rlx.autodiff.reverse import grad, vjp
from rlx.ops.linalg import (
    BatchedDenseSolve,
    DenseSolve,
    DotGeneral,
    GroupedMatMul,
    LoraMatMul,
    MatMul,
)
from rlx.ops.movement import Transpose


def _graph(build, shapes, dtype="f64"):
    g = rlx.Graph("t")
    ids = [g.input(f"x{k}", s, dtype) for k, s in enumerate(shapes)]
    g.set_outputs(build(g, *ids))
    return g


def _check(build, shapes, values=None, compiled=False, seed=0):
    g = _graph(build, shapes)
    rng = np.random.default_rng(seed)
    vals = {f"x{k}": rng.standard_normal(s) for k, s in enumerate(shapes)}
    vals.update(values or {})
    wrt = [f"x{k}" for k in range(len(shapes)) if vals[f"x{k}"].dtype.kind == "f"]
    check_vjp(g, vals, wrt, compiled=compiled, seed=seed)
    check_jvp(g, vals, wrt, compiled=compiled, seed=seed)


@st.composite
def matmul_shapes(draw):
    """Operand shapes NumPy's matmul accepts: 1-D operands, batch dims that broadcast
    (missing or 1 on either side)."""
    m, k, n = (draw(st.integers(1, 3)) for _ in range(3))
    batch = draw(st.lists(st.integers(2, 3), max_size=2))

    def side(core):
        if not core:  # a 1-D operand
            return []
        cut = draw(st.integers(0, len(batch)))
        return [1 if draw(st.booleans()) else d for d in batch[cut:]]

    a1, b1 = draw(st.booleans()), draw(st.booleans())
    a = [k] if a1 else [*side(True), m, k]
    b = [k] if b1 else [*side(True), k, n]
    return a, b


@settings(max_examples=30, deadline=None)
@given(matmul_shapes(), st.integers(0, 2**16))
def test_matmul_all_forms(shapes, seed):
    _check(lambda g, a, b: g.matmul(a, b), list(shapes), seed=seed)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (4, 5)),
        ((4,), (2, 4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((4,), (4,)),
    ],
)
def test_matmul_compiled(sa, sb):
    _check(lambda g, a, b: g.matmul(a, b), [sa, sb], compiled=True)
    assert MatMul


def test_matmul_matches_torch_autograd():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((5, 4, 2))
    ct = rng.standard_normal((2, 5, 3, 2))
    g = _graph(lambda g, x, y: g.matmul(x, y), [a.shape, b.shape])
    da, db = vjp(g, ["x0", "x1"]).evaluate({"x0": a, "x1": b, "ct0": ct})[1:]
    ta, tb = (torch.tensor(v, requires_grad=True) for v in (a, b))
    (ta @ tb).backward(torch.tensor(ct))
    np.testing.assert_allclose(da, ta.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(db, tb.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize(
    "sa,sb,contract,batch",
    [
        ((3, 2, 4), (2, 4, 5, 3), ((2, 0), (1, 3)), ((1,), (0,))),
        ((3, 4), (4, 5), ((1,), (0,)), ((), ())),
        ((4, 3), (5, 4), ((0,), (1,)), ((), ())),
        ((2, 3, 4), (2, 4), ((2,), (1,)), ((0,), (0,))),
    ],
)
def test_dot_general(sa, sb, contract, batch):
    _check(lambda g, a, b: g.dot_general(a, b, contract, batch), [sa, sb], compiled=True)
    assert DotGeneral


@pytest.mark.parametrize("sb", [(4,), (4, 2), (2, 4), (2, 4, 3)])
def test_dense_solves(sb):
    rng = np.random.default_rng(2)
    batched = len(sb) == 2 and sb[0] == 2 or len(sb) == 3
    sa = (2, 4, 4) if batched else (4, 4)
    a = rng.standard_normal(sa) + 4 * np.eye(4)  # well conditioned
    _check(lambda g, x, y: g.dense_solve(x, y), [sa, sb], values={"x0": a}, compiled=True)
    assert DenseSolve and BatchedDenseSolve


def test_dense_solve_gradient_formula():
    """dx = solve(A^T, ct), dA = -dx x^T, against NumPy."""
    rng = np.random.default_rng(3)
    a, b, ct = (
        rng.standard_normal((3, 3)) + 3 * np.eye(3),
        rng.standard_normal(3),
        rng.standard_normal(3),
    )
    g = _graph(lambda g, x, y: g.dense_solve(x, y), [(3, 3), (3,)])
    da, db = vjp(g, ["x0", "x1"]).evaluate({"x0": a, "x1": b, "ct0": ct})[1:]
    want_db = np.linalg.solve(a.T, ct)
    np.testing.assert_allclose(db, want_db, rtol=1e-12)
    np.testing.assert_allclose(da, -np.outer(want_db, np.linalg.solve(a, b)), rtol=1e-12)


def test_grouped_and_lora_matmul():
    ids = np.array([0, 2, 0, 1, 2], np.int32)
    _check(
        lambda g, x, w: g.grouped_matmul(x, w, g.constant(ids)), [(5, 3), (3, 3, 4)], compiled=True
    )
    _check(
        lambda g, x, w, a, b: g.lora_matmul(x, w, a, b, 0.5),
        [(2, 3, 4), (4, 5), (4, 2), (2, 5)],
        compiled=True,
    )
    assert GroupedMatMul and LoraMatMul


def test_grouped_matmul_with_a_symbolic_expert_count():
    """The weight gradient scatters outer products when the expert count is symbolic."""
    g = rlx.Graph("gs")
    e = g.sym("experts", max=8)
    x, w = g.input("x", (5, 3), "f64"), g.input("w", (e, 3, 4), "f64")
    g.set_outputs(g.grouped_matmul(x, w, g.input("i", (5,), "i32")))
    rng = np.random.default_rng(6)
    vals = {
        "x": rng.standard_normal((5, 3)),
        "w": rng.standard_normal((3, 3, 4)),
        "i": np.array([0, 2, 0, 1, 2], np.int32),
    }
    check_vjp(g, vals, ["x", "w"], compiled=True)
    check_jvp(g, vals, ["x", "w"])


@pytest.mark.parametrize(
    "sa,sb,axes",
    [
        ((3, 4), (4, 2), {"x0": 0}),
        ((3, 4), (4, 2), {"x1": 1}),
        ((3, 4), (4, 2), {"x0": 1, "x1": 0}),
        ((4,), (4, 2), {"x0": 0}),
        ((3, 4), (4,), {"x1": 0, "x0": 2}),
        ((2, 3, 4), (4, 2), {"x1": 0}),
        ((4,), (4,), {"x0": 0, "x1": 0}),
    ],
)
def test_vmap_matmul_matches_a_loop(sa, sb, axes):
    g = _graph(lambda g, a, b: g.matmul(a, b), [sa, sb])
    n, rng = 3, np.random.default_rng(4)
    vals = {}
    for name, s in (("x0", sa), ("x1", sb)):
        s = list(s)
        if axes.get(name) is not None:
            s.insert(axes[name], n)
        vals[name] = rng.standard_normal(s)
    vg = vmap(g, axes, size=n)
    assert len(vg.find(MatMul)) == 1, "one batched matmul, not a loop"
    want = []
    for k in range(n):
        feed = {m: np.take(v, k, axes[m]) if m in axes else v for m, v in vals.items()}
        want.append(np.matmul(feed["x0"], feed["x1"]))
    np.testing.assert_allclose(vg.evaluate(vals)[0], np.stack(want), rtol=1e-12)


def test_mlp_backward_contracts_inside_dot_general():
    """loss = sum(relu(x @ W1 + b1) @ W2): the weight and input gradients are
    dot_generals over the forward operands, with no transpose node to copy them."""
    g = rlx.Graph("mlp")
    x = g.input("x", (8, 6))
    w1, b1, w2 = g.param("w1", (6, 5)), g.param("b1", (5,)), g.param("w2", (5, 3))
    g.set_outputs(g.sum(g.matmul(g.relu(g.add(g.matmul(x, w1), b1)), w2)))
    gg = grad(g, ["x", "w1", "b1", "w2"])
    assert not gg.find(Transpose) and len(gg.find(DotGeneral)) == 4
    rng = np.random.default_rng(5)
    params = {
        k: rng.standard_normal(s).astype(np.float32)
        for k, s in (("w1", (6, 5)), ("b1", (5,)), ("w2", (5, 3)))
    }
    xv = rng.standard_normal((8, 6)).astype(np.float32)
    cg = rlx.Session("cpu").compile(gg, params=params)
    kinds = [k.op for k in cg.report().kernels]
    assert "transpose" not in kinds and kinds.count("dot_general") >= 3
    pre = xv @ params["w1"] + params["b1"]
    dh = np.ones((8, 3), np.float32) @ params["w2"].T * (pre > 0)
    got = cg.run({"x": xv})
    np.testing.assert_allclose(got[0], dh @ params["w1"].T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], xv.T @ dh, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[3], np.maximum(pre, 0).T @ np.ones((8, 3)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axes", [{"x0": 0}, {"x1": 2}, {"x0": 1, "x1": 0}])
def test_vmap_dot_general_matches_a_loop(axes):
    contract, batch = ((2,), (1,)), ((0,), (0,))
    g = _graph(lambda g, a, b: g.dot_general(a, b, contract, batch), [(2, 3, 4), (2, 4, 5)])
    n, rng = 3, np.random.default_rng(8)
    vals = {}
    for name, s in (("x0", [2, 3, 4]), ("x1", [2, 4, 5])):
        if name in axes:
            s.insert(axes[name], n)
        vals[name] = rng.standard_normal(s)
    vg = vmap(g, axes, size=n)
    assert len(vg.find(DotGeneral)) == 1
    want = [
        np.einsum(
            "bik,bkj->bij", *(np.take(v, k, axes[m]) if m in axes else v for m, v in vals.items())
        )
        for k in range(n)
    ]
    np.testing.assert_allclose(vg.evaluate(vals)[0], np.stack(want), rtol=1e-12)
