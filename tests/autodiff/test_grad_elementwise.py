"""Derivative rules of the elementwise family (unary, binary, where, cast, trig, cumprod,
compare / bitwise / bitcast nondiff) against finite differences in f64
(``rlx.autodiff.check``: reference interpreter and the compiled CPU graph), with
hypothesis-drawn shapes and broadcasting operands; the PyTorch conventions at kinks and
ties (relu and abs at 0, maximum / minimum ties) against torch.autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.autodiff import grad, jvp, vmap
from rlx.autodiff.check import check_jvp, check_vjp
from rlx.errors import AutodiffError
from rlx.ops import OPS
from rlx.ops.bitcast import Bitcast
from rlx.ops.bitwise import Bitwise, BitwiseKind, BitwiseNot
from rlx.ops.cumulative import CumProd
from rlx.ops.elementwise import Binary, BinaryKind, Compare, Unary, UnaryKind
from rlx.ops.trig import Trig, TrigKind
from rlx.runtime.session import Session

FEW = settings(max_examples=2, deadline=None)

# in-domain value ranges (low, high); values are kept >= 0.05 away from the kinks at 0
POSITIVE = (0.3, 2.0)
DOMAIN = {
    UnaryKind.LOG: POSITIVE,
    UnaryKind.SQRT: POSITIVE,
    UnaryKind.RSQRT: POSITIVE,
    UnaryKind.RECIP: POSITIVE,
    TrigKind.ASIN: (-0.9, 0.9),
    TrigKind.ACOS: (-0.9, 0.9),
    TrigKind.ATANH: (-0.9, 0.9),
    TrigKind.ACOSH: (1.2, 3.0),
    TrigKind.TAN: (-1.2, 1.2),
}
ZERO_DERIVATIVE = {UnaryKind.ROUND, UnaryKind.FLOOR, UnaryKind.CEIL, UnaryKind.SIGN}
UNARY = [u for u in UnaryKind if u is not UnaryKind.NOT]
BINARY = [b for b in BinaryKind if b not in (BinaryKind.AND, BinaryKind.OR)]


def _values(seed: int, shape: tuple[int, ...], lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    """Uniform in [lo, hi), at least 0.05 away from 0 and from the half-integers (the
    kinks of relu / abs / sign and the jumps of round / floor / ceil)."""
    x = np.random.default_rng(seed).uniform(lo, hi, shape)
    frac = np.abs(x * 2 - np.round(x * 2))
    return np.where(frac < 0.1, x + 0.07, x)


@st.composite
def _broadcast_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An operand shape and a second one that broadcasts against it (a suffix, some
    dims 1, or the first's rank with a stretched axis)."""
    a = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    k = draw(st.integers(0, len(a)))
    b = [d if draw(st.booleans()) else 1 for d in a[len(a) - k :]]
    if draw(st.booleans()):
        return a, tuple(b)
    return tuple(b), a


def _check(g: rlx.Graph, values: dict[str, np.ndarray], wrt: list[str], **kw: float) -> None:
    check_vjp(g, values, wrt, compiled=True, **kw)
    check_jvp(g, values, wrt, compiled=True, **kw)


def _graph(name: str, shapes: dict[str, tuple[int, ...]]) -> tuple[rlx.Graph, list[int]]:
    g = rlx.Graph(name)
    return g, [g.input(n, s, "f64") for n, s in shapes.items()]


@pytest.mark.parametrize("fn", UNARY, ids=lambda u: u.value)
@FEW
@given(shape=st.lists(st.integers(1, 4), max_size=3), seed=st.integers(0, 2**16))
def test_unary(fn: UnaryKind, shape: list[int], seed: int) -> None:
    g, (x,) = _graph(fn.value, {"x": tuple(shape)})
    g.set_outputs([g.unary(fn, x)])
    _check(g, {"x": _values(seed, tuple(shape), *DOMAIN.get(fn, (-2.0, 2.0)))}, ["x"])


