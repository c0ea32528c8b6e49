"""Derivative rules of the normalisations (LayerNorm, RmsNorm, GroupNorm) and their
backward ops (LayerNormBackward, LayerNormBackwardGamma, RmsNormBackward) against finite differences in f64
(``rlx.autodiff.check``: reference interpreter and compiled CPU graph) on hypothesis-drawn
shapes; layer norm's gradients against torch.autograd in f32; vmap of layer / RMS norm
(batched x, batched gamma) against a loop over the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.autodiff import grad, vjp, vmap
from rlx.autodiff.check import check_jvp, check_vjp
from rlx.ops.nn_grad import LayerNormBackward, LayerNormBackwardGamma, RmsNormBackward
from rlx.options import CompileOptions
from rlx.runtime.session import Session

FEW = settings(max_examples=3, deadline=None)


def _check(g: rlx.Graph, values: dict[str, np.ndarray]) -> None:
    check_vjp(g, values, list(values), compiled=True)
    check_jvp(g, values, list(values), compiled=True)


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
@FEW
@given(
    lead=st.lists(st.integers(1, 3), max_size=2),
    d=st.integers(1, 6),
    beta=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_last_axis_norms(norm: str, lead: list[int], d: int, beta: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (*lead, d)
    g = rlx.Graph(norm)
    x = g.input("x", shape, "f64")
    gamma = g.input("gamma", (d,), "f64")
    values = {"x": rng.standard_normal(shape) * 2 + 1, "gamma": rng.standard_normal(d)}
    b = None
    if beta:
        b = g.input("beta", (d,), "f64")
        values["beta"] = rng.standard_normal(d)
    g.set_outputs([getattr(g, norm)(x, gamma, b, eps=1e-3)])
    _check(g, values)


@FEW
@given(
    n=st.integers(1, 2),
    groups=st.integers(1, 3),
    per=st.integers(1, 2),
    spatial=st.lists(st.integers(1, 3), max_size=2),
    seed=st.integers(0, 2**16),
)
def test_group_norm(n: int, groups: int, per: int, spatial: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    c = groups * per
    shape = (n, c, *spatial)
    if per * int(np.prod(spatial)) == 1:
        shape = (n, c, *spatial, 2)  # one element per group normalises to exactly 0
    g = rlx.Graph("group_norm")
    x, gamma, beta = (g.input(k, s, "f64") for k, s in (("x", shape), ("g", (c,)), ("b", (c,))))
    g.set_outputs([g.group_norm(x, gamma, beta, groups, eps=1e-3)])
    _check(
        g,
        {"x": rng.standard_normal(shape), "g": rng.standard_normal(c), "b": rng.standard_normal(c)},
    )


def test_second_order_through_layer_norm_fails_clearly() -> None:
    """The backward ops have no rules of their own: hvp through them names the op."""
    g = rlx.Graph("ln2")
    x = g.input("x", (2, 4), "f64")
    gamma = g.input("gamma", (4,), "f64")
    g.set_outputs([g.sum(g.square(g.layer_norm(x, gamma)))])
    first = grad(g, ["x"])
    first.set_outputs([first.sum(first.outputs[0])])
    with pytest.raises(rlx.errors.AutodiffError, match="layer_norm_backward.*not differentiable"):
        grad(first, ["x"])


BACKWARD = [(LayerNormBackward, "x"), (RmsNormBackward, "x"), (RmsNormBackward, "gamma")]


@pytest.mark.parametrize(("op", "wrt"), BACKWARD)
def test_backward_op_shape_rule_and_bad_input(op: type, wrt: str) -> None:
    g = rlx.Graph("b")
    x = g.input("x", (3, 4), "f32")
    gamma = g.input("gamma", (4,), "f32")
    ct = g.input("ct", (3, 4), "f32")
    out = g.apply(op(1e-5, wrt), [x, gamma, ct])
    assert g.shape(out).dims == ((3, 4) if wrt == "x" else (4,))
    bad = g.input("bad", (3, 5), "f32")
    with pytest.raises(rlx.errors.ShapeError, match="cotangent must match"):
        g.apply(op(1e-5, wrt), [x, gamma, bad])
    with pytest.raises(rlx.errors.ShapeError, match="wrt must be 'x'"):
        g.apply(op(1e-5, "beta"), [x, gamma, ct])


def test_layer_norm_backward_gamma_shape_rule() -> None:
    """Layer norm's dgamma is its own op (inputs x and ct); layer_norm_backward is dx only."""
    g = rlx.Graph("b")
    x = g.input("x", (2, 3, 4), "f32")
    gamma = g.input("gamma", (4,), "f32")
    ct = g.input("ct", (2, 3, 4), "f32")
    assert g.shape(g.apply(LayerNormBackwardGamma(1e-5), [x, ct])).dims == (4,)
    with pytest.raises(rlx.errors.ShapeError, match="cotangent must match"):
        g.apply(LayerNormBackwardGamma(1e-5), [x, g.input("bad", (2, 3, 5), "f32")])
    with pytest.raises(rlx.errors.ShapeError, match="layer_norm_backward_gamma"):
        g.apply(LayerNormBackward(1e-5, "gamma"), [x, gamma, ct])


