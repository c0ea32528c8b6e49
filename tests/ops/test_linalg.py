import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx import DType, Shape
from rlx.errors import ShapeError
from rlx.ops.linalg import DotGeneral, MatMul

RNG = np.random.default_rng(0)


def _mm(a_shape, b_shape, dtype=DType.F32):
    g = rlx.Graph("mm")
    a = g.input("a", a_shape, dtype)
    b = g.input("b", b_shape, dtype)
    y = g.matmul(a, b)
    g.set_outputs([y])
    return g, y


@pytest.mark.parametrize(
    ("a", "b", "out"),
    [
        ((3, 4), (4, 5), (3, 5)),
        ((4,), (4, 5), (5,)),
        ((3, 4), (4,), (3,)),
        ((4,), (4,), ()),
        ((2, 1, 3, 4), (5, 4, 6), (2, 5, 3, 6)),
        ((7, 3, 4), (4,), (7, 3)),
        ((4,), (2, 4, 6), (2, 6)),
    ],
)
def test_matmul_shape_rule_matches_numpy(a, b, out):
    g, y = _mm(a, b)
    assert g.shape(y) == Shape(out, DType.F32)
    av, bv = RNG.standard_normal(a).astype(np.float32), RNG.standard_normal(b).astype(np.float32)
    (got,) = g.evaluate({"a": av, "b": bv})
    assert got.shape == np.matmul(av, bv).shape == out
    np.testing.assert_allclose(got, np.matmul(av, bv), rtol=1e-5, atol=1e-5)


@st.composite
def _broadcast_pair(draw):
    rank = draw(st.integers(0, 3))
    full = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    a_batch, b_batch = [], []
    for d in full:
        a_batch.append(1 if draw(st.booleans()) else d)
        b_batch.append(1 if draw(st.booleans()) else d)
    a_batch = a_batch[draw(st.integers(0, rank)) :]
    b_batch = b_batch[draw(st.integers(0, rank)) :]
    m, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    a_shape = (*a_batch, m, k) if draw(st.booleans()) or a_batch else (k,)
    b_shape = (*b_batch, k, n) if draw(st.booleans()) or b_batch else (k,)
    return a_shape, b_shape


@given(_broadcast_pair(), st.integers(0, 2**31 - 1))
def test_matmul_broadcasting_property(shapes, seed):
    a_shape, b_shape = shapes
    rng = np.random.default_rng(seed)
    av = rng.standard_normal(a_shape).astype(np.float32)
    bv = rng.standard_normal(b_shape).astype(np.float32)
    g, y = _mm(a_shape, b_shape)
    want = np.matmul(av, bv)
    assert g.shape(y).dims == want.shape
    (got,) = g.evaluate({"a": av, "b": bv})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_matmul_symbolic_batch_and_rows():
    g = rlx.Graph("sym")
    b, s = g.sym("batch", max=8), g.sym("seq")
    x = g.input("x", (b, s, 4))
    w = g.param("w", (4, 3))
    y = g.matmul(x, w)
    g.set_outputs([y])
    assert g.shape(y) == Shape((b, s, 3))
    xv = RNG.standard_normal((2, 5, 4)).astype(np.float32)
    wv = RNG.standard_normal((4, 3)).astype(np.float32)
    (got,) = g.evaluate({"x": xv}, {"w": wv})
    np.testing.assert_allclose(got, xv @ wv, rtol=1e-5)
    # a symbolic contracted dim must match itself exactly
    z = g.input("z", (s, 2))
    with pytest.raises(ShapeError, match=r"K=seq"):
        g.matmul(x, z)


@pytest.mark.parametrize("dt", [DType.F16, DType.BF16])
def test_low_precision_matmul_accumulates_in_f32(dt):
    k = 3000  # f16 accumulation of ones would stall at 2048
    a = np.ones((2, k), np.float32)
    b = np.ones((k, 3), np.float32)
    b[::7] = 0.5
    g, _ = _mm((2, k), (k, 3), dt)
    (got,) = g.evaluate({"a": a.astype(dt.np), "b": b.astype(dt.np)})
    assert got.dtype == dt.np
    want = (a.astype(dt.np).astype(np.float32) @ b.astype(dt.np).astype(np.float32)).astype(dt.np)
    np.testing.assert_array_equal(got, want)
    assert float(got[0, 0]) > 2048  # exact sum 2785.5, rounded once to the node dtype


