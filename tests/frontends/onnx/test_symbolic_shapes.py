"""Shape arithmetic over symbolic dims at import (rlx/frontends/onnx/symbolic.py) and the
``shape_of`` op it materializes with: the exporters' ``Shape -> Gather -> Concat ->
Reshape`` chains, ``Range`` / ``ConstantOfShape`` / ``Slice`` bounded by a dynamic axis,
and values that leave the symbolic world (``seq + 1``), each compiled once and run at two
bindings against a NumPy twin (and ONNX Runtime on the same model when installed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import rlx  # noqa: E402
from rlx import DType, Shape  # noqa: E402
from rlx.frontends.onnx import OnnxUnsupportedError  # noqa: E402
from rlx.frontends.onnx.symbolic import SymValue  # noqa: E402
from rlx.ops.movement import ShapeOf  # noqa: E402

RNG = np.random.default_rng(0)
POS = np.arange(16, dtype=np.int64).reshape(1, 16)  # a position-id buffer, sliced to seq


def _c(name: str, v) -> onnx.NodeProto:  # noqa: ANN001
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(v)))


def _model(nodes, outputs, inits=()) -> onnx.ModelProto:  # noqa: ANN001
    g = helper.make_graph(
        nodes,
        "sym",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info(n, t, dims) for n, t, dims in outputs],
        list(inits),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def exporter_like() -> onnx.ModelProto:
    """What torch's exporters write for ``x.view(b, s, 2, 4)``, position ids, a ones mask
    and ``x * seq``; a ``Where(shape == -1, 1, shape)`` fix-up included."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        _c("i0", np.int64(0)),
        _c("i1", np.int64(1)),
        _c("ax0", np.array([0], np.int64)),
        helper.make_node("Gather", ["shp", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["shp", "i1"], ["s"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"]),
        _c("tail", np.array([2, 4], np.int64)),
        helper.make_node("Concat", ["b1", "s1", "tail"], ["vshape"], axis=0),
        helper.make_node("Reshape", ["x", "vshape"], ["view"]),
        # position ids: POS[:, :seq] (a slice to a symbolic end of a static axis)
        _c("one1", np.array([1], np.int64)),
        helper.make_node("Slice", ["pos", "ax0", "s1", "one1", "one1"], ["pos_s"]),
        # a ones mask [batch, seq] via ConstantOfShape of the fixed-up shape
        helper.make_node("Concat", ["b1", "s1"], ["bs"], axis=0),
        _c("neg", np.array([-1, -1], np.int64)),
        helper.make_node("Equal", ["bs", "neg"], ["is_neg"]),
        _c("ones2", np.array([1, 1], np.int64)),
        helper.make_node("Where", ["is_neg", "ones2", "bs"], ["bs_fixed"]),
        helper.make_node(
            "ConstantOfShape",
            ["bs_fixed"],
            ["mask"],
            value=numpy_helper.from_array(np.array([1.0], np.float32)),
        ),
        # Range(0, seq) as float, and x * seq (a symbolic value used as a tensor)
        helper.make_node("Range", ["i0", "s", "i1"], ["ar"]),
        helper.make_node("Cast", ["s"], ["s_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "s_f"], ["xs"]),
        # seq + 1 is no monomial: it is computed when the graph runs
        helper.make_node("Add", ["s", "i1"], ["s_plus"]),
    ]
    f, i = TensorProto.FLOAT, TensorProto.INT64
    outs = [
        ("view", f, ["batch", "seq", 2, 4]),
        ("pos_s", i, [1, "seq"]),
        ("mask", f, ["batch", "seq"]),
        ("ar", i, ["seq"]),
        ("xs", f, ["batch", "seq", 8]),
        ("s_plus", i, []),
    ]
    return _model(nodes, outs, [numpy_helper.from_array(POS, "pos")])


def twin(x: np.ndarray) -> list[np.ndarray]:
    b, s, _ = x.shape
    return [
        x.reshape(b, s, 2, 4),
        POS[:, :s],
        np.ones((b, s), np.float32),
        np.arange(s, dtype=np.int64),
        x * np.float32(s),
        np.asarray(s + 1, np.int64),
    ]


def test_exporter_shape_chains_compile_once_and_run_at_two_bindings() -> None:
    m = rlx.onnx.load(exporter_like())
    c = m.compile()
    for b, s in ((1, 3), (4, 11)):
        x = RNG.standard_normal((b, s, 8)).astype(np.float32)
        got = c.run({"x": x})
        for name, g, w in zip(m.outputs, got, twin(x), strict=True):
            assert g.shape == w.shape, name
            np.testing.assert_array_equal(g, w, err_msg=name)


def test_onnx_runtime_agrees_on_the_same_model() -> None:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(exporter_like().SerializeToString())
    x = RNG.standard_normal((2, 5, 8)).astype(np.float32)
    for g, w in zip(sess.run(None, {"x": x}), twin(x), strict=True):
        np.testing.assert_array_equal(g, w)


def test_symbolic_dims_stay_symbolic_in_the_graph() -> None:
    m = rlx.onnx.load(exporter_like())
    want = Shape((rlx.shape.sym("batch"), rlx.shape.sym("seq"), 2, 4), DType.F32)
    assert any(n.shape == want for n in m.graph.nodes if n.op.mnemonic == "reshape")
    assert sum(1 for n in m.graph.nodes if isinstance(n.op, ShapeOf)) == 1  # x carries both


def test_shape_of_op_matches_numpy_on_symbolic_and_static_dims() -> None:
    g = rlx.Graph("s")
    x = g.input("x", Shape((g.sym("n"), 3, g.sym("m")), DType.BF16))
    g.set_outputs([g.shape_of(x), g.apply(ShapeOf(), [g.reshape(x, [-1])])])
    c = rlx.Session("cpu").compile(g)
    for dims in ((2, 3, 5), (7, 3, 1)):
        a = np.zeros(dims, dtype=DType.BF16.np)
        s, flat = c.run({"x": a})
        np.testing.assert_array_equal(s, np.asarray(a.shape, np.int64))
        np.testing.assert_array_equal(flat, [a.size])
        assert s.dtype == np.int64
    ref = g.evaluate({"x": np.zeros((2, 3, 4), DType.BF16.np)})
    np.testing.assert_array_equal(ref[0], [2, 3, 4])


def test_shape_arithmetic_keeps_monomials_and_folds_ints() -> None:
    """batch*seq (a Flatten's shape) and seq/1 stay symbolic; Shape of a static tensor folds."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        _c("ax", np.array([0, 1], np.int64)),
        helper.make_node("Gather", ["shp", "ax"], ["bs"], axis=0),
        _c("axes0", np.array([0], np.int64)),
        helper.make_node("ReduceProd", ["bs"], ["n"], keepdims=1),
        _c("c8", np.array([8], np.int64)),
        helper.make_node("Concat", ["n", "c8"], ["flat"], axis=0),
        helper.make_node("Reshape", ["x", "flat"], ["y"]),
    ]
    m = rlx.onnx.load(_model(nodes, [("y", TensorProto.FLOAT, ["n", 8])]))
    x = RNG.standard_normal((3, 5, 8)).astype(np.float32)
    np.testing.assert_array_equal(m.compile().run({"x": x})[0], x.reshape(15, 8))


def test_range_with_a_symbolic_limit_and_a_nonzero_start_is_unsupported() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], start=1, end=2),
        helper.make_node("Squeeze", ["shp"], ["s"]),
        _c("st", np.int64(2)),
        _c("d", np.int64(1)),
        helper.make_node("Range", ["st", "s", "d"], ["ar"], name="rng"),
    ]
    with pytest.raises(OnnxUnsupportedError, match=r"'rng' \(Range\).*symbolic limit"):
        rlx.onnx.load(_model(nodes, [("ar", TensorProto.INT64, ["k"])]))


def test_sym_value_repr_names_its_dims() -> None:
    from rlx.frontends.onnx.symbolic import shape_value
    from rlx.shape import Sym

    v = shape_value((Sym.named("b"), 4), 0, 2)
    assert isinstance(v, SymValue) and "b" in repr(v) and v.shape.dims == (2,)
    assert not isinstance(shape_value((3, 4), 0, 2), SymValue)  # static: a plain constant


def test_a_converter_that_fails_unexpectedly_is_an_import_error_naming_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlx.frontends.onnx import OnnxImportError
    from rlx.frontends.onnx.ops import TABLE, Entry

    def broken(ctx):  # noqa: ANN001, ANN202
        raise TypeError("boom")

    (old,) = TABLE[("", "Reshape")][-1:]
    monkeypatch.setitem(
        TABLE, ("", "Reshape"), [Entry(old.domain, old.op_type, old.since, old.until, broken)]
    )
    with pytest.raises(OnnxImportError, match=r"\(Reshape\).*could not be converted: TypeError"):
        rlx.onnx.load(exporter_like())


def test_slicing_a_static_axis_to_a_symbol_bounds_the_symbol() -> None:
    """POS[:, :seq] on a 16-long table: seq <= 16, and seq = 17 is an InputError naming the
    bound (ONNX Slice would clamp, giving 16 rows where the graph expects 17)."""
    from rlx.errors import InputError

    m = rlx.onnx.load(exporter_like())
    assert m.graph.sym_bounds["seq"] == (1, 16)
    c = m.compile()
    (pos,) = [i for i, n in enumerate(m.outputs) if n == "pos_s"]
    np.testing.assert_array_equal(c.run({"x": np.zeros((1, 16, 8), np.float32)})[pos], POS)
    with pytest.raises(InputError, match=r"seq"):
        c.run({"x": np.zeros((1, 17, 8), np.float32)})


def _ev(d, env: dict[str, int]) -> int:  # noqa: ANN001
    return d.evaluate(env) if isinstance(d, rlx.shape.Sym) else int(d)


@settings(max_examples=200, deadline=None)
@given(
    op=st.sampled_from(["Mul", "Add", "Sub", "Div", "Equal", "Max", "Min"]),
    a=st.one_of(st.integers(-3, 6), st.sampled_from(["b", "s", "b*s", "2*s"])),
    c=st.one_of(st.integers(-3, 6), st.sampled_from(["b", "s", "b*s", "2*s"])),
    b=st.integers(1, 9),
    s=st.integers(1, 9),
)
def test_symbolic_rules_agree_with_integer_arithmetic_at_every_binding(op, a, c, b, s) -> None:  # noqa: ANN001
    """Whenever a rule gives a symbolic answer, evaluating it at a binding equals the ONNX op
    on the bound integers (the rules may decline: the value is then computed at run time)."""
    from rlx.frontends.onnx.symbolic import _BINARY, _VARIADIC, _NotSymbolic
    from rlx.shape import Sym

    syms = {"b": Sym.named("b"), "s": Sym.named("s"), "b*s": Sym((("b", 1), ("s", 1))),
            "2*s": Sym("s", 2)}  # fmt: skip
    x, y = (syms[v] if isinstance(v, str) else v for v in (a, c))
    if isinstance(x, int) and isinstance(y, int):
        return
    if op == "Div" and _ev(y, {"b": b, "s": s}) == 0:
        return
    env = {"b": b, "s": s}
    try:
        got = {**_BINARY, **_VARIADIC}[op](x, y)
    except _NotSymbolic:
        return
    xi, yi = _ev(x, env), _ev(y, env)
    want = {
        "Mul": lambda: xi * yi,
        "Add": lambda: xi + yi,
        "Sub": lambda: xi - yi,
        "Div": lambda: int(xi / yi),  # truncation toward zero
        "Equal": lambda: xi == yi,
        "Max": lambda: max(xi, yi),
        "Min": lambda: min(xi, yi),
    }[op]()
    assert (got if isinstance(got, bool) else _ev(got, env)) == want


def test_a_symbolic_value_where_numbers_are_needed_names_the_node_and_the_fix() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Tile", ["x", "shp"], ["y"], name="tile"),
    ]
    with pytest.raises(OnnxUnsupportedError, match=r"'tile' \(Tile\).*symbolic dims.*input_dims"):
        rlx.onnx.load(_model(nodes, [("y", TensorProto.FLOAT, ["a", "b", "c"])]))
