"""Data movement (rlx/ops/movement.py): shape rules (static and symbolic) and references
against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlx
from rlx import DType, Shape, sym
from rlx.errors import InputError, ShapeError
from rlx.ops.movement import (
    Concat,
    Expand,
    Gather,
    Narrow,
    Pad,
    Reshape,
    ScatterAdd,
    Slice,
    Transpose,
)

from .helpers import run


def arange(shape, dtype=np.float32):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)


def test_only_reshape_is_a_view():
    assert Reshape.view is True
    for op in (Transpose, Concat, Expand, Narrow, Slice, Gather, ScatterAdd, Pad):
        assert op.view is False


# ---- reshape -------------------------------------------------------------------------


@given(shape=shapes, data=st.data())
def test_reshape_matches_numpy(shape, data):
    x = arange(shape)
    new = list(data.draw(st.permutations(shape)))
    if data.draw(st.booleans()):
        new[data.draw(st.integers(0, len(new) - 1))] = -1
    if data.draw(st.booleans()):
        new.insert(0, 1)
    got = run(lambda g, a: g.reshape(a, new), x)
    np.testing.assert_array_equal(got, x.reshape(new))


def test_reshape_symbolic_flatten_and_back():
    g = rlx.Graph()
    b, s = g.sym("batch"), g.sym("seq")
    x = g.input("x", (b, s, 384))
    flat = g.reshape(x, [-1, 384])
    assert g.shape(flat) == Shape((b * s, 384))
    back = g.reshape(flat, [b, "seq", -1])
    assert g.shape(back) == Shape((b, s, 384))
    half = g.reshape(x, [b, s, 2, -1])
    assert g.shape(half).dims[-1] == 192
    g.set_outputs([flat, back])
    a = np.random.default_rng(0).normal(size=(2, 3, 384)).astype(np.float32)
    f, bk = g.evaluate({"x": a})
    np.testing.assert_array_equal(f, a.reshape(6, 384))
    np.testing.assert_array_equal(bk, a)
    assert str(g.nodes[flat].op) == "reshape[dims=[batch*seq,384]]"


def test_reshape_errors_name_expected_and_given():
    g = rlx.Graph()
    x = g.input("x", (2, 3))
    with pytest.raises(
        ShapeError, match=r"cannot reshape f32\[2,3\] \(6 elements\) to \[4,2\] \(8 elements\)"
    ):
        g.reshape(x, [4, 2])
    with pytest.raises(ShapeError, match=r"at most one -1 allowed in dims \[-1,-1\], got 2"):
        g.reshape(x, [-1, -1])
    with pytest.raises(
        ShapeError,
        match=r"cannot infer the -1 in \[4,-1\] for input f32\[2,3\]: its 6 elements are not a whole multiple of 4",
    ):
        g.reshape(x, [4, -1])
    with pytest.raises(ShapeError, match=r"dims must be >= 0, got -2"):
        g.reshape(x, [-2, 3])
    with pytest.raises(ShapeError, match=r"g.reshape resolves a -1"):
        g.apply(Reshape((-1, 3)), [x])
    y = g.input("y", ("batch", 6))
    with pytest.raises(
        ShapeError, match=r"cannot infer the -1 in \[4,-1\] for input f32\[batch,6\]"
    ):
        g.reshape(y, [4, -1])
    with pytest.raises(ShapeError, match=r"cannot infer the -1 in \[seq,-1\] for input f32\[2,3\]"):
        g.reshape(x, ["seq", -1])
    with pytest.raises(ShapeError, match=r"to \[batch,3\]"):
        g.reshape(x, ["batch", 3])


# ---- transpose -----------------------------------------------------------------------


@given(shape=shapes, data=st.data())
def test_transpose_matches_numpy(shape, data):
    x = arange(shape)
    perm = data.draw(st.permutations(range(len(shape))))
    perm = [p - len(shape) if data.draw(st.booleans()) else p for p in perm]
    np.testing.assert_array_equal(run(lambda g, a: g.transpose(a, perm), x), np.transpose(x, perm))


def test_transpose_default_reverses_and_normalises_perm():
    x = arange((2, 3, 4))
    np.testing.assert_array_equal(run(lambda g, a: g.transpose(a), x), x.T)
    g = rlx.Graph()
    y = g.input("y", ("b", 3, 4))
    t = g.transpose(y, (-1, 0, 1))
    assert g.nodes[t].op == Transpose((2, 0, 1)) and g.shape(t) == Shape((4, "b", 3))


def test_transpose_bad_perm():
    s = Shape((2, 3, 4))
    for perm in [(0, 0, 1), (0, 1), (0, 1, 3)]:
        with pytest.raises(
            ShapeError,
            match=r"is not a permutation of the 3 axes of f32\[2,3,4\] \(expected an ordering of \(0, 1, 2\)\)",
        ):
            Transpose(perm).infer((s,))


# ---- concat --------------------------------------------------------------------------


@given(shape=shapes, data=st.data())
def test_concat_matches_numpy(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
    parts = []
    for k, n in enumerate(sizes):
        s = list(shape)
        s[axis] = n
        parts.append(arange(s) + 100 * k)
    got = run(lambda g, *ids: g.concat(ids, axis), *parts)
    np.testing.assert_array_equal(got, np.concatenate(parts, axis))


def test_concat_symbolic_multiples_of_one_symbol():
    s = sym("seq")
    a, b = Shape(("batch", s, 8)), Shape(("batch", 2 * s, 8))
    assert Concat(1).infer((a, a)) == Shape(("batch", 2 * s, 8))
    assert Concat(1).infer((a, b)) == Shape(("batch", 3 * s, 8))
    assert Concat(1).infer((a, Shape(("batch", 0, 8)))) == a
    assert Concat(2).infer((a, a)) == Shape(("batch", s, 16))
    g = rlx.Graph()
    x = g.input("x", (s, 2))
    g.set_outputs([g.concat([x, x], 0)])
    a2 = arange((3, 2))
    (out,) = g.evaluate({"x": a2})
    np.testing.assert_array_equal(out, np.concatenate([a2, a2]))


def test_concat_errors_name_expected_and_given():
    a = Shape((2, 3))
    with pytest.raises(
        ShapeError,
        match=r"input 1 f32\[3,3\] has dim 0 = 3, expected 2 like input 0 f32\[2,3\] \(only axis 1 may differ\)",
    ):
        Concat(1).infer((a, Shape((3, 3))))
    with pytest.raises(ShapeError, match=r"input 1 f16\[2,3\] has dtype f16, expected f32"):
        Concat(0).infer((a, Shape((2, 3), DType.F16)))
    with pytest.raises(ShapeError, match=r"input 2 f32\[2\] has rank 1, expected 2"):
        Concat(0).infer((a, a, Shape((2,))))
    with pytest.raises(ShapeError, match=r"needs at least one input"):
        Concat(0).infer(())
    with pytest.raises(ShapeError, match=r"axis 2 out of range for rank-2"):
        Concat(2).infer((a, a))
    with pytest.raises(ShapeError, match=r"sizes \[batch,4\].*make these dims static"):
        Concat(0).infer((Shape(("batch", 3)), Shape((4, 3))))
    with pytest.raises(ShapeError, match=r"sizes \[batch,seq\]"):
        Concat(0).infer((Shape(("batch", 3)), Shape(("seq", 3))))
    g = rlx.Graph()
    with pytest.raises(ShapeError, match="needs at least one input"):
        g.concat([], 0)


# ---- expand --------------------------------------------------------------------------


@st.composite
def broadcastable(draw):
    target = draw(shapes)
    keep = draw(st.integers(0, len(target)))
    src = [1 if draw(st.booleans()) else d for d in target[len(target) - keep :]]
    return tuple(src), tuple(target)


@given(pair=broadcastable())
def test_expand_matches_broadcast_to(pair):
    src, target = pair
    x = arange(src)
    got = run(lambda g, a: g.expand(a, target), x)
    np.testing.assert_array_equal(got, np.broadcast_to(x, target))


def test_expand_keeps_minus_one_dims_and_symbols():
    g = rlx.Graph()
    x = g.input("x", ("batch", 1, 4))
    e = g.expand(x, [2, -1, 3, -1])
    assert g.shape(e) == Shape((2, "batch", 3, 4))
    assert str(g.nodes[e].op) == "expand[dims=[2,batch,3,4]]"
    g.set_outputs([e])
    a = arange((5, 1, 4))
    np.testing.assert_array_equal(g.evaluate({"x": a})[0], np.broadcast_to(a, (2, 5, 3, 4)))


def test_expand_errors():
    s = Shape((3, 1))
    with pytest.raises(
        ShapeError,
        match=r"cannot broadcast f32\[3,1\] to \[4,5\]: input dim 0 is 3, expected 1 or 4",
    ):
        Expand((4, 5)).infer((s,))
    with pytest.raises(ShapeError, match=r"target rank 1 is below the input rank 2"):
        Expand((3,)).infer((s,))
    g = rlx.Graph()
    x = g.input("x", (3,))
    with pytest.raises(ShapeError, match=r"-1 at position 0 of \[-1,3\] has no input dim"):
        g.expand(x, [-1, 3])


# ---- narrow and slice ----------------------------------------------------------------


def test_narrow_matches_slicing():
    x = arange((3, 5, 2))
    got = run(lambda g, a: g.narrow(a, -2, 1, 3), x)
    np.testing.assert_array_equal(got, x[:, 1:4])
    assert Narrow(0, 2, 4).infer((Shape(("n", 3)),)) == Shape((4, 3))


def test_narrow_errors():
    s = Shape((3, 5))
    with pytest.raises(
        ShapeError, match=r"start 3 \+ length 3 exceeds the size 5 of axis 1 of f32\[3,5\]"
    ):
        Narrow(1, 3, 3).infer((s,))
    with pytest.raises(ShapeError, match=r"got start=-1, length=2"):
        Narrow(1, -1, 2).infer((s,))
    g = rlx.Graph()
    x = g.input("x", ("n",))
    g.set_outputs([g.narrow(x, 0, 2, 4)])
    with pytest.raises(InputError, match=r"start 2 \+ length 4 exceeds the size 5 of axis 0"):
        g.evaluate({"x": np.zeros(5, np.float32)})


index = st.one_of(st.none(), st.integers(-6, 6))


@given(shape=shapes, data=st.data())
def test_slice_matches_numpy(shape, data):
    x = arange(shape)
    k = data.draw(st.integers(0, len(shape)))
    starts = [data.draw(index) for _ in range(k)]
    stops = [data.draw(index) for _ in range(k)]
    steps = [data.draw(st.integers(-3, 3).filter(bool)) for _ in range(k)]
    got = run(lambda g, a: g.slice(a, starts, stops, steps), x)
    want = x[tuple(slice(a, b, c) for a, b, c in zip(starts, stops, steps))]
    np.testing.assert_array_equal(got, want)


def test_slice_symbolic_axes():
    s = Shape(("n", 8))
    assert Slice((0, 2), (None, 8), (1, 2)).infer((s,)) == Shape(("n", 3))
    assert Slice((1, 0), (5, None), (2, 1)).infer((s,)) == Shape((2, 8))
    with pytest.raises(
        ShapeError, match=r"axis 0 of f32\[n,8\] is symbolic \(n\).*got start=-2, stop=None, step=1"
    ):
        Slice((-2, 0), (None, None), (1, 1)).infer((s,))
    g = rlx.Graph()
    x = g.input("x", ("n",))
    g.set_outputs([g.slice(x, [0], [4])])
    np.testing.assert_array_equal(g.evaluate({"x": arange((6,))})[0], [0, 1, 2, 3])
    with pytest.raises(InputError, match=r"gives \(2,\), but the graph expects \(4,\)"):
        g.evaluate({"x": arange((2,))})


def test_slice_errors():
    s = Shape((4, 4))
    with pytest.raises(ShapeError, match=r"step 0 on axis 1 must be a non-zero int"):
        Slice((0, 0), (4, 4), (1, 0)).infer((s,))
    with pytest.raises(
        ShapeError, match=r"starts \(0,\) must have one entry per axis of f32\[4,4\] \(2\)"
    ):
        Slice((0,), (4, 4), (1, 1)).infer((s,))
    g = rlx.Graph()
    x = g.input("x", (4,))
    with pytest.raises(ShapeError, match=r"must have equal lengths <= the rank 1"):
        g.slice(x, [0, 0], [1, 1])


# ---- gather and scatter_add ----------------------------------------------------------


@given(
    shape=shapes,
    idx_shape=hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3),
    dt=st.sampled_from([np.int32, np.int64, np.uint8]),
    data=st.data(),
)
def test_gather_matches_take(shape, idx_shape, dt, data):
    x = arange(shape)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    lo = 0 if dt is np.uint8 else -n
    idx = data.draw(hnp.arrays(dt, idx_shape, elements=st.integers(lo, n - 1)))
    got = run(lambda g, a, i: g.gather(a, i, axis), x, idx)
    np.testing.assert_array_equal(got, np.take(x, idx.astype(np.int64), axis=axis))


def test_gather_embedding_lookup_with_symbolic_dims():
    g = rlx.Graph()
    table = g.param("emb", (10, 4))
    ids = g.input("ids", ("batch", "seq"), DType.I32)
    e = g.gather(table, ids, 0)
    assert g.shape(e) == Shape(("batch", "seq", 4))
    g.set_outputs([e])
    w = arange((10, 4))
    i = np.array([[1, 9, 0]], np.int32)
    np.testing.assert_array_equal(g.evaluate({"ids": i}, {"emb": w})[0], w[i])
    with pytest.raises(
        InputError,
        match=r"gather: index 10 out of range for axis 0 of size 10 \(expected -10 <= index < 10; 2 such indices\)",
    ):
        g.evaluate({"ids": np.array([[10, 3, 12]], np.int32)}, {"emb": w})


def test_gather_errors():
    with pytest.raises(ShapeError, match=r"indices must be an integer tensor, got f32\[2\]"):
        Gather(0).infer((Shape((3,)), Shape((2,))))
    with pytest.raises(ShapeError, match=r"axis 1 out of range for rank-1"):
        Gather(1).infer((Shape((3,)), Shape((2,), DType.I32)))


def test_scatter_add_accumulates_repeated_indices():
    x = arange((3, 4))
    idx = np.array([2, 0, 2, -1], np.int64)
    upd = np.ones((3, 4), np.float32) * np.array([1, 10, 100, 1000], np.float32)
    got = run(lambda g, a, i, u: g.scatter_add(a, i, u, axis=1), x, idx, upd)
    want = x.copy()
    for j, t in enumerate(idx):
        want[:, t] += upd[:, j]
    np.testing.assert_array_equal(got, want)
    assert want[0, 2] == 2 + 1 + 100 and want[0, 3] == 3 + 1000


@given(shape=shapes, m=st.integers(0, 5), data=st.data())
def test_scatter_add_matches_add_at(shape, m, data):
    x = arange(shape, np.int32)
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    idx = data.draw(hnp.arrays(np.int32, (m,), elements=st.integers(0, n - 1)))
    us = list(shape)
    us[axis] = m
    upd = arange(us, np.int32) + 1
    got = run(lambda g, a, i, u: g.scatter_add(a, i, u, axis), x, idx, upd)
    want = x.copy()
    np.add.at(want, (slice(None),) * axis + (idx,), upd)
    np.testing.assert_array_equal(got, want)


def test_scatter_add_f16_accumulates_in_f32():
    x = np.array([2048.0], np.float16)  # f16 spacing at 2048 is 2: 2048 + 1 rounds back
    upd = np.ones(4, np.float16)
    got = run(lambda g, a, i, u: g.scatter_add(a, i, u), x, np.zeros(4, np.int32), upd)
    assert got.dtype == np.float16 and got[0] == 2052


def test_scatter_add_errors():
    x = Shape((2, 3))
    i1 = Shape((4,), DType.I32)
    with pytest.raises(ShapeError, match=r"updates must have dims \[2,4\] .* got f32\[2,3\]"):
        ScatterAdd(1).infer((x, i1, Shape((2, 3))))
    with pytest.raises(ShapeError, match=r"indices must be a 1-D integer tensor, got i32\[2,2\]"):
        ScatterAdd(0).infer((x, Shape((2, 2), DType.I32), x))
    with pytest.raises(ShapeError, match=r"updates dtype f16 differs from the input's f32"):
        ScatterAdd(0).infer((x, Shape((2,), DType.I32), Shape((2, 3), DType.F16)))
    g = rlx.Graph()
    a = g.input("a", (2, 3))
    i = g.input("i", (1,), DType.I32)
    u = g.input("u", (1, 3))
    g.set_outputs([g.scatter_add(a, i, u)])
    z = np.zeros((2, 3), np.float32)
    with pytest.raises(
        InputError, match=r"scatter_add: index -3 out of range for axis 0 of size 2"
    ):
        g.evaluate({"a": z, "i": np.array([-3], np.int32), "u": z[:1]})


# ---- pad -----------------------------------------------------------------------------


@given(shape=shapes, data=st.data(), value=st.sampled_from([0.0, -1.5, 7.0]))
def test_pad_matches_numpy(shape, data, value):
    x = arange(shape)
    pads = [(data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape]
    got = run(lambda g, a: g.pad(a, pads, value), x)
    np.testing.assert_array_equal(got, np.pad(x, pads, constant_values=value))


def test_pad_int_and_errors():
    x = arange((2, 2), np.int32)
    got = run(lambda g, a: g.pad(a, 1, -7.0), x)
    np.testing.assert_array_equal(got, np.pad(x, 1, constant_values=-7))
    assert got.dtype == np.int32
    with pytest.raises(ShapeError, match=r"pad value 2.0 is not representable in bool"):
        Pad(((0, 0),), 2.0).infer((Shape((2,), DType.BOOL),))
    b = np.array([True, False])
    np.testing.assert_array_equal(run(lambda g, a: g.pad(a, 1, 1.0), b), [1, 1, 0, 1])
    with pytest.raises(ShapeError, match=r"pad value 0.5 is not representable in i32"):
        Pad(((0, 0),), 0.5).infer((Shape((2,), DType.I32),))
    with pytest.raises(
        ShapeError,
        match=r"one \(before, after\) pair of ints >= 0 per axis of f32\[2,2\] \(2 pairs\), got \(\(0, 1\),\)",
    ):
        Pad(((0, 1),)).infer((Shape((2, 2)),))
    with pytest.raises(ShapeError, match=r"got \(\(0, -1\),\)"):
        Pad(((0, -1),)).infer((Shape((2,)),))
    with pytest.raises(
        ShapeError,
        match=r"axis 0 of f32\[n,2\] is symbolic \(n\): padding it by \(1, 0\) needs a static dim",
    ):
        Pad(((1, 0), (0, 0))).infer((Shape(("n", 2)),))
    assert Pad(((0, 0), (1, 2))).infer((Shape(("n", 2)),)) == Shape(("n", 5))
    g = rlx.Graph()
    y = g.input("y", (2,))
    with pytest.raises(
        ShapeError,
        match=r"pads must be an int or one \(before, after\) pair per axis of f32\[2\], got \[\(1, 2, 3\)\]",
    ):
        g.pad(y, [(1, 2, 3)])


# ---- squeeze, unsqueeze, flatten -----------------------------------------------------


def test_squeeze_unsqueeze_flatten_match_numpy():
    x = arange((1, 3, 1, 2))
    np.testing.assert_array_equal(run(lambda g, a: g.squeeze(a), x), np.squeeze(x))
    np.testing.assert_array_equal(run(lambda g, a: g.squeeze(a, -2), x), np.squeeze(x, 2))
    np.testing.assert_array_equal(
        run(lambda g, a: g.unsqueeze(a, (0, -1)), x), np.expand_dims(x, (0, -1))
    )
    np.testing.assert_array_equal(run(lambda g, a: g.flatten(a), x), x.reshape(-1))
    np.testing.assert_array_equal(run(lambda g, a: g.flatten(a, 1, 2), x), x.reshape(1, 3, 2))
    g = rlx.Graph()
    y = g.input("y", ("b", "s", 4))
    assert g.shape(g.flatten(y, 0, 1)) == Shape((sym("b") * sym("s"), 4))
    assert g.shape(g.unsqueeze(y, 1)) == Shape(("b", 1, "s", 4))
    assert all(isinstance(n.op, Reshape) for n in g.nodes[1:])


def test_squeeze_unsqueeze_flatten_errors():
    g = rlx.Graph()
    x = g.input("x", (1, 3))
    with pytest.raises(ShapeError, match=r"squeeze: axis 1 of f32\[1,3\] has size 3, expected 1"):
        g.squeeze(x, 1)
    with pytest.raises(ShapeError, match=r"squeeze: axis 2 out of range for rank-2"):
        g.squeeze(x, 2)
    with pytest.raises(
        ShapeError,
        match=r"unsqueeze: axes \(0, 0\) must be distinct and in \[-4, 4\) for the rank-4 output",
    ):
        g.unsqueeze(x, (0, 0))
    with pytest.raises(ShapeError, match=r"flatten: start axis 1 comes after end axis 0"):
        g.flatten(x, 1, 0)
    with pytest.raises(ShapeError, match=r"axis 4 out of range for rank-2") as ei:
        g.flatten(x, 0, 4)
    assert "test_movement.py" in str(ei.value)  # builder errors point at the user's line
