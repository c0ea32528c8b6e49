"""Cross-entropy recognition: ``-log_softmax(x)[label]`` spelled out with a gather ->
one ``softmax_cross_entropy`` node (``rlx/ops/loss.py``), whose vjp is the one-pass
``softmax_cross_entropy_backward`` instead of the log-softmax backward, a scatter and
the reshapes.

What rlx's ``cross_entropy`` (``rlx/ops/compose/losses.py``, integer labels) and the ONNX
importer's NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss (classes on axis 1 of a
rank-2 input) build, over the last axis::

    logp   = log_softmax(x)                      axis -1
    picked = gather_elements(logp, reshape(labels, [..., 1]))   axis -1
    nll    = neg(reshape(picked, labels' dims))

In: a graph. Out: each ``nll`` replaced by ``softmax_cross_entropy(x, labels)``; what
reduces it (mean, sum, a weighting) is left as it is. ``log_softmax`` and the gather
must have no user outside the chain (label smoothing reads the log-probabilities a
second time: a near miss), and the reshape of the labels is swallowed only when the
gather is its one user. Near misses the report names: the log-softmax or the gather on
another axis than the last, indices that are not the labels reshaped to ``[..., 1]``, no
negation, class-probability targets (a float tensor multiplying the log-probabilities),
an intermediate read outside the chain.
"""

from __future__ import annotations

from rlx.ir.mir import Node, NodeId
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind
from rlx.ops.indexing import GatherElements
from rlx.ops.loss import SoftmaxCrossEntropyWithLogits
from rlx.ops.movement import Reshape
from rlx.ops.reduce import LogSoftmax
from rlx.passes.fusion import FusionView, Match, PatternFusion
from rlx.passes.report import FusionPattern

__all__ = ["CrossEntropyFusion"]


class CrossEntropyFusion(PatternFusion):
    """``neg(reshape(gather_elements(log_softmax(x), reshape(labels))))`` over the last
    axis -> ``softmax_cross_entropy(x, labels)``."""

    name = "fuse_cross_entropy"
    pattern = FusionPattern.CROSS_ENTROPY

    def match_at(self, view: FusionView, node: Node, claimed: set[NodeId]) -> Match | None:
        if not isinstance(node.op, LogSoftmax):
            return None
        x = node.inputs[0]
        rank = view.node(x).shape.rank
        users = view.consumers[node.id]
        gathers = [
            u
            for u in users
            if isinstance(view.node(u).op, GatherElements) and view.node(u).inputs[0] == node.id
        ]
        if not gathers:
            muls = [u for u in users if _is_mul(view, u)]
            if muls:
                self.miss(
                    [node.id, muls[0]],
                    f"cross-entropy at {view.desc(node.id)} * {view.desc(muls[0])}",
                    "the log-probabilities are multiplied by class probabilities (float "
                    "targets); softmax_cross_entropy takes integer labels",
                )
            return None
        gather = gathers[0]
        desc = f"cross-entropy at {view.desc(node.id)} + {view.desc(gather)}"
        chain = [node.id, gather]
        axis, gaxis = node.op.axis % rank, view.node(gather).op.axis % rank  # type: ignore[attr-defined]
        if axis != rank - 1 or gaxis != axis:
            self.miss(
                chain,
                desc,
                f"log_softmax over axis {axis} and the gather along axis {gaxis}: the "
                f"fused op takes the classes on the last axis ({rank - 1})",
            )
            return None
        labels = self._labels(view, view.node(gather).inputs[1], view.node(x).shape.dims)
        if labels is None:
            self.miss(
                chain,
                desc,
                f"the gathered indices {view.ref(view.node(gather).inputs[1])} are not "
                "labels of the logits' dims without the class axis, reshaped to [..., 1]",
            )
            return None
        tail = self._negated(view, gather, view.node(labels).shape.dims)
        if tail is None:
            self.miss(
                chain,
                desc,
                "the picked log-probabilities are not reshaped to the labels' dims and negated",
            )
            return None
        inside = frozenset([*chain, *tail])
        if self.escapes(view, inside, tail[-1], desc):
            return None
        index = view.node(gather).inputs[1]
        if not view.why_escapes(index, inside | {index}):
            inside |= {index}
        op = SoftmaxCrossEntropyWithLogits()
        why = view.infer(op, (x, labels))
        if why is not None:
            self.miss(sorted(inside), desc, why)
            return None
        return Match(tail[-1], op, (x, labels), inside, f"{desc} ({len(inside)} nodes)")

    @staticmethod
    def _labels(view: FusionView, index: NodeId, dims: tuple) -> NodeId | None:
        """The labels ``[...]`` that ``index`` reshapes to ``[..., 1]``, else None."""
        node = view.node(index)
        if not isinstance(node.op, Reshape) or node.shape.dims != (*dims[:-1], 1):
            return None
        labels = node.inputs[0]
        return labels if view.node(labels).shape.dims == dims[:-1] else None

    @staticmethod
    def _negated(view: FusionView, gather: NodeId, dims: tuple) -> list[NodeId] | None:
        """``[reshape, neg]`` reading the gather: its output reshaped to ``dims`` and
        negated, else None."""
        for r in view.consumers[gather]:
            rn = view.node(r)
            if not isinstance(rn.op, Reshape) or rn.shape.dims != dims:
                continue
            for n in view.consumers[r]:
                op = view.node(n).op
                if isinstance(op, Unary) and op.fn is UnaryKind.NEG:
                    return [r, n]
        return None


def _is_mul(view: FusionView, nid: NodeId) -> bool:
    op = view.node(nid).op
    return isinstance(op, Binary) and op.fn is BinaryKind.MUL
