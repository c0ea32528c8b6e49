"""The loader's checker run on stubbed weights (``fastcheck.py``): structural errors of a
model with large initializers are still caught (as onnx.checker catches them on the full
model), a valid model passes, the caller's ModelProto keeps its weights, and a large
tensor with a wrong byte count is still an import error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import rlx
from rlx.frontends.onnx import OnnxImportError, fastcheck

N = 160  # 160 x 160 f32 = 100 KiB: above fastcheck.STUB_BYTES


def _model() -> onnx.ModelProto:
    w = np.arange(N * N, dtype=np.float32).reshape(N, N) / (N * N)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, N])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_weights_are_stubbed_and_structure_still_checked() -> None:
    m = _model()
    assert len(m.graph.initializer[0].raw_data) > fastcheck.STUB_BYTES
    before = m.SerializeToString()
    fastcheck.check_model(m)  # valid: passes
    got = rlx.onnx.load(m)
    assert m.SerializeToString() == before  # the caller's proto is untouched
    x = np.ones((2, N), np.float32)
    w = numpy_helper.to_array(m.graph.initializer[0])
    np.testing.assert_allclose(got.compile().run({"x": x})[0], np.maximum(x @ w, 0), rtol=1e-5)
    for breaks in ("input", "op", "ssa"):
        bad = _model()
        if breaks == "input":
            bad.graph.node[1].input[0] = "nowhere"
        elif breaks == "op":
            bad.graph.node[1].op_type = "NoSuchOp"
        else:
            bad.graph.node[1].output[0] = "h"  # two nodes write "h"
        with pytest.raises(onnx.checker.ValidationError):
            onnx.checker.check_model(bad)  # what onnx says about the full model ...
        with pytest.raises(onnx.checker.ValidationError):
            fastcheck.check_model(bad)  # ... the stubbed check says too


def test_large_tensor_with_wrong_byte_count() -> None:
    m = _model()
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:-4]
    with pytest.raises(OnnxImportError, match="bytes of data"):
        rlx.onnx.load(m)
