"""Cross-encoder rerankers. In: a Hugging Face ``...ForSequenceClassification`` directory
(BERT, RoBERTa, XLM-R, DistilBERT: :data:`rlx.models.hf.CLASSIFIER_ARCHITECTURES`) and
text pairs. Out: one score per pair (or ``num_labels`` logits), as sentence-transformers'
``CrossEncoder.predict`` gives them, and ``rank`` results as ``CrossEncoder.rank``.

The classification head runs inside the compiled graph on the first token's vector
(transformers' heads): BERT's pooler (dense + tanh) then ``classifier``; RoBERTa's
``classifier.dense`` + tanh then ``classifier.out_proj``; DistilBERT's ``pre_classifier``
+ ReLU then ``classifier``. The graph outputs the logits ``[batch, num_labels]``.

The activation on the logits is the one sentence-transformers 6 picks (:func:`activation_of`):
``activation_fn`` of ``config_sentence_transformers.json``, else ``config.json``'s
``sentence_transformers.activation_fn`` or (older files) ``sbert_ce_default_activation_function``,
a ``torch.*`` path; else sigmoid when ``num_labels == 1`` and identity otherwise. Pairs are
tokenized by the checkpoint's tokenizer as pairs (its pair template: type ids 0 / 1 for
BERT, unless ``tokenizer_config.json``'s ``model_input_names`` leaves them out), truncated
together to the model's max length, batched longest first and padded to
a bucket length like :class:`~rlx.models.SentenceEncoder`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import InputError, ModelError
from rlx.ir.mir import Graph
from rlx.models.hf import HFModel, Task, check_precision, load
from rlx.models.hf.arch import build_encoder
from rlx.models.hf.config import Family, read_json
from rlx.models.hf.layout import read_prompts, resolve_prompt
from rlx.models.hf.tokenizer import check_texts
from rlx.models.hf.weights import head_names
from rlx.models.sentence import bucket_lengths

__all__ = ["Reranker", "Activation", "activation_of", "classifier_graph"]


class Activation(enum.Enum):
    """What is applied to the logits before they are returned."""

    SIGMOID = "sigmoid"
    IDENTITY = "identity"
    TANH = "tanh"

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The activation of f32 ``x``, elementwise (f32)."""
        x = np.asarray(x, np.float32)
        if self is Activation.SIGMOID:
            return np.asarray(1.0 / (1.0 + np.exp(-x)), np.float32)
        if self is Activation.TANH:
            return np.tanh(x)
        return x


#: torch class paths sentence-transformers stores, and the activation each names.
TORCH_ACTIVATIONS: dict[str, Activation] = {
    "torch.nn.modules.activation.Sigmoid": Activation.SIGMOID,
    "torch.nn.Sigmoid": Activation.SIGMOID,
    "torch.nn.modules.linear.Identity": Activation.IDENTITY,
    "torch.nn.Identity": Activation.IDENTITY,
    "torch.nn.modules.activation.Tanh": Activation.TANH,
    "torch.nn.Tanh": Activation.TANH,
}


def _named(path: Any, where: Path) -> Activation | None:
    """The activation a stored class path names; None for no path, or for a path outside
    ``torch.`` (sentence-transformers ignores those without trust_remote_code)."""
    if path is None or not isinstance(path, str) or not path.startswith("torch."):
        return None
    if path not in TORCH_ACTIVATIONS:
        raise ModelError(
            f"{where}: activation_fn {path!r} is not supported; supported: "
            f"{', '.join(TORCH_ACTIVATIONS)}"
        )
    return TORCH_ACTIVATIONS[path]


def activation_of(model_dir: Path, num_labels: int) -> Activation:
    """The activation sentence-transformers applies for the checkpoint in ``model_dir``
    (see the module docstring)."""
    st = model_dir / "config_sentence_transformers.json"
    if st.is_file():
        act = _named(read_json(st, "sentence-transformers config").get("activation_fn"), st)
        if act is not None:
            return act
    cfg_path = model_dir / "config.json"
    cfg = read_json(cfg_path, "config")
    block = cfg.get("sentence_transformers")
    if isinstance(block, dict) and "activation_fn" in block:
        act = _named(block["activation_fn"], cfg_path)
    else:
        act = _named(cfg.get("sbert_ce_default_activation_function"), cfg_path)
    if act is not None:
        return act
    return Activation.SIGMOID if num_labels == 1 else Activation.IDENTITY


