"""The function forms of the transforms (rlx/frontends/trace/transforms.py): rlx.grad,
value_and_grad, jvp, vjp and vmap of Python functions on NumPy arrays, as JAX spells them,
against NumPy closed forms; composition with rlx.jit and with each other."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
import rlx.numpy as rnp

RNG = np.random.default_rng(3)


def _params() -> dict[str, np.ndarray]:
    return {
        "w": RNG.standard_normal((3, 4)),
        "b": RNG.standard_normal(4),
        "c": RNG.standard_normal(4),
    }


def loss(p: dict, x: np.ndarray) -> object:
    h = rnp.tanh(x @ p["w"] + p["b"])
    return rnp.sum(h * p["c"])


def _np_grads(p: dict, x: np.ndarray) -> tuple[float, dict, np.ndarray]:
    """The loss and its gradients by hand."""
    h = np.tanh(x @ p["w"] + p["b"])
    dz = (1 - h**2) * p["c"]
    return (
        float((h * p["c"]).sum()),
        {"w": x.T @ dz, "b": dz.sum(0), "c": h.sum(0)},
        dz @ p["w"].T,
    )


def _close(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-10, err_msg=k)


def test_grad_of_a_pytree_loss() -> None:
    p, x = _params(), RNG.standard_normal((5, 3))
    _, want, _ = _np_grads(p, x)
    got = rlx.grad(loss)(p, x)
    _close(got, want)
    assert all(isinstance(v, np.ndarray) for v in got.values())


def test_value_and_grad_argnums_tuple() -> None:
    p, x = _params(), RNG.standard_normal((5, 3))
    val, gp, gx = _np_grads(p, x)
    v, (g0, g1) = rlx.value_and_grad(loss, argnums=(0, 1))(p, x)
    np.testing.assert_allclose(v, val, rtol=1e-12)
    _close(g0, gp)
    np.testing.assert_allclose(g1, gx, rtol=1e-10)
    np.testing.assert_allclose(rlx.grad(loss, argnums=1)(p, x), gx, rtol=1e-10)


def test_grad_has_aux() -> None:
    def f(p, x):
        h = rnp.tanh(x @ p["w"] + p["b"])
        return rnp.sum(h * p["c"]), {"h": h}

    p, x = _params(), RNG.standard_normal((2, 3))
    (v, aux), gr = rlx.value_and_grad(f, has_aux=True)(p, x)
    np.testing.assert_allclose(aux["h"], np.tanh(x @ p["w"] + p["b"]), rtol=1e-12)
    _close(gr, _np_grads(p, x)[1])
    gr2, aux2 = rlx.grad(f, has_aux=True)(p, x)
    _close(gr2, gr)


def test_grad_composes_with_jit_both_ways() -> None:
    p, x = _params(), RNG.standard_normal((5, 3))
    want = _np_grads(p, x)[1]
    jg = rlx.jit(rlx.grad(loss))
    _close(jg(p, x), want)
    _close(jg(p, x), want)  # the cached compile
    assert jg.cache_size() == 1
    _close(rlx.grad(rlx.jit(loss))(p, x), want)
    # frozen (read-only) weights are params of the compiled graph: gradients still flow
    _close(rlx.grad(loss)(rlx.freeze(p), x), want)


def test_grad_of_grad() -> None:
    def f(x):
        return rnp.sum(rnp.sin(x) * x)

    x = RNG.standard_normal(4)
    g1 = rlx.grad(f)
    np.testing.assert_allclose(g1(x), np.cos(x) * x + np.sin(x), rtol=1e-12)
    # d/dx of sum(g1(x) * u): the Hessian (diagonal here) times u
    u = RNG.standard_normal(4)
    hu = rlx.grad(lambda x, u: rnp.sum(g1(x) * u))(x, u)
    np.testing.assert_allclose(hu, (2 * np.cos(x) - x * np.sin(x)) * u, rtol=1e-12)


def test_jvp_and_vjp_of_functions() -> None:
    def f(x, y):
        return {"a": rnp.tanh(x) * y, "b": rnp.exp(y)}

    x, y = RNG.standard_normal((2, 3)), RNG.standard_normal(3)
    tx, ty = RNG.standard_normal((2, 3)), RNG.standard_normal(3)
    out, tan = rlx.jvp(f, (x, y), (tx, ty))
    t = np.tanh(x)
    np.testing.assert_allclose(out["a"], t * y, rtol=1e-12)
    np.testing.assert_allclose(tan["a"], (1 - t**2) * tx * y + t * ty, rtol=1e-12)
    np.testing.assert_allclose(tan["b"], np.exp(y) * ty, rtol=1e-12)

    out2, back = rlx.vjp(f, x, y)
    np.testing.assert_allclose(out2["b"], np.exp(y), rtol=1e-12)
    ca, cb = RNG.standard_normal((2, 3)), RNG.standard_normal(3)
    gx, gy = back({"a": ca, "b": cb})
    np.testing.assert_allclose(gx, ca * (1 - t**2) * y, rtol=1e-12)
    np.testing.assert_allclose(gy, (ca * t).sum(0) + cb * np.exp(y), rtol=1e-12)


def test_vmap_of_a_function_in_axes_out_axes() -> None:
    def f(a, b):
        return rnp.tanh(a) * b, rnp.sum(a, axis=0)

    x, y = RNG.standard_normal((3, 4)), RNG.standard_normal(3)
    p, s = rlx.vmap(f, in_axes=(1, None))(x, y)
    np.testing.assert_allclose(p, (np.tanh(x) * y[:, None]).T, rtol=1e-12)
    np.testing.assert_allclose(s, x.sum(0), rtol=1e-12)
    p1 = rlx.vmap(lambda a, b: rnp.tanh(a) * b, in_axes=(1, None), out_axes=1)(x, y)
    np.testing.assert_allclose(p1, np.tanh(x) * y[:, None], rtol=1e-12)


def test_per_example_gradients_by_vmap_of_grad() -> None:
    p, xs = _params(), RNG.standard_normal((4, 3))

    def one(p, x):
        return loss(p, rnp.reshape(x, (1, 3)))

    got = rlx.vmap(rlx.grad(one), in_axes=(None, 0))(p, xs)
    for k in range(4):
        want = _np_grads(p, xs[k : k + 1])[1]
        for name in want:
            np.testing.assert_allclose(got[name][k], want[name], rtol=1e-10, err_msg=name)


def test_grad_of_a_non_function_is_refused() -> None:
    with pytest.raises(rlx.errors.AutodiffError, match="a Graph or a Python function"):
        rlx.grad(3)
