"""Elementwise kernels (``kernels/elementwise.py``) vs the reference interpreter: integer
division (truncating toward zero, ``x / 0 -> 0``) and integer / float powers, their
edge cases, in place, broadcast, and without per-run allocation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.ops.elementwise import BinaryKind
from rlx.runtime.session import Session
from tests.cpu.kernels.checks import (
    FAST,
    RAW,
    check_exact,
    check_numpy_kernel,
    schedule_allocations,
)

RNG = np.random.default_rng(11)


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

    check_numpy_kernel(build, feed, "binary")


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

    check_numpy_kernel(build, {"a": a, "b": b}, "binary")
    g = rlx.Graph("chain")
    g.set_outputs([build(g)])
    plan = Session("cpu").compile(g, RAW).memory_plan
    divs = [n.id for n in g.nodes if n.op.mnemonic == "binary" and n.op.fn is BinaryKind.DIV]
    assert any(plan.slots[i].inplace_of is not None for i in divs)


@pytest.mark.parametrize("dt", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32])
def test_int_pow_edge_cases(dt):
    signed = np.dtype(dt).kind == "i"
    base = [0, 0, 1, 1, 2, 3, 7, 100]
    expo = [0, 3, 0, 9, 7, 40, 2, 5]
    if signed:
        base += [0, 1, -1, -1, -1, 2, -2, -3, -5, 5]
        expo += [-1, -4, -3, -2, 0, -1, 3, 5, 33, -7]
    a, b = np.array(base, dt), np.array(expo, dt)
    (got,), _, cg = check_exact(lambda g, a, b: g.pow(a, b), a=a, b=b)
    bits = 8 * np.dtype(dt).itemsize
    lo = -(1 << (bits - 1)) if signed else 0

    def oracle(x, e):  # Python ints: truncated reciprocal for e < 0, then wrap
        if e < 0:
            v = 1 if x == 1 else ((-1 if e % 2 else 1) if x == -1 else 0)
        else:
            v = x**e
        return ((v - lo) % (1 << bits)) + lo

    np.testing.assert_array_equal(got, np.array([oracle(int(x), int(e)) for x, e in zip(a, b)], dt))
    assert schedule_allocations(cg, {"a": a, "b": b}) < 4096


def test_int_pow_broadcast_and_in_place():
    a = RNG.integers(-4, 5, (3, 5)).astype(np.int32)
    b = np.array([-2, -1, 0, 1, 3], np.int32)
    # (a ** b) + a: the pow's output may take a's slot when a dies there
    check_exact(lambda g, a, b: g.add(g.pow(g.neg(a), b), b), a=a, b=b)


def test_int_pow_without_negative_exponents_wraps():
    a = np.array([3, -3, 7, 0, -1, 2], np.int32)
    b = np.array([21, 21, 12, 0, 7, 31], np.int32)
    (got,), _, _ = check_exact(lambda g, a, b: g.pow(a, b), a=a, b=b)
    want = [((int(x) ** int(e) + 2**31) % 2**32) - 2**31 for x, e in zip(a, b)]
    np.testing.assert_array_equal(got, np.array(want, np.int32))


def test_float_pow_edge_cases_match_numpy():
    a = np.array([0.0, 0.0, -2.0, -2.0, np.inf, np.nan, 1.0, -0.0], np.float32)
    b = np.array([0.0, -1.0, 3.0, 0.5, -1.0, 0.0, np.nan, -3.0], np.float32)
    (got,), _, _ = check_exact(lambda g, a, b: g.pow(a, b), a=a, b=b)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, np.power(a, b))
