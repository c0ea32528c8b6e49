"""Sentence embeddings. In: a sentence-transformers (or plain Hugging Face) encoder
directory and texts. Out: float32 vectors ``[n, dim]``, as ``SentenceTransformer.encode``
gives them. The encoder is any family :mod:`rlx.models.hf` loads: BERT, RoBERTa / XLM-R,
DistilBERT, ModernBERT, NomicBERT, or a Qwen2 / Qwen3 decoder (gte-Qwen2,
Qwen3-Embedding: last-token pooling, the prompts of ``config_sentence_transformers.json``).

The pooling runs inside the compiled graph: the encoder's last hidden state is pooled
over the non-padding tokens (:func:`pool`) and the graph has two outputs, the pooled
vector and its L2-normalized form, so ``normalize=`` picks one without a second compile.

:class:`SentenceEncoder` batches like sentence-transformers: texts are sorted by token
count (longest first) to cut padding, and the order is restored at the end. Each batch is
padded to a multiple of :data:`PAD_MULTIPLE` tokens (capped at the model's
``max_length``), so a corpus needs at most ``len(buckets)`` shapes per batch size (at
most two batch sizes: ``batch_size`` and the last, shorter batch). A new shape costs a
few ms (the compiled graph plans it and shares its arena and weights with the others),
so fine buckets pay: on 2,000 generated sentences of 4-120 words, multiples of 8 pad to
1.06x the real token count where powers of two (16 ... 512) padded to 1.44x. Texts longer than
``max_length`` tokens are truncated as the tokenizer file says. :meth:`encode_batches`
is the per-batch core (an iterator in, an iterator out), for a runner that feeds shards.

``precision``: "f32"; "bf16" (``PrecisionPolicy.AutoMixedBf16``); "int8"
(``rlx.quantize`` with dynamic per-token u8 activations by default: min cosine 0.996
against transformers on the stored sentences, where static per-tensor scales reach 0.98;
``quantize_options={"activations": "static"}`` calibrates instead. ``calibration_texts``
or the built-in sample :data:`rlx.models.hf.CALIBRATION_TEXTS` calibrate static scales
and measure the AccuracyReport on ``encoder.quantization_report``).

An empty text list gives an empty ``[0, dim]`` array; a non-string text is an InputError
naming its index.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError
from rlx.ir.mir import Graph, NodeId
from rlx.models.hf import HFModel, check_precision, load
from rlx.models.hf.arch import build_encoder
from rlx.models.hf.layout import Pooling, StLayout, read_layout, resolve_prompt
from rlx.models.hf.tokenizer import check_texts

__all__ = [
    "SentenceEncoder",
    "Pooling",
    "pool",
    "sentence_graph",
    "bucket_lengths",
    "POOLING_MASK",
    "BUCKETS",
    "PAD_MULTIPLE",
]

#: Batches are padded to a multiple of this many tokens (capped at the model's max_length).
PAD_MULTIPLE = 8
#: Sequence lengths batches are padded to, up to 512 (capped at the model's max_length).
BUCKETS = tuple(range(PAD_MULTIPLE, 513, PAD_MULTIPLE))
#: ``progress=None`` shows a bar from this many batches on (when tqdm is installed).
PROGRESS_MIN_BATCHES = 8


def pool(
    g: Graph, hidden: NodeId, mask: NodeId, kind: Pooling, select: NodeId | None = None
) -> NodeId:
    """``[batch, hidden]`` from ``hidden [batch, seq, h]`` and the f32 ``mask [batch, seq]``
    (1 = token, contiguous): sentence-transformers' Pooling. Mean over tokens with the
    count clamped at 1e-9; the first / the last token (padding on either side); the max
    with padding at -1e9; the sum over sqrt(count); the mean weighted by position (1 for
    the first token, 2 for the second, ...). ``select`` (f32 ``[batch, seq]``, default
    ``mask``) picks the tokens pooled when it differs from the attention mask (prompt
    tokens left out); positions still count from the first token of ``mask``."""
    b, s, _ = g.node(hidden).shape.dims
    m3 = g.reshape(mask, (b, s, 1))
    sel = m3 if select is None else g.reshape(select, (b, s, 1))
    if kind is Pooling.MAX:
        return g.max(g.add(hidden, g.mul(g.sub(sel, 1.0), 1e9)), 1)
    if kind is Pooling.WEIGHTED_MEAN:
        w = g.mul(g.cumsum(m3, 1), sel)  # 1, 2, ... from the first token, on the selected
        return g.div(g.sum(g.mul(hidden, w), 1), g.maximum(g.sum(w, 1), 1e-9))
    if kind in (Pooling.CLS, Pooling.LAST_TOKEN):
        seen = g.cumsum(sel, 1)
        at = g.sub(seen, sel) if kind is Pooling.CLS else g.sub(seen, g.sum(sel, 1, keepdims=True))
        one_hot = g.mul(g.cast(g.eq(at, 0.0), DType.F32), sel)  # exact: one 1, zeros elsewhere
        return g.sum(g.mul(hidden, one_hot), 1)
    total = g.sum(g.mul(hidden, sel), 1)
    count = g.maximum(g.sum(sel, 1), 1e-9)
    if kind is Pooling.MEAN_SQRT_LEN:
        return g.div(total, g.sqrt(count))
    return g.div(total, count)


def _l2_normalize(g: Graph, x: NodeId) -> NodeId:
    """``x / max(||x||, 1e-12)`` over the last axis (torch.nn.functional.normalize)."""
    norm = g.sqrt(g.sum(g.mul(x, x), -1, keepdims=True))
    return g.div(x, g.maximum(norm, 1e-12))


#: The graph input of the tokens to pool, when it is not the attention mask.
POOLING_MASK = "pooling_mask"


def sentence_graph(model: HFModel, kind: Pooling, exclude_prompt: bool = False) -> Graph:
    """The encoder of ``model`` with the pooling head; outputs ``[pooled, normalized]``.
    ``exclude_prompt``: the graph takes one more i64 input, :data:`POOLING_MASK` (the
    attention mask with the prompt's tokens cleared), selecting the tokens pooled."""
    g, hidden, mask = build_encoder(model.config, f"{model.config.architecture}_{kind.value}")
    select = None
    if exclude_prompt:
        dims = g.node(mask).shape.dims
        select = g.cast(g.input(POOLING_MASK, dims, DType.I64), DType.F32)
    pooled = pool(g, hidden, mask, kind, select)
    g.set_outputs([pooled, _l2_normalize(g, pooled)])
    return g


def bucket_lengths(max_length: int) -> tuple[int, ...]:
    """The lengths batches are padded to: multiples of :data:`PAD_MULTIPLE` below
    ``max_length``, then ``max_length``."""
    return tuple(range(PAD_MULTIPLE, max_length, PAD_MULTIPLE)) + (max_length,)


class SentenceEncoder:
    """Text -> embeddings for the model directory ``path`` (see the module docstring).

    ``precision``: "f32", "bf16" or "int8"; ``num_threads``: threads of the compiled
    graph (None: rlx's default); ``calibration_texts``: sentences to calibrate INT8 on;
    ``quantize_options``: keyword arguments for ``rlx.quantize`` (``activations=``
    "dynamic" (the default here) or "static", ``method=``, ``smooth_alpha=``, ``exclude=``
    layer weight names such as ``"encoder.layer.0.output.dense.weight"``,
    ``accuracy_budget=``); ``max_shape_plans``: (batch, length) shapes the compiled graph
    keeps planned (default 16; a server batching many shapes keeps more; f32 / bf16).
    """

    def __init__(
        self,
        path: str | Path,
        precision: str = "f32",
        num_threads: int | None = None,
        *,
        calibration_texts: Sequence[str] | None = None,
        quantize_options: Mapping[str, Any] | None = None,
        max_shape_plans: int | None = None,
    ):
        check_precision(precision)
        self.layout: StLayout = read_layout(Path(path))
        self.model: HFModel = load(self.layout.transformer_dir, precision, num_threads)
        self.precision = precision
        self.graph = sentence_graph(
            self.model, self.layout.pooling, exclude_prompt=not self.layout.include_prompt
        )
        self.quantization_report: Any = None
        if precision == "int8":
            opts = dict(quantize_options or {})
            opts.setdefault("activations", "dynamic")  # per-token scales hold BERT's outliers
            result = self.model.quantize(calibration_texts, graph=self.graph, **opts)
            self.compiled = result.compiled
            self.quantization_report = result.report
        else:
            plans: dict[str, Any] = {"batch_invariant": True}  # a row's bits: any batch
            if max_shape_plans is not None:
                plans["max_shape_plans"] = max_shape_plans
            self.compiled = self.model.compile(self.graph, **plans)
        self.buckets = bucket_lengths(self.model.max_length)

    @property
    def dim(self) -> int:
        """The embedding size."""
        return self.model.config.hidden_size

    @property
    def max_length(self) -> int:
        """Texts are truncated to this many tokens (special tokens included)."""
        return self.model.max_length

    @property
    def normalize_default(self) -> bool:
        """Whether the model's modules.json ends in a Normalize module."""
        return self.layout.normalize

    @property
    def prompts(self) -> dict[str, str]:
        """The model's prompts (name -> text prepended to each input), from
        config_sentence_transformers.json."""
        return dict(self.layout.prompts)

    def resolve_prompt(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The text :meth:`encode` prepends: ``prompt`` when given, else the model's prompt
        named ``prompt_name`` (InputError listing them when it has none of that name), else
        its default prompt, else "" (sentence-transformers' rule)."""
        return resolve_prompt(self.prompts, self.layout.default_prompt_name, prompt_name, prompt)

    def _prompt_tokens(self, prompt: str) -> int:
        """The prompt's length in tokens without a trailing special token (the tokens of
        each text that sentence-transformers leaves out of the pooling)."""
        ids, special = self.model.tokenizer.tokenize_with_special([prompt])[0]
        return len(ids) - (1 if special and special[-1] else 0)

    def _pad_len(self, longest: int) -> int:
        return next(b for b in self.buckets if b >= longest)

    def encode_batches(
        self, batches: Iterable[Sequence[str]], normalize: bool | None = None
    ) -> Iterator[np.ndarray]:
        """For each batch of texts, its embeddings f32 ``[len(batch), dim]`` in the
        batch's order (padded to a bucket length, no sorting across batches)."""
        for batch in batches:
            yield self._run(self.model.tokenizer.tokenize(check_texts(batch)), normalize)

    def encode_tokenized(
        self,
        encs: Sequence[tuple[list[int], list[int]]],
        normalize: bool | None = None,
        *,
        length: int | None = None,
    ) -> np.ndarray:
        """Embeddings f32 ``[len(encs), dim]`` of texts already tokenized by
        ``model.tokenizer.tokenize``, as one batch padded to its bucket (or to the bucket
        of ``length`` tokens when that is longer: a server pads to a few length classes to
        bound the shapes it compiles; padding does not change a row's bits), in their order
        (for a server that tokenizes once to count and to batch)."""
        return self._run(list(encs), normalize, length=length)

    def replica(self, num_threads: int | None = None) -> SentenceEncoder:
        """A SentenceEncoder sharing this one's model, tokenizer and compiled program but
        with its own CompiledGraph (own params, arena and shape plans; ``num_threads``
        threads, default: this one's), so two threads can encode at once. Not for int8
        (its compiled graph comes from calibration): ValueError."""
        if self.precision == "int8":
            raise ValueError("an int8 SentenceEncoder has no replica; load another one")
        twin = copy.copy(self)
        threads = self.compiled.num_threads if num_threads is None else num_threads
        twin.compiled = self.model.compile(
            self.graph,
            num_threads=threads,
            max_shape_plans=self.compiled.options.max_shape_plans,
            batch_invariant=True,
        )
        return twin

    def _run(
        self,
        encs: list[tuple[list[int], list[int]]],
        normalize: bool | None,
        prompt_tokens: int = 0,
        length: int | None = None,
    ) -> np.ndarray:
        """Embeddings of one batch of tokenized texts, padded to its bucket (at least that
        of ``length`` tokens); the first ``prompt_tokens`` tokens of each are not pooled
        when the model leaves prompts out."""
        if not encs:
            return np.zeros((0, self.dim), np.float32)
        out = 1 if (self.layout.normalize if normalize is None else normalize) else 0
        longest = max(len(ids) for ids, _ in encs)
        pad = self._pad_len(min(max(longest, length or 0), self.max_length))
        feed = self.model.tokenizer.pad(encs, pad)
        if not self.layout.include_prompt:
            feed[POOLING_MASK] = _without_prompt(feed["attention_mask"], prompt_tokens)
        return np.asarray(self.compiled.run(feed)[out], dtype=np.float32)

    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 32,
        normalize: bool | None = None,
        progress: bool | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
    ) -> np.ndarray:
        """Embeddings f32 ``[len(texts), dim]`` in the order of ``texts``. ``normalize``
        None follows the model (a Normalize module); ``progress`` None shows a tqdm bar
        for more than a few batches when tqdm is installed. ``prompt`` (or the model's
        prompt named ``prompt_name``, or its default prompt) is prepended to each text, as
        sentence-transformers does (:meth:`resolve_prompt`)."""
        items = check_texts(texts)
        text = self.resolve_prompt(prompt_name, prompt)
        n_prompt = self._prompt_tokens(text) if text and not self.layout.include_prompt else 0
        items = [text + t for t in items] if text else items
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if not items:
            return np.zeros((0, self.dim), np.float32)
        encs = self.model.tokenizer.tokenize(items)  # once: lengths, then the batches
        order = np.argsort(-np.array([len(ids) for ids, _ in encs]), kind="stable")
        chunks = [
            [encs[j] for j in order[i : i + batch_size]] for i in range(0, len(items), batch_size)
        ]
        it: Iterable[np.ndarray] = (self._run(c, normalize, n_prompt) for c in chunks)
        if progress or (progress is None and len(chunks) >= PROGRESS_MIN_BATCHES):
            it = _with_bar(it, len(chunks))
        out = np.empty((len(items), self.dim), np.float32)
        out[order] = np.concatenate(list(it), axis=0)
        return out

    def __repr__(self) -> str:
        return (
            f"SentenceEncoder({self.model.config.architecture}, dim={self.dim}, "
            f"pooling={self.layout.pooling.value}, normalize={self.layout.normalize}, "
            f"precision={self.precision!r}, path={str(self.layout.transformer_dir)!r})"
        )


def _without_prompt(mask: np.ndarray, n: int) -> np.ndarray:
    """``mask`` with the first ``n`` tokens of each row (after any left padding) cleared."""
    out = mask.copy()
    if n:
        out[np.cumsum(mask, axis=1) <= n] = 0
    return out


def _with_bar(it: Iterable[np.ndarray], total: int) -> Iterable[np.ndarray]:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return it
    return tqdm(it, total=total, desc="encode", unit="batch")
