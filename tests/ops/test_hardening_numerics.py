"""Edge values of quantize, pad and (log-)softmax (issue 19, faults 14, 15 and 17).

Each op runs on the reference interpreter (``Graph.evaluate``) and compiled on the CPU
backend (native kernels on and off), and both are compared with an oracle written here
as a plain Python loop over the elements or rows, never with rlx's own code:

* quantize: ``saturate(round_half_even(f(x) / f(s)) + zp)`` per element, ``f`` the
  compute float (f64 for f64 inputs, else f32); NaN gives the zero point, +-inf and huge
  values saturate. The I32 output must saturate at exactly 2**31 - 1 (f32 cannot hold it).
* pad: an integer pad value that its dtype cannot hold is a DTypeError when the node is
  built, so neither execution path ever sees it.
* softmax / log_softmax, PyTorch's semantics: a row holding a NaN or a +inf, or only
  -inf, is all NaN; finite rows (even near finfo.max) never overflow; an empty axis gives
  an empty result.
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np
import pytest

import rlx
from rlx.dtype import DType
from rlx.errors import DTypeError, ShapeError, VerifyError
from rlx.ops.movement import Pad
from rlx.options import CompileOptions
from rlx.shape import Shape

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16]
OPTIONS = {
    "native": CompileOptions(use_cache=False),
    "numpy": CompileOptions(use_cache=False, native=False),
}


def _both(build, x: np.ndarray) -> list[np.ndarray]:
    """``build(g, x)`` evaluated by the reference and compiled (native on and off)."""
    g = rlx.Graph("edge")
    i = g.input("x", x.shape, DType.from_numpy(x.dtype))
    g.set_outputs([build(g, i)])
    outs = [g.evaluate({"x": x})[0]]
    for opts in OPTIONS.values():
        outs.append(rlx.Session("cpu").compile(g, opts).run({"x": x})[0])
    return outs


# ---- quantize (fault 14) -------------------------------------------------------------

QRANGE = {"i8": (-128, 127), "u8": (0, 255), "i16": (-32768, 32767), "i32": (-(2**31), 2**31 - 1)}
EDGES = [
    0.0, 0.5, 1.5, -2.5, 1.0, -1.0, 126.6, 127.5, -128.5, 255.5, 32767.5, -32768.5,
    16777217.0, -16777217.0, 2147483520.0, 2147483647.0, 2147483648.0, -2147483648.0,
    -2147483904.0, 3e9, -3e9, 1e30, -1e30, 3.0e38, math.inf, -math.inf, math.nan,
]  # fmt: skip


def quantize_oracle(
    x: np.ndarray, scales: list[float], zps: list[int], axis: int | None, qmin: int, qmax: int
) -> np.ndarray:
    """Element by element in Python integers (``round`` is round half to even)."""
    ct = np.float64 if x.dtype == np.float64 else np.float32
    out = np.empty(x.shape, np.int64)
    for idx in np.ndindex(*x.shape):
        c = 0 if axis is None else idx[axis]
        with np.errstate(all="ignore"):
            v = float(ct(x[idx]) / ct(scales[c]))
        if math.isnan(v):
            q = zps[c]
        elif math.isinf(v):
            q = qmax if v > 0 else qmin
        else:
            q = min(max(round(v) + zps[c], qmin), qmax)
        out[idx] = q
    return out


@pytest.mark.parametrize("qdtype", list(QRANGE))
@pytest.mark.parametrize("fdtype", FLOATS, ids=str)
def test_quantize_saturates_like_the_oracle_on_every_path(qdtype, fdtype):
    qmin, qmax = QRANGE[qdtype]
    with np.errstate(over="ignore"):
        x = np.array(EDGES, np.float64).astype(fdtype).reshape(3, 9)
    zp_t = qmin + 7 if qdtype == "u8" else 5
    zps_c = [0, qmax - 1, qmin + 1] if qdtype != "u8" else [0, 250, 3]
    cases = [
        ("per-tensor s=1", [1.0], [0], None),
        ("per-tensor s=0.5 zp", [0.5], [zp_t], None),
        ("per-channel", [1.0, 0.25, 3.0], zps_c, 0),
    ]
    for what, scales, zps, axis in cases:
        want = quantize_oracle(x, scales, zps, axis, qmin, qmax)
        op = functools.partial(rlx.Graph.quantize, scales=scales, zero_points=zps, axis=axis)
        outs = _both(lambda g, i, op=op: op(g, i, dtype=qdtype), x)
        for path, got in zip(["reference", *OPTIONS], outs, strict=True):
            assert got.dtype == DType.parse(qdtype).np, (what, path)
            np.testing.assert_array_equal(got, want, err_msg=f"{what}, {path}")


def test_quantize_i32_saturates_at_int32_max_not_int32_min():
    """The case of the report: f32 -> i32 of a huge value gave -2**31 once compiled."""
    x = np.array([[3e9, np.inf, -3e9], [2147483647.0, -np.inf, np.nan]], np.float32)
    want = [[2**31 - 1, 2**31 - 1, -(2**31)], [2**31 - 1, -(2**31), 0]]
    per_tensor = _both(lambda g, i: g.quantize(i, 1.0, dtype="i32"), x)
    per_channel = _both(lambda g, i: g.quantize(i, [1.0, 1.0], axis=0, dtype="i32"), x)
    for got in per_tensor + per_channel:
        np.testing.assert_array_equal(got, want)


def test_quantize_i32_adds_the_zero_point_exactly():
    """rint(x / s) + zp beyond 2**24 is not exact in f32: the sum must be integer."""
    x = np.array([16777216.0, -16777216.0, 2147483520.0], np.float32)
    for got in _both(lambda g, i: g.quantize(i, 1.0, [5], dtype="i32"), x):
        np.testing.assert_array_equal(got, [16777221, -16777211, 2147483525])


# ---- pad (fault 15) ------------------------------------------------------------------

BAD_PADS = [
    ("i8", 300.0, "outside the range"),
    ("i8", -129.0, "outside the range"),
    ("u8", 300.0, "outside the range"),
    ("u8", -1.0, "outside the range"),
    ("i16", 40000.0, "outside the range"),
    ("i32", 2.0**31, "outside the range"),
    ("i32", 1e30, "outside the range"),
    ("u32", -1.0, "outside the range"),
    ("i64", 2.0**63, "outside the range"),
    ("i32", 2.5, "integral"),
    ("u8", math.nan, "integral"),
    ("i8", math.inf, "integral"),
    ("bool", 2.0, "0 or 1"),
]


@pytest.mark.parametrize(("dtype", "value", "why"), BAD_PADS)
def test_pad_value_that_does_not_fit_is_a_build_time_error(dtype, value, why):
    g = rlx.Graph("pad")
    x = g.input("x", (2,), dtype)
    before = len(g.nodes)
    with pytest.raises(DTypeError, match=rf"pad value .* not representable in {dtype}.*{why}"):
        g.pad(x, 1, value)
    assert len(g.nodes) == before  # nothing half-built
    with pytest.raises(ShapeError, match=why):  # the shape rule itself
        Pad(((1, 1),), value).infer((Shape((2,), DType.parse(dtype)),))
    # a node that skipped the rule (as from a crafted file) fails verify, which load runs
    g.set_outputs([g.add_node(Pad(((1, 1),), value), [x], Shape((4,), DType.parse(dtype)))])
    with pytest.raises(VerifyError, match=rf"pad .*{why}"):
        g.verify()


@pytest.mark.parametrize(
    ("dtype", "value"),
    [("i8", 127), ("i8", -128), ("u8", 255), ("u8", 0), ("i16", -32768), ("i32", 2**31 - 1),
     ("i32", -(2**31)), ("u32", 2**32 - 1), ("i64", -(2**63)), ("bool", 1)],
)  # fmt: skip
def test_pad_value_at_the_dtype_limits_is_exact_on_every_path(dtype, value):
    x = (np.arange(4).reshape(2, 2) % 2).astype(DType.parse(dtype).np)
    want = np.empty((4, 4), x.dtype)
    want[...] = value  # oracle: the border by hand, the interior copied
    want[1:3, 1:3] = x
    for got in _both(lambda g, i: g.pad(i, 1, value), x):
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got, want)


def test_float_pad_values_pass_as_a_cast_would():
    x = np.zeros((1,), np.float16)
    for got in _both(lambda g, i: g.pad(i, 1, 1e6), x):  # beyond f16: +inf, as a cast
        np.testing.assert_array_equal(got, [np.inf, 0, np.inf])


# ---- softmax / log_softmax (fault 17) --------------------------------------------------


def softmax_row_oracle(row: list[float], log: bool) -> list[float]:
    """PyTorch's (log-)softmax of one row, in Python float64: NaN anywhere, a +inf, or
    only -inf -> a NaN row; otherwise exp(x - max) / sum with an exact sum (fsum)."""
    if any(math.isnan(v) or v == math.inf for v in row) or all(v == -math.inf for v in row):
        return [math.nan] * len(row)
    m = max(row)
    s = [v - m for v in row]
    z = math.fsum(math.exp(v) for v in s)
    return [v - math.log(z) for v in s] if log else [math.exp(v) / z for v in s]


def softmax_oracle(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    xs = np.moveaxis(x.astype(np.float64), axis, -1)
    out = np.empty(xs.shape, np.float64)
    for idx in np.ndindex(*xs.shape[:-1]):
        out[idx] = softmax_row_oracle([float(v) for v in xs[idx]], log)
    return np.moveaxis(out, -1, axis)


def _finfo_max(dt: np.dtype) -> float:
    return float(ml_dtypes.finfo(dt).max)


def _edge_rows(dt: np.dtype, n: int) -> np.ndarray:
    big = _finfo_max(dt)
    rows = [
        [big] * n,  # all at finfo.max: uniform, no overflow
        [big, -big] + [big / 3] * (n - 2),  # x - max overflows to -inf for -big
        [-math.inf] * n,  # fully masked: NaN (as PyTorch)
        [math.nan] + [1.0] * (n - 1),
        [1.0] * (n - 1) + [math.inf],
        [-math.inf] * (n - 1) + [2.0],  # one live entry: 1 / 0 and 0 / -inf
        [float(v) for v in np.linspace(-3, 3, n)],
    ]
    return np.array(rows, np.float64).astype(dt)


TOL = {"float64": 1e-12, "float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_softmax_of_non_finite_and_huge_rows_matches_pytorch_semantics(dt, log):
    x = _edge_rows(dt, 19)  # 19: a vector body and a tail in the native row kernel
    for axis, xx in [(-1, x), (0, np.ascontiguousarray(x.T))]:
        with np.errstate(over="ignore"):  # -6.8e38 rounds to -inf in f32
            want = softmax_oracle(xx, axis, log).astype(dt).astype(np.float64)
        op = rlx.Graph.log_softmax if log else rlx.Graph.softmax
        outs = _both(lambda g, i, op=op, axis=axis: op(g, i, axis), xx)
        for path, got in zip(["reference", *OPTIONS], outs, strict=True):
            assert got.dtype == dt
            tol = TOL[dt.name]
            np.testing.assert_allclose(
                got.astype(np.float64), want, rtol=tol, atol=tol, err_msg=f"{path}, axis {axis}"
            )


def test_softmax_edge_values_by_hand():
    """The oracle's rules, spelled out on f32."""
    x = np.array([[np.nan, 1.0], [-np.inf, -np.inf], [np.inf, 0.0], [3e38, 3e38]], np.float32)
    sm = softmax_oracle(x, -1, log=False)
    np.testing.assert_array_equal(sm, [[np.nan] * 2, [np.nan] * 2, [np.nan] * 2, [0.5, 0.5]])
    big = float(np.float32(3e38))
    lsm = softmax_oracle(np.array([[big, -big]], np.float32), -1, log=True)
    np.testing.assert_array_equal(lsm, [[0.0, -2 * big]])  # -inf once rounded to f32
    for got in _both(lambda g, i: g.softmax(i), x):
        np.testing.assert_array_equal(got, sm.astype(np.float32))


@pytest.mark.parametrize(("shape", "axis"), [((2, 0), -1), ((0, 3), 0), ((2, 0, 3), 1), ((0,), 0)])
@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_softmax_over_an_empty_axis_is_empty(dt, shape, axis):
    """NumPy's max of an empty axis raises; the ops give an empty result (as PyTorch)."""
    x = np.zeros(shape, dt)
    for build in (lambda g, i: g.softmax(i, axis), lambda g, i: g.log_softmax(i, axis)):
        for got in _both(build, x):
            assert got.shape == shape and got.dtype == dt