def test_layer_norm_gradients_match_torch_f32() -> None:
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((4, 7, 32)).astype(np.float32) * 3 + 1
    gs = rng.standard_normal(32).astype(np.float32)
    bs = rng.standard_normal(32).astype(np.float32)
    ws = rng.standard_normal((4, 7, 32)).astype(np.float32)  # a weighted-sum loss
    g = rlx.Graph("ln")
    x, gamma, beta, w = (g.input(k, v.shape, "f32") for k, v in zip("xgbw", (xs, gs, bs, ws)))
    g.set_outputs([g.sum(g.mul(g.layer_norm(x, gamma, beta, eps=1e-5), w))])
    back = grad(g, ["x", "g", "b"])
    ops = [n.op.mnemonic for n in back.nodes]
    assert ops.count("layer_norm_backward") == ops.count("layer_norm_backward_gamma") == 1
    got = Session("cpu").compile(back).run({"x": xs, "g": gs, "b": bs, "w": ws})
    tx, tg, tb = (torch.tensor(a, requires_grad=True) for a in (xs, gs, bs))
    loss = (torch.nn.functional.layer_norm(tx, (32,), tg, tb, 1e-5) * torch.tensor(ws)).sum()
    loss.backward()
    for a, t in zip(got, (tx, tg, tb), strict=True):
        want = t.grad.numpy()
        assert np.max(np.abs(a - want)) <= 1e-5 * max(1.0, float(np.max(np.abs(want)))) * 4


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("batched_gamma", [False, True])
def test_vmap_norm_matches_a_loop(norm: str, axis: int, batched_gamma: bool) -> None:
    rng = np.random.default_rng(axis)
    g = rlx.Graph("n")
    x = g.input("x", (3, 5), "f64")
    gamma = g.input("gamma", (5,), "f64")
    beta = g.input("beta", (5,), "f64")
    g.set_outputs([getattr(g, norm)(x, gamma, beta)])
    v = 4
    xs = np.moveaxis(rng.standard_normal((v, 3, 5)), 0, axis)
    gs = rng.standard_normal((v, 5)) if batched_gamma else rng.standard_normal(5)
    bs = rng.standard_normal(5)
    axes = {"x": axis, "gamma": 0 if batched_gamma else None, "beta": None}
    mapped = vmap(g, axes, size=v)
    assert any(n.op.mnemonic == norm for n in mapped.nodes)
    (got,) = mapped.evaluate({"x": xs, "gamma": gs, "beta": bs}, {})
    for i in range(v):
        gi = gs[i] if batched_gamma else gs
        (want,) = g.evaluate({"x": np.take(xs, i, axis), "gamma": gi, "beta": bs}, {})
        np.testing.assert_allclose(got[i], want, rtol=1e-12, atol=1e-12)


def test_layer_norm_vjp_on_a_symbolic_batch() -> None:
    g = rlx.Graph("sym")
    b = g.sym("batch")
    x = g.input("x", (b, 6), "f64")
    gamma = g.input("gamma", (6,), "f64")
    g.set_outputs([g.layer_norm(x, gamma)])
    back = vjp(g, ["x", "gamma"])
    cg = Session("cpu").compile(back)
    rng = np.random.default_rng(1)
    for n in (1, 3):
        feed = {
            k.op.name: rng.standard_normal([n if d is b else d for d in k.shape.dims])
            for k in back.input_nodes()
        }
        for got, want in zip(cg.run(feed), back.evaluate(feed, {}), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("isa", ["auto", "avx2", "portable"])
@pytest.mark.parametrize(("op", "wrt"), [*BACKWARD, (LayerNormBackwardGamma, None)])
def test_native_norm_backward_on_two_threads(isa: str, op: type, wrt: str, monkeypatch) -> None:
    """The native kernel (csrc/norm_grad.c) at a size that uses the OpenMP team, per build
    target, against the NumPy reference."""
    monkeypatch.setenv("RLX_ISA", isa)
    rng = np.random.default_rng(3)
    rows, d = 300, 130
    feed = {
        "x": rng.standard_normal((rows, d)).astype(np.float32) * 2 + 1,
        "gamma": rng.standard_normal(d).astype(np.float32),
        "ct": rng.standard_normal((rows, d)).astype(np.float32),
    }
    if wrt is None:  # layer norm's dgamma does not read gamma
        del feed["gamma"]
    g = rlx.Graph("nb")
    ids = [g.input(k, v.shape, "f32") for k, v in feed.items()]
    g.set_outputs([g.apply(op(1e-5) if wrt is None else op(1e-5, wrt), ids)])
    cg = Session("cpu").compile(g, CompileOptions(num_threads=2, use_cache=False))
    assert [k.kind.value for k in cg.report().kernels if k.op == op.mnemonic] == ["native"]
    (want,) = g.evaluate(feed, {})
    (got,) = cg.run(feed)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_vmap_rms_norm_with_only_gamma_mapped() -> None:
    rng = np.random.default_rng(4)
    g = rlx.Graph("n")
    x = g.input("x", (3, 5), "f64")
    gamma = g.input("gamma", (5,), "f64")
    g.set_outputs([g.rms_norm(x, gamma)])
    xs, gs = rng.standard_normal((3, 5)), rng.standard_normal((5, 4))
    (got,) = vmap(g, {"x": None, "gamma": 1}, size=4).evaluate({"x": xs, "gamma": gs}, {})
    for i in range(4):
        (want,) = g.evaluate({"x": xs, "gamma": gs[:, i]}, {})
        np.testing.assert_allclose(got[i], want, rtol=1e-12, atol=1e-12)