def classifier_graph(model: HFModel) -> Graph:
    """The encoder of ``model`` with its sequence-classification head; one output, the
    logits ``[batch, num_labels]``."""
    cfg = model.config
    if not cfg.num_labels:
        raise ModelError(f"{model.path}: {cfg.architecture} has no classification head")
    g, hidden, _ = build_encoder(cfg, f"{cfg.architecture}_rerank")
    h, n = cfg.hidden_size, cfg.num_labels
    dense, proj = head_names(cfg)
    first = g.gather(hidden, g.constant(np.int64(0)), 1)
    x = g.linear(first, g.param(f"{dense}.weight", (h, h)), g.param(f"{dense}.bias", (h,)))
    x = g.relu(x) if cfg.family is Family.DISTILBERT else g.tanh(x)
    logits = g.linear(x, g.param(f"{proj}.weight", (h, n)), g.param(f"{proj}.bias", (n,)))
    g.set_outputs([logits])
    return g


def _check_pairs(pairs: Any) -> list[tuple[str, str]]:
    """``pairs`` as a list of (str, str); InputError naming the first bad pair."""
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
        raise InputError(
            f"pairs must be a list of (query, document) string pairs, got {type(pairs).__name__}"
        )
    out: list[tuple[str, str]] = []
    for i, p in enumerate(pairs):
        if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or len(p) != 2:
            raise InputError(f"pairs[{i}] must be a pair of two strings, got {p!r:.60}")
        for j, t in enumerate(p):
            if not isinstance(t, str):
                raise InputError(
                    f"pairs[{i}][{j}] is a {type(t).__name__} ({t!r:.40}), expected a str"
                )
        check_texts(list(p))  # lone surrogates
        out.append((p[0], p[1]))
    return out


def _passes_token_types(model: HFModel) -> bool:
    """Whether transformers would feed the pair's segment ids: the model has more than one
    token type (RoBERTa / XLM-R have one) and ``tokenizer_config.json`` does not list
    ``model_input_names`` without ``token_type_ids`` (then transformers passes zeros)."""
    if model.config.type_vocab_size < 2:
        return False
    path = model.path / "tokenizer_config.json"
    names = read_json(path, "tokenizer config").get("model_input_names") if path.is_file() else None
    return not isinstance(names, list) or "token_type_ids" in names


def _is_single_pair(pairs: Any) -> bool:
    """One pair given bare (``("q", "d")``), as ``CrossEncoder.predict`` accepts."""
    return (
        isinstance(pairs, (list, tuple))
        and len(pairs) == 2
        and all(isinstance(t, str) for t in pairs)
    )


