"""Loss ops: softmax cross-entropy from logits and integer labels, and its backward op.

* :class:`SoftmaxCrossEntropyWithLogits` ``(logits [..., C], labels [...]) -> loss [...]``:
  ``logsumexp(logits) - logits[label]`` along the last axis, one value per row
  (``torch.nn.functional.cross_entropy(..., reduction="none")`` with the classes last);
  the mean / sum of a loss stays a ``reduce`` after it.
* :class:`SoftmaxCrossEntropyBackward` ``(ct [...], logits [..., C], labels [...]) ->
  (softmax(logits) - onehot(labels)) * ct[..., None]``: its vjp wrt the logits, one row
  pass instead of the graph of primitives (softmax, scatter of the one-hot, products).

Labels are integers. ``out_of_range`` (:class:`OutOfRange`) says what a label outside
``[0, C)`` means: ``ERROR`` (the default, ``gather_elements``' rule, which the spelled-out
loss uses): labels in ``[-C, 0)`` count from the end and any other is an ``InputError``
naming the op when the graph runs; ``ZERO``: the row's loss and gradient are 0 (a one-hot
of such a label is all zeros; torch's ``ignore_index`` rows). Both are computed stably (the row's
maximum is subtracted before ``exp``); a row holding NaN or +inf, or only -inf, gives NaN
(as ``log_softmax``). The ``fuse_cross_entropy`` pass (``rlx/passes/fusion_loss.py``)
rewrites ``-log_softmax(x)[label]`` chains into the forward op; ``rlx.train`` runs it
before differentiating, so a training step's backward pass is the backward op.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.errors import InputError
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.ops.elementwise import _wide
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId

__all__ = [
    "OutOfRange",
    "SoftmaxCrossEntropyWithLogits",
    "SoftmaxCrossEntropyBackward",
    "label_rows",
    "log_softmax_rows",
]


def _check_pair(op: Op, logits: Shape, labels: Shape) -> None:
    expect(
        logits.dtype.is_float and logits.rank >= 1,
        op,
        f"logits must be a float tensor [..., classes], got {logits}",
    )
    expect(labels.dtype.is_int, op, f"labels must be an integer tensor, got {labels}")
    expect(
        labels.dims == logits.dims[:-1],
        op,
        f"labels {labels} must have the logits' dims without the class axis, "
        f"{list(logits.dims[:-1])}",
    )


class OutOfRange(enum.Enum):
    """What a label outside ``[0, classes)`` means to the cross-entropy ops."""

    ERROR = "error"  # [-C, 0) counts from the end (gather_elements); others: InputError
    ZERO = "zero"  # the row's loss and gradient are 0 (one-hot rows of zeros)


def label_rows(op: Op, labels: np.ndarray, classes: int) -> np.ndarray:
    """``labels`` flattened to int64 row indices in ``[0, classes)``: with
    ``OutOfRange.ERROR`` negative ones wrapped and an InputError naming ``op`` for the
    rest; with ``ZERO`` -1 for every label outside the range (a row to zero)."""
    i = np.asarray(labels).reshape(-1).astype(np.int64)
    if op.out_of_range is OutOfRange.ZERO:  # type: ignore[attr-defined]
        return np.where((i < 0) | (i >= classes), -1, i)
    bad = (i < -classes) | (i >= classes)
    if bad.any():
        raise InputError(
            f"{op.mnemonic}: label {int(i[bad][0])} out of range for {classes} classes "
            f"({int(bad.sum())} such labels; expected -{classes} <= label < {classes})"
        )
    return np.where(i < 0, i + classes, i)


def log_softmax_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x - max`` and ``log(sum(exp(x - max)))`` of rows ``x [R, C]``: (shifted, lse)."""
    s = x - np.max(x, axis=1, keepdims=True)
    return s, np.log(np.sum(np.exp(s), axis=1))


def _batch_first(
    g: Graph, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
) -> tuple[NodeId, ...]:
    """The inputs with their batch axis first (unbatched ones broadcast along it)."""
    from rlx.ops.axis_batch import align_batch
    from rlx.ops.rules import moveaxis

    moved = tuple(x if b is None else moveaxis(g, x, b, 0) for x, b in zip(ins, bdims, strict=True))
    return align_batch(g, moved, tuple(None if b is None else 0 for b in bdims))[0]


