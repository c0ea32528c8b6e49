"""``fuse_cross_entropy`` (rlx/passes/fusion_loss.py): rlx's own ``cross_entropy`` and the
ONNX importer's SoftmaxCrossEntropyLoss become one ``softmax_cross_entropy`` node with the
numbers of ``torch.nn.functional.cross_entropy``, and so does a traced
``-(one_hot(y) * log_softmax(x)).sum(-1).mean()``; chains that are not that (label
smoothing, class-probability targets, the classes on another axis) stay as they are,
with the reason in the fusion report."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from onnx import TensorProto, helper

import rlx
from rlx import DType
from rlx.ir.mir import Graph
from rlx.ops.compose.losses import cross_entropy
from rlx.ops.indexing import GatherElements
from rlx.ops.loss import OutOfRange, SoftmaxCrossEntropyWithLogits
from rlx.ops.reduce import LogSoftmax
from rlx.options import CompileOptions
from rlx.passes.report import FusionPattern

from .test_fusion import fuse_all, ops_of

CE = FusionPattern.CROSS_ENTROPY
RNG = np.random.default_rng(0)


def _logits_graph(lead: tuple[int, ...], c: int) -> tuple[Graph, int, int]:
    g = Graph("ce")
    x = g.input("x", (*lead, c))
    y = g.input("y", lead, DType.I64)
    h = g.matmul(x, g.param("w", (c, c)))
    return g, h, y


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("lead", [(6,), (2, 3)])
def test_rlx_cross_entropy_fuses_and_matches_torch(reduction, lead):
    c = 5
    g, h, y = _logits_graph(lead, c)
    g.set_outputs([cross_entropy(g, h, y, reduction=reduction)])
    out, report = fuse_all(g)
    assert len(ops_of(out, SoftmaxCrossEntropyWithLogits)) == 1
    assert not ops_of(out, LogSoftmax) and not ops_of(out, GatherElements)
    assert report.count(CE) == 1 and not report.missed_of(CE)
    (fused,) = report.fused_of(CE)
    assert (
        "cross-entropy at" in fused.description
        and fused.into == "softmax_cross_entropy[out_of_range=error]"
    )
    x, w = (
        RNG.standard_normal((*lead, c)).astype(np.float32),
        RNG.standard_normal((c, c)).astype(np.float32),
    )
    yv = RNG.integers(0, c, lead)
    logits = torch.tensor(x.astype(np.float64)) @ torch.tensor(w.astype(np.float64))
    want = F.cross_entropy(logits.reshape(-1, c), torch.tensor(yv).reshape(-1), reduction=reduction)
    want = want.numpy().reshape(lead) if reduction == "none" else want.numpy()
    for graph in (g, out):
        got = graph.evaluate({"x": x, "y": yv}, {"w": w})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_compile_fuses_unless_the_pass_is_disabled():
    g, h, y = _logits_graph((4,), 3)
    g.set_outputs([cross_entropy(g, h, y)])
    w = np.eye(3, dtype=np.float32)
    on = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False), params={"w": w})
    off = rlx.Session("cpu").compile(
        g, CompileOptions(use_cache=False, disabled_passes=("fuse_cross_entropy",)), params={"w": w}
    )
    assert "softmax_cross_entropy" in {n.op.mnemonic for n in on.graph.nodes}
    assert "softmax_cross_entropy" not in {n.op.mnemonic for n in off.graph.nodes}
    feed = {"x": RNG.standard_normal((4, 3)).astype(np.float32), "y": np.array([0, 2, 1, 1])}
    np.testing.assert_allclose(on.run(feed)[0], off.run(feed)[0], rtol=1e-6)


def test_label_smoothing_is_a_near_miss():
    """``(1 - e) * nll + e * mean(-logp)`` reads the log-probabilities twice."""
    g, h, y = _logits_graph((4,), 3)
    logp = g.log_softmax(h, -1)
    picked = g.apply(GatherElements(1), [logp, g.unsqueeze(y, -1)])
    nll = g.neg(g.reshape(picked, [4]))
    smooth = g.neg(g.mean(logp, -1))
    g.set_outputs([g.mean(g.add(g.mul(nll, 0.9), g.mul(smooth, 0.1)))])
    out, report = fuse_all(g)
    assert report.count(CE) == 0 and not ops_of(out, SoftmaxCrossEntropyWithLogits)
    (miss,) = report.missed_of(CE)
    assert "has 2 users" in miss.reason and "outside the pattern" in miss.reason


def test_probability_targets_and_other_axes_are_near_misses():
    g = Graph("p")
    x, t = g.input("x", (4, 3)), g.input("t", (4, 3))
    g.set_outputs([cross_entropy(g, x, t)])
    _, report = fuse_all(g)
    (miss,) = report.missed_of(CE)
    assert "class probabilities" in miss.reason and report.count(CE) == 0

    g = Graph("axis1")  # classes on axis 1 of [N, C, D], as ONNX's loss takes them
    x, y = g.input("x", (2, 3, 4)), g.input("y", (2, 4), DType.I64)
    picked = g.apply(GatherElements(1), [g.log_softmax(x, 1), g.unsqueeze(y, 1)])
    g.set_outputs([g.neg(g.reshape(picked, [2, 4]))])
    _, report = fuse_all(g)
    (miss,) = report.missed_of(CE)
    assert "log_softmax over axis 1 and the gather along axis 1" in miss.reason
    assert "last axis (2)" in miss.reason


def test_onnx_softmax_cross_entropy_loss_fuses_and_matches_torch():
    """An imported SoftmaxCrossEntropyLoss (ignore_index, mean) on [N, C] logits."""
    nodes = [helper.make_node("SoftmaxCrossEntropyLoss", ["x", "y"], ["loss"], ignore_index=-1)]
    graph = helper.make_graph(
        nodes,
        "sce",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 4]),
         helper.make_tensor_value_info("y", TensorProto.INT64, [5])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    cg = rlx.onnx.load(model.SerializeToString()).compile(CompileOptions(use_cache=False))
    assert "softmax_cross_entropy" in {n.op.mnemonic for n in cg.graph.nodes}
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    y = np.array([0, 3, -1, 2, 1])
    want = F.cross_entropy(torch.tensor(x, dtype=torch.float64), torch.tensor(y), ignore_index=-1)
    np.testing.assert_allclose(cg.run({"x": x, "y": y})[0], want.numpy(), rtol=1e-5)


def test_traced_one_hot_loss_fuses_with_out_of_range_zero():
    """``-(one_hot(y, C) * log_softmax(x)).sum(-1).mean()`` traced by rlx.jit: one
    ``softmax_cross_entropy[out_of_range=zero]`` then the mean; an out-of-range label's
    one-hot is all zeros, so its row counts 0 (torch: ignore_index rows, summed, divided
    by every row)."""

    def loss(x, y):
        return -(rlx.nn.one_hot(y, 5) * rlx.nn.log_softmax(x)).sum(-1).mean()

    x = RNG.standard_normal((4, 5)).astype(np.float32)
    y = np.array([0, 7, 4, -1])
    g = rlx.jit(loss).lower(x, y).graph
    out, report = fuse_all(g)
    (node,) = ops_of(out, SoftmaxCrossEntropyWithLogits)
    assert node.op.out_of_range is OutOfRange.ZERO and report.count(CE) == 1
    assert not ops_of(out, LogSoftmax)
    tl = torch.tensor(np.where((y < 0) | (y >= 5), -100, y))
    rows = F.cross_entropy(torch.tensor(x, dtype=torch.float64), tl, reduction="none")
    want = rows.sum().numpy() / 4
    for graph in (g, out):
        np.testing.assert_allclose(graph.evaluate({"x": x, "y": y})[0], want, rtol=1e-5)
    np.testing.assert_allclose(rlx.jit(loss)(x, y), want, rtol=1e-5)


def test_one_hot_of_other_classes_is_a_near_miss():
    """A one-hot against a constant that is not arange(C) is class probabilities."""
    g = Graph("oh")
    x, y = g.input("x", (4, 3)), g.input("y", (4,), DType.I64)
    oh = g.cast(g.eq(g.unsqueeze(y, -1), g.constant(np.array([2, 1, 0]))), "f32")
    g.set_outputs([g.neg(g.sum(g.mul(oh, g.log_softmax(x, -1)), -1))])
    out, report = fuse_all(g)
    (miss,) = report.missed_of(CE)
    assert "not a one-hot of integer labels" in miss.reason
    assert not ops_of(out, SoftmaxCrossEntropyWithLogits)


def test_one_hot_fusion_is_finite_where_the_product_is_nan():
    """docs/architecture.md: ``0 * log_softmax`` of a ``-inf`` logit is NaN in the chain;
    the fused op gives the gathered loss (torch's value)."""
    g = Graph("inf")
    x, y = g.input("x", (2, 3)), g.input("y", (2,), DType.I64)
    oh = g.cast(g.eq(g.unsqueeze(y, -1), g.constant(np.arange(3))), "f32")
    g.set_outputs([g.neg(g.sum(g.mul(oh, g.log_softmax(x, -1)), -1))])
    out, _ = fuse_all(g)
    xv = np.array([[0.5, -np.inf, 1.0], [2.0, 1.0, 0.0]], np.float32)
    yv = np.array([0, 1])
    want = F.cross_entropy(
        torch.tensor(xv, dtype=torch.float64), torch.tensor(yv), reduction="none"
    )
    with np.errstate(invalid="ignore"):
        chain = g.evaluate({"x": xv, "y": yv})[0]
    assert np.isnan(chain[0]) and np.isfinite(chain[1])
    np.testing.assert_allclose(out.evaluate({"x": xv, "y": yv})[0], want.numpy(), rtol=1e-6)
