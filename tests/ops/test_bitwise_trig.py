"""Bitwise (and / or / xor / shl / shr), BitwiseNot and Trig: reference and CPU kernel
against Python integer arithmetic and the math module."""

from __future__ import annotations

import math

import numpy as np
import pytest

import rlx
from rlx.errors import ShapeError
from rlx.ops.bitwise import Bitwise, BitwiseKind, BitwiseNot
from rlx.ops.trig import Trig, TrigKind

RNG = np.random.default_rng(2)


def _both(op, *arrays):  # noqa: ANN001, ANN202
    g = rlx.Graph("t")
    ids = [g.input(f"a{i}", a.shape, rlx.DType.from_numpy(a.dtype)) for i, a in enumerate(arrays)]
    g.set_outputs(g.apply(op, ids))
    feeds = {f"a{i}": a for i, a in enumerate(arrays)}
    ref = g.evaluate(feeds)[0]
    cpu = rlx.Session("cpu").compile(g).run(feeds)[0]
    if ref.dtype.kind not in "iub":  # bf16 NaNs compare as floats
        np.testing.assert_array_equal(ref.astype(np.float64), cpu.astype(np.float64))
    else:
        np.testing.assert_array_equal(ref, cpu)
    return ref


@pytest.mark.parametrize("dt", [np.uint8, np.int32, np.uint32, np.int64])
@pytest.mark.parametrize("kind", list(BitwiseKind))
def test_bitwise_matches_python_ints(dt, kind: BitwiseKind) -> None:  # noqa: ANN001
    bits = np.dtype(dt).itemsize * 8
    info = np.iinfo(dt)
    a = RNG.integers(max(info.min, -1000), min(info.max, 1000), size=(3, 4)).astype(dt)
    b = RNG.integers(0, bits + 2, size=(4,)).astype(dt)
    if kind in (BitwiseKind.AND, BitwiseKind.OR, BitwiseKind.XOR):
        b = RNG.integers(max(info.min, -1000), min(info.max, 1000), size=(4,)).astype(dt)
    out = _both(Bitwise(kind), a, b)
    mask = (1 << bits) - 1
    for (i, j), v in np.ndenumerate(a):
        x, y = int(v), int(b[j])
        if kind is BitwiseKind.AND:
            want = x & y
        elif kind is BitwiseKind.OR:
            want = x | y
        elif kind is BitwiseKind.XOR:
            want = x ^ y
        elif kind is BitwiseKind.SHL:
            want = (x << y) & mask if y < bits else 0
        else:
            want = x >> min(y, bits) if y < bits else (-1 if x < 0 else 0)
        assert int(out[i, j]) == int(np.array(want & mask).astype(np.uint64).astype(dt)), (x, y)


def test_bitwise_not_and_bool_ops() -> None:
    a = np.array([0, 1, 200, 255], np.uint8)
    np.testing.assert_array_equal(_both(BitwiseNot(), a), [255, 254, 55, 0])
    p, q = np.array([True, False, True]), np.array([True, True, False])
    np.testing.assert_array_equal(_both(Bitwise(BitwiseKind.XOR), p, q), [False, True, True])


def test_shifts_of_bool_and_floats_are_refused() -> None:
    g = rlx.Graph("bad")
    with pytest.raises(ShapeError, match="integer"):
        g.apply(Bitwise(BitwiseKind.SHL), [g.input("a", [2], "bool"), g.input("b", [2], "bool")])
    with pytest.raises(ShapeError, match="float"):
        g.apply(Trig(TrigKind.TAN), [g.input("c", [2], "i32")])


_MATH = {TrigKind.TAN: math.tan, TrigKind.ASIN: math.asin, TrigKind.ACOS: math.acos,
         TrigKind.ATAN: math.atan, TrigKind.SINH: math.sinh, TrigKind.COSH: math.cosh,
         TrigKind.ASINH: math.asinh, TrigKind.ACOSH: math.acosh, TrigKind.ATANH: math.atanh}  # fmt: skip


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("kind", list(TrigKind))
def test_trig_matches_math(dt, kind: TrigKind) -> None:  # noqa: ANN001
    lo, hi = {TrigKind.ACOSH: (1.0, 4.0)}.get(kind, (-0.9, 0.9))
    x = RNG.uniform(lo, hi, size=7).astype(dt)
    out = _both(Trig(kind), x)
    want = np.array([_MATH[kind](float(v)) for v in x])
    np.testing.assert_allclose(out, want, rtol=1e-6 if dt == np.float32 else 1e-12)


def test_trig_bf16_rounds_once_and_out_of_domain_is_nan() -> None:
    x = np.array([0.5, 2.0], np.float32).astype(rlx.DType.BF16.np)
    out = _both(Trig(TrigKind.ASIN), x)
    assert float(out[0]) == float(np.float32(math.asin(0.5)).astype(rlx.DType.BF16.np))
    assert np.isnan(float(out[1]))


@pytest.mark.parametrize("dt", [np.float32, np.int64, np.float64])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("exclusive", [False, True])
def test_cumprod_matches_a_loop(dt, reverse: bool, exclusive: bool) -> None:  # noqa: ANN001
    from rlx.ops.cumulative import CumProd

    x = RNG.integers(-3, 4, size=(2, 5)).astype(dt)
    out = _both(CumProd(1, reverse, exclusive), x)
    for i in range(2):
        order = list(range(5))[::-1] if reverse else list(range(5))
        acc = 1
        for j in order:
            if exclusive:
                assert out[i, j] == acc
                acc *= x[i, j]
            else:
                acc *= x[i, j]
                assert out[i, j] == acc


@pytest.mark.parametrize(
    ("src", "dst"),
    [(np.float32, np.int32), (np.int64, np.float64), (np.int8, np.uint8), (np.bool_, np.uint8)],
)
def test_bitcast_reads_the_same_bytes(src, dst) -> None:  # noqa: ANN001
    from rlx.ops.bitcast import Bitcast

    x = np.array([[1.5, -2.0, 0.0], [3.25, 7.0, -0.5]]).astype(src)
    out = _both(Bitcast(rlx.DType.from_numpy(dst)), x)
    assert out.dtype == np.dtype(dst) and out.tobytes() == x.tobytes()


def test_bitcast_needs_equal_widths() -> None:
    from rlx.ops.bitcast import Bitcast

    g = rlx.Graph("bad")
    with pytest.raises(ShapeError, match="4-byte"):
        g.apply(Bitcast(rlx.DType.I64), [g.input("x", [2], "f32")])
