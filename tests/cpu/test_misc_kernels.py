"""kernels.misc: group norm, scatter-add, fake quantize, exclusive cumsum and integer
division kernels vs the reference interpreter, and their kind in the report."""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.backends.cpu.kernels import KernelKind
from rlx.errors import InputError
from rlx.ops.elementwise import BinaryKind
from rlx.options import CompileOptions
from rlx.runtime.session import Session

RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)
TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
FLOATS = ("float32", "float64", "float16", "bfloat16")
DT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
FAST = settings(max_examples=40, deadline=None)


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _rand(rng: np.random.Generator, dims: tuple[int, ...], dtype: str) -> np.ndarray:
    dt = _np_dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -50), min(info.max, 50), dims, endpoint=True).astype(dt)
    return rng.standard_normal(dims).astype(dt)


def _check(
    build: Callable[[rlx.Graph], object],
    feed: dict[str, np.ndarray],
    op: str,
    options: CompileOptions = RAW,
) -> None:
    """Compile ``build``, run it twice (scratch reuse), compare with the reference and
    check the output node's kernel is not the reference kernel."""
    g = rlx.Graph(op)
    g.set_outputs([build(g)])
    cg = Session("cpu").compile(g, options)
    (want,) = g.evaluate(feed)
    for _ in range(2):
        (got,) = cg.run(feed)
        assert got.dtype == want.dtype and got.shape == want.shape
        if want.dtype.kind in "iub":
            np.testing.assert_array_equal(got, want)
        else:
            tol = TOL[want.dtype.name]
            np.testing.assert_allclose(
                got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol
            )
    recs = [k for k in cg.report().kernels if k.op == op]
    assert recs and all(k.kind is KernelKind.NUMPY for k in recs), recs