@register
class SoftmaxCrossEntropyWithLogits(Op):
    """``(logits [..., C] float, labels [...] int) -> logsumexp(logits) - logits[label]``
    along the last axis: the per-row cross-entropy, in the logits' dtype (module
    docstring: labels, non-finite rows)."""

    mnemonic: ClassVar[str] = "softmax_cross_entropy"
    arity: ClassVar[int] = 2
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    out_of_range: OutOfRange = OutOfRange.ERROR

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        logits, labels = ins
        _check_pair(self, logits, labels)
        return Shape(labels.dims, logits.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        x, labels = _wide(xs[0]), xs[1]
        c = x.shape[-1]
        rows = x.reshape(labels.size, c)
        idx = label_rows(self, labels, c)
        if idx.size == 0:
            return np.zeros(labels.shape, x.dtype)
        with np.errstate(all="ignore"):
            s, lse = log_softmax_rows(rows)
            loss = lse - s[np.arange(idx.size), np.maximum(idx, 0)]
            return np.where(idx < 0, 0, loss).astype(x.dtype).reshape(labels.shape)

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        logits, labels = node.inputs
        back = SoftmaxCrossEntropyBackward(self.out_of_range)
        return g.apply(back, [ct, logits, labels]), None

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.rules import ones

        t = tangents[0]  # d loss = sum((softmax - onehot) * t, classes)
        if t is None:
            return None
        logits, labels = node.inputs
        back = SoftmaxCrossEntropyBackward(self.out_of_range)
        w = g.apply(back, [ones(g, node.shape), logits, labels])
        return g.sum(g.mul(w, t), -1)

    def batch(
        self, g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
    ) -> tuple[NodeId, int | None]:
        return g.apply(self, list(_batch_first(g, ins, bdims))), 0


@register
class SoftmaxCrossEntropyBackward(Op):
    """``(ct [...], logits [..., C], labels [...]) -> (softmax(logits) - onehot(labels)) *
    ct[..., None]``: the cotangent of the logits of :class:`SoftmaxCrossEntropyWithLogits`
    from the cotangent ``ct`` of its loss (``ct`` in the logits' dtype)."""

    mnemonic: ClassVar[str] = "softmax_cross_entropy_backward"
    arity: ClassVar[int] = 3
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    out_of_range: OutOfRange = OutOfRange.ERROR

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        ct, logits, labels = ins
        _check_pair(self, logits, labels)
        expect(
            ct.dims == labels.dims and ct.dtype is logits.dtype,
            self,
            f"the cotangent {ct} must have the labels' dims {list(labels.dims)} and the "
            f"logits' dtype {logits.dtype.value}",
        )
        return logits

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        ct, x, labels = _wide(xs[0]), _wide(xs[1]), xs[2]
        c = x.shape[-1]
        rows = x.reshape(labels.size, c)
        idx = label_rows(self, labels, c)
        with np.errstate(all="ignore"):
            e = np.exp(rows - np.max(rows, axis=1, keepdims=True)) if rows.size else rows.copy()
            p = e / np.sum(e, axis=1, keepdims=True)
            keep = idx >= 0
            p[np.arange(idx.size)[keep], idx[keep]] -= 1
            p[~keep] = 0
            return (p * ct.reshape(-1, 1)).reshape(x.shape)

    # out = (s - oh) * c, s = softmax(x): linear in c; in x, c * J_softmax (symmetric)
    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        from rlx.ops.rules import ones

        c, x, labels = node.inputs
        w = g.apply(self, [ones(g, c), x, labels])
        d_c = g.sum(g.mul(ct, w), -1)
        d_x = g.mul(g.softmax_backward(ct, g.softmax(x, -1), -1), g.unsqueeze(c, -1))
        return d_c, d_x, None

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        from rlx.ops.rules import add_any

        c, x, labels = node.inputs
        tc, tx, _ = tangents
        terms = [None if tc is None else g.apply(self, [tc, x, labels])]
        if tx is not None:
            jt = g.softmax_backward(tx, g.softmax(x, -1), -1)
            terms.append(g.mul(jt, g.unsqueeze(c, -1)))
        return add_any(g, terms)

    def batch(
        self, g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
    ) -> tuple[NodeId, int | None]:
        return g.apply(self, list(_batch_first(g, ins, bdims))), 0


@graph_method
def softmax_cross_entropy(
    g: Graph, logits: NodeId, labels: NodeId, out_of_range: OutOfRange = OutOfRange.ERROR
) -> NodeId:
    """The per-row cross-entropy of ``logits [..., C]`` against integer ``labels [...]``
    (``SoftmaxCrossEntropyWithLogits``): reduce it with ``g.mean`` / ``g.sum``."""
    return g.apply(SoftmaxCrossEntropyWithLogits(out_of_range), [logits, labels])


@graph_method
def softmax_cross_entropy_backward(
    g: Graph,
    ct: NodeId,
    logits: NodeId,
    labels: NodeId,
    out_of_range: OutOfRange = OutOfRange.ERROR,
) -> NodeId:
    """``(softmax(logits) - onehot(labels)) * ct[..., None]``: the logits' cotangent."""
    return g.apply(SoftmaxCrossEntropyBackward(out_of_range), [ct, logits, labels])
