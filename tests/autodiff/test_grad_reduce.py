"""Derivative and batching rules of the reduction family (reduce, softmax, log-softmax,
cumsum, top-k, argmax / argmin) and the softmax backward ops with their CPU kernels.

Oracles: finite differences in f64 (``rlx.autodiff.check``, reference interpreter and
compiled CPU graph) with hypothesis-drawn shapes, axes (negative ones too) and keepdims;
torch.autograd for the PyTorch conventions (amax ties split evenly, prod with zeros,
softmax); per-example NumPy loops for vmap; NumPy formulas for the native kernels under
every instruction set this CPU runs (RLX_ISA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.autodiff import grad, vmap
from rlx.autodiff.check import check_jvp, check_vjp
from rlx.backends.cpu.kernels import KernelKind
from rlx.backends.cpu.native import cpu
from rlx.ops.reduce import ArgMax, ArgMin, Cumsum, LogSoftmax, Reduce, ReduceKind, Softmax, TopK
from rlx.ops.reduce_grad import LogSoftmaxBackward, SoftmaxBackward
from rlx.options import CompileOptions
from rlx.runtime.session import Session

FEW = settings(max_examples=3, deadline=None)
RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)


def _values(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Distinct values (no ties: max / min / top-k are smooth around them)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    return (rng.permutation(n) * 0.37 - n * 0.15 + rng.uniform(0, 0.1, n)).reshape(shape)


def _check(g: rlx.Graph, values: dict[str, np.ndarray], wrt: list[str]) -> None:
    check_vjp(g, values, wrt, compiled=True)
    check_jvp(g, values, wrt, compiled=True)


@st.composite
def _shape_axes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A shape of rank 1-3 and a subset of its axes, each possibly negative."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    r = len(shape)
    axes = draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
    return shape, tuple(a - r if draw(st.booleans()) else a for a in axes)


def _unary_graph(name: str, shape: tuple[int, ...], op) -> rlx.Graph:
    g = rlx.Graph(name)
    x = g.input("x", shape, "f64")
    g.set_outputs([g.apply(op, [x])])
    return g


@pytest.mark.parametrize("fn", list(ReduceKind), ids=lambda k: k.value)
@FEW
@given(sa=_shape_axes(), keepdims=st.booleans(), seed=st.integers(0, 999))
def test_reduce(fn: ReduceKind, sa: tuple, keepdims: bool, seed: int) -> None:
    shape, axes = sa
    x = _values(seed, shape)
    if fn is ReduceKind.PROD:
        x = x / np.abs(x).max() + np.sign(x) * 0.5  # moderate magnitudes
    _check(_unary_graph("reduce", shape, Reduce(fn, axes, keepdims)), {"x": x}, ["x"])


@pytest.mark.parametrize("op", [Softmax, LogSoftmax], ids=["softmax", "log_softmax"])
@FEW
@given(sa=_shape_axes(), seed=st.integers(0, 999))
def test_softmax_family(op: type, sa: tuple, seed: int) -> None:
    shape, axes = sa
    x = np.random.default_rng(seed).standard_normal(shape)
    _check(_unary_graph("sm", shape, op(axes[0])), {"x": x}, ["x"])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("exclusive", [False, True])
@FEW
@given(sa=_shape_axes(), seed=st.integers(0, 999))
def test_cumsum(reverse: bool, exclusive: bool, sa: tuple, seed: int) -> None:
    shape, axes = sa
    x = np.random.default_rng(seed).standard_normal(shape)
    _check(_unary_graph("cs", shape, Cumsum(axes[0], reverse, exclusive)), {"x": x}, ["x"])


@pytest.mark.parametrize("largest", [True, False])
@FEW
@given(sa=_shape_axes(), data=st.data())
def test_topk_values(largest: bool, sa: tuple, data: st.DataObject) -> None:
    shape, axes = sa
    k = data.draw(st.integers(1, shape[axes[0]]))
    x = _values(data.draw(st.integers(0, 999)), shape)
    _check(_unary_graph("topk", shape, TopK(k, axes[0], largest)), {"x": x}, ["x"])


@pytest.mark.parametrize("op", [SoftmaxBackward, LogSoftmaxBackward], ids=lambda c: c.mnemonic)
@FEW
@given(sa=_shape_axes(), seed=st.integers(0, 999))
def test_backward_ops_own_rules(op: type, sa: tuple, seed: int) -> None:
    """Second order: the backward ops' vjp / jvp in both inputs."""
    shape, axes = sa
    g = rlx.Graph("bw")
    dy, y = g.input("dy", shape, "f64"), g.input("y", shape, "f64")
    g.set_outputs([g.apply(op(axes[0]), [dy, y])])
    rng = np.random.default_rng(seed)
    _check(g, {"dy": rng.standard_normal(shape), "y": rng.standard_normal(shape)}, ["dy", "y"])