@FAST
@given(
    n=st.integers(1, 3),
    cg=st.sampled_from([(1, 1), (2, 4), (3, 6), (4, 4)]),
    spatial=st.lists(st.integers(1, 4), max_size=2),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_group_norm(n: int, cg: tuple[int, int], spatial: list[int], dtype: str, seed: int) -> None:
    groups, c = cg
    dims = (n, c, *spatial)
    rng = np.random.default_rng(seed)
    feed = {
        "x": _rand(rng, dims, dtype),
        "g": _rand(rng, (c,), dtype),
        "b": _rand(rng, (c,), dtype),
    }

    def build(g: rlx.Graph) -> object:
        x = g.input("x", dims, DT[dtype])
        return g.group_norm(x, g.input("g", (c,), DT[dtype]), g.input("b", (c,), DT[dtype]), groups)

    _check(build, feed, "group_norm")


@FAST
@given(
    dims=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    m=st.integers(0, 6),
    axis=st.integers(0, 2),
    dtype=st.sampled_from(("float32", "float16", "int32", "int64")),
    seed=st.integers(0, 2**16),
)
def test_scatter_add(dims: list[int], m: int, axis: int, dtype: str, seed: int) -> None:
    ax = axis % len(dims)
    rng = np.random.default_rng(seed)
    n = dims[ax]
    udims = (*dims[:ax], m, *dims[ax + 1 :])
    idx = rng.integers(-n, n, m).astype(np.int64)  # repeats and negatives included
    feed = {"x": _rand(rng, tuple(dims), dtype), "i": idx, "u": _rand(rng, udims, dtype)}
    dt = {"int32": "i32", "int64": "i64"}.get(dtype) or DT[dtype]

    def build(g: rlx.Graph) -> object:
        x = g.input("x", tuple(dims), dt)
        return g.scatter_add(x, g.input("i", (m,), "i64"), g.input("u", udims, dt), axis=ax)

    _check(build, feed, "scatter_add")


def test_scatter_add_out_of_range_raises_input_error() -> None:
    g = rlx.Graph("sa")
    x = g.input("x", (3, 2))
    g.set_outputs([g.scatter_add(x, g.input("i", (2,), "i64"), g.input("u", (2, 2)))])
    cg = Session("cpu").compile(g, RAW)
    feed = {
        "x": np.zeros((3, 2), np.float32),
        "i": np.array([0, 3]),
        "u": np.ones((2, 2), np.float32),
    }
    with pytest.raises(InputError, match="index 3 out of range for axis 0 of size 3"):
        cg.run(feed)


@FAST
@given(
    dims=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    per_channel=st.booleans(),
    axis=st.integers(0, 2),
    qrange=st.sampled_from([(-128, 127), (0, 255), (-8, 7)]),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_fake_quantize(
    dims: list[int],
    per_channel: bool,
    axis: int,
    qrange: tuple[int, int],
    dtype: str,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    ax = axis % len(dims) if per_channel else None
    k = dims[ax] if ax is not None else 1
    scales = [float(s) for s in rng.uniform(0.01, 0.5, k)]
    zps = [int(z) for z in rng.integers(qrange[0], qrange[1] + 1, k)]
    x = (_rand(rng, tuple(dims), "float64") * 20).astype(_np_dtype(dtype))
    x.flat[0] = np.nan
    if x.size > 1:
        x.flat[1] = np.inf
    feed = {"x": x}

    def build(g: rlx.Graph) -> object:
        xi = g.input("x", tuple(dims), DT[dtype])
        return g.fake_quantize(xi, scales, zps, axis=ax, qmin=qrange[0], qmax=qrange[1])

    _check(build, feed, "fake_quantize")


@FAST
@given(
    dims=st.lists(st.integers(0, 5), min_size=1, max_size=3),
    axis=st.integers(-3, 2),
    reverse=st.booleans(),
    exclusive=st.booleans(),
    dtype=st.sampled_from(("float32", "float64", "float16", "int32", "int8")),
    seed=st.integers(0, 2**16),
)
def test_cumsum(
    dims: list[int], axis: int, reverse: bool, exclusive: bool, dtype: str, seed: int
) -> None:
    ax = axis % len(dims)
    rng = np.random.default_rng(seed)
    feed = {"x": _rand(rng, tuple(dims), dtype)}
    dt = {"int32": "i32", "int8": "i8"}.get(dtype) or DT[dtype]

    def build(g: rlx.Graph) -> object:
        return g.cumsum(g.input("x", tuple(dims), dt), ax, reverse, exclusive)

    _check(build, feed, "cumsum")


@FAST
@given(
    dims=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    broadcast=st.booleans(),
    dtype=st.sampled_from(("int8", "int32", "int64", "uint8", "uint32")),
    seed=st.integers(0, 2**16),
)
def test_integer_div(dims: list[int], broadcast: bool, dtype: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, dims, endpoint=True).astype(dtype)
    bdims = tuple(dims[1:]) if broadcast else tuple(dims)
    b = rng.integers(max(info.min, -9), min(info.max, 9), bdims, endpoint=True).astype(dtype)
    if info.min < 0:
        a.flat[0] = info.min  # min / -1 wraps, as the reference
        if b.size:
            b.flat[0] = -1
    if b.size > 1:
        b.flat[-1] = 0  # x / 0 -> 0
    feed = {"a": a, "b": b}
    dt = {"int8": "i8", "int32": "i32", "int64": "i64", "uint8": "u8", "uint32": "u32"}[dtype]

    def build(g: rlx.Graph) -> object:
        return g.div(g.input("a", tuple(dims), dt), g.input("b", bdims, dt))

    _check(build, feed, "binary")


def test_integer_div_in_place_chain() -> None:
    """The planner may give a div an input's slot: a chain of divides and
    adds on dying buffers still matches the reference."""
    rng = np.random.default_rng(0)
    a = rng.integers(-1000, 1000, (4, 6)).astype(np.int32)
    b = rng.integers(-7, 7, (4, 6)).astype(np.int32)

    def build(g: rlx.Graph) -> object:
        x, y = g.input("a", (4, 6), "i32"), g.input("b", (4, 6), "i32")
        t = g.add(x, y)
        q = g.div(t, y)
        return g.div(g.add(q, t), g.add(y, y))

    _check(build, {"a": a, "b": b}, "binary")
    g = rlx.Graph("chain")
    g.set_outputs([build(g)])
    plan = Session("cpu").compile(g, RAW).memory_plan
    divs = [n.id for n in g.nodes if n.op.mnemonic == "binary" and n.op.fn is BinaryKind.DIV]
    assert any(plan.slots[i].inplace_of is not None for i in divs)


def test_float_and_inclusive_nodes_keep_their_kernels() -> None:
    """The superseding factories hand float division and inclusive cumsums back."""
    g = rlx.Graph("back")
    x = g.input("x", (3, 4))
    g.set_outputs([g.cumsum(g.div(x, g.input("y", (3, 4))), 1, reverse=True)])
    cg = Session("cpu").compile(g, RAW)
    rng = np.random.default_rng(1)
    feed = {"x": _rand(rng, (3, 4), "float32"), "y": _rand(rng, (3, 4), "float32") + 3}
    (want,) = g.evaluate(feed)
    (got,) = cg.run(feed)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert {k.op: k.kind for k in cg.report().kernels} == {
        "binary": KernelKind.NUMPY,
        "cumsum": KernelKind.NUMPY,
    }
