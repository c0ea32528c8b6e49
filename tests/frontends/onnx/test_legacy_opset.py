"""Opset 6 forms (rlx/frontends/onnx/ops/legacy.py) against NumPy twins: legacy
``broadcast=1`` with ``axis`` (B aligned at A's axis, not at the end), PRelu-6's per-channel
1-D slope, BatchNormalization-6 in test mode, and the training forms named unsupported.
(ONNX Runtime cannot load opset 6, so NumPy is the oracle here.)"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import rlx  # noqa: E402
from rlx.frontends.onnx import OnnxImportError, OnnxUnsupportedError  # noqa: E402

RNG = np.random.default_rng(6)
F = TensorProto.FLOAT


def _model(node, ins, out_dims, inits=(), opset=6) -> onnx.ModelProto:  # noqa: ANN001
    g = helper.make_graph(
        [node],
        "legacy",
        [helper.make_tensor_value_info(n, F, d) for n, d in ins],
        [helper.make_tensor_value_info("y", F, out_dims)],
        list(inits),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(
    ("op", "fn"), [("Add", np.add), ("Mul", np.multiply), ("Sub", np.subtract)]
)
def test_legacy_broadcast_aligns_b_at_axis(op: str, fn) -> None:  # noqa: ANN001
    a = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    node = helper.make_node(op, ["a", "b"], ["y"], broadcast=1, axis=1)
    m = rlx.onnx.load(_model(node, [("a", [2, 3, 4]), ("b", [3])], [2, 3, 4]))
    got = m.compile().run({"a": a, "b": b})[0]
    np.testing.assert_allclose(got, fn(a, b[:, None]), rtol=1e-6)


def test_legacy_broadcast_without_axis_is_suffix_aligned_and_opset_7_ignores_it() -> None:
    a = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    for opset, node in (
        (6, helper.make_node("Add", ["a", "b"], ["y"], broadcast=1)),
        (7, helper.make_node("Add", ["a", "b"], ["y"])),
    ):
        m = rlx.onnx.load(_model(node, [("a", [2, 3, 4]), ("b", [4])], [2, 3, 4], opset=opset))
        np.testing.assert_allclose(m.compile().run({"a": a, "b": b})[0], a + b, rtol=1e-6)


def test_legacy_broadcast_that_does_not_fit_is_an_error_naming_the_node() -> None:
    node = helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=2, name="bad_add")
    m = _model(node, [("a", [2, 3, 4]), ("b", [3, 4])], [2, 3, 4])
    with pytest.raises(OnnxImportError, match=r"bad_add.*does not fit"):
        rlx.onnx.load(m, check=False)


def test_prelu_6_applies_a_1d_slope_per_channel() -> None:
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    s = np.array([0.1, 0.5, 2.0], np.float32)
    node = helper.make_node("PRelu", ["x", "s"], ["y"])
    m = rlx.onnx.load(
        _model(node, [("x", [2, 3, 4, 5])], [2, 3, 4, 5], [numpy_helper.from_array(s, "s")])
    )
    want = np.where(x < 0, x * s[None, :, None, None], x)
    np.testing.assert_allclose(m.compile().run({"x": x})[0], want, rtol=1e-6)


def _bn(**attrs) -> onnx.ModelProto:  # noqa: ANN003
    c = 3
    inits = [
        numpy_helper.from_array(np.array([1.0, 2.0, 0.5], np.float32), "scale"),
        numpy_helper.from_array(np.array([0.0, 0.1, -0.2], np.float32), "bias"),
        numpy_helper.from_array(np.array([0.3, -0.1, 0.0], np.float32), "mean"),
        numpy_helper.from_array(np.array([1.0, 0.5, 2.0], np.float32), "var"),
    ]
    node = helper.make_node(
        "BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], name="bn", **attrs
    )
    return _model(node, [("x", [2, c, 4])], [2, c, 4], inits)


def test_batch_norm_6_in_test_mode_matches_numpy() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    m = rlx.onnx.load(_bn(is_test=1, epsilon=1e-3))
    sc, b = np.array([1.0, 2.0, 0.5]), np.array([0.0, 0.1, -0.2])
    mu, var = np.array([0.3, -0.1, 0.0]), np.array([1.0, 0.5, 2.0])
    want = (x - mu[:, None]) / np.sqrt(var[:, None] + 1e-3) * sc[:, None] + b[:, None]
    np.testing.assert_allclose(m.compile().run({"x": x})[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("attrs", "why"), [({"is_test": 0}, "training mode"), ({"is_test": 1, "spatial": 0}, "spatial")]
)
def test_batch_norm_6_training_forms_are_unsupported(attrs: dict, why: str) -> None:
    with pytest.raises(OnnxUnsupportedError, match=rf"'bn'.*opset 6.*{why}"):
        rlx.onnx.load(_bn(**attrs))
