"""Derivative rules of the training step's ops (rlx/ops/state.py): ``barrier`` is the
identity for vjp and jvp (finite differences, f64, reference and compiled); ``assign``
writes state, has no rule, and stays off the gradient path."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.autodiff.check import check_jvp, check_vjp
from rlx.ops.state import Assign, Barrier


@pytest.mark.parametrize("compiled", [False, True])
def test_barrier_rules_match_finite_differences(compiled):
    g = rlx.Graph("bar")
    x = g.input("x", (3, 4), "f64")
    g.set_outputs([g.sum(g.mul(g.exp(g.barrier(x)), g.barrier(g.sin(x))))])
    values = {"x": np.random.default_rng(0).standard_normal((3, 4))}
    check_vjp(g, values, ["x"], compiled=compiled)
    check_jvp(g, values, ["x"], compiled=compiled)
    assert Barrier.nondiff == ""


def test_assign_stays_off_the_gradient_path():
    """The step graph differentiates a model that also writes its params: the write does
    not change the gradient (it runs after every reader), and assign has no rule."""
    g = rlx.Graph("asg")
    p = g.param("p", (3,), "f64")
    g.assign(p, g.mul(p, 2.0))
    g.set_outputs([g.sum(g.mul(p, p))])
    pv = np.array([1.0, -2.0, 0.5])
    (grad,) = rlx.grad(g, ["p"]).evaluate({}, {"p": pv})
    np.testing.assert_array_equal(grad, 2 * pv)
    assert Assign.nondiff == "assign writes state; its output is a token"


def test_adam_update_is_an_effect_without_a_derivative():
    from rlx.ops.state import AdamUpdate

    assert AdamUpdate.nondiff == "optimizer state update"
    assert AdamUpdate.effect and not AdamUpdate.pure
