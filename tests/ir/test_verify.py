"""The MIR verifier: one test per kind of malformed graph. Each checks that the error is a
VerifyError carrying the node id, and that its message names the node (``%k`` and op) and
says what is wrong."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rlx
from rlx.dtype import DType
from rlx.errors import ShapeError, VerifyError
from rlx.ir.mir import Node
from rlx.ir.verify import topo_sort
from rlx.ops.control import If
from rlx.ops.core import Input, Param
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind
from rlx.ops.movement import Concat
from rlx.shape import Shape

EXP = Unary(UnaryKind.EXP)
ADD = Binary(BinaryKind.ADD)
F23 = Shape((2, 3))


def _two_inputs() -> tuple[rlx.Graph, int, int]:
    g = rlx.Graph("g")
    return g, g.input("x", (2, 3)), g.input("y", (2, 3))


def test_a_sound_graph_verifies_and_returns_itself():
    g, x, y = _two_inputs()
    g.set_outputs(g.add(g.exp(x), y))
    assert g.verify() is g
    assert topo_sort(g) == list(range(len(g)))


def test_cycle_names_a_node_on_it():
    g, x, _ = _two_inputs()
    g.add_node(ADD, [x, 3], F23)  # %2 reads %3 ...
    g.add_node(EXP, [2], F23)  # ... and %3 reads %2
    g.set_outputs([3])
    with pytest.raises(VerifyError) as ei:
        g.verify()
    assert ei.value.node == 2
    assert "%2 add: the graph has a cycle through this node" in str(ei.value)
    with pytest.raises(VerifyError, match="cycle"):
        g.topo_order()


def test_self_loop_is_a_cycle():
    g, x, _ = _two_inputs()
    g.add_node(ADD, [x, 2], F23)
    g.set_outputs([2])
    with pytest.raises(VerifyError, match=r"%2 add: the graph has a cycle") as ei:
        g.verify()
    assert ei.value.node == 2


@pytest.mark.parametrize("bad", [7, -1])
def test_dangling_edge_names_node_and_missing_input(bad: int):
    g, x, _ = _two_inputs()
    g.add_node(ADD, [x, bad], F23)
    g.set_outputs([2])
    with pytest.raises(VerifyError) as ei:
        g.verify()
    assert ei.value.node == 2
    assert f"%2 add: input %{bad} does not exist (3 nodes)" in str(ei.value)


def test_builder_rejects_out_of_range_edges_and_outputs():
    g, x, _ = _two_inputs()
    with pytest.raises(
        VerifyError, match=r"exp: input id 5 does not exist in graph 'g' \(2 nodes\)"
    ):
        g.apply(EXP, [5])
    with pytest.raises(VerifyError, match="output id 9 does not exist in graph 'g'"):
        g.set_outputs([9])
    assert len(g) == 2


def test_out_of_range_output_and_missing_outputs():
    g, x, _ = _two_inputs()
    with pytest.raises(VerifyError, match="graph 'g' has no outputs"):
        g.verify()
    g.outputs = [x, 12]
    with pytest.raises(VerifyError, match="output %12 does not exist in graph 'g'"):
        g.verify()


def test_wrong_arity_names_node_expected_and_given():
    g, x, y = _two_inputs()
    g.add_node(EXP, [x, y], F23)
    g.set_outputs([2])
    with pytest.raises(VerifyError) as ei:
        g.verify()
    assert ei.value.node == 2
    assert "%2 exp: expected 1 inputs, has 2" in str(ei.value)
    with pytest.raises(ShapeError, match="add: expected 2 inputs, got 1"):
        g.apply(ADD, [x])


def test_variadic_op_with_no_inputs_is_a_shape_rule_violation():
    g, x, _ = _two_inputs()
    g.add_node(Concat(0), [], F23)
    g.set_outputs([2])
    with pytest.raises(VerifyError) as ei:
        g.verify()
    assert ei.value.node == 2
    assert "%2 concat[axis=0]: shape rule rejects its inputs" in str(ei.value)
    assert "needs at least one input" in str(ei.value)


def test_dtype_rule_violation_names_node_and_dtypes():
    g = rlx.Graph("g")
    x = g.input("x", (2, 3))
    i = g.input("i", (2, 3), DType.I32)
    g.add_node(ADD, [x, i], F23)
    g.set_outputs([2])
    with pytest.raises(VerifyError) as ei:
        g.verify()
    msg = str(ei.value)
    assert ei.value.node == 2
    assert "%2 add: shape rule rejects its inputs" in msg
    assert "f32" in msg and "i32" in msg


def test_shape_rule_violation_names_node_and_shapes():
    g = rlx.Graph("g")
    x = g.input("x", (2, 3))
    z = g.input("z", (4, 3))
    g.add_node(ADD, [x, z], F23)
    g.set_outputs([2])
    with pytest.raises(VerifyError) as ei:
        g.verify()
    msg = str(ei.value)
    assert ei.value.node == 2 and "%2 add: shape rule rejects its inputs" in msg
    assert "do not broadcast" in msg and "[2,3]" in msg and "[4,3]" in msg


@pytest.mark.parametrize(
    "recorded, want",
    [
        (Shape((2, 4)), "recorded shape f32[2,4] but the shape rule gives f32[2,3]"),
        (Shape((2, 3), DType.F16), "recorded shape f16[2,3] but the shape rule gives f32[2,3]"),
    ],
)
def test_recorded_shape_or_dtype_disagreeing_with_the_rule(recorded: Shape, want: str):
    g, x, _ = _two_inputs()
    g.add_node(EXP, [x], recorded)
    g.set_outputs([2])
    with pytest.raises(VerifyError) as ei:
        g.verify()
    assert ei.value.node == 2 and f"%2 exp: {want}" in str(ei.value)


def test_builder_checks_a_given_shape_against_the_rule():
    g, x, _ = _two_inputs()
    assert g.nodes[g.apply(EXP, [x], shape=F23)].shape == F23
    with pytest.raises(
        ShapeError, match=r"exp: given shape f32\[3,2\] but the shape rule gives f32\[2,3\]"
    ):
        g.apply(EXP, [x], shape=Shape((3, 2)))


@pytest.mark.parametrize("boundary", [Input, Param])
def test_duplicate_input_or_param_names(boundary: type):
    g = rlx.Graph("g")
    g.add_node(boundary("x", F23), [], F23)
    g.add_node(boundary("x", F23), [], F23)
    g.set_outputs([1])
    with pytest.raises(VerifyError) as ei:
        g.verify()
    what = boundary.mnemonic
    assert ei.value.node == 1
    assert f"%1: duplicate {what} name 'x' (also %0)" in str(ei.value)


def test_builder_rejects_duplicate_names_at_once():
    g = rlx.Graph("g")
    g.input("x", (2,))
    with pytest.raises(ShapeError, match=r"input name 'x' is already used by node %0"):
        g.input("x", (3,))
    g.param("w", (2,))
    with pytest.raises(ShapeError, match=r"param name 'w' is already used by node %1"):
        g.param("w", (2,))


def test_node_id_must_match_its_index():
    g, x, y = _two_inputs()
    g.set_outputs(g.add(x, y))
    g.nodes[1] = dataclasses.replace(g.nodes[1], id=5)
    with pytest.raises(VerifyError, match="node at index 1 has id %5") as ei:
        g.verify()
    assert ei.value.node == 1


def test_bad_sub_graph_names_the_outer_node_and_the_sub_graph():
    g = rlx.Graph("g")
    p = g.input("p", (), DType.BOOL)
    x = g.input("x", (2,))
    n = g.cond(p, lambda s, a: s.exp(a), lambda s, a: s.neg(a), [x])
    g.set_outputs(n)
    op = g.nodes[n].op
    assert isinstance(op, If)
    broken = op.else_branch.copy()
    body = broken.nodes[1]  # neg of in0: give it a second input, keep its shape
    broken.nodes[1] = Node(body.id, body.op, (0, 0), body.shape, body.loc)
    g.nodes[n] = dataclasses.replace(g.nodes[n], op=dataclasses.replace(op, else_branch=broken))
    with pytest.raises(VerifyError) as ei:
        g.verify()
    msg = str(ei.value)
    assert ei.value.node == n
    assert f"%{n} if: sub-graph {broken.name!r}: %1 neg: expected 1 inputs, has 2" in msg


def test_verify_error_points_at_the_user_line_that_built_the_node():
    g, x, _ = _two_inputs()
    e = g.exp(x)
    g.nodes[e] = dataclasses.replace(g.nodes[e], shape=Shape((9,)))
    g.set_outputs(e)
    with pytest.raises(VerifyError) as ei:
        g.verify()
    assert "test_verify.py" in str(ei.value) and ei.value.loc is not None


def test_topo_order_of_a_graph_built_out_of_order():
    g = rlx.Graph("g")
    g.add_node(EXP, [1], F23)  # %0 reads %1, added later
    g.add_node(Input("x", F23), [], F23)
    g.set_outputs([0])
    g.verify()
    assert g.topo_order() == [1, 0]
    (out,) = g.evaluate({"x": np.zeros((2, 3), np.float32)})
    assert np.allclose(out, 1.0)