@pytest.mark.parametrize("dt", [DType.F16, DType.BF16])
def test_low_precision_dot_general_accumulates_in_f32(dt):
    a = RNG.standard_normal((2, 600, 3)).astype(dt.np)
    b = RNG.standard_normal((2, 600, 4)).astype(dt.np)
    g = rlx.Graph("dg")
    y = g.dot_general(
        g.input("a", a.shape, dt), g.input("b", b.shape, dt), ((1,), (1,)), ((0,), (0,))
    )
    g.set_outputs([y])
    (got,) = g.evaluate({"a": a, "b": b})
    want = np.einsum("bkm,bkn->bmn", a.astype(np.float32), b.astype(np.float32)).astype(dt.np)
    assert got.dtype == dt.np
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_int_matmul_accumulates_in_i64_and_wraps():
    a = RNG.integers(-128, 128, (3, 50)).astype(np.int8)
    b = RNG.integers(-128, 128, (50, 2)).astype(np.int8)
    g, y = _mm((3, 50), (50, 2), DType.I8)
    assert g.shape(y).dtype is DType.I8
    (got,) = g.evaluate({"a": a, "b": b})
    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int8)
    np.testing.assert_array_equal(got, want)


def test_matmul_errors_name_both_operands():
    g = rlx.Graph("bad")
    a = g.input("a", (3, 4))
    b = g.input("b", (5, 6))
    with pytest.raises(ShapeError, match=r"f32\[3,4\].*K=4.*f32\[5,6\].*K=5"):
        g.matmul(a, b)
    h = g.input("h", (4, 6), DType.F16)
    with pytest.raises(ShapeError, match=r"equal dtypes.*f32\[3,4\].*f16\[4,6\]"):
        g.matmul(a, h)
    p = g.input("p", (2, 3, 4))
    q = g.input("q", (3, 4, 2))
    with pytest.raises(ShapeError, match=r"batch dims.*f32\[2,3,4\].*f32\[3,4,2\]"):
        g.matmul(p, q)
    t = g.input("t", (4, 4), DType.BOOL)
    with pytest.raises(ShapeError, match="bool"):
        g.matmul(t, t)
    s = g.input("s", ())
    with pytest.raises(ShapeError, match="rank >= 1"):
        g.matmul(s, a)
    assert len(g) == 7  # failed builds left no node


@st.composite
def _dot_general_case(draw):
    nb, nc = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    nlf, nrf = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    sizes = draw(
        st.lists(st.integers(1, 3), min_size=nb + nc + nlf + nrf, max_size=nb + nc + nlf + nrf)
    )
    batch, contract = sizes[:nb], sizes[nb : nb + nc]
    lfree, rfree = sizes[nb + nc : nb + nc + nlf], sizes[nb + nc + nlf :]
    # role of each axis: ("b", i) / ("c", i) / ("f", i), in a random order per operand
    lroles = draw(
        st.permutations(
            [("b", i) for i in range(nb)]
            + [("c", i) for i in range(nc)]
            + [("f", i) for i in range(nlf)]
        )
    )
    rroles = draw(
        st.permutations(
            [("b", i) for i in range(nb)]
            + [("c", i) for i in range(nc)]
            + [("f", i) for i in range(nrf)]
        )
    )
    return batch, contract, lfree, rfree, lroles, rroles


@given(_dot_general_case(), st.integers(0, 2**31 - 1))
def test_dot_general_matches_einsum(case, seed):
    batch, contract, lfree, rfree, lroles, rroles = case
    letters = iter("abcdefghijklmnop")
    names = {("b", i): next(letters) for i in range(len(batch))}
    names |= {("c", i): next(letters) for i in range(len(contract))}
    lnames = {("f", i): next(letters) for i in range(len(lfree))}
    rnames = {("f", i): next(letters) for i in range(len(rfree))}
    size = {("b", i): d for i, d in enumerate(batch)} | {
        ("c", i): d for i, d in enumerate(contract)
    }

    def dims(roles, free):
        return tuple(free[r[1]] if r[0] == "f" else size[r] for r in roles)

    lshape, rshape = dims(lroles, lfree), dims(rroles, rfree)
    lsub = "".join(lnames[r] if r[0] == "f" else names[r] for r in lroles)
    rsub = "".join(rnames[r] if r[0] == "f" else names[r] for r in rroles)
    out = "".join(names[("b", i)] for i in range(len(batch)))
    out += "".join(lnames[r] for r in lroles if r[0] == "f")
    out += "".join(rnames[r] for r in rroles if r[0] == "f")
    rng = np.random.default_rng(seed)
    lv = rng.standard_normal(lshape).astype(np.float32)
    rv = rng.standard_normal(rshape).astype(np.float32)
    want = np.einsum(f"{lsub},{rsub}->{out}", lv, rv)

    def axes(roles, kind):
        n = sum(r[0] == kind for r in roles)
        return tuple(roles.index((kind, i)) for i in range(n))

    g = rlx.Graph("dg")
    a, b = g.input("a", lshape), g.input("b", rshape)
    y = g.dot_general(
        a,
        b,
        contract=(axes(lroles, "c"), axes(rroles, "c")),
        batch=(axes(lroles, "b"), axes(rroles, "b")),
    )
    g.set_outputs([y])
    assert g.shape(y).dims == want.shape
    (got,) = g.evaluate({"a": lv, "b": rv})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dot_general_normalises_negative_axes_and_symbolic_batch():
    g = rlx.Graph("dg")
    n = g.sym("n")
    a = g.input("a", (n, 3, 4))
    b = g.input("b", (n, 4, 5))
    y = g.dot_general(a, b, contract=((-1,), (1,)), batch=((0,), (0,)))
    assert g.nodes[y].op == DotGeneral((2,), (1,), (0,), (0,))
    assert g.shape(y) == Shape((n, 3, 5))
    av = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    bv = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    g.set_outputs([y])
    np.testing.assert_allclose(g.evaluate({"a": av, "b": bv})[0], av @ bv, rtol=1e-5)
    assert "dot_general[lhs_contract=(2,), rhs_contract=(1,)" in str(g.nodes[y].op)


