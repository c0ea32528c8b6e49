"""Custom ops: the name registry, delegation of infer / reference / arity / kind, and the
errors for unregistered names at build and load time."""

import numpy as np
import pytest

import rlx
from rlx import DType, Shape
from rlx.errors import RlxError, SerializationError, ShapeError
from rlx.ir.serialize import dumps, loads
from rlx.ops.base import OpKind
from rlx.ops.custom import (
    Custom,
    custom_op,
    custom_op_names,
    register_custom_op,
    unregister_custom_op,
)


def _scale_infer(ins, attrs):
    (x,) = ins
    if not x.dtype.is_float:
        raise ShapeError(f"scale_shift needs a float input, got {x}")
    return x


def _scale_ref(xs, attrs, ctx):
    return xs[0] * attrs["scale"] + attrs.get("shift", 0.0)


@pytest.fixture
def scale_shift():
    register_custom_op("t_scale_shift", _scale_infer, _scale_ref, arity=1, kind=OpKind.ELEMENTWISE)
    yield "t_scale_shift"
    unregister_custom_op("t_scale_shift")


@pytest.fixture
def concat_rows():
    def infer(ins, attrs):
        rows = sum(s.dims[0] for s in ins)
        return Shape((rows, *ins[0].dims[1:]), ins[0].dtype)

    def ref(xs, attrs, ctx):
        return np.concatenate(xs, axis=0)

    register_custom_op("t_concat_rows", infer, ref)
    yield "t_concat_rows"
    unregister_custom_op("t_concat_rows")


def test_custom_op_builds_and_evaluates_with_attributes(scale_shift):
    g = rlx.Graph("g")
    x = g.input("x", (2, 3))
    y = g.custom(scale_shift, [x], scale=2.5, shift=-1.0)
    g.set_outputs(y)
    g.verify()
    op = g.nodes[y].op
    assert op == Custom("t_scale_shift", (("scale", 2.5), ("shift", -1.0)))
    assert op.kind is OpKind.ELEMENTWISE and Custom.kind is OpKind.COMPUTE
    assert op.num_inputs() == 1 and dict(op.attr_map) == {"scale": 2.5, "shift": -1.0}
    assert "custom[name=t_scale_shift, scale=2.5, shift=-1.0]" in g.inspect()
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    (out,) = g.evaluate({"x": xv})
    np.testing.assert_allclose(out, xv * 2.5 - 1.0)


def test_variadic_custom_op(concat_rows):
    g = rlx.Graph("g")
    a, b, c = g.input("a", (1, 2)), g.input("b", (2, 2)), g.input("c", (3, 2))
    y = g.custom(concat_rows, [a, b, c])
    g.set_outputs(y)
    assert g.shape(y) == Shape((6, 2))
    vals = {k: np.full((n, 2), n, np.float32) for k, n in (("a", 1), ("b", 2), ("c", 3))}
    (out,) = g.evaluate(vals)
    np.testing.assert_array_equal(out[:, 0], [1, 2, 2, 3, 3, 3])


def test_arity_and_shape_rule_are_enforced(scale_shift):
    g = rlx.Graph("g")
    x = g.input("x", (2,))
    with pytest.raises(ShapeError, match="expected 1 inputs, got 2"):
        g.custom(scale_shift, [x, x], scale=1.0)
    with pytest.raises(ShapeError, match=r"scale_shift needs a float input, got i32\[2\]"):
        g.custom(scale_shift, [g.input("i", (2,), DType.I32)], scale=1.0)


