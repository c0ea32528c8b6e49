"""``fuse_conv_act``: conv [+ residual] [-> relu / clip] becomes one conv node. Checked
against the reference interpreter on the unfused graph (the oracle of every pass), with
the fusion report's fusions and near misses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlx.ir.mir import Graph, NodeId
from rlx.ops.nn import Conv, ConvAct
from rlx.passes.dce import DeadCodeElimination
from rlx.passes.report import FusionPattern

from .graphs import random_inputs, random_params
from .test_cleanup import same_numbers
from .test_fusion import fuse_all, ops_of


def _conv(g: Graph, x: NodeId, c: int, o: int, name: str, k: int = 3) -> NodeId:
    w = g.param(f"{name}.w", (o, c, k, k))
    return g.conv(x, w, g.param(f"{name}.b", (o,)), padding=k // 2)


def _values(g: Graph) -> tuple[dict, dict]:
    return random_inputs(g), random_params(g)


def _scalar(g: Graph, v: float) -> NodeId:
    return g.constant(np.asarray(v, np.float32))


def _convs(out: Graph) -> list[Conv]:
    return [n.op for n in ops_of(out, Conv)]  # type: ignore[misc]


def test_resnet_block_fuses_relu_and_residual() -> None:
    g = Graph("block")
    x = g.input("x", (2, 4, 7, 9))
    y = g.relu(_conv(g, x, 4, 4, "c1"))
    z = g.relu(g.add(_conv(g, y, 4, 4, "c2"), x))  # the skip: relu(conv + x)
    g.set_outputs([z])
    out, report = fuse_all(g)
    convs = _convs(out)
    assert [(c.act, c.has_residual) for c in convs] == [
        (ConvAct.RELU, False),
        (ConvAct.RELU, True),
    ]
    assert len(out.nodes) < len(g.nodes) and report.count(FusionPattern.CONV_ACT) == 2
    same_numbers(g, out, *_values(g))


@pytest.mark.parametrize(
    ("lo", "hi"), [(0.0, 6.0), (-0.5, 0.25), (None, 0.5), (-0.25, None), (0.0, None)]
)
def test_clip_forms_fuse(lo: float | None, hi: float | None) -> None:
    g = Graph("clip")
    x = g.input("x", (1, 3, 6, 6))
    y = _conv(g, x, 3, 8, "c")
    if lo is not None:
        y = g.maximum(y, _scalar(g, lo))
    if hi is not None:
        y = g.minimum(y, _scalar(g, hi))
    g.set_outputs([y])
    out, _ = fuse_all(g)
    (c,) = _convs(out)
    if (lo, hi) == (0.0, None):
        assert c.act is ConvAct.RELU
    else:
        want = (-math.inf if lo is None else lo, math.inf if hi is None else hi)
        assert c.act is ConvAct.CLIP and c.clip == want
    # x, w, b, conv: the constants went with the clip
    assert len(DeadCodeElimination().run(out).nodes) == 4
    same_numbers(g, out, *_values(g))


def test_residual_without_activation_and_depthwise() -> None:
    """MobileNetV2's inverted residual: a 1x1 conv + the block input, no activation; a
    depthwise conv + relu6 before it."""
    g = Graph("inverted")
    x = g.input("x", (2, 8, 5, 5))
    dw = g.conv(x, g.param("dw.w", (8, 1, 3, 3)), g.param("dw.b", (8,)), padding=1, groups=8)
    h = g.minimum(g.maximum(dw, _scalar(g, 0.0)), _scalar(g, 6.0))
    y = g.add(x, _conv(g, h, 8, 8, "pw", k=1))
    g.set_outputs([y])
    out, _ = fuse_all(g)
    assert [(c.act, c.clip, c.has_residual, c.groups) for c in _convs(out)] == [
        (ConvAct.CLIP, (0.0, 6.0), False, 8),
        (ConvAct.NONE, (0.0, 0.0), True, 1),
    ]
    same_numbers(g, out, *_values(g))


def test_near_misses_keep_the_graph() -> None:
    g = Graph("misses")
    x = g.input("x", (1, 2, 4, 4))
    a = _conv(g, x, 2, 2, "a")
    b = g.relu(a)  # a has a second user: no fusion
    c = g.add(a, g.input("r", (1, 2, 1, 4)))  # a broadcast residual
    d = g.minimum(g.maximum(_conv(g, x, 2, 2, "d"), _scalar(g, 1.0)), _scalar(g, -1.0))
    e = g.maximum(_conv(g, x, 2, 2, "e"), g.input("t", (1, 2, 4, 4)))  # not a constant
    g.set_outputs([b, c, d, e])
    out, report = fuse_all(g)
    convs = _convs(out)
    # only d fuses: max(conv, 1) with its min dropped (lo > hi), min by 1 left outside
    assert [(cv.act, cv.clip) for cv in convs].count((ConvAct.CLIP, (1.0, math.inf))) == 1
    assert sum(cv.act is ConvAct.NONE for cv in convs) == 2
    assert any("users" in str(m) for m in report.missed_of(FusionPattern.CONV_ACT))
    same_numbers(g, out, *_values(g))


def test_fused_conv_has_no_derivative() -> None:
    g = Graph("grad")
    x = g.input("x", (1, 2, 4, 4))
    y = g.relu(_conv(g, x, 2, 2, "c"))
    g.set_outputs([y])
    out, _ = fuse_all(g)
    (node,) = ops_of(out, Conv)
    with pytest.raises(Exception, match="no derivative"):
        node.op.vjp(out, node, node.id)


def test_conv_plus_conv_fuses_once_without_a_near_miss() -> None:
    """``a + b`` of two convs where ``a`` has another user: ``b`` takes the add (``a`` is
    its residual) and the report records no near miss for ``a``."""
    g = Graph("two")
    x = g.input("x", (1, 4, 5, 5))
    a = _conv(g, x, 4, 4, "a")
    b = _conv(g, g.relu(a), 4, 4, "b")
    g.set_outputs([g.add(a, b)])
    out, report = fuse_all(g)
    assert [(c.act, c.has_residual) for c in _convs(out)] == [
        (ConvAct.NONE, False),
        (ConvAct.NONE, True),
    ]
    assert not report.missed_of(FusionPattern.CONV_ACT)
    same_numbers(g, out, *_values(g))
