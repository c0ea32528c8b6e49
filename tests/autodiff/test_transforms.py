"""The graph transforms jvp, hvp and vmap (rlx/autodiff), against NumPy closed forms, finite
differences of the gradient and per-example NumPy loops (jax.vmap's semantics for
in_axes / out_axes: ``out = moveaxis(stack([f(x[b]) for b]), 0, out_axes)``)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.autodiff import grad, hvp, jvp, vmap
from rlx.autodiff.check import check_jvp
from rlx.errors import AutodiffError
from rlx.ops.base import Op, register
from rlx.runtime.session import Session
from rlx.shape import Shape

RNG = np.random.default_rng(7)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


# ---- forward mode ---------------------------------------------------------------------


def _tanh_mul() -> tuple[rlx.Graph, int, int]:
    g = rlx.Graph("tm")
    x = g.input("x", [2, 3], "f64")
    y = g.input("y", [3], "f64")
    w = g.param("w", [3], "f64")
    a = g.mul(g.tanh(x), w)
    b = g.exp(y)
    g.set_outputs([a, b])
    return g, a, b


def test_jvp_layout_and_closed_form() -> None:
    g, _, _ = _tanh_mul()
    j = jvp(g, ["w", "x"])
    assert j.input_names == ["x", "y", "t_w", "t_x"]
    assert len(j.outputs) == 4
    x, y, w, tw, tx = _rand(2, 3), _rand(3), _rand(3), _rand(3), _rand(2, 3)
    a, b, ta, tb = j.evaluate({"x": x, "y": y, "t_w": tw, "t_x": tx}, {"w": w})
    t = np.tanh(x)
    np.testing.assert_allclose(a, t * w, rtol=1e-12)
    np.testing.assert_allclose(ta, (1 - t**2) * tx * w + t * tw, rtol=1e-12)
    # exp(y) does not depend on w or x: a zero tangent of its shape and dtype
    assert tb.shape == (3,) and tb.dtype == np.float64 and not tb.any()
    np.testing.assert_allclose(b, np.exp(y), rtol=1e-12)


def test_jvp_fan_out_against_finite_differences() -> None:
    g = rlx.Graph("fan")
    x = g.input("x", [4], "f64")
    w = g.input("w", [4], "f64")
    s = g.sin(x)
    h = g.add(g.mul(s, w), g.mul(s, s))  # s read three times
    g.set_outputs([g.sum(g.mul(h, x), [0]), h])
    check_jvp(g, {"x": _rand(4), "w": _rand(4)}, ["x", "w"], compiled=True)


def test_jvp_tangent_names_avoid_taken_names() -> None:
    g = rlx.Graph("names")
    x = g.input("x", [2], "f64")
    t = g.input("t_x", [2], "f64")
    g.set_outputs([g.mul(x, t)])
    j = jvp(g, ["x"])
    assert j.input_names == ["x", "t_x", "_t_x"]
    x0, t0, v = _rand(2), _rand(2), _rand(2)
    out = j.evaluate({"x": x0, "t_x": t0, "_t_x": v})
    np.testing.assert_allclose(out[1], v * t0, rtol=1e-12)


def test_jvp_nodes_carry_the_forward_nodes_line() -> None:
    g = rlx.Graph("loc")
    x = g.input("x", [3], "f64")
    y = g.tanh(x)
    g.set_outputs([y])
    j = jvp(g, ["x"])
    line = g.nodes[y].loc
    added = j.nodes[len(g.nodes) + 1 :]  # after the tangent input
    assert added and all(n.loc == line for n in added)


# ---- Hessian-vector products ----------------------------------------------------------


def test_hvp_quadratic_form() -> None:
    g = rlx.Graph("quad")
    x = g.input("x", [4, 1], "f64")
    a = g.param("a", [4, 4], "f64")
    g.set_outputs([g.sum(g.mul(x, g.matmul(a, x)), [0, 1])])
    h = hvp(g, ["x"])
    assert h.input_names == ["x", "v_x"]
    av, xv, v = _rand(4, 4), _rand(4, 1), _rand(4, 1)
    (hv,) = h.evaluate({"x": xv, "v_x": v}, {"a": av})
    np.testing.assert_allclose(hv, (av + av.T) @ v, rtol=1e-10)


def test_hvp_sum_tanh_wx_with_cross_terms() -> None:
    """H of sum(tanh(W x)) over (W, x) jointly, applied to (V, u): the block Hessian."""
    g = rlx.Graph("tanh_wx")
    x = g.input("x", [3, 1], "f64")
    w = g.input("w", [2, 3], "f64")
    g.set_outputs([g.sum(g.tanh(g.matmul(w, x)), [0, 1])])
    h = hvp(g, ["w", "x"])
    assert h.input_names == ["x", "w", "v_w", "v_x"]
    xv, wv, vw, vx = _rand(3, 1), _rand(2, 3), _rand(2, 3), _rand(3, 1)
    hw, hx = h.evaluate({"x": xv, "w": wv, "v_w": vw, "v_x": vx})
    t = np.tanh(wv @ xv)
    d1, d2 = 1 - t**2, -2 * t * (1 - t**2)  # tanh', tanh''
    dz = vw @ xv + wv @ vx  # the pre-activation's change along (V, u)
    np.testing.assert_allclose(hw, (d2 * dz) @ xv.T + d1 @ vx.T, rtol=1e-10)
    np.testing.assert_allclose(hx, wv.T @ (d2 * dz) + vw.T @ d1, rtol=1e-10)


def test_hvp_log_sum_exp() -> None:
    g = rlx.Graph("lse")
    x = g.input("x", [5], "f64")
    g.set_outputs([g.log(g.sum(g.exp(x), [0]))])
    h = hvp(g, ["x"])
    xv, v = _rand(5), _rand(5)
    (hv,) = h.evaluate({"x": xv, "v_x": v})
    p = np.exp(xv) / np.exp(xv).sum()
    np.testing.assert_allclose(hv, (np.diag(p) - np.outer(p, p)) @ v, rtol=1e-10, atol=1e-14)


def test_hvp_matches_finite_differences_of_the_gradient() -> None:
    g = rlx.Graph("mix")
    x = g.input("x", [3], "f64")
    w = g.param("w", [3], "f64")
    z = g.mul(g.sin(x), g.exp(g.mul(w, x)))
    g.set_outputs([g.sum(g.mul(z, z), [0])])
    gr = grad(g, ["x", "w"])
    h = hvp(g, ["x", "w"])
    xv, wv, vx, vw = _rand(3), _rand(3) * 0.3, _rand(3), _rand(3)
    eps = 1e-6
    plus = gr.evaluate({"x": xv + eps * vx}, {"w": wv + eps * vw})
    minus = gr.evaluate({"x": xv - eps * vx}, {"w": wv - eps * vw})
    got = h.evaluate({"x": xv, "v_x": vx, "v_w": vw}, {"w": wv})
    for a, b, c in zip(got, plus, minus, strict=True):
        np.testing.assert_allclose(a, (b - c) / (2 * eps), rtol=1e-6, atol=1e-8)


# ---- vmap -----------------------------------------------------------------------------


def _elementwise_graph(xs: tuple[int, ...], ys: tuple[int, ...]) -> rlx.Graph:
    g = rlx.Graph("ew")
    x = g.input("x", list(xs), "f64")
    y = g.input("y", list(ys), "f64")
    g.set_outputs([g.add(g.mul(g.tanh(x), y), g.exp(g.neg(y))), g.sin(x)])
    return g


def _np_ew(x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    return [np.tanh(x) * y + np.exp(-y), np.sin(x)]


def _batched(a: np.ndarray, axis: int | None, size: int) -> np.ndarray:
    if axis is None:
        return a
    return np.moveaxis(np.stack([a * (k + 1) - k for k in range(size)]), 0, axis)


def _example(a: np.ndarray, axis: int | None, k: int) -> np.ndarray:
    return a if axis is None else np.take(a, k, axis=axis)


@given(
    rank=st.integers(0, 3),
    ydrop=st.integers(0, 3),
    size=st.integers(1, 4),
    data=st.data(),
)
def test_vmap_elementwise_matches_a_loop(rank: int, ydrop: int, size: int, data) -> None:
    xs = tuple(data.draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)))
    ys = tuple(d if data.draw(st.booleans()) else 1 for d in xs[min(ydrop, rank) :])
    ax = data.draw(st.sampled_from([None, *range(len(xs) + 1)]))
    ay = data.draw(st.sampled_from([None, *range(len(ys) + 1)]))
    if ax is None and ay is None:
        ax = 0
    oa = data.draw(st.integers(0, len(xs)))
    g = _elementwise_graph(xs, ys)
    v = vmap(g, {"x": ax, "y": ay}, out_axes=oa, size=size)
    x = _batched(_rand(*xs), ax, size)
    y = _batched(_rand(*ys), ay, size)
    got = v.evaluate({"x": x, "y": y})
    for k, out in enumerate(got):
        loop = [_np_ew(_example(x, ax, b), _example(y, ay, b))[k] for b in range(size)]
        np.testing.assert_allclose(out, np.moveaxis(np.stack(loop), 0, oa), rtol=1e-12)


def test_vmap_in_axes_out_axes_semantics() -> None:
    """jax.vmap's conventions: an int in_axes batches every input, an unbatched output is
    broadcast along the batch, out_axes per output, negative axes count from the end."""
    g = _elementwise_graph((2, 3), (3,))
    v = vmap(g, 0, out_axes=[-1, 1], size=4)
    assert [v.shape(i).dims for i in (0, 1)] == [(4, 2, 3), (4, 3)]
    x, y = _rand(4, 2, 3), _rand(4, 3)
    a, s = v.evaluate({"x": x, "y": y})
    np.testing.assert_allclose(a, np.moveaxis(np.tanh(x) * y[:, None] + np.exp(-y)[:, None], 0, -1))
    np.testing.assert_allclose(s, np.moveaxis(np.sin(x), 0, 1))
    # only y batched: sin(x) does not depend on it and is broadcast along the batch
    v = vmap(g, {"y": 0}, size=4)
    a, s = v.evaluate({"x": x[0], "y": y})
    np.testing.assert_allclose(s, np.broadcast_to(np.sin(x[0]), (4, 2, 3)))
    # ... or kept unbatched with out_axes None
    v = vmap(g, {"y": 0}, out_axes=[0, None], size=4)
    assert v.shape(v.outputs[1]).dims == (2, 3)


def test_vmap_symbolic_batch_size_runs_at_any_size_compiled() -> None:
    g = rlx.Graph("sym")
    x = g.input("x", [3], "f32")
    w = g.param("w", [3], "f32")
    g.set_outputs([g.mul(g.sigmoid(x), w)])
    v = vmap(g, {"x": 0}, size="n")
    assert v.input_nodes()[0].shape.dims[0] == rlx.sym("n")
    wv = _rand(3).astype(np.float32)
    c = Session("cpu").compile(v, params={"w": wv})
    for n in (1, 5):
        xv = _rand(n, 3).astype(np.float32)
        (out,) = c.run({"x": xv})
        np.testing.assert_allclose(out, wv / (1 + np.exp(-xv)), rtol=1e-5)


def test_vmap_reduction_and_matmul_match_a_loop() -> None:
    g = rlx.Graph("rm")
    x = g.input("x", [3, 4], "f64")
    w = g.param("w", [4, 2], "f64")
    y = g.matmul(x, w)
    g.set_outputs([g.sum(g.mul(y, y), [1]), g.softmax(y, -1)])
    v = vmap(g, {"x": 2}, size=3)
    x, w = _rand(3, 4, 3), _rand(4, 2)
    s, p = v.evaluate({"x": x}, {"w": w})
    for b in range(3):
        yb = x[:, :, b] @ w
        np.testing.assert_allclose(s[b], (yb * yb).sum(1), rtol=1e-12)
        e = np.exp(yb - yb.max(-1, keepdims=True))
        np.testing.assert_allclose(p[b], e / e.sum(-1, keepdims=True), rtol=1e-12)


def _row_cumsum_op() -> type[Op]:
    """An op with no batching rule (defined in the test, removed after it): the vmap
    driver must fall back to one application per example."""

    @register
    class RowCumsum(Op):
        """Running sum along the last axis, with no batch rule."""

        mnemonic: ClassVar[str] = "test_row_cumsum"
        arity: ClassVar[int] = 1

        def infer(self, ins: tuple[Shape, ...]) -> Shape:
            return ins[0]

        def reference(self, xs, ctx):
            return np.cumsum(xs[0], axis=-1)

    return RowCumsum


def test_vmap_per_example_fallback_for_an_op_without_a_rule() -> None:
    op = _row_cumsum_op()
    g = rlx.Graph("fb")
    x = g.input("x", [2, 3], "f64")
    g.set_outputs([g.exp(g.apply(op(), [x]))])
    v = vmap(g, {"x": 1}, size=4)
    xv = _rand(2, 4, 3)
    (out,) = v.evaluate({"x": xv})
    want = np.stack([np.exp(np.cumsum(xv[:, b], axis=-1)) for b in range(4)])
    np.testing.assert_allclose(out, want, rtol=1e-12)
    with pytest.raises(AutodiffError, match="test_row_cumsum.*no batching rule") as e:
        vmap(g, {"x": 0}, size="n")
    assert e.value.loc == g.nodes[2].loc


def test_vmap_over_a_param_and_of_a_gradient_graph() -> None:
    """A batched param (one weight vector per example), and vmap of a grad graph:
    per-example gradients of sum(tanh(x * w)) wrt w."""
    g = rlx.Graph("pg")
    x = g.input("x", [3], "f64")
    w = g.param("w", [3], "f64")
    g.set_outputs([g.sum(g.tanh(g.mul(x, w)), [0])])
    v = vmap(grad(g, ["w"]), {"x": 0, "w": 0}, size=4)
    xs, ws = _rand(4, 3), _rand(4, 3)
    (gw,) = v.evaluate({"x": xs}, {"w": ws})
    np.testing.assert_allclose(gw, xs * (1 - np.tanh(xs * ws) ** 2), rtol=1e-12)