def test_registry_rejects_duplicates_unless_replaced(scale_shift):
    with pytest.raises(ShapeError, match="already registered"):
        register_custom_op(scale_shift, _scale_infer, _scale_ref)
    entry = register_custom_op(scale_shift, _scale_infer, _scale_ref, arity=1, replace=True)
    assert custom_op(scale_shift) is entry and entry.kind is OpKind.COMPUTE
    assert scale_shift in custom_op_names()
    with pytest.raises(ShapeError, match="must be an identifier"):
        register_custom_op("not a name", _scale_infer, _scale_ref)
    with pytest.raises(ShapeError, match="arity must be None or an int >= 0"):
        register_custom_op("t_bad_arity", _scale_infer, _scale_ref, arity=-1)
    with pytest.raises(ShapeError, match="must be callables"):
        register_custom_op("t_not_callable", _scale_infer, 3)
    assert "t_bad_arity" not in custom_op_names()


def test_unregistered_name_fails_at_build():
    g = rlx.Graph("g")
    x = g.input("x", (2,))
    with pytest.raises(ShapeError, match="custom op 'nope' is not registered"):
        g.custom("nope", [x])
    with pytest.raises(ShapeError, match="'nope' is not registered"):
        unregister_custom_op("nope")
    assert len(g) == 1


def test_bad_attributes_are_rejected(scale_shift):
    with pytest.raises(ShapeError, match="must be hashable"):
        Custom(scale_shift, (("scale", [1.0]),))
    with pytest.raises(ShapeError, match="duplicate attribute names"):
        Custom(scale_shift, (("scale", 1.0), ("scale", 2.0)))
    with pytest.raises(ShapeError, match="must be identifiers"):
        Custom(scale_shift, (("not valid", 1.0),))
    g = rlx.Graph("g")
    y = g.custom(scale_shift, [g.input("x", (2,))], scale=2.0, shape=[1, 2])
    assert g.nodes[y].op.attr_map["shape"] == (1, 2)  # lists become tuples


def test_misbehaving_user_functions_give_rlx_errors():
    register_custom_op("t_raises", lambda ins, attrs: ins[0].dims[5], lambda xs, a, c: xs[0])
    register_custom_op("t_not_shape", lambda ins, attrs: (1, 2), lambda xs, a, c: xs[0])
    register_custom_op(
        "t_wrong_ref", lambda ins, attrs: ins[0], lambda xs, a, c: np.zeros(7, np.float32)
    )
    register_custom_op("t_ref_raises", lambda ins, attrs: ins[0], lambda xs, a, c: 1 / 0)
    try:
        g = rlx.Graph("g")
        x = g.input("x", (2,))
        with pytest.raises(ShapeError, match="its infer raised IndexError"):
            g.custom("t_raises", [x])
        with pytest.raises(ShapeError, match=r"infer must return a Shape, returned \(1, 2\)"):
            g.custom("t_not_shape", [x])
        g.set_outputs(g.custom("t_wrong_ref", [x]))
        with pytest.raises(ShapeError, match=r"returned shape \(7,\) but its infer gives \(2,\)"):
            g.evaluate({"x": np.zeros(2, np.float32)})
        g2 = rlx.Graph("g2")
        g2.set_outputs(g2.custom("t_ref_raises", [g2.input("x", (2,))]))
        with pytest.raises(RlxError, match="its reference raised ZeroDivisionError") as ei:
            g2.evaluate({"x": np.zeros(2, np.float32)})
        assert ei.value.node == 1 and "test_custom.py" in str(ei.value)
    finally:
        for name in ("t_raises", "t_not_shape", "t_wrong_ref", "t_ref_raises"):
            unregister_custom_op(name)


def test_custom_ops_round_trip_and_need_registration_at_load(scale_shift):
    g = rlx.Graph("g")
    y = g.custom(scale_shift, [g.input("x", (3,))], scale=0.5, tag="t", dt=DType.BF16)
    g.set_outputs(y)
    data = dumps(g)
    g2, _ = loads(data)
    assert g2 == g and g2.fingerprint() == g.fingerprint()
    unregister_custom_op(scale_shift)
    try:
        with pytest.raises(SerializationError, match="custom op 't_scale_shift' is not registered"):
            loads(data)
    finally:
        register_custom_op(scale_shift, _scale_infer, _scale_ref, arity=1)