def test_dot_general_errors():
    g = rlx.Graph("bad")
    a = g.input("a", (2, 3, 4))
    b = g.input("b", (2, 5, 4))
    with pytest.raises(
        ShapeError,
        match=r"contracting dims differ: lhs f32\[2,3,4\] axis 1 is 3, rhs f32\[2,5,4\] axis 1 is 5",
    ):
        g.dot_general(a, b, contract=((1,), (1,)))
    with pytest.raises(ShapeError, match=r"lhs has 1 contracting axes \(2,\) but rhs has 2"):
        g.dot_general(a, b, contract=((2,), (1, 2)))
    with pytest.raises(ShapeError, match="out of range for a rank-3"):
        g.dot_general(a, b, contract=((3,), (2,)))
    with pytest.raises(ShapeError, match="both batch and contracting"):
        g.dot_general(a, b, contract=((0,), (0,)), batch=((0,), (0,)))
    with pytest.raises(ShapeError, match="repeat an axis"):
        g.dot_general(a, b, contract=((2, 2), (2, 2)))
    c = g.input("c", (3, 5, 4))
    with pytest.raises(
        ShapeError,
        match=r"batch dims differ: lhs f32\[2,3,4\] axis 0 is 2, rhs f32\[3,5,4\] axis 0 is 3",
    ):
        g.dot_general(a, c, contract=((2,), (2,)), batch=((0,), (0,)))


def test_linear_with_and_without_bias():
    g = rlx.Graph("lin")
    s = g.sym("seq")
    x = g.input("x", (2, s, 4))
    w = g.param("w", (4, 3))
    bias = g.param("b", (3,))
    y = g.linear(x, w, bias)
    z = g.linear(x, w)
    g.set_outputs([y, z])
    assert g.shape(y) == Shape((2, s, 3)) and g.shape(z) == g.shape(y)
    xv = RNG.standard_normal((2, 5, 4)).astype(np.float32)
    wv = RNG.standard_normal((4, 3)).astype(np.float32)
    bv = RNG.standard_normal(3).astype(np.float32)
    got_y, got_z = g.evaluate({"x": xv}, {"w": wv, "b": bv})
    np.testing.assert_allclose(got_y, xv @ wv + bv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_z, xv @ wv, rtol=1e-5, atol=1e-6)


def test_linear_errors_name_weight_and_bias():
    g = rlx.Graph("lin")
    x = g.input("x", (2, 4))
    w3 = g.param("w3", (1, 4, 3))
    w = g.param("w", (4, 3))
    bad_b = g.param("b", (4,))
    n = len(g)
    with pytest.raises(ShapeError, match=r"weight %1 must be \[in, out\], got f32\[1,4,3\]") as ei:
        g.linear(x, w3)
    assert "test_linalg.py" in str(ei.value)
    with pytest.raises(
        ShapeError, match=r"bias %3 must be \[3\] for weight f32\[4,3\], got f32\[4\]"
    ):
        g.linear(x, w, bad_b)
    assert len(g) == n


def test_ops_are_hashable_and_printable():
    assert MatMul() == MatMul() and hash(MatMul()) == hash(MatMul())
    assert str(MatMul()) == "matmul"
    d = DotGeneral((1,), (0,))
    assert d == DotGeneral((1,), (0,), (), ()) and len({d, DotGeneral((1,), (0,))}) == 1
