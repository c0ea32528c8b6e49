"""rlx.onnx.load: a model built with onnx.helper round-trips (rlx vs a NumPy twin), and each
bad model is a clear rlx error with nothing built: checker failure, missing or short
external data, truncated file, wrong tensor byte count, an op rlx does not import."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import rlx  # noqa: E402
from rlx.errors import ModelError, UnsupportedOpError  # noqa: E402
from rlx.frontends.onnx import NeedsConstantError, OnnxImportError, OnnxUnsupportedError  # noqa: E402
from tests.frontends.missing import error_without  # noqa: E402

RNG = np.random.default_rng(0)
W = RNG.standard_normal((16, 5)).astype(np.float32)
B = RNG.standard_normal(5).astype(np.float32)


def mlp(opset: int = 17, batch: str | int = "batch") -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["y"], name="sm", axis=-1),
    ]
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def twin(x: np.ndarray) -> np.ndarray:
    r = np.maximum(x @ W + B, 0)
    e = np.exp(r - r.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_round_trip_with_a_symbolic_batch(tmp_path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    m = rlx.onnx.load(path)
    assert str(m.inputs["x"].dims[0]) == "batch"
    assert set(m.params) == {"w"} and m.outputs == ("y",)  # b (5 values) folds as a constant
    c = m.compile()
    for n in (1, 3):
        x = RNG.standard_normal((n, 16)).astype(np.float32)
        np.testing.assert_allclose(c.run({"x": x})[0], twin(x), rtol=1e-5, atol=1e-6)


def test_bytes_and_proto_give_the_same_graph() -> None:
    a = rlx.onnx.load(mlp().SerializeToString()).graph
    b = rlx.onnx.load(mlp()).graph
    assert a.fingerprint() == b.fingerprint()


def test_softmax_before_opset_13_flattens_from_axis() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=1)],
        "sm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
    )
    for opset, want in ((11, _softmax(x.reshape(2, 12)).reshape(2, 3, 4)), (13, _softmax(x, 1))):
        m = rlx.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))
        np.testing.assert_allclose(m.compile().run({"x": x})[0], want, rtol=1e-5)


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def test_checker_failure_is_an_import_error() -> None:
    m = mlp()
    m.graph.node[0].input[1] = "nowhere"
    with pytest.raises(OnnxImportError, match="onnx checker"):
        rlx.onnx.load(m)


def test_truncated_file(tmp_path) -> None:
    data = mlp().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxImportError, match="truncated|not a readable"):
        rlx.onnx.load(path)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(OnnxImportError, match="does not exist"):
        rlx.onnx.load(tmp_path / "nope.onnx")


def test_wrong_tensor_byte_count() -> None:
    m = mlp()
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:-4]
    with pytest.raises(OnnxImportError, match="'w'.*bytes"):
        rlx.onnx.load(m, check=False)


def _external(tmp_path):  # noqa: ANN202
    m = mlp()
    onnx.save(m, tmp_path / "ext.onnx", save_as_external_data=True, location="w.bin",
              size_threshold=0)  # fmt: skip
    return tmp_path / "ext.onnx", tmp_path / "w.bin"


def test_external_data_is_read(tmp_path) -> None:
    path, _ = _external(tmp_path)
    m = rlx.onnx.load(path)
    np.testing.assert_array_equal(m.params["w"], W)


def test_missing_external_data_file(tmp_path) -> None:
    path, data = _external(tmp_path)
    data.unlink()
    with pytest.raises(OnnxImportError, match="w.bin"):
        rlx.onnx.load(path)


def test_short_external_data_file(tmp_path) -> None:
    path, data = _external(tmp_path)
    data.write_bytes(data.read_bytes()[:10])
    with pytest.raises(OnnxImportError, match="truncated|past the end"):
        rlx.onnx.load(path, check=False)


def test_unsupported_op_names_op_domain_opset_and_node() -> None:
    g = helper.make_graph(
        [helper.make_node("Det", ["x"], ["y"], name="my_det")],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxUnsupportedError) as e:
        rlx.onnx.load(m)
    assert isinstance(e.value, UnsupportedOpError)
    for part in ("Det", "ai.onnx", "opset 17", "my_det"):
        assert part in str(e.value)
    assert (e.value.op_type, e.value.domain, e.value.opset) == ("Det", "", 17)


def test_shape_input_must_be_known_or_folded() -> None:
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")],
        "rs",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(NeedsConstantError, match="constant_inputs") as e:
        rlx.onnx.load(m)
    assert e.value.input_name == "s"
    s = np.array([3, 4], np.int64)
    mod = rlx.onnx.load(m, constant_inputs={"s": s})
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    out = mod.compile().run(mod.feeds({"x": x, "s": s}))[0]
    np.testing.assert_array_equal(out, x.reshape(3, 4))
    with pytest.raises(OnnxImportError, match="folded"):
        mod.feeds({"x": x, "s": np.array([4, 3], np.int64)})


def test_unsupported_dtype_names_it() -> None:
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "u16",
        [helper.make_tensor_value_info("x", TensorProto.UINT16, [2])],
        [helper.make_tensor_value_info("y", TensorProto.UINT16, [2])],
    )
    with pytest.raises(OnnxUnsupportedError, match="UINT16"):
        rlx.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_opset_below_6_is_refused() -> None:
    with pytest.raises(OnnxUnsupportedError, match="opset 5"):
        rlx.onnx.load(mlp(opset=5), check=False)


def test_rlx_onnx_without_the_onnx_package_names_the_extra() -> None:
    out = error_without("onnx", "rlx.onnx")
    assert "ModelError" in out and "rlx[onnx]" in out
    assert issubclass(OnnxImportError, ModelError)


def test_unknown_dims_become_symbols_named_after_input_and_axis() -> None:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
    )
    m = rlx.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert str(m.inputs["x"].dims[0]) == "x_0" and m.inputs["x"].dims[1] == 3
    x = np.array([[-1.0, 2.0, -3.0]] * 4, np.float32)
    np.testing.assert_array_equal(m.compile().run({"x": x})[0], np.maximum(x, 0))


def test_layer_norm_scale_of_higher_rank_is_an_import_error() -> None:
    """A LayerNormalization scale whose rank exceeds the normalized dims cannot broadcast:
    an error naming the node and both shapes (it was a bare NotImplementedError)."""
    g = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln", axis=-1)],
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.ones((3, 4), np.float32), "s")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(
        OnnxImportError, match=r"LayerNormalization node 'ln': scale of shape \[3, 4\]"
    ):
        rlx.onnx.load(model)