def test_hvp_through_softmax_cross_entropy() -> None:
    """Hessian-vector products reach the backward ops' own vjp rules."""
    g = rlx.Graph("ce")
    x = g.input("x", (3, 5), "f64")
    t = g.input("t", (3, 5), "f64")
    loss = g.sum(g.mul(g.log_softmax(x, -1), t))
    g.set_outputs([g.add(loss, g.sum(g.mul(g.softmax(x, 0), t)))])
    gr = grad(g, ["x"])
    rng = np.random.default_rng(1)
    check_vjp(gr, {"x": rng.standard_normal((3, 5)), "t": rng.random((3, 5))}, ["x"])


def _torch_grad(f, x: np.ndarray) -> np.ndarray:
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    f(t).sum().backward()
    return t.grad.numpy()


def _rlx_grad(build, x: np.ndarray) -> np.ndarray:
    g = rlx.Graph("t")
    xi = g.input("x", x.shape, "f64")
    g.set_outputs([g.sum(build(g, xi))])
    gg = grad(g, ["x"])
    (ref,) = gg.evaluate({"x": x})
    (got,) = Session("cpu").compile(gg).run({"x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    return ref


def test_against_torch_autograd() -> None:
    ties = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, 5.0, 4.0, 5.0]])
    w = np.arange(12.0).reshape(3, 4)
    cases = [  # (rlx, torch): amax / amin split ties evenly
        (lambda g, a: g.max(a, 1), lambda t: torch.amax(t, 1)),
        (lambda g, a: g.mul(g.min(a, 0, True), 3.0), lambda t: 3 * torch.amin(t, 0, True)),
        (lambda g, a: g.max(a), lambda t: torch.amax(t)),
    ]
    for ours, theirs in cases:
        np.testing.assert_allclose(_rlx_grad(ours, ties), _torch_grad(theirs, ties), rtol=1e-12)
    zeros = np.array([[0.0, 2.0, 3.0, -1.0], [0.0, 0.0, 4.0, 2.0], [1.5, 2.0, 0.5, 3.0]])
    for ours, theirs in [
        (lambda g, a: g.prod(a, 1), lambda t: torch.prod(t, 1)),
        (lambda g, a: g.prod(a, 0), lambda t: torch.prod(t, 0)),
        (lambda g, a: g.prod(a), lambda t: torch.prod(t)),
        (lambda g, a: g.prod(a, [0, 1], True), lambda t: torch.prod(t.reshape(-1))),
    ]:
        np.testing.assert_allclose(_rlx_grad(ours, zeros), _torch_grad(theirs, zeros), atol=1e-12)
    wt = torch.tensor(w)
    for ours, theirs in [
        (lambda g, a: g.mul(g.softmax(a, 0), g.constant(w)), lambda t: torch.softmax(t, 0) * wt),
        (lambda g, a: g.mul(g.log_softmax(a), g.constant(w)), lambda t: t.log_softmax(-1) * wt),
    ]:
        np.testing.assert_allclose(_rlx_grad(ours, zeros), _torch_grad(theirs, zeros), rtol=1e-10)


