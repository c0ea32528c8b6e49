"""Elementwise ops (unary, binary, compare, where, cast): shape/dtype rules and reference
implementations against NumPy / SciPy, with hypothesis for broadcasting."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import erf

import rlx
from rlx.autodiff.reverse import grad
from rlx.backends.cpu import native
from rlx.dtype import DType
from rlx.errors import ShapeError
from rlx.ops.elementwise import (
    UNARY_FNS,
    Binary,
    BinaryKind,
    Cast,
    Compare,
    CompareKind,
    Unary,
    UnaryKind,
    Where,
)
from rlx.ops.unary_kinds import UNARY
from rlx.shape import Shape


def _sig(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


UNARY_EXPECT = {
    UnaryKind.RELU: lambda x: np.maximum(x, 0),
    UnaryKind.GELU: lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))),
    UnaryKind.GELU_TANH: lambda x: (
        0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    ),
    UnaryKind.SILU: lambda x: x * _sig(x),
    UnaryKind.SIGMOID: _sig,
    UnaryKind.TANH: np.tanh,
    UnaryKind.EXP: np.exp,
    UnaryKind.LOG: np.log,
    UnaryKind.SQRT: np.sqrt,
    UnaryKind.RSQRT: lambda x: 1 / np.sqrt(x),
    UnaryKind.NEG: lambda x: -x,
    UnaryKind.ABS: np.abs,
    UnaryKind.SIN: np.sin,
    UnaryKind.COS: np.cos,
    UnaryKind.ROUND: np.round,
    UnaryKind.FLOOR: np.floor,
    UnaryKind.CEIL: np.ceil,
    UnaryKind.RECIP: lambda x: 1 / x,
    UnaryKind.SQUARE: lambda x: x * x,
    UnaryKind.SOFTPLUS: lambda x: np.log1p(np.exp(x)),
    UnaryKind.ERF: erf,
    UnaryKind.SIGN: np.sign,
    UnaryKind.HARDSWISH: lambda x: x * np.minimum(np.maximum(x + 3, 0), 6) / 6,
}
POSITIVE = {UnaryKind.LOG, UnaryKind.SQRT, UnaryKind.RSQRT}


def _run(build, *arrays: np.ndarray) -> np.ndarray:
    g = rlx.Graph("t")
    ids = [g.input(f"x{i}", a.shape, DType.from_numpy(a.dtype)) for i, a in enumerate(arrays)]
    g.set_outputs(build(g, *ids))
    g.verify()
    (out,) = g.evaluate({f"x{i}": a for i, a in enumerate(arrays)})
    assert out.shape == g.shape(g.outputs[0]).concrete()
    assert out.dtype == g.shape(g.outputs[0]).dtype.np
    return out


def test_every_unary_kind_has_an_expectation():
    assert set(UNARY_EXPECT) | {UnaryKind.NOT} == set(UnaryKind)


def test_every_unary_kind_has_one_row_of_facts():
    assert set(UNARY) == set(UnaryKind)
    assert UNARY_FNS == {k: f.numpy for k, f in UNARY.items()}


@pytest.mark.parametrize("kind", list(UNARY_EXPECT), ids=lambda k: k.value)
def test_unary_matches_numpy(kind: UnaryKind):
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (4, 5)).astype(np.float32)
    if kind in POSITIVE:
        x = np.abs(x) + 0.1
    got = _run(lambda g, a: g.unary(kind, a), x)
    np.testing.assert_allclose(got, UNARY_EXPECT[kind](x.astype(np.float64)), rtol=2e-6, atol=2e-6)
    # the builder named after the kind builds the same op
    g = rlx.Graph("t")
    name = "logical_not" if kind is UnaryKind.NOT else kind.value
    y = getattr(g, name)(g.input("x", (2,)))
    assert g.nodes[y].op == Unary(kind) and str(g.nodes[y].op) == kind.value


def test_round_is_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6], np.float32)
    got = _run(lambda g, a: g.round(a), x)
    np.testing.assert_array_equal(got, [0.0, 2.0, 2.0, -0.0, -2.0, 2.0, -3.0])


@pytest.mark.parametrize("dt", [DType.BF16, DType.F16, DType.F8E4M3])
def test_low_precision_unary_computes_wide_and_rounds_once(dt: DType):
    x = np.linspace(-2, 2, 9).astype(dt.np)
    got = _run(lambda g, a: g.gelu(a), x)
    assert got.dtype == dt.np
    want = UNARY_EXPECT[UnaryKind.GELU](x.astype(np.float64)).astype(np.float32).astype(dt.np)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize(
    "kind", [UnaryKind.RELU, UnaryKind.NEG, UnaryKind.ABS, UnaryKind.SQUARE, UnaryKind.SIGN]
)
def test_integer_friendly_unaries_keep_the_dtype(kind: UnaryKind):
    x = np.array([-3, 0, 2, 7], np.int32)
    got = _run(lambda g, a: g.unary(kind, a), x)
    np.testing.assert_array_equal(got, UNARY_EXPECT[kind](x).astype(np.int32))


def test_float_only_unaries_reject_ints_and_bools_with_the_input_named():
    g = rlx.Graph("t")
    i = g.input("i", (3,), DType.I32)
    with pytest.raises(ShapeError, match=r"exp needs a float input, got i32\[3\]") as ei:
        g.exp(i)
    assert ei.value.node == 1 and "test_elementwise.py" in str(ei.value)
    b = g.input("b", (3,), DType.BOOL)
    with pytest.raises(ShapeError, match=r"neg of a bool tensor bool\[3\]"):
        g.neg(b)
    with pytest.raises(ShapeError, match=r"not needs a bool input, got i32\[3\]"):
        g.logical_not(i)
    np.testing.assert_array_equal(
        _run(lambda g, a: g.logical_not(a), np.array([True, False])), [False, True]
    )


BINARY_EXPECT = {
    BinaryKind.ADD: np.add,
    BinaryKind.SUB: np.subtract,
    BinaryKind.MUL: np.multiply,
    BinaryKind.DIV: np.divide,
    BinaryKind.MAX: np.maximum,
    BinaryKind.MIN: np.minimum,
    BinaryKind.POW: lambda a, b: np.power(np.abs(a), b),
    BinaryKind.MOD: np.fmod,
}


@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
    kind=st.sampled_from(list(BINARY_EXPECT)),
    seed=st.integers(0, 2**16),
)
def test_binary_broadcasts_like_numpy(shapes, kind: BinaryKind, seed: int):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 2, shapes.input_shapes[0]).astype(np.float32)
    b = rng.uniform(0.5, 2, shapes.input_shapes[1]).astype(np.float32)
    got = _run(lambda g, x, y: g.binary(kind, x, y), a, b)
    assert got.shape == shapes.result_shape
    want = BINARY_EXPECT[kind](a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5)


@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3))
def test_where_broadcasts_over_all_three(shapes):
    rng = np.random.default_rng(0)
    c = rng.random(shapes.input_shapes[0]) < 0.5
    a = rng.standard_normal(shapes.input_shapes[1]).astype(np.float32)
    b = rng.standard_normal(shapes.input_shapes[2]).astype(np.float32)
    got = _run(lambda g, x, y, z: g.where(x, y, z), c, a, b)
    np.testing.assert_array_equal(got, np.where(c, a, b))


def test_integer_division_truncates_and_mod_takes_the_dividends_sign():
    a = np.array([7, -7, 7, -7, 5], np.int32)
    b = np.array([2, 2, -2, -2, 0], np.int32)
    np.testing.assert_array_equal(_run(lambda g, x, y: g.div(x, y), a, b), [3, -3, -3, 3, 0])
    np.testing.assert_array_equal(
        _run(lambda g, x, y: g.binary(BinaryKind.MOD, x, y), a[:4], b[:4]), [1, -1, 1, -1]
    )


def test_integer_pow_with_negative_exponents_truncates_toward_zero():
    a = np.array([2, 1, -1, -1, 3, 0, -2, 5], np.int32)
    b = np.array([-1, -2, -3, -2, 2, -1, 3, 0], np.int32)
    got = _run(lambda g, x, y: g.pow(x, y), a, b)
    np.testing.assert_array_equal(got, [0, 1, -1, 1, 9, 0, -8, 1])


def test_binary_op_needs_equal_dtypes_but_the_builder_promotes():
    g = rlx.Graph("t")
    x = g.input("x", (2, 3))
    i = g.input("i", (3,), DType.I32)
    with pytest.raises(ShapeError, match=r"add needs equal dtypes, got f32\[2,3\] and i32\[3\]"):
        g.binary(BinaryKind.ADD, x, i)
    y = g.add(x, i)  # builder casts i32 -> f32 (promote), then adds
    assert g.shape(y) == Shape((2, 3), DType.F32)
    assert isinstance(g.nodes[g.nodes[y].inputs[1]].op, Cast)
    h = g.input("h", (3,), DType.F16)
    assert g.shape(g.mul(i, h)).dtype is DType.F16  # int meets float: the float wins
    s = g.mul(h, 2.0)  # a Python scalar takes the tensor's dtype (weak type)
    assert g.shape(s) == Shape((3,), DType.F16)
    with pytest.raises(ShapeError, match="do not broadcast"):
        g.add(x, g.input("z", (4,)))
    with pytest.raises(ShapeError, match="and of bool tensors|and needs bool"):
        g.logical_and(i, i)


@pytest.mark.parametrize("kind", list(CompareKind), ids=lambda k: k.value)
def test_compare_gives_bool_like_numpy(kind: CompareKind):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 3, (3, 4)).astype(np.float32)
    b = rng.integers(0, 3, (4,)).astype(np.float32)
    got = _run(lambda g, x, y: getattr(g, kind.value)(x, y), a, b)
    ref = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal}
    ref |= {"gt": np.greater, "ge": np.greater_equal}
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, ref[kind.value](a, b))


def test_compare_where_cast_shape_rules():
    f, i, b = Shape((2, 3)), Shape((3,), DType.I32), Shape((2, 1), DType.BOOL)
    assert Compare(CompareKind.LT).infer((f, f)) == Shape((2, 3), DType.BOOL)
    with pytest.raises(ShapeError, match="compare: needs equal dtypes"):
        Compare(CompareKind.LT).infer((f, i))
    assert Where().infer((b, f, f)) == f
    with pytest.raises(ShapeError, match=r"condition must be bool, got f32\[2,3\]"):
        Where().infer((f, f, f))
    assert Cast(DType.BF16).infer((f,)) == Shape((2, 3), DType.BF16)
    assert Binary(BinaryKind.MAX).infer((Shape(("b", 1)), Shape((4,)))) == Shape(("b", 4))


@pytest.mark.parametrize(
    "to", [DType.I32, DType.U8, DType.F16, DType.BF16, DType.F8E4M3, DType.F8E5M2]
)
def test_cast_matches_numpy_and_ml_dtypes(to: DType):
    x = np.array([-2.7, -0.5, 0.0, 0.49, 1.5, 3.9, 100.25], np.float32)
    if to is DType.U8:
        x = np.abs(x)
    got = _run(lambda g, a: g.cast(a, to), x)
    assert got.dtype == to.np
    np.testing.assert_array_equal(got, x.astype(to.np))
    if to is DType.I32:
        np.testing.assert_array_equal(got, [-2, 0, 0, 0, 1, 3, 100])  # toward zero
    if to is DType.F8E4M3:
        assert got.dtype == np.dtype(ml_dtypes.float8_e4m3fn)


def test_fp8_back_to_f32_is_exact():
    x = np.array([0.0, 0.5, -1.75, 448.0], ml_dtypes.float8_e4m3fn)
    got = _run(lambda g, a: g.cast(a, "f32"), x)
    np.testing.assert_array_equal(got, x.astype(np.float32))


def test_symbolic_dims_flow_through_elementwise_rules():
    g = rlx.Graph("t")
    bsz = g.sym("batch")
    x = g.input("x", (bsz, 1, 4))
    y = g.input("y", (3, 1))
    z = g.where(g.gt(x, 0.0), g.exp(g.add(x, y)), 0.0)
    assert g.shape(z) == Shape((bsz, 3, 4))
    g.set_outputs(z)
    xv = np.random.default_rng(2).standard_normal((2, 1, 4)).astype(np.float32)
    yv = np.ones((3, 1), np.float32)
    (out,) = g.evaluate({"x": xv, "y": yv})
    np.testing.assert_allclose(out, np.where(xv > 0, np.exp(xv + yv), 0), rtol=1e-6)


def test_integer_div_truncates_toward_zero_at_the_type_minimum():
    import math

    from rlx.ops.elementwise import _div

    a = np.array([-27, 27, -27, 27, -128, 7, -7, 5, -128], np.int8)
    b = np.array([-128, -128, 5, -5, 1, 0, 2, -2, 3], np.int8)
    want = [int(math.trunc(x / y)) if y else 0 for x, y in zip(a.tolist(), b.tolist())]
    assert _div(a, b).tolist() == want


@pytest.mark.parametrize("dt", [DType.F32, DType.F64, DType.BF16])
def test_hardswish_against_torch(dt: DType):
    """hardswish's reference, its compiled CPU kernels (the standalone native loop and a
    fused region) and its gradient against torch.nn.functional.hardswish and torch's
    autograd, on a grid through the kinks at -3 and 3, the signed zeros and infinities."""
    torch = pytest.importorskip("torch")
    x = np.concatenate([np.linspace(-5, 5, 41), [-3.0, 3.0, -0.0, 0.0, np.inf, -np.inf]])
    xd = x.astype(dt.np)
    tx = torch.tensor(xd.astype(np.float64), requires_grad=True)
    want = torch.nn.functional.hardswish(tx)
    want.sum().backward()
    # exact in f64, rounded once to the dtype (every grid value is exact in bf16)
    expect = want.detach().numpy().astype(dt.np).astype(np.float64)
    outs = {}
    for name, build in {
        "alone": lambda g, a: g.hardswish(a),
        "region": lambda g, a: g.mul(g.hardswish(a), 0.5),
    }.items():
        g = rlx.Graph(name)
        g.set_outputs([build(g, g.input("x", x.shape, dt))])
        cg = rlx.Session("cpu").compile(g)
        (ref,) = g.evaluate({"x": xd})
        (got,) = cg.run({"x": xd})
        np.testing.assert_array_equal(got.astype(np.float64), ref.astype(np.float64))
        assert (np.signbit(got) == np.signbit(ref)).all()
        outs[name] = (ref, {k.op: k.kind.value for k in cg.report().kernels})
    ref, kinds = outs["alone"]
    np.testing.assert_array_equal(ref.astype(np.float64), expect)
    assert (np.signbit(ref) == np.signbit(expect)).all()
    if native.available():
        assert kinds == {"unary": "native"}
        assert outs["region"][1] == {"elementwise_region": "native"}
    s = rlx.Graph("sum_hardswish")
    v = s.input("x", x.shape, dt)
    s.set_outputs([s.sum(s.hardswish(v))])
    (dx,) = grad(s, ["x"]).evaluate({"x": xd})
    tol = {DType.F64: 0.0, DType.F32: 1e-6, DType.BF16: 1e-2}[dt]
    np.testing.assert_allclose(dx.astype(np.float64), tx.grad.numpy(), rtol=tol, atol=tol)