class Reranker:
    """Scores (query, document) pairs with the cross-encoder in directory ``path``.

    ``precision``: "f32", "bf16" or "int8" (as :class:`~rlx.models.SentenceEncoder`);
    ``num_threads``: threads of the compiled graph (None: rlx's default).
    """

    def __init__(
        self, path: str | Path, precision: str = "f32", num_threads: int | None = None
    ) -> None:
        check_precision(precision)
        self.model: HFModel = load(path, precision, num_threads, task=Task.RERANK)
        self.precision = precision
        self.activation: Activation = activation_of(self.model.path, self.num_labels)
        self.graph = classifier_graph(self.model)
        self.compiled = self.model.compile(self.graph)
        self.buckets = bucket_lengths(self.model.max_length)
        self._token_types = _passes_token_types(self.model)
        prompts, self.default_prompt_name = read_prompts(self.model.path)
        self.prompts: dict[str, str] = dict(prompts)

    @property
    def num_labels(self) -> int:
        """Scores per pair (1 for a reranker)."""
        return self.model.config.num_labels

    @property
    def max_length(self) -> int:
        """Pairs are truncated to this many tokens (special tokens included)."""
        return self.model.max_length

    def _logits(self, encs: list[tuple[list[int], list[int]]]) -> np.ndarray:
        pad = next(b for b in self.buckets if b >= max(len(ids) for ids, _ in encs))
        feed = self.model.tokenizer.pad(encs, pad)
        if "token_type_ids" in feed and not self._token_types:
            feed["token_type_ids"][:] = 0
        return np.asarray(self.compiled.run(feed)[0], dtype=np.float32)

    def predict(
        self,
        pairs: Sequence[Sequence[str]] | Sequence[str],
        batch_size: int = 32,
        activation: Activation | None = None,
        apply_softmax: bool = False,
        prompt_name: str | None = None,
        prompt: str | None = None,
    ) -> np.ndarray:
        """Scores f32 ``[len(pairs)]`` (``[len(pairs), num_labels]`` when ``num_labels``
        > 1) in the order of ``pairs``: the logits through ``activation`` (default: the
        checkpoint's, :attr:`activation`), then a softmax over the labels when
        ``apply_softmax`` and ``num_labels > 1``. One bare pair gives a 0-d array (one row
        for several labels); no pairs an empty array. ``prompt`` (or the prompt named
        ``prompt_name`` in config_sentence_transformers.json, or its default prompt) is
        prepended to the first text of each pair, as ``CrossEncoder`` does."""
        single = _is_single_pair(pairs)
        items = _check_pairs([pairs] if single else pairs)
        text = resolve_prompt(self.prompts, self.default_prompt_name, prompt_name, prompt)
        items = [(text + q, d) for q, d in items] if text else items
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if activation is not None and not isinstance(activation, Activation):
            raise InputError(
                f"activation must be an Activation ({', '.join(a.name for a in Activation)}), "
                f"got {activation!r}"
            )
        shape = (0,) if self.num_labels == 1 else (0, self.num_labels)
        if not items:
            return np.zeros(shape, np.float32)
        encs = self.model.tokenizer.tokenize_pairs(items)
        order = np.argsort(-np.array([len(ids) for ids, _ in encs]), kind="stable")
        logits = np.empty((len(items), self.num_labels), np.float32)
        for i in range(0, len(items), batch_size):
            idx = order[i : i + batch_size]
            logits[idx] = self._logits([encs[j] for j in idx])
        scores = (activation or self.activation).apply(logits)
        if self.num_labels == 1:
            scores = scores[:, 0]
        elif apply_softmax:
            e = np.exp(scores - scores.max(axis=1, keepdims=True))
            scores = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
        return np.asarray(scores[0]) if single else scores

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        return_documents: bool = False,
        batch_size: int = 32,
        prompt_name: str | None = None,
        prompt: str | None = None,
    ) -> list[dict[str, Any]]:
        """The documents by score, best first, as ``CrossEncoder.rank``: a list of
        ``{"corpus_id": index in documents, "score": float}`` (with ``"text"`` when
        ``return_documents``), the first ``top_k`` (None: all). Ties keep the
        documents' order. Needs a single-score model (``num_labels == 1``); the prompt
        arguments are :meth:`predict`'s."""
        if self.num_labels != 1:
            raise ModelError(
                f"rank needs a model with one score per pair (num_labels=1); "
                f"{self.model.config.architecture} at {self.model.path} has "
                f"num_labels={self.num_labels}: use predict"
            )
        if not isinstance(query, str):
            raise InputError(f"query is a {type(query).__name__} ({query!r:.40}), expected a str")
        docs = check_texts(documents)
        if not docs:
            raise InputError("documents is empty; give at least one document to rank")
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1
        ):
            raise InputError(f"top_k must be None or an int >= 1, got {top_k!r}")
        scores = self.predict(
            [(query, d) for d in docs],
            batch_size=batch_size,
            prompt_name=prompt_name,
            prompt=prompt,
        )
        out: list[dict[str, Any]] = []
        for i, s in enumerate(scores.tolist()):
            out.append(
                {"corpus_id": i, "score": s, **({"text": docs[i]} if return_documents else {})}
            )
        return sorted(out, key=lambda r: r["score"], reverse=True)[:top_k]

    def __repr__(self) -> str:
        return (
            f"Reranker({self.model.config.architecture}, num_labels={self.num_labels}, "
            f"activation={self.activation.value}, max_length={self.max_length}, "
            f"precision={self.precision!r}, path={str(self.model.path)!r})"
        )
