"""A QDQ model as ONNX Runtime's quantizer writes it (QuantizeLinear / DequantizeLinear
around a MatMul, int8 weights as an initializer) imports into rlx's quantize / dequantize
ops and an integer MatMulInteger into an int32 matmul; outputs against NumPy twins."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import rlx  # noqa: E402
from rlx.dtype import DType  # noqa: E402
from rlx.ops.linalg import MatMul  # noqa: E402
from rlx.ops.quant import Dequantize, Quantize  # noqa: E402

RNG = np.random.default_rng(5)


def _const(name: str, v: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(v), name)


def test_qdq_matmul_imports_to_quantize_and_dequantize() -> None:
    wq = RNG.integers(-127, 128, size=(8, 4)).astype(np.int8)
    w_scale = np.float32(0.02)
    x_scale, x_zp = np.float32(0.05), np.uint8(128)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"]),
        helper.make_node("MatMul", ["xd", "wd"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [_const("wq", wq), _const("ws", w_scale), _const("xs", x_scale), _const("xz", x_zp)],
    )
    m = rlx.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    ops = [type(n.op) for n in m.graph.nodes]
    assert Quantize in ops and Dequantize in ops
    q = next(n for n in m.graph.nodes if isinstance(n.op, Quantize))
    assert q.shape.dtype is DType.U8 and q.op.scales == (pytest.approx(0.05),)
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    xq = np.clip(np.rint(x / x_scale) + 128, 0, 255)
    want = ((xq - 128) * x_scale) @ (wq.astype(np.float32) * w_scale)
    np.testing.assert_allclose(m.compile().run({"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_matmul_integer_is_an_int32_matmul() -> None:
    a = RNG.integers(0, 256, size=(2, 5)).astype(np.uint8)
    b = RNG.integers(-128, 128, size=(5, 3)).astype(np.int8)
    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b", "az"], ["y"])],
        "mmi",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 3])],
        [_const("b", b), _const("az", np.uint8(7))],
    )
    m = rlx.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    mm = next(n for n in m.graph.nodes if isinstance(n.op, MatMul))
    assert mm.shape.dtype is DType.I32
    got = m.compile().run({"a": a})[0]
    want = (a.astype(np.int64) - 7) @ b.astype(np.int64)
    np.testing.assert_array_equal(got, want.astype(np.int32))
