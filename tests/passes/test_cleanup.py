"""DCE, CSE, constant folding, algebraic simplification and broadcast legalisation:
structure afterwards and numbers (pass on vs off, reference interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx.errors import CompileError
from rlx.ir.mir import Graph
from rlx.ops.core import Constant, Input, Param
from rlx.ops.elementwise import Binary, Cast, Unary, UnaryKind
from rlx.ops.movement import Expand, Reshape, Transpose
from rlx.passes.broadcast import BroadcastLegalization, kernel_indexable
from rlx.passes.cse import CommonSubexpressionElimination
from rlx.passes.dce import DeadCodeElimination
from rlx.passes.fold import ConstantFolding
from rlx.passes.simplify import AlgebraicSimplification

from .graphs import (
    mlp,
    random_graph_values,
    random_graphs,
    random_inputs,
    random_params,
    transformer_block,
)


def same_numbers(before: Graph, after: Graph, ins: dict, params: dict, rtol: float = 1e-5) -> None:
    after.verify()
    want = before.evaluate(ins, params)
    got = after.evaluate(ins, {k: v for k, v in params.items() if k in after.param_names})
    assert len(want) == len(got)
    for w, o in zip(want, got):
        assert o.shape == w.shape and o.dtype == w.dtype
        np.testing.assert_allclose(o, w, rtol=rtol, atol=1e-6)


def ops_of(g: Graph, cls: type) -> list:
    return [n for n in g.nodes if isinstance(n.op, cls)]


# ---- DCE --------------------------------------------------------------------------


def test_dce_drops_dead_nodes_keeps_interface():
    g = Graph("dead")
    x = g.input("x", (2, 3))
    g.input("unused", (4,))
    w = g.param("w", (3, 3))
    dead = g.exp(x)
    g.tanh(dead)
    y = g.relu(x)
    g.set_outputs([y])
    p = DeadCodeElimination()
    out = p.run(g)
    assert [type(n.op) for n in out.nodes] == [Input, Input, Param, Unary]
    assert out.nodes[out.outputs[0]].op == Unary(UnaryKind.RELU)
    assert any("removed 2 dead nodes" in n for n in p.notes)
    assert any("'unused'" in n and "'w'" in n for n in p.notes)
    assert len(g) == 6 and w == 2  # the input graph is untouched


@given(random_graphs())
def test_dce_random(g):
    out = DeadCodeElimination().run(g)
    ins, ps = random_graph_values(g)
    same_numbers(g, out, ins, ps)
    users = {i for n in out.nodes for i in n.inputs} | set(out.outputs)
    for n in out.nodes:  # everything left is read or is an input/param
        assert n.id in users or isinstance(n.op, (Input, Param))


# ---- CSE --------------------------------------------------------------------------


def test_cse_merges_duplicates_commutative_and_constants():
    g = Graph("dup")
    x = g.input("x", (2, 3))
    y = g.input("y", (2, 3))
    a1, a2 = g.add(x, y), g.add(y, x)  # commutative: one node
    s1, s2 = g.sub(x, y), g.sub(y, x)  # not commutative: two nodes
    c1, c2 = g.mul(x, 2.0), g.mul(x, 2.0)  # equal constants merge, then equal muls
    g.set_outputs([g.add(a1, a2), g.add(s1, s2), g.add(c1, c2)])
    p = CommonSubexpressionElimination()
    out = p.run(g)
    assert len(ops_of(out, Constant)) == 1
    assert len([n for n in out.nodes if isinstance(n.op, Binary) and n.op.fn.value == "sub"]) == 2
    assert len([n for n in out.nodes if isinstance(n.op, Binary) and n.op.fn.value == "mul"]) == 1
    assert "merged 3 duplicate nodes" in p.notes[0]
    same_numbers(g, out, random_inputs(g), {})


@given(random_graphs())
def test_cse_random(g):
    out = CommonSubexpressionElimination().run(g)
    ins, ps = random_graph_values(g)
    same_numbers(g, out, ins, ps)
    keys = [(n.op, n.inputs) for n in out.nodes if n.op.pure]
    assert len(keys) == len(set(keys))


# ---- constant folding ---------------------------------------------------------------


def test_fold_constant_subgraph():
    g = Graph("fold")
    x = g.input("x", (3,))
    c = g.constant(np.array([1.0, 2.0, 3.0], np.float32))
    k = g.exp(g.mul(c, 2.0))  # constant
    g.set_outputs([g.add(x, k)])
    p = ConstantFolding()
    out = DeadCodeElimination().run(p.run(g))
    assert [type(n.op) for n in out.nodes] == [Input, Constant, Binary]
    np.testing.assert_allclose(
        out.nodes[1].op.value.array(), np.exp([2.0, 4.0, 6.0]).astype(np.float32), rtol=1e-6
    )
    assert "folded 2 nodes" in p.notes
    same_numbers(g, out, {"x": np.ones(3, np.float32)}, {})


def test_fold_freezes_params_and_folds_param_only_subgraphs():
    g = Graph("frozen")
    x = g.input("x", (2, 4))
    w = g.param("w", (3, 4))
    y = g.matmul(x, g.transpose(w, (1, 0)))  # transpose(w) is param-only
    g.set_outputs([y])
    params = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    p = ConstantFolding(params)
    out = DeadCodeElimination().run(p.run(g))
    assert not ops_of(out, Param) and not ops_of(out, Transpose)
    (cst,) = ops_of(out, Constant)
    np.testing.assert_array_equal(cst.op.value.array(), params["w"].T)
    assert p.notes[:2] == ["froze 1 params as constants", "folded 1 nodes"]
    same_numbers(g, out, {"x": np.ones((2, 4), np.float32)}, params)
    # without params nothing is frozen
    assert ops_of(ConstantFolding().run(g), Param)


def test_fold_rejects_bad_frozen_param():
    g = Graph("bad")
    w = g.param("w", (3, 4))
    g.set_outputs([g.relu(w)])
    with pytest.raises(CompileError, match=r"param 'w' expects shape f32\[3,4\], given \(4, 3\)"):
        ConstantFolding({"w": np.zeros((4, 3), np.float32)}).run(g)


def test_fold_does_not_grow_the_graph():
    g = Graph("grow")
    x = g.input("x", (512, 512))
    big = g.expand(g.constant(np.float32(1.0)), (512, 512))
    g.set_outputs([g.add(x, big)])
    p = ConstantFolding()
    out = p.run(g)
    assert ops_of(out, Expand)
    assert "would grow the graph" in p.notes[-1]


@given(random_graphs())
def test_fold_random(g):
    ins, ps = random_graph_values(g)
    same_numbers(g, ConstantFolding().run(g), ins, ps)
    frozen = ConstantFolding(ps).run(g)
    assert not ops_of(frozen, Param)
    same_numbers(g, frozen, ins, ps)


# ---- algebraic simplification --------------------------------------------------------


def test_simplify_identities():
    g = Graph("ids")
    x = g.input("x", (2, 3))
    y = g.mul(x, 1.0)
    y = g.add(y, 0.0)
    y = g.sub(y, 0.0)
    y = g.div(y, 1.0)
    y = g.neg(g.neg(y))
    y = g.cast(y, "f32")
    y = g.transpose(g.transpose(y, (1, 0)), (1, 0))
    y = g.reshape(y, (2, 3))  # to its own dims
    y = g.reshape(g.reshape(y, (6,)), (3, 2))
    g.set_outputs([y])
    p = AlgebraicSimplification()
    out = DeadCodeElimination().run(p.run(g))
    assert [type(n.op) for n in out.nodes] == [Input, Reshape]
    assert out.nodes[1].inputs == (0,) and out.nodes[1].shape.dims == (3, 2)
    notes = " ".join(p.notes)
    for what in (
        "x mul 1",
        "x add 0",
        "x sub 0",
        "x div 1",
        "double negation",
        "cast to same dtype",
        "transpose of transpose",
        "reshape of reshape",
        "identity reshape",
    ):
        assert what in notes, what
    x_val = np.arange(6, dtype=np.float32).reshape(2, 3)
    same_numbers(g, out, {"x": x_val}, {})


def test_simplify_keeps_broadcasting_identity_and_non_identities():
    g = Graph("keep")
    x = g.input("x", (3,))
    ones = g.constant(np.ones((2, 3), np.float32))
    a = g.mul(x, ones)  # broadcasts x to [2,3]: not an identity
    b = g.mul(x, 2.0)
    c = g.sub(g.constant(np.float32(0.0)), x)  # 0 - x is not x
    t = g.transpose(
        g.transpose(g.reshape(a, (2, 3, 1)), (2, 0, 1)), (0, 2, 1)
    )  # composes to a transpose
    g.set_outputs([a, b, c, t])
    out = AlgebraicSimplification().run(g)
    muls = [n for n in out.nodes if isinstance(n.op, Binary)]
    assert len(muls) == 3
    (tr,) = [n for n in DeadCodeElimination().run(out).nodes if isinstance(n.op, Transpose)]
    assert tr.op.perm == (2, 1, 0)
    same_numbers(g, out, {"x": np.array([1, 2, 3], np.float32)}, {})


@given(random_graphs())
def test_simplify_random(g):
    ins, ps = random_graph_values(g)
    out = DeadCodeElimination().run(AlgebraicSimplification().run(g))
    same_numbers(g, out, ins, ps)
    for n in out.nodes:
        if isinstance(n.op, Cast):
            assert out.nodes[n.inputs[0]].dtype is not n.dtype
        if isinstance(n.op, Transpose):
            assert not isinstance(out.nodes[n.inputs[0]].op, Transpose)
        if isinstance(n.op, Reshape):
            assert not isinstance(out.nodes[n.inputs[0]].op, Reshape)
        if isinstance(n.op, Unary) and n.op.fn is UnaryKind.NEG:
            src = out.nodes[n.inputs[0]].op
            assert not (isinstance(src, Unary) and src.fn is UnaryKind.NEG)


# ---- broadcast legalisation ----------------------------------------------------------


@pytest.mark.parametrize(
    ("in_dims", "out_dims", "ok"),
    [
        ((3, 4), (3, 4), True),
        ((), (3, 4), True),
        ((4,), (3, 4), True),
        ((1, 4), (3, 4), True),
        ((3, 1), (3, 4), True),  # a row statistic
        ((2, 5, 1), (2, 5, 8), True),
        ((1, 1, 5, 5), (2, 3, 5, 5), True),
        ((2, 1, 8), (2, 5, 8), False),  # non-contiguous
        ((2, 1, 1, 5), (2, 3, 5, 5), False),
        ((1, 3, 1), (1, 3, 1), True),
    ],
)
def test_kernel_indexable(in_dims, out_dims, ok):
    assert kernel_indexable(in_dims, out_dims) is ok


def test_broadcast_legalization_inserts_expand_once():
    g = Graph("bc")
    x = g.input("x", (2, 5, 8))
    m = g.input("m", (2, 1, 8))
    b = g.input("b", (8,))
    y = g.add(g.mul(x, m), g.sub(x, m))  # m needs an expand, shared by both
    y = g.add(y, b)  # legal
    g.set_outputs([y])
    p = BroadcastLegalization()
    out = p.run(g)
    (e,) = ops_of(out, Expand)
    assert e.inputs == (1,) and e.shape.dims == (2, 5, 8)
    assert p.notes[0] == "inserted 1 expands"
    for n in out.nodes:
        if n.op.elementwise and len(n.inputs) > 1:
            assert all(kernel_indexable(out.nodes[i].shape.dims, n.shape.dims) for i in n.inputs)
    rng = np.random.default_rng(0)
    ins = {
        "x": rng.standard_normal((2, 5, 8)),
        "m": rng.standard_normal((2, 1, 8)),
        "b": rng.standard_normal(8),
    }
    same_numbers(g, out, ins, {})


def test_cleanup_on_mlp_and_block():
    for g in (mlp(), transformer_block()):
        ins, ps = random_inputs(g), random_params(g)
        out = g
        for p in (
            DeadCodeElimination(),
            CommonSubexpressionElimination(),
            ConstantFolding(),
            AlgebraicSimplification(),
            BroadcastLegalization(),
        ):
            out = p.run(out)
            same_numbers(g, out, ins, ps)


@st.composite
def broadcast_pairs(draw):
    """Two broadcast-compatible dim tuples (ranks 0..4, dims 1..3)."""
    rank = draw(st.integers(0, 4))
    out = [draw(st.integers(1, 3)) for _ in range(rank)]
    a = [d if draw(st.booleans()) else 1 for d in out]
    b = [d if draw(st.booleans()) else 1 for d in out]
    a = a[draw(st.integers(0, rank)) :]  # drop some leading dims
    return tuple(a), tuple(b)


@given(broadcast_pairs())
def test_broadcast_legalization_random_shapes(pair):
    a_dims, b_dims = pair
    g = Graph("bc")
    a = g.input("a", a_dims)
    b = g.input("b", b_dims)
    g.set_outputs([g.where(g.gt(a, b), g.mul(a, b), g.sub(a, b))])
    out = BroadcastLegalization().run(g)
    for n in out.nodes:
        if n.op.elementwise and len(n.inputs) > 1:
            assert all(kernel_indexable(out.nodes[i].shape.dims, n.shape.dims) for i in n.inputs)
    expands = ops_of(out, Expand)
    assert len({e.inputs for e in expands}) == len(expands)  # one expand per value and shape
    rng = np.random.default_rng(0)
    ins = {"a": rng.standard_normal(a_dims), "b": rng.standard_normal(b_dims)}
    same_numbers(g, out, ins, {})
