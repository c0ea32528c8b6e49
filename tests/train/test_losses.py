"""Losses (rlx/ops/compose/losses.py) against torch.nn.functional: values and gradients with
respect to the predictions (rlx.value_and_grad, compiled), f64, and the NumPy accuracy."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.errors import InputError
from rlx.ops.compose.losses import accuracy, cross_entropy, mse
from rlx.options import CompileOptions

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _value_and_grad(build, shapes, feed):
    g = rlx.Graph("loss")
    ids = {k: g.input(k, s, dt) for k, (s, dt) in shapes.items()}
    g.set_outputs([build(g, ids)])
    vg = rlx.value_and_grad(g, ["pred"])
    cg = rlx.Session("cpu").compile(vg, CompileOptions(use_cache=False))
    loss, grad = cg.run(feed)
    return loss, grad


def _torch(fn, pred, *rest):
    p = torch.tensor(pred, requires_grad=True)
    out = fn(p, *(torch.tensor(r) for r in rest))
    out.sum().backward()
    return out.detach().numpy(), p.grad.numpy()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_integer_labels_matches_torch(reduction):
    rng = np.random.default_rng(0)
    pred, y = rng.standard_normal((5, 4)) * 3, rng.integers(0, 4, 5)
    shapes = {"pred": ((5, 4), "f64"), "y": ((5,), "i64")}

    def build(g, ids):
        loss = cross_entropy(g, ids["pred"], ids["y"], reduction=reduction)
        return loss if reduction != "none" else g.sum(loss)

    loss, grad = _value_and_grad(build, shapes, {"pred": pred, "y": y})
    want, want_grad = _torch(lambda p, t: F.cross_entropy(p, t, reduction=reduction), pred, y)
    np.testing.assert_allclose(loss, want.sum(), rtol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-14)


def test_cross_entropy_with_probabilities_and_leading_dims_matches_torch():
    rng = np.random.default_rng(1)
    pred = rng.standard_normal((2, 3, 5))
    t = rng.random((2, 3, 5))
    t /= t.sum(-1, keepdims=True)
    shapes = {"pred": ((2, 3, 5), "f64"), "t": ((2, 3, 5), "f64")}
    loss, grad = _value_and_grad(
        lambda g, i: cross_entropy(g, i["pred"], i["t"]), shapes, {"pred": pred, "t": t}
    )
    # torch puts the classes on axis 1: move ours (the last) there
    want, want_grad = _torch(
        lambda p, q: F.cross_entropy(p.permute(0, 2, 1), q.permute(0, 2, 1)), pred, t
    )
    np.testing.assert_allclose(loss, want, rtol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_mse_matches_torch(reduction):
    rng = np.random.default_rng(2)
    pred, t = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    shapes = {"pred": ((4, 3), "f64"), "t": ((4, 3), "f64")}
    loss, grad = _value_and_grad(
        lambda g, i: mse(g, i["pred"], i["t"], reduction=reduction),
        shapes,
        {"pred": pred, "t": t},
    )
    want, want_grad = _torch(lambda p, q: F.mse_loss(p, q, reduction=reduction), pred, t)
    np.testing.assert_allclose(loss, want, rtol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12)


def test_accuracy_counts_argmax_hits():
    logits = np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 3.0], [5.0, 4.0]])
    assert accuracy(logits, np.array([1, 0, 0, 1])) == 0.5
    with pytest.raises(InputError, match=r"labels of shape \(3,\) for logits of shape \(4, 2\)"):
        accuracy(logits, np.zeros(3))


def test_bad_targets_raise_naming_the_node():
    g = rlx.Graph("bad")
    x = g.input("x", (4, 3))
    with pytest.raises(InputError, match=r"integer labels %1 must have .* \[4\]; given i64\[4,3\]"):
        cross_entropy(g, x, g.input("y", (4, 3), "i64"))
    with pytest.raises(InputError, match=r"probabilities %2 must have the logits' shape"):
        cross_entropy(g, x, g.input("p", (4, 2)))
    with pytest.raises(InputError, match=r"target %3 must hold integer labels"):
        cross_entropy(g, x, g.input("b", (4,), "bool"))
    with pytest.raises(InputError, match=r"reduction must be one of"):
        mse(g, x, x, reduction="avg")
    assert len(g) == 4  # bad input added no node
