"""Cross-entropy recognition: ``-log_softmax(x)[label]`` spelled out with a gather or a
one-hot product -> one ``softmax_cross_entropy`` node (``rlx/ops/loss.py``), whose vjp is the one-pass
``softmax_cross_entropy_backward`` instead of the log-softmax backward, a scatter and
the reshapes.

What rlx's ``cross_entropy`` (``rlx/ops/compose/losses.py``, integer labels) and the ONNX
importer's NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss (classes on axis 1 of a
rank-2 input) build, over the last axis::

    logp   = log_softmax(x)                      axis -1
    picked = gather_elements(logp, reshape(labels, [..., 1]))   axis -1
    nll    = neg(reshape(picked, labels' dims))

and what ``rlx.nn.one_hot`` gives traced code (``-(one_hot(y, C) * log_softmax(x)).sum(-1)``)::

    onehot = cast(equal(reshape(labels, [..., 1]), arange(C)), float)
    nll    = neg(reduce_sum(onehot * logp, axis -1))      or
    loss   = neg(reduce_mean / reduce_sum(reduce_sum(onehot * logp, axis -1)))

which becomes ``softmax_cross_entropy[out_of_range=zero]`` (in the second form followed
by the outer reduction: ``-mean(s) = mean(-s)``; a label outside ``[0, C)`` has
a one-hot of zeros: its row's loss and gradient are 0). There the fused op gives the
gathered value where the product gives NaN: ``0 * log_softmax`` of a ``-inf`` logit
(``0 * -inf``) in a row whose label is elsewhere, or of a NaN row whose label is out of
range.

In: a graph. Out: each ``nll`` replaced by ``softmax_cross_entropy(x, labels)``; what
reduces it (mean, sum, a weighting) is left as it is. ``log_softmax`` and the gather
must have no user outside the chain (label smoothing reads the log-probabilities a
second time: a near miss), and the reshape of the labels is swallowed only when the
gather is its one user. Near misses the report names: the log-softmax or the gather on
another axis than the last, indices that are not the labels reshaped to ``[..., 1]``, no
negation, class-probability targets (a float tensor that is not such a one-hot
multiplying the log-probabilities), an intermediate read outside the chain.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.base import Op
from rlx.ops.core import Constant
from rlx.ops.elementwise import Binary, BinaryKind, Cast, Compare, CompareKind, Unary, UnaryKind
from rlx.ops.indexing import GatherElements
from rlx.ops.loss import OutOfRange, SoftmaxCrossEntropyWithLogits
from rlx.ops.movement import Reshape
from rlx.ops.reduce import LogSoftmax, Reduce, ReduceKind
from rlx.passes.fusion import FusionView, Match, PatternFusion, apply_matches
from rlx.passes.report import FusionPattern

__all__ = ["CrossEntropyFusion"]


class CrossEntropyFusion(PatternFusion):
    """``neg(reshape(gather_elements(log_softmax(x), reshape(labels))))`` over the last
    axis -> ``softmax_cross_entropy(x, labels)``."""

    name = "fuse_cross_entropy"
    pattern = FusionPattern.CROSS_ENTROPY

    def run(self, graph: Graph) -> Graph:
        self._then: dict[NodeId, Op] = {}  # anchor -> the reduction after the fused op
        return super().run(graph)

    def apply(self, graph: Graph, matches: Sequence[Match]) -> Graph:
        return apply_matches(graph, matches, self._then)

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
            return self._one_hot_match(view, node, muls[0]) if muls else None
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

    def _one_hot_match(self, view: FusionView, node: Node, mul: NodeId) -> Match | None:
        """``neg(reduce_sum(one_hot(labels) * log_softmax(x), -1))`` -> the fused op with
        ``OutOfRange.ZERO``; a near miss when the other factor is no such one-hot."""
        x = node.inputs[0]
        dims = view.node(x).shape.dims
        desc = f"cross-entropy at {view.desc(node.id)} * {view.desc(mul)}"
        a, b = view.node(mul).inputs
        factor = b if a == node.id else a
        got = _one_hot(view, factor, dims) if factor != node.id else None
        if got is None:
            self.miss(
                [node.id, mul],
                desc,
                "the log-probabilities are multiplied by class probabilities (float "
                "targets), not a one-hot of integer labels; softmax_cross_entropy takes labels",
            )
            return None
        labels, onehot = got
        axis, rank = node.op.axis % len(dims), len(dims)  # type: ignore[attr-defined]
        tail = _summed_negated(view, mul, rank)
        if axis != rank - 1 or tail is None:
            self.miss(
                [node.id, mul],
                desc,
                f"not -sum(one_hot * log_softmax) over the last axis ({rank - 1}): "
                f"log_softmax over axis {axis}",
            )
            return None
        inside = frozenset([node.id, mul, *tail])
        if self.escapes(view, inside, tail[-1], desc):
            return None
        if len(tail) == 3:  # neg(mean(sum)): the fused op, then the mean
            self._then[tail[-1]] = view.node(tail[1]).op
        for n in onehot:  # the one-hot's nodes go when only the chain reads them
            if not view.why_escapes(n, inside | {n}):
                inside |= {n}
        op = SoftmaxCrossEntropyWithLogits(OutOfRange.ZERO)
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


def _one_hot(view: FusionView, nid: NodeId, dims: tuple) -> tuple[NodeId, list[NodeId]] | None:
    """``cast(equal(reshape(labels, [..., 1]), arange(C)), float)`` of the logits' ``dims``
    -> (labels, its nodes from the cast inward), else None."""
    cast = view.node(nid)
    if not isinstance(cast.op, Cast) or cast.shape.dims != dims or not cast.dtype.is_float:
        return None
    eq = view.node(cast.inputs[0])
    if not isinstance(eq.op, Compare) or eq.op.fn is not CompareKind.EQ:
        return None
    for col, cls in (eq.inputs, eq.inputs[::-1]):
        labels = CrossEntropyFusion._labels(view, col, dims)
        const = view.node(cls).op
        if labels is None or not isinstance(const, Constant):
            continue
        arr = const.value.array()
        c = dims[-1]
        if (
            arr.shape[-1:] == (c,)
            and arr.size == c
            and np.array_equal(arr.reshape(-1), np.arange(c))
        ):
            return labels, [nid, eq.id, col]
    return None


def _summed_negated(view: FusionView, mul: NodeId, rank: int) -> list[NodeId] | None:
    """``[reduce_sum over the last axis, neg]`` reading ``mul``, or ``[reduce_sum, reduce
    (mean or sum), neg]`` (the negation after the batch's reduction), else None."""
    for r in view.consumers[mul]:
        op = view.node(r).op
        if not isinstance(op, Reduce) or op.fn is not ReduceKind.SUM or op.keepdims:
            continue
        if tuple(a % rank for a in op.axes) != (rank - 1,):
            continue
        for n in view.consumers[r]:
            if _is_neg(view, n):
                return [r, n]
            red = view.node(n).op
            if isinstance(red, Reduce) and red.fn in (ReduceKind.SUM, ReduceKind.MEAN):
                negs = [k for k in view.consumers[n] if _is_neg(view, k)]
                if negs:
                    return [r, n, negs[0]]
    return None


def _is_neg(view: FusionView, nid: NodeId) -> bool:
    op = view.node(nid).op
    return isinstance(op, Unary) and op.fn is UnaryKind.NEG


def _is_mul(view: FusionView, nid: NodeId) -> bool:
    op = view.node(nid).op
    return isinstance(op, Binary) and op.fn is BinaryKind.MUL
