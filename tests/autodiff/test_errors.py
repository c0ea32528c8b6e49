"""Bad input to the transforms: AutodiffError whose message names the node and what was
wrong, whose ``.loc`` is the user's line that built the node, and which leaves the graph
as it was. And the one good input that looks bad: gradients of graphs with symbolic dims."""

from __future__ import annotations

import sys
from typing import ClassVar

import numpy as np
import pytest

import rlx
import rlx.numpy as rnp
from rlx.autodiff import grad, hvp, jvp, value_and_grad, vjp, vmap
from rlx.errors import AutodiffError
from rlx.ops.base import Op, register
from rlx.runtime.session import Session
from rlx.shape import Shape


def _next_line() -> int:
    """The number of the line after the caller's."""
    return sys._getframe(1).f_lineno + 1


def _op(name: str, nondiff: str = "") -> type[Op]:
    """A float -> float op with no derivative rules (registered inside the test only)."""

    @register
    class NoRule(Op):
        """Test op: x * 2 without vjp / jvp / batch rules."""

        mnemonic: ClassVar[str] = name
        arity: ClassVar[int] = 1

        def infer(self, ins: tuple[Shape, ...]) -> Shape:
            return ins[0]

        def reference(self, xs, ctx):
            return xs[0] * 2

    NoRule.nondiff = nondiff
    return NoRule


def test_grad_wrt_an_integer_input() -> None:
    g = rlx.Graph("ints")
    x = g.input("x", [3], "f32")
    line = _next_line()
    n = g.input("n", [3], "i32")
    g.set_outputs([g.sum(g.mul(x, g.cast(n, "f32")), [0])])
    before = g.fingerprint()
    with pytest.raises(AutodiffError, match=r"wrt: .*input.* has dtype i32.*float") as e:
        grad(g, ["x", "n"])
    assert e.value.loc.line == line and e.value.node == n
    assert g.fingerprint() == before
    with pytest.raises(AutodiffError, match="no input or param named 'm'"):
        grad(g, ["m"])


def test_non_scalar_loss_without_a_cotangent() -> None:
    g = rlx.Graph("vec")
    x = g.input("x", [3], "f64")
    line = _next_line()
    y = g.tanh(x)
    g.set_outputs([y])
    with pytest.raises(AutodiffError, match=r"loss .*tanh.* has shape f64\[3\], not a scalar") as e:
        value_and_grad(g, ["x"])
    assert e.value.loc.line == line and e.value.node == y
    # with a cotangent (vjp) the same graph is fine
    v = vjp(g, ["x"])
    xv, ct = np.arange(3.0), np.ones(3)
    np.testing.assert_allclose(v.evaluate({"x": xv, "ct0": ct})[1], 1 - np.tanh(xv) ** 2)


def test_op_without_a_rule() -> None:
    op = _op("test_norule")
    g = rlx.Graph("norule")
    x = g.input("x", [3], "f64")
    line = _next_line()
    y = g.apply(op(), [x])
    g.set_outputs([g.sum(y, [0])])
    with pytest.raises(AutodiffError, match=r"test_norule.*no derivative rule \(vjp\)") as e:
        grad(g, ["x"])
    assert e.value.loc.line == line and e.value.node == y
    with pytest.raises(AutodiffError, match=r"test_norule.*no forward-mode rule \(jvp\)") as e:
        jvp(g, ["x"])
    assert e.value.loc.line == line
    with pytest.raises(AutodiffError, match="no derivative rule"):
        hvp(g, ["x"])
    with pytest.raises(AutodiffError, match="test_norule.*no batching rule.*symbolic") as e:
        vmap(g, {"x": 0}, size="n")
    assert e.value.loc.line == line