@pytest.mark.parametrize("fn", BINARY, ids=lambda b: b.value)
@FEW
@given(shapes=_broadcast_pair(), seed=st.integers(0, 2**16))
def test_binary_broadcasting(fn: BinaryKind, shapes: tuple, seed: int) -> None:
    g, (a, b) = _graph(fn.value, {"a": shapes[0], "b": shapes[1]})
    g.set_outputs([g.binary(fn, a, b)])
    lo, hi = POSITIVE if fn is BinaryKind.POW else (-2.0, 2.0)
    va = _values(seed, shapes[0], lo, hi)
    vb = _values(seed + 1, shapes[1], lo, hi)
    if fn is BinaryKind.MOD:  # a / b at least 0.08 away from the integers (fmod's jumps)
        rng = np.random.default_rng(seed)
        vb = rng.choice([0.5, -0.25, 1.0], shapes[1])
        va = rng.integers(-4, 5, shapes[0]) * 0.5 + 0.125 + rng.uniform(-0.02, 0.02, shapes[0])
    _check(g, {"a": va, "b": vb}, ["a", "b"])


@pytest.mark.parametrize("fn", list(TrigKind), ids=lambda t: t.value)
@FEW
@given(shape=st.lists(st.integers(1, 4), max_size=3), seed=st.integers(0, 2**16))
def test_trig(fn: TrigKind, shape: list[int], seed: int) -> None:
    g, (x,) = _graph(fn.value, {"x": tuple(shape)})
    g.set_outputs([g.apply(Trig(fn), [x])])
    _check(g, {"x": _values(seed, tuple(shape), *DOMAIN.get(fn, (-2.0, 2.0)))}, ["x"])


@FEW
@given(shapes=_broadcast_pair(), seed=st.integers(0, 2**16))
def test_where_broadcasting(shapes: tuple, seed: int) -> None:
    g, (c, a, b) = _graph("where", {"c": shapes[1], "a": shapes[0], "b": shapes[1]})
    g.set_outputs([g.where(g.gt(c, 0.0), g.sin(a), g.mul(b, b))])
    vals = {"c": _values(seed, shapes[1]), "a": _values(seed + 1, shapes[0])}
    vals["b"] = _values(seed + 2, shapes[1])
    _check(g, vals, ["a", "b"])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("exclusive", [False, True])
@FEW
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data())
def test_cumprod(reverse: bool, exclusive: bool, shape: list[int], data: st.DataObject) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    g, (x,) = _graph("cumprod", {"x": tuple(shape)})
    g.set_outputs([g.apply(CumProd(axis, reverse, exclusive), [x])])
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    x = np.where(rng.random(shape) < 0.5, -1.0, 1.0) * rng.uniform(0.5, 1.5, shape)
    x[rng.random(shape) < 0.3] = 0.0  # zeros (one or several per row) are handled exactly
    _check(g, {"x": x}, ["x"])


