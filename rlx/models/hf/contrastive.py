"""A contrastive training loss on a Hugging Face encoder. In: a loaded
:class:`~rlx.models.hf.HFModel` (or its :class:`EncoderConfig`) and text pairs. Out:
:func:`mnrl_graph`, a MIR graph whose one output is the multiple-negatives ranking loss
(sentence-transformers' ``MultipleNegativesRankingLoss``) of a batch of pairs, the feed for
it (:func:`mnrl_inputs`) and a writable copy of the model's params (:func:`trainable`).

The batch holds the anchors then their positives (``2 * pairs`` rows). Each row's token
states are mean-pooled over its real tokens and L2-normalized; the loss is the mean over
anchors ``i`` of the cross entropy of ``scale * cos(anchor_i, positive_j)`` over ``j``
with target ``j = i`` (the other pairs' positives are the negatives). Because the graph's
batch is symbolic, the two halves are picked by matmuls with the 0/1 selection inputs
``select_anchor`` / ``select_positive`` (``[pairs, 2 * pairs]``) and the targets come as
the one-hot ``labels`` (``[pairs, pairs]``, the identity), all made by :func:`mnrl_inputs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx.errors import ModelError
from rlx.ir.mir import Graph
from rlx.models.hf.arch import build_encoder
from rlx.models.hf.config import EncoderConfig
from rlx.ops.compose.losses import cross_entropy

__all__ = ["mnrl_graph", "mnrl_inputs", "trainable"]


def mnrl_graph(cfg: EncoderConfig, scale: float = 20.0, name: str = "mnrl") -> Graph:
    """The encoder of ``cfg`` with the loss above as its one output (shape ``[1]``)."""
    g, x, mask = build_encoder(cfg, name)
    pairs = g.sym("pairs")
    batch = g.shape(mask).dims[0]
    sel_a = g.input("select_anchor", (pairs, batch))
    sel_p = g.input("select_positive", (pairs, batch))
    labels = g.input("labels", (pairs, pairs))
    m = g.unsqueeze(mask, -1)
    pooled = g.div(g.sum(g.mul(x, m), 1), g.sum(m, 1))
    e = g.mul(pooled, g.rsqrt(g.sum(g.mul(pooled, pooled), -1, keepdims=True)))
    a, p = g.matmul(sel_a, e), g.matmul(sel_p, e)
    scores = g.mul(g.matmul(a, g.transpose(p, (1, 0))), float(scale))
    g.set_outputs([g.reshape(cross_entropy(g, scores, labels), (1,))])
    return g.verify()


def mnrl_inputs(model: Any, anchors: Sequence[str], positives: Sequence[str]) -> dict:
    """The graph inputs of :func:`mnrl_graph` for ``anchors[i]`` paired with
    ``positives[i]``: the tokenized texts (anchors first, padded to the longest) and the
    selection / label matrices."""
    n = len(anchors)
    if n < 1 or len(positives) != n:
        raise ModelError(
            f"mnrl_inputs: need as many positives as anchors (>= 1), got {n} anchors and "
            f"{len(positives)} positives"
        )
    feed = dict(model.inputs(list(anchors) + list(positives)))
    eye = np.eye(n, dtype=np.float32)
    zero = np.zeros((n, n), dtype=np.float32)
    feed["select_anchor"] = np.concatenate([eye, zero], 1)
    feed["select_positive"] = np.concatenate([zero, eye], 1)
    feed["labels"] = eye
    return feed


def trainable(params: Mapping[str, np.ndarray], graph: Graph) -> dict[str, np.ndarray]:
    """Writable, contiguous f32 copies of the params ``graph`` uses (the checkpoint's
    arrays are read-only views of the file), by name."""
    used = set(graph.param_names)
    missing = used - set(params)
    if missing:
        raise ModelError(f"trainable: params {sorted(missing)} of {graph.name!r} are not given")
    return {k: np.array(params[k], dtype=np.float32, order="C") for k in graph.param_names}
