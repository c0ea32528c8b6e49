"""Q/DQ insertion (the seed's rlx-compile quant_insert tests, translated) and the
validation of calibration entries."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.dtype import DType
from rlx.errors import QuantizationError
from rlx.ops.elementwise import Binary, BinaryKind, Cast
from rlx.ops.quant import Dequantize, Quantize
from rlx.quant.record import CalibrationEntry, CalibrationRecord, insert_q_dq


def test_inserts_q_dq_pair_after_tap():
    g = rlx.Graph("ptq_demo")
    x = g.input("x", (4, 8))
    y = g.relu(x)
    z = g.add(y, y)
    g.set_outputs([z])
    record: CalibrationRecord = {y: CalibrationEntry.per_tensor(0.05)}
    g2 = insert_q_dq(g, record)
    g2.verify()
    assert g2.find(Quantize) and g2.find(Dequantize)
    (add,) = [n for n in g2.nodes if isinstance(n.op, Binary) and n.op.fn is BinaryKind.ADD]
    for i in add.inputs:
        assert isinstance(g2.nodes[i].op, Dequantize), (
            f"add input should be dequantize, got {g2.nodes[i].op}"
        )
    # the quantize reads the raw tap
    (q,) = g2.find(Quantize)
    assert g2.nodes[q.inputs[0]].op.mnemonic == "unary"


def test_untagged_nodes_pass_through_unchanged():
    g = rlx.Graph("no_taps")
    x = g.input("x", (4,))
    g.set_outputs([g.relu(x)])
    g2 = insert_q_dq(g, {})
    assert len(g2) == len(g) and g2 == g


def test_tap_that_is_an_output_returns_the_dequantize():
    g = rlx.Graph("out_tap")
    x = g.input("x", (3,))
    y = g.relu(x)
    g.set_outputs([y, x])
    g2 = insert_q_dq(g, {y: CalibrationEntry.per_tensor(0.5, 2, DType.U8)})
    assert isinstance(g2.nodes[g2.outputs[0]].op, Dequantize)
    assert g2.outputs[1] == x
    out, raw = g2.evaluate({"x": np.array([-1.0, 0.3, 0.8], np.float32)})
    np.testing.assert_array_equal(out, [0.0, 0.5, 1.0])  # 0.8/0.5 = 1.6 -> 2
    assert g2.nodes[g2.nodes[g2.outputs[0]].inputs[0]].dtype is DType.U8


def test_per_channel_entry_and_non_f32_tap():
    g = rlx.Graph("pc")
    x = g.input("x", (2, 3), "f16")
    g.set_outputs([g.neg(x)])
    g2 = insert_q_dq(g, {x: CalibrationEntry.per_channel(1, [1.0, 0.5, 0.25])})
    g2.verify()
    assert isinstance(g2.nodes[g2.nodes[g2.outputs[0]].inputs[0]].op, Cast)
    (y,) = g2.evaluate({"x": np.array([[1.2, 1.2, 1.2], [-3, 0.1, 0.2]], np.float16)})
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, -np.array([[1.0, 1.0, 1.25], [-3.0, 0.0, 0.25]], np.float16))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: CalibrationEntry.per_tensor(0.0), "finite and > 0"),
        (lambda: CalibrationEntry.per_tensor(float("nan")), "finite and > 0"),
        (lambda: CalibrationEntry.per_tensor(1.0, 300), r"\[-128, 127\]"),
        (lambda: CalibrationEntry.per_tensor(1.0, -1, DType.U8), r"\[0, 255\]"),
        (lambda: CalibrationEntry.per_tensor(1.0, 0, DType.F32), "i8 or u8"),
        (lambda: CalibrationEntry.per_channel(0, [1.0, 2.0], [0]), "2 scales but 1 zero points"),
        (lambda: CalibrationEntry.per_channel(-1, [1.0]), "axis must be >= 0"),
        (lambda: CalibrationEntry.per_channel(0, []), "at least one scale"),
        (lambda: CalibrationEntry(None, (1.0, 2.0), (0, 0)), "one scale, got 2"),
    ],
)
def test_entry_validation(make, match):
    with pytest.raises(QuantizationError, match=match):
        make()


def test_record_checked_against_graph():
    g = rlx.Graph("chk")
    x = g.input("x", (2, 3))
    i = g.input("i", (2,), "i32")
    g.set_outputs([x, i])
    with pytest.raises(QuantizationError, match="needs 3 scales, the record gives 2"):
        insert_q_dq(g, {x: CalibrationEntry.per_channel(1, [1.0, 1.0])})
    with pytest.raises(QuantizationError, match="axis 2 out of range"):
        insert_q_dq(g, {x: CalibrationEntry.per_channel(2, [1.0])})
    with pytest.raises(QuantizationError, match="only float tensors"):
        insert_q_dq(g, {i: CalibrationEntry.per_tensor(1.0)})
    with pytest.raises(QuantizationError, match="has 2 nodes"):
        insert_q_dq(g, {7: CalibrationEntry.per_tensor(1.0)})