def test_cumprod_with_zeros_matches_torch() -> None:
    x = np.array([[2.0, 0.0, 3.0, 0.0, 5.0], [0.0, 1.5, -2.0, 4.0, 1.0], [1.0, 2.0, 3.0, 4.0, 0.0]])
    got = _rlx_grad(lambda g, a: g.mul(g.apply(CumProd(1), [a]), g.constant(x + 1.0)), x)
    want = _torch_grad(lambda t: torch.cumprod(t, 1) * torch.tensor(x + 1.0), x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


def test_cast_float_to_float_and_back() -> None:
    g, (x,) = _graph("cast", {"x": (3, 4)})
    g.set_outputs([g.mul(g.cast(g.cast(x, "f32"), "f64"), x)])
    # the f32 round trip makes finite differences noisy at 1e-7: a coarser step
    _check(g, {"x": _values(0, (3, 4))}, ["x"], eps=1e-3, rtol=1e-4)


def test_cast_to_integer_carries_no_gradient() -> None:
    g, (x,) = _graph("cast_int", {"x": (5,)})
    g.set_outputs([g.sum(g.mul(g.cast(g.cast(x, "i32"), "f64"), x))])
    v = np.array([1.5, -2.5, 0.2, 3.9, -0.7])
    (gx,) = grad(g, ["x"]).evaluate({"x": v})
    np.testing.assert_allclose(gx, np.trunc(v))  # d/dx (trunc(x) * x), trunc held constant


def test_zero_derivative_kinds_give_zero_gradient_not_an_error() -> None:
    g, (x,) = _graph("steps", {"x": (4,)})
    y = g.add(g.add(g.round(x), g.floor(x)), g.add(g.ceil(x), g.sign(x)))
    g.set_outputs([g.sum(g.add(y, g.mul(x, 0.5)))])
    (gx,) = grad(g, ["x"]).evaluate({"x": np.array([0.3, -1.2, 2.7, 0.0])})
    np.testing.assert_array_equal(gx, np.full(4, 0.5))
    jg = jvp(g, ["x"])
    out = jg.evaluate({"x": np.ones(4), "t_x": np.arange(4.0)})
    np.testing.assert_allclose(out[1], 0.5 * 6.0)


def test_nondiff_reasons() -> None:
    assert Compare.nondiff == "comparison: bool output"
    for cls in (Bitwise, BitwiseNot, Bitcast, OPS["argmax"], OPS["argmin"]):
        assert cls.nondiff, cls.__name__
    # a float -> i32 bitcast cuts the path: the gradient flowing into it is refused
    g, (x,) = _graph("bits", {"x": (3,)})
    bits = g.apply(Bitcast(rlx.DType.I64), [x])
    same = g.apply(Bitwise(BitwiseKind.AND), [bits, bits])
    g.set_outputs([g.sum(g.mul(g.apply(Bitcast(rlx.DType.F64), [same]), x))])
    (gx,) = grad(g, ["x"]).evaluate({"x": np.array([1.0, 2.0, -3.0])})
    np.testing.assert_allclose(gx, [1.0, 2.0, -3.0])  # only the direct factor x counts


def test_integer_unary_and_binary_carry_no_gradient() -> None:
    """Unary / Binary on integers: their rules exist (the classes are differentiable) but
    the driver flows only through floats, so an integer side path stays out of it."""
    assert Unary.nondiff == "" and Binary.nondiff == ""
    g = rlx.Graph("ints")
    x, i = g.input("x", (3,), "f64"), g.input("i", (3,), "i32")
    k = g.apply(Binary(BinaryKind.MUL), [g.apply(Unary(UnaryKind.ABS), [i]), i])
    g.set_outputs([g.sum(g.mul(x, g.cast(k, "f64")))])
    iv = np.array([-2, 0, 3], np.int32)
    (gx,) = grad(g, ["x"]).evaluate({"x": np.ones(3), "i": iv})
    np.testing.assert_array_equal(gx, np.abs(iv) * iv)
    out = jvp(g, ["x"]).evaluate({"x": np.ones(3), "i": iv, "t_x": np.ones(3)})
    np.testing.assert_array_equal(out[1], np.sum(np.abs(iv) * iv))


def test_gradient_into_an_integer_input_is_refused() -> None:
    g = rlx.Graph("int")
    x = g.input("x", (3,), "i32")
    g.set_outputs([g.sum(g.cast(g.neg(x), "f32"))])
    with pytest.raises(AutodiffError, match="i32"):
        grad(g, ["x"])


def _torch_grad(f, *xs: np.ndarray) -> list[np.ndarray]:
    ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in xs]
    f(*ts).sum().backward()
    return [t.grad.numpy() for t in ts]


def _rlx_grad(build, *xs: np.ndarray) -> list[np.ndarray]:
    g = rlx.Graph("t")
    ids = [g.input(f"x{i}", x.shape, "f64") for i, x in enumerate(xs)]
    g.set_outputs([g.sum(build(g, *ids))])
    gg = grad(g, [f"x{i}" for i in range(len(xs))])
    feed = {f"x{i}": x for i, x in enumerate(xs)}
    ref = gg.evaluate(feed)
    got = Session("cpu").compile(gg).run(feed)
    for r, c in zip(ref, got, strict=True):
        np.testing.assert_allclose(c, r, rtol=1e-12, atol=1e-12)
    return ref


def test_pytorch_conventions_at_kinks_and_ties() -> None:
    x = np.array([-1.0, 0.0, 2.0, -0.0])
    for ours, theirs in [
        (lambda g, a: g.relu(a), torch.relu),
        (lambda g, a: g.abs(a), torch.abs),
        (lambda g, a: g.sign(a), torch.sign),
    ]:
        np.testing.assert_array_equal(_rlx_grad(ours, x)[0], _torch_grad(theirs, x)[0])
    a = np.array([1.0, 2.0, 3.0, -1.0])
    b = np.array([1.0, 0.0, 3.0, 5.0])  # ties at 0 and 2
    for ours, theirs in [
        (lambda g, p, q: g.maximum(p, q), torch.maximum),
        (lambda g, p, q: g.minimum(p, q), torch.minimum),
    ]:
        got, want = _rlx_grad(ours, a, b), _torch_grad(theirs, a, b)
        for gg, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(gg, w)
    base, ex = np.array([0.0, 0.0, 2.0]), np.array([0.0, 2.0, 0.5])
    got = _rlx_grad(lambda g, p, q: g.pow(p, q), base, ex)
    for gg, w in zip(got, _torch_grad(torch.pow, base, ex), strict=True):
        np.testing.assert_allclose(gg, w, rtol=1e-12)
    fa, fb = np.array([5.3, -5.3, 7.0]), np.array([2.0, 2.0, -3.0])
    got = _rlx_grad(lambda g, p, q: g.mod(p, q), fa, fb)
    for gg, w in zip(got, _torch_grad(torch.fmod, fa, fb), strict=True):
        np.testing.assert_allclose(gg, w, rtol=1e-12)


