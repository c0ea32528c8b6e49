"""Losses as graph builders, and a NumPy accuracy. In: node ids of predictions and
targets. Out: the node of the loss (one element with the default reductions), built from
ordinary ops, so that the training step differentiates it like any other node.

``cross_entropy`` is ``torch.nn.functional.cross_entropy`` with the classes on the last
axis: integer labels (``-log_softmax(logits)[label]``, a ``gather_elements``) or class
probabilities of the logits' shape (``-sum(p * log_softmax(logits))``); ``mse`` is
``torch.nn.functional.mse_loss``. ``reduction``: "mean" (default), "sum" or "none".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlx import source
from rlx.errors import InputError
from rlx.ops.indexing import GatherElements

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId

__all__ = ["cross_entropy", "mse", "accuracy"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str, what: str) -> None:
    if reduction not in _REDUCTIONS:
        raise InputError(
            f"{what}: reduction must be one of {list(_REDUCTIONS)}, given {reduction!r}",
            loc=source.capture(),
        )


def _reduce(g: Graph, x: NodeId, reduction: str) -> NodeId:
    if reduction == "none":
        return x
    return g.mean(x) if reduction == "mean" else g.sum(x)


def cross_entropy(g: Graph, logits: NodeId, target: NodeId, *, reduction: str = "mean") -> NodeId:
    """Cross-entropy of ``logits [..., C]`` (float) against integer ``target [...]``
    (class indices) or float ``target [..., C]`` (class probabilities)."""
    ls, ts = g.shape(logits), g.shape(target)
    _check_reduction(reduction, "cross_entropy")
    if not ls.dtype.is_float or ls.rank < 1:
        raise InputError(
            f"cross_entropy: logits %{logits} must be float [..., classes], given {ls}",
            loc=source.capture(),
        )
    if ts.dtype.is_int:
        if ts.dims != ls.dims[:-1]:
            raise InputError(
                f"cross_entropy: integer labels %{target} must have the logits' dims without "
                f"the class axis, {list(ls.dims[:-1])}; given {ts}",
                loc=source.capture(),
            )
        logp = g.log_softmax(logits, -1)
        picked = g.apply(GatherElements(ls.rank - 1), [logp, g.unsqueeze(target, -1)])
        nll = g.neg(g.reshape(picked, list(ts.dims)))
    elif ts.dtype.is_float:
        if ts.dims != ls.dims:
            raise InputError(
                f"cross_entropy: class probabilities %{target} must have the logits' shape "
                f"{ls}, given {ts}",
                loc=source.capture(),
            )
        t = target if ts.dtype is ls.dtype else g.cast(target, ls.dtype)
        nll = g.neg(g.sum(g.mul(t, g.log_softmax(logits, -1)), -1))
    else:
        raise InputError(
            f"cross_entropy: target %{target} must hold integer labels or float "
            f"probabilities, given {ts}",
            loc=source.capture(),
        )
    return _reduce(g, nll, reduction)


def mse(g: Graph, pred: NodeId, target: NodeId, *, reduction: str = "mean") -> NodeId:
    """Mean squared error ``(pred - target)**2`` (broadcasting), reduced."""
    _check_reduction(reduction, "mse")
    d = g.sub(pred, target)
    return _reduce(g, g.mul(d, d), reduction)


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of rows whose largest logit (last axis) is at the label."""
    logits, labels = np.asarray(logits), np.asarray(labels)
    if logits.shape[:-1] != labels.shape:
        raise InputError(
            f"accuracy: labels of shape {labels.shape} for logits of shape {logits.shape}"
        )
    return float(np.mean(np.argmax(logits, axis=-1) == labels))