def test_nondiff_op_on_the_path() -> None:
    op = _op("test_step", nondiff="test: piecewise constant")
    g = rlx.Graph("step")
    x = g.input("x", [3], "f64")
    w = g.input("w", [3], "f64")
    line = _next_line()
    y = g.apply(op(), [x])
    g.set_outputs([g.sum(g.mul(y, w), [0])])
    with pytest.raises(
        AutodiffError, match=r"test_step.*not differentiable \(test: piecewise"
    ) as e:
        grad(g, ["x"])
    assert e.value.loc.line == line and e.value.node == y
    with pytest.raises(AutodiffError, match="not differentiable") as e:
        jvp(g, ["x"])
    assert e.value.loc.line == line
    # off the path (wrt w only) it is fine: d/dw sum(2x * w) = 2x
    (gw,) = grad(g, ["w"]).evaluate({"x": np.arange(3.0), "w": np.ones(3)})
    np.testing.assert_allclose(gw, 2 * np.arange(3.0))


def test_function_form_errors_name_the_users_line() -> None:
    with pytest.raises(AutodiffError, match="has dtype i32"):
        rlx.grad(lambda n: rnp.sum(n * 1.0))(np.arange(3, dtype=np.int32))
    with pytest.raises(AutodiffError, match="not a scalar"):
        rlx.grad(lambda x: rnp.tanh(x))(np.ones(3, np.float32))
    with pytest.raises(AutodiffError, match="must return one scalar"):
        rlx.grad(lambda x: (rnp.sum(x), rnp.sum(x)))(np.ones(3, np.float32))
    with pytest.raises(AutodiffError, match=r"has_aux=True: .* a pair \(loss, aux\)"):
        rlx.grad(lambda x: rnp.sum(x), has_aux=True)(np.ones(3, np.float32))
    op = _op("test_fn_norule")

    def f(x):
        from rlx.frontends.trace.tracer import current

        t = current()
        f.line = _next_line()
        y = t.g.apply(op(), [x.id])
        return rnp.sum(t.wrap(y))

    with pytest.raises(AutodiffError, match="test_fn_norule") as e:
        rlx.grad(f)(np.ones(3, np.float32))
    assert e.value.loc.line == f.line


def test_vmap_bad_axes() -> None:
    g = rlx.Graph("v")
    x = g.input("x", [2, 3], "f64")
    y = g.input("y", [3], "f64")
    g.set_outputs([g.mul(x, y), g.exp(y)])
    with pytest.raises(
        AutodiffError, match=r"no such input or param; inputs and params: \['x', 'y'\]"
    ):
        vmap(g, {"z": 0})
    with pytest.raises(AutodiffError, match=r"in_axes\['x'\] = 3 is not an axis"):
        vmap(g, {"x": 3}, size=2)
    with pytest.raises(AutodiffError, match="output 0 .* depends on a batched input"):
        vmap(g, {"x": 0}, out_axes=None, size=2)
    with pytest.raises(AutodiffError, match="batches no input"):
        vmap(g, None)
    with pytest.raises(AutodiffError, match="size must be a positive int"):
        vmap(g, 0, size=0)
    with pytest.raises(AutodiffError, match="disagree on the batch size"):
        rlx.vmap(lambda a, b: a * b)(np.ones((2, 3)), np.ones((4, 3)))


def test_grad_of_a_graph_with_symbolic_dims() -> None:
    g = rlx.Graph("sym")
    n = g.sym("batch")
    x = g.input("x", [n, 3], "f64")
    w = g.param("w", [3, 2], "f64")
    g.set_outputs([g.mean(g.tanh(g.matmul(x, w)), [0, 1])])
    gr = grad(g, ["w", "x"])
    wv = np.random.default_rng(0).standard_normal((3, 2))
    compiled = Session("cpu").compile(gr, params={"w": wv})
    for rows in (1, 4):
        xv = np.random.default_rng(rows).standard_normal((rows, 3))
        t = np.tanh(xv @ wv)
        dz = (1 - t**2) / t.size
        for got in (gr.evaluate({"x": xv}, {"w": wv}), compiled.run({"x": xv})):
            np.testing.assert_allclose(got[0], xv.T @ dz, rtol=1e-10)
            np.testing.assert_allclose(got[1], dz @ wv.T, rtol=1e-10)
