"""The errors a new user hits first: each is an rlx.errors exception whose message names
the tensor or node, what was expected and what was given, and (for node errors) the
user's line that built the node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.errors import (
    CompileError,
    InputError,
    QuantizationError,
    SerializationError,
    ShapeError,
    VerifyError,
)
from rlx.ops.elementwise import Unary, UnaryKind
from rlx.quant.calibrate import calibrate

HERE = Path(__file__).name


def _mlp() -> rlx.Graph:
    g = rlx.Graph("mlp")
    x = g.input("x", rlx.Shape((4, 8), rlx.DType.F32))
    w = g.param("w", rlx.Shape((8, 3), rlx.DType.F32))
    g.set_outputs(g.relu(g.matmul(x, w)))
    return g


PARAMS = {"w": np.ones((8, 3), np.float32)}


@pytest.fixture
def compiled() -> rlx.CompiledGraph:
    return rlx.Session("cpu").compile(_mlp(), params=PARAMS)


def _points_here(err: rlx.RlxError) -> None:
    assert err.loc is not None and Path(err.loc.file).name == HERE
    assert f"{HERE}:{err.loc.line}" in str(err)


# ---- run() inputs ---------------------------------------------------------------------


def test_unknown_input_name_lists_the_graph_inputs(compiled: rlx.CompiledGraph) -> None:
    with pytest.raises(InputError, match=r"unknown input\(s\) \['y'\].*'mlp': \['x'\]"):
        compiled.run({"y": np.ones((4, 8), np.float32)})


def test_missing_input_is_named(compiled: rlx.CompiledGraph) -> None:
    with pytest.raises(InputError, match=r"missing input\(s\) \['x'\]"):
        compiled.run({})


def test_wrong_shape_names_input_expected_given_and_line(compiled: rlx.CompiledGraph) -> None:
    with pytest.raises(InputError) as ei:
        compiled.run({"x": np.ones((4, 7), np.float32)})
    msg = str(ei.value)
    assert "input 'x'" in msg and "f32[4,8]" in msg and "(4, 7)" in msg
    _points_here(ei.value)


def test_wrong_dtype_names_input_expected_and_given(compiled: rlx.CompiledGraph) -> None:
    with pytest.raises(InputError) as ei:
        compiled.run({"x": np.ones((4, 8), np.complex64)})
    msg = str(ei.value)
    assert "input 'x'" in msg and "f32" in msg and "complex64" in msg


def test_run_takes_a_dict(compiled: rlx.CompiledGraph) -> None:
    with pytest.raises(InputError, match=r"dict of input name -> array, given ndarray"):
        compiled.run(np.ones((4, 8), np.float32))  # type: ignore[arg-type]


# ---- params ---------------------------------------------------------------------------


def test_missing_param_is_named_at_run() -> None:
    c = rlx.Session("cpu").compile(_mlp())
    with pytest.raises(InputError, match=r"param\(s\) \['w'\] never set"):
        c.run({"x": np.ones((4, 8), np.float32)})


def test_param_of_the_wrong_shape_names_param_expected_and_given() -> None:
    with pytest.raises(InputError) as ei:
        rlx.Session("cpu").compile(_mlp(), params={"w": np.ones((8, 4), np.float32)})
    msg = str(ei.value)
    assert "param 'w'" in msg and "f32[8,3]" in msg and "(8, 4)" in msg


def test_unknown_param_lists_the_graph_params(compiled: rlx.CompiledGraph) -> None:
    with pytest.raises(InputError, match=r"unknown param 'nope'; params of graph 'mlp': \['w'\]"):
        compiled.set_param("nope", np.ones(3, np.float32))


# ---- building graphs ------------------------------------------------------------------


def test_shape_mismatch_at_build_names_op_both_shapes_and_line() -> None:
    g = rlx.Graph("b")
    a = g.input("a", rlx.Shape((4, 8)))
    b = g.input("b", rlx.Shape((7, 3)))
    with pytest.raises(ShapeError) as ei:
        g.matmul(a, b)
    msg = str(ei.value)
    assert msg.startswith("matmul") and "f32[4,8]" in msg and "f32[7,3]" in msg
    assert ei.value.node == 2
    _points_here(ei.value)


def test_builder_given_an_unknown_node_id_raises_verify_error() -> None:
    g = rlx.Graph("b")
    a = g.input("a", rlx.Shape((4, 8)))
    with pytest.raises(VerifyError, match=r"graph 'b': node id 99 does not exist \(1 nodes\)"):
        g.add(a, 99)
    with pytest.raises(VerifyError, match=r"node id 5 does not exist"):
        g.reshape(5, (2, 16))


@pytest.mark.parametrize("bad", [1.5, [0], True, "x"])
def test_builder_given_a_non_id_names_what_it_got(bad: object) -> None:
    g = rlx.Graph("b")
    g.input("a", rlx.Shape((4, 8)))
    g.input("c", rlx.Shape((4, 8)))
    with pytest.raises(VerifyError) as ei:
        g.relu(bad)
    msg = str(ei.value)
    assert msg.startswith("relu: inputs must be node ids")
    assert f"given {type(bad).__name__} {bad!r}" in msg
    _points_here(ei.value)


def test_node_lookup_of_a_missing_id_raises_verify_error() -> None:
    g = _mlp()
    with pytest.raises(VerifyError, match=r"graph 'mlp': node id -1 does not exist"):
        g.node(-1)
    with pytest.raises(VerifyError, match=r"expected a node id .* given str 'x'"):
        g.shape("x")  # type: ignore[arg-type]
    assert g.shape(np.int64(0)) == g.nodes[0].shape


def test_compile_of_a_malformed_graph_names_the_node() -> None:
    g = rlx.Graph("bad")
    a = g.input("a", rlx.Shape((4, 8)))
    r = g.add_node(Unary(UnaryKind.RELU), [a], rlx.Shape((4, 9)))
    g.set_outputs(r)
    with pytest.raises(VerifyError) as ei:
        rlx.Session("cpu").compile(g)
    assert ei.value.node == r
    assert str(ei.value).startswith(
        "%1 relu: recorded shape f32[4,9] but the shape rule gives f32[4,8]"
    )


def test_compile_without_outputs_says_what_to_call() -> None:
    g = rlx.Graph("no_out")
    g.relu(g.input("a", rlx.Shape((4, 8))))
    with pytest.raises(VerifyError, match=r"graph 'no_out' has no outputs \(call set_outputs\)"):
        rlx.Session("cpu").compile(g)


def test_compile_of_a_non_graph() -> None:
    with pytest.raises(
        CompileError, match=r"cannot compile a str; expected a Graph or GraphModule"
    ):
        rlx.Session("cpu").compile("model.rlx")


# ---- sessions, files, quantization ----------------------------------------------------


def test_unknown_backend_lists_the_available_ones() -> None:
    with pytest.raises(CompileError, match=r"unknown backend 'gpu'; available backends: \['cpu'\]"):
        rlx.Session("gpu")


def test_load_of_a_corrupt_file_says_what_is_wrong(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.rlx"
    garbage.write_bytes(b"garbage" * 10)
    with pytest.raises(SerializationError, match=r"garbage.rlx': not an rlx graph file.*b'RLXG'"):
        rlx.load(garbage)
    good = tmp_path / "good.rlx"
    rlx.save(_mlp(), good, PARAMS)
    data = good.read_bytes()
    truncated = tmp_path / "truncated.rlx"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(SerializationError, match=rf"truncated at byte {len(data) // 2}"):
        rlx.load(truncated)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    corrupt = tmp_path / "corrupt.rlx"
    corrupt.write_bytes(bytes(flipped))
    with pytest.raises(SerializationError, match=r"checksum mismatch"):
        rlx.load(corrupt)
    with pytest.raises(SerializationError, match=r"cannot read .*missing.rlx"):
        rlx.load(tmp_path / "missing.rlx")


@pytest.mark.parametrize("batches", [[], iter([])], ids=["empty_list", "empty_iterator"])
def test_quantize_with_no_calibration_batches(batches: object) -> None:
    with pytest.raises(
        QuantizationError,
        match=r"quantize: calibration_data has no batches; expected at least one "
        r"input dict with the inputs of graph 'mlp': \['x'\]",
    ):
        rlx.quantize(_mlp(), batches, params=PARAMS)  # type: ignore[arg-type]


def test_calibrate_with_no_batches_names_the_graph_inputs(compiled: rlx.CompiledGraph) -> None:
    with pytest.raises(
        QuantizationError,
        match=r"calibrate\(\): given no batches; .* graph 'mlp': \['x'\]",
    ):
        calibrate(compiled, [], progress=False)


def test_quantize_with_an_unknown_method_lists_the_known_ones() -> None:
    calib = [{"x": np.ones((4, 8), np.float32)}]
    with pytest.raises(QuantizationError, match=r"unknown calibration method 'foo'.*'percentile'"):
        rlx.quantize(_mlp(), calib, params=PARAMS, method="foo")


def test_quantize_with_a_wrong_input_name_names_the_users_graph() -> None:
    calib = [{"z": np.ones((4, 8), np.float32)}]
    with pytest.raises(InputError, match=r"unknown input\(s\) \['z'\]; inputs of graph 'mlp': "):
        rlx.quantize(_mlp(), calib, params=PARAMS)


def test_compile_params_must_be_a_dict() -> None:
    with pytest.raises(
        InputError, match=r"takes a dict of param name -> array, given list; .*'mlp': \['w'\]"
    ):
        rlx.Session("cpu").compile(_mlp(), params=[np.ones((8, 3), np.float32)])  # type: ignore[arg-type]


def test_evaluate_verifies_a_malformed_graph_first():
    import rlx
    from rlx.errors import VerifyError
    from rlx.ops.elementwise import Unary, UnaryKind

    g = rlx.Graph("bad")
    x = g.input("x", (2,))
    g.add_node(Unary(UnaryKind.RELU), [x, x], rlx.Shape((2,)))
    g.set_outputs([1])
    with pytest.raises(VerifyError, match="expected 1 inputs"):
        g.evaluate({"x": [1.0, 2.0]})