def test_grad_with_a_symbolic_batch() -> None:
    g = rlx.Graph("sym")
    n = g.sym("batch")
    x = g.input("x", [n, 5], "f64")
    w = g.param("w", [5], "f64")
    h = g.log_softmax(g.mul(x, w), -1)
    loss = g.add(g.mean(g.max(h, 1)), g.mean(g.cumsum(g.softmax(x, 0), 0)))
    g.set_outputs([g.add(loss, g.sum(g.prod(g.topk(x, 2, 1)[0], 0)))])
    gr = grad(g, ["w", "x"])
    wv = np.random.default_rng(0).standard_normal(5)
    compiled = Session("cpu").compile(gr, params={"w": wv})
    for rows in (1, 3):
        xv = _values(rows, (rows, 5)) * 0.3
        check_vjp(g, {"x": xv, "w": wv}, ["w", "x"])
        ref = gr.evaluate({"x": xv}, {"w": wv})
        for got, want in zip(compiled.run({"x": xv}), ref, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        tx = torch.tensor(xv, requires_grad=True)
        tw = torch.tensor(wv, requires_grad=True)
        th = torch.log_softmax(tx * tw, -1)
        tl = th.amax(1).mean() + torch.softmax(tx, 0).cumsum(0).mean()
        (tl + tx.topk(2, 1).values.prod(0).sum()).backward()
        np.testing.assert_allclose(ref[0], tw.grad.numpy(), rtol=1e-10)
        np.testing.assert_allclose(ref[1], tx.grad.numpy(), rtol=1e-10, atol=1e-12)


# ---- vmap ----------------------------------------------------------------------------

BATCHED = [
    ("sum", lambda g, x: g.apply(Reduce(ReduceKind.SUM, (-1, 0), False), [x])),
    ("max_keep", lambda g, x: g.apply(Reduce(ReduceKind.MAX, (1,), True), [x])),
    ("softmax", lambda g, x: g.softmax(x, 0)),
    ("log_softmax", lambda g, x: g.log_softmax(x, -1)),
    ("cumsum", lambda g, x: g.cumsum(x, 1, reverse=True)),
    ("argmax", lambda g, x: g.argmax(x, 0)),
    ("argmin_keep", lambda g, x: g.argmin(x, -1, keepdims=True)),
    ("topk", lambda g, x: g.topk(x, 2, 1)[0]),
    ("topk_idx", lambda g, x: g.topk(x, 2, 0, largest=False)[1]),
    ("softmax_bw", lambda g, x: g.softmax_backward(g.exp(x), g.constant(np.ones((3, 4))), 0)),
    ("log_softmax_bw", lambda g, x: g.log_softmax_backward(g.constant(np.ones((3, 4))), x, 1)),
]


@pytest.mark.parametrize("name,build", BATCHED, ids=[b[0] for b in BATCHED])
@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_vmap_batch_rules(name: str, build, in_axis: int) -> None:
    g = rlx.Graph(name)
    x = g.input("x", (3, 4), "f64")
    g.set_outputs([build(g, x)])
    xs = _values(in_axis, (3, 4, 5)[:in_axis] + (2,) + (3, 4, 5)[in_axis:2])
    v = vmap(g, {"x": in_axis}, size=2)
    assert not any(n.op.mnemonic == "concat" for n in v.nodes), "a batch rule was not used"
    (got,) = v.evaluate({"x": xs})
    want = np.stack([g.evaluate({"x": np.take(xs, b, in_axis)})[0] for b in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_vmap_symbolic_batch_of_a_reduction() -> None:
    g = rlx.Graph("vs")
    x = g.input("x", (3, 4), "f64")
    g.set_outputs([g.sum(g.softmax(x, 1), 0)])
    v = vmap(g, {"x": 1}, size="n")
    xs = _values(0, (3, 5, 4))
    (got,) = Session("cpu").compile(v).run({"x": xs})
    e = np.exp(xs - xs.max(2, keepdims=True))
    np.testing.assert_allclose(got, (e / e.sum(2, keepdims=True)).sum(0), rtol=1e-12)
    assert ArgMax.batch is ArgMin.batch  # one shared rule for the axis ops


# ---- the backward ops' kernels ---------------------------------------------------------


def _np_backward(log: bool, dy: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    dy, y = dy.astype(np.float64), y.astype(np.float64)
    if log:
        return dy - np.exp(y) * dy.sum(axis, keepdims=True)
    return y * (dy - (dy * y).sum(axis, keepdims=True))


def _run_backward(log: bool, shape, dt: str, axis: int, opts: CompileOptions):
    g = rlx.Graph("k")
    d, y = g.input("d", shape, dt), g.input("y", shape, dt)
    g.set_outputs([(g.log_softmax_backward if log else g.softmax_backward)(d, y, axis)])
    rng = np.random.default_rng(3)
    npd = rlx.DType.parse(dt).np
    dv = rng.standard_normal(shape).astype(npd)
    yv = (-rng.random(shape) * 3 if log else rng.random(shape)).astype(npd)
    cg = Session("cpu").compile(g, opts)
    (got,) = cg.run({"d": dv, "y": yv})
    return got, _np_backward(log, dv, yv, axis), cg.report().kernels[-1]


TOL = {"f32": 2e-6, "f64": 1e-13, "f16": 2e-3, "bf16": 1e-2}


@pytest.mark.parametrize("target", cpu.runnable_targets(), ids=lambda t: t.value)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_native_kernels_every_isa(target, log: bool, monkeypatch) -> None:
    monkeypatch.setenv("RLX_ISA", target.value)
    for dt, shape in [("f32", (7, 130)), ("f64", (2, 3, 33)), ("f16", (4, 17)), ("bf16", (3, 9))]:
        got, want, rec = _run_backward(log, shape, dt, -1, RAW)
        assert rec.kind is KernelKind.NATIVE, rec.notes
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got.astype(np.float64), want, atol=TOL[dt] * scale, rtol=0)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_numpy_kernels(log: bool) -> None:
    for dt, shape, axis, opts in [
        ("f32", (5, 6), 0, RAW),  # not the last axis
        ("f64", (4, 9), -1, CompileOptions(optimize=False, fuse=False, native=False)),
        ("f8e4m3", (3, 4), 1, RAW),
    ]:
        got, want, rec = _run_backward(log, shape, dt, axis, opts)
        assert rec.kind is KernelKind.NUMPY, rec.notes
        tol = 0.15 * max(1.0, float(np.abs(want).max())) if dt == "f8e4m3" else 1e-6
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def test_two_threads_match_one() -> None:
    shape = (512, 1024)  # above the OpenMP work threshold
    outs = []
    for threads in (1, 2):
        opts = CompileOptions(optimize=False, fuse=False, use_cache=False, num_threads=threads)
        got, want, rec = _run_backward(False, shape, "f32", -1, opts)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)  # f32 row sums of 1024
        outs.append(got)
    np.testing.assert_array_equal(outs[0], outs[1])