COMPLEX = [
    ("mul", lambda g, a, b: g.mul(a, b)),
    ("div", lambda g, a, b: g.div(a, b)),
    ("exp", lambda g, a, b: g.mul(g.exp(a), b)),
    ("square", lambda g, a, b: g.square(g.sub(a, b))),
    ("recip", lambda g, a, b: g.recip(g.add(g.add(a, b), 4.0))),
    ("sin_log_sqrt", lambda g, a, b: g.add(g.sin(a), g.mul(g.log(a), g.sqrt(b)))),
    ("pow", lambda g, a, b: g.pow(a, b)),
    ("prod_mean", lambda g, a, b: g.add(g.prod(g.mul(a, b), 1, True), g.mean(a, 1, True))),
    ("to_real", lambda g, a, b: g.cast(g.mul(a, b), "f32")),
    ("from_real", lambda g, a, b: g.mul(g.cast(g.cast(a, "f32"), "c64"), b)),
]


@pytest.mark.parametrize("name,build", COMPLEX, ids=[c[0] for c in COMPLEX])
def test_complex_rules_are_the_adjoint_for_re_inner_product(name: str, build) -> None:
    """c64 (the one complex dtype): reverse mode conjugates the derivative (JAX's
    convention), checked in c64 with a coarse finite-difference step."""
    rng = np.random.default_rng(5)
    z = (rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))).astype(np.complex64)
    w = (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(np.complex64)
    g = rlx.Graph(name)
    a, b = g.input("a", (3, 4), "c64"), g.input("b", (4,), "c64")
    g.set_outputs([build(g, a, b)])
    tol = {"eps": 1e-3, "rtol": 3e-3, "atol": 1e-3}
    check_vjp(g, {"a": z, "b": w}, ["a", "b"], compiled=True, **tol)
    check_jvp(g, {"a": z, "b": w}, ["a", "b"], compiled=True, **tol)


VMAPPED = [
    ("trig", "f64", lambda g, x, y: g.apply(Trig(TrigKind.ATAN), [x])),
    ("bitwise", "i32", lambda g, x, y: g.apply(Bitwise(BitwiseKind.XOR), [x, y])),
    ("bitwise_not", "i32", lambda g, x, y: g.apply(BitwiseNot(), [x])),
    ("bitcast", "f64", lambda g, x, y: g.apply(Bitcast(rlx.DType.I64), [x])),
    ("cumprod", "f64", lambda g, x, y: g.apply(CumProd(-1, True), [x])),
]


@pytest.mark.parametrize("name,dt,build", VMAPPED, ids=[v[0] for v in VMAPPED])
@pytest.mark.parametrize("axes", [(1, 0), (2, None)])
def test_vmap_rules_with_a_symbolic_batch(name: str, dt: str, build, axes: tuple) -> None:
    """The elementwise ops outside the driver's generic rule have batch rules: a
    symbolic batch size (no per-example fallback) against a per-example loop."""
    g = rlx.Graph(name)
    x, y = g.input("x", (3, 4), dt), g.input("y", (4,), dt)
    g.set_outputs([build(g, x, y)])
    v = vmap(g, {"x": axes[0], "y": axes[1]}, size="n")
    rng, npt = np.random.default_rng(2), rlx.DType.parse(dt).np
    xs = rng.integers(-50, 50, (3, 4)[: axes[0]] + (5,) + (3, 4)[axes[0] :]).astype(npt)
    ys = rng.integers(-50, 50, (5, 4) if axes[1] == 0 else (4,)).astype(npt)
    feed = {k: a for k, a in (("x", xs), ("y", ys)) if k in v.input_names}
    (got,) = Session("cpu").compile(v).run(feed)
    want = [
        g.evaluate({"x": np.take(xs, b, axes[0]), "y": ys[b] if axes[1] == 0 else ys})[0]
        for b in range(5)
    ]
    np.testing.assert_array_equal(got, np.stack(want))
