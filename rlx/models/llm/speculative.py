"""Speculative decoding. In: the target :class:`~rlx.models.llm.model.LlmModel` and its
state after nothing, a prompt, a drafter (a second, smaller model with the same vocabulary,
or :class:`NgramDraft`: prompt lookup, no second model) and ``k`` drafted tokens per step.
Out: the target's tokens one by one (:func:`speculative_tokens`, what
:func:`rlx.models.llm.generate.generate` runs with ``draft=``), and per step the number of
drafted tokens and how many of them were accepted.

A step: the drafter proposes up to ``k`` tokens ``d1..dk`` after the context; the target
runs the last token ``t`` and ``d1..dk`` in ONE run of ``k + 1`` rows
(:meth:`~rlx.models.llm.model.SequenceState.verify`: the prefill path at the context's
position, every row's logits out), so row ``i`` holds the target's logits after ``di``.
Greedy: ``di`` is accepted while it is the argmax of row ``i - 1``; the first mismatch is
replaced by that argmax (or, when all ``k`` are accepted, row ``k`` gives one more token),
so every step adds ``accepted + 1`` tokens, each the target's own greedy choice. The
rejected rows are dropped from the target's KV cache
(:meth:`~rlx.models.llm.model.SequenceState.truncate`: later runs overwrite them before
any query reads them) and from the draft model's.

Greedy output equals plain greedy decoding by construction, up to the rounding of the
k + 1-row run against the one-row run: the packed GEMV (1-3 rows) and the GEMM (more)
round apart, so the logits of a position differ by up to about 2e-5 (absolute; measured
on Gemma-3-270M over 8 positions), and only two top logits within that of each other
could pick another token. The tests check token-for-token equality (tiny
models against transformers, Gemma-3-270M against its transformers references).

With ``temperature > 0`` the standard speculative sampling rule (Leviathan et al. 2023;
Chen et al. 2023) keeps the target's distribution exact: ``di`` drawn from the draft's
distribution ``q`` is accepted with probability ``min(1, p(di) / q(di))`` (``p``: the
target's distribution after temperature / top-k / top-p, as
:func:`~rlx.models.llm.sampling.choose` draws); on the first rejection the token is drawn
from ``max(p - q, 0)`` normalised; after ``k`` acceptances one more from ``p``. The n-gram
drafter's ``q`` is one token with probability 1. The tokens differ from plain sampling
with the same seed (other draws), their distribution does not.

:class:`NgramDraft` (prompt lookup decoding): the last ``n`` tokens of the context
(``n`` from ``max_ngram`` down to ``min_ngram``) are looked up in the earlier context; the
tokens that followed their most recent earlier occurrence are the draft. No match: a
plain one-token step. It pays where the output repeats the prompt (code edits,
extraction, summaries quoting the text); a draft model pays only when it is much cheaper
than the target (BENCHMARKS_speculative.md).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.errors import InputError
from rlx.models.llm.sampling import SamplingParams, choose

__all__ = [
    "NgramDraft",
    "accept_drafts",
    "SpeculativeCounts",
    "check_draft_model",
    "distribution",
    "speculative_tokens",
]


@dataclass(frozen=True)
class NgramDraft:
    """Prompt-lookup drafting (module docstring): match the last ``max_ngram`` down to
    ``min_ngram`` tokens of the context against its earlier tokens."""

    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        for name, v in (("max_ngram", self.max_ngram), ("min_ngram", self.min_ngram)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"NgramDraft: {name} must be an int >= 1, given {v!r}")
        if self.min_ngram > self.max_ngram:
            raise InputError(
                f"NgramDraft: min_ngram={self.min_ngram} exceeds max_ngram={self.max_ngram}"
            )

    def lookup(self, ctx: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the most recent earlier occurrence of the
        context's last n-gram (the longest n that matches); [] when none does."""
        arr = np.asarray(ctx, dtype=np.int64)
        size = len(arr)
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            # windows starting at 0..size-1-n: each has at least one token after it
            win = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((win == arr[size - n :]).all(axis=1))
            if len(hits):
                i = int(hits[-1]) + n
                return arr[i : i + k].tolist()
        return []


@dataclass
class SpeculativeCounts:
    """Per target run of the decode: ``drafted`` tokens (0: no draft, a plain step) and
    how many were ``accepted``; seconds of the target's prefill (``prefill_s``) and of the
    draft model's (``draft_prefill_s``, 0 for the n-gram drafter); ``start``: the
    ``time.perf_counter()`` the prefill started at."""

    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    draft_prefill_s: float = 0.0
    start: float = 0.0


def distribution(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """f64 ``[vocab]``: the probabilities :func:`~rlx.models.llm.sampling.choose` draws
    from (softmax of ``logits / temperature``, then top-k, then top-p); sampling only."""
    z = np.asarray(logits, dtype=np.float32).reshape(-1)
    k = z.size if sp.top_k == 0 else min(sp.top_k, z.size)
    top = np.argpartition(-z, k - 1)[:k] if k < z.size else np.arange(z.size)
    top = top[np.argsort(-z[top], kind="stable")]
    w = z[top].astype(np.float64) / sp.temperature
    p = np.exp(w - w.max())
    p /= p.sum()
    if sp.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), sp.top_p) + 1)
        p = p[:keep] / p[:keep].sum()
        top = top[:keep]
    out = np.zeros(z.size, np.float64)
    out[top] = p
    return out


def check_draft_model(target: Any, draft: Any) -> None:
    """InputError unless ``draft`` can draft for ``target``: the same vocabulary size and,
    when both files carry one, the same token list (a draft's token ids must mean the
    target's tokens)."""
    tv, dv = target.config.vocab, draft.config.vocab
    if tv != dv:
        raise InputError(
            f"generate: the draft model {draft.path} has a vocabulary of {dv} tokens, the "
            f"target {target.path} {tv}: a draft model must share the target's tokenizer"
        )
    key = "tokenizer.ggml.tokens"
    tt, dt = target.file.metadata.get(key), draft.file.metadata.get(key)
    if tt is not None and dt is not None and list(tt) != list(dt):
        i = next(j for j, (a, b) in enumerate(zip(tt, dt, strict=True)) if a != b)
        raise InputError(
            f"generate: the draft model {draft.path} has another tokenizer than the target "
            f"{target.path}: {key}[{i}] is {dt[i]!r} in the draft, {tt[i]!r} in the target"
        )


class _ModelDrafter:
    """Drafts with a second model on its own SequenceState."""

    def __init__(self, model: Any, counts: SpeculativeCounts) -> None:
        self.state = model.new_state()
        self.counts = counts

    def propose(
        self, ctx: list[int], k: int, sp: SamplingParams, rng: np.random.Generator
    ) -> tuple[list[int], list[np.ndarray] | None]:
        st = self.state
        new = ctx[st.position :]
        if st.position == 0:
            t0 = time.perf_counter()
            logits = st.prefill(ctx)
            self.counts.draft_prefill_s += time.perf_counter() - t0
        elif len(new) == 1:
            logits = st.step(new[0])
        else:
            logits = st.verify(new)[-1]
        out: list[int] = []
        qs: list[np.ndarray] | None = None if sp.greedy else []
        for i in range(k):
            tok = choose(logits, sp, rng)
            if qs is not None:
                qs.append(distribution(logits, sp))
            out.append(tok)
            if i + 1 < k:
                logits = st.step(tok)
        return out, qs

    def keep(self, n: int) -> None:
        """The first ``n`` tokens of the context are final: drop the rest."""
        if self.state.position > n:
            self.state.truncate(n)


class _NgramDrafter:
    def __init__(self, spec: NgramDraft) -> None:
        self.spec = spec

    def propose(
        self, ctx: list[int], k: int, sp: SamplingParams, rng: np.random.Generator
    ) -> tuple[list[int], list[np.ndarray] | None]:
        return self.spec.lookup(ctx, k), None

    def keep(self, n: int) -> None:
        pass


def accept_drafts(
    rows: np.ndarray,
    drafts: list[int],
    qs: list[np.ndarray] | None,
    sp: SamplingParams,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """``(accepted, next token)`` from the target's ``rows`` (``[len(drafts) + 1, vocab]``
    logits) for ``drafts`` (module docstring: greedy prefix match, or speculative
    sampling with the draft's distributions ``qs``; None: each draft had probability 1)."""
    if sp.greedy:
        a = 0
        while a < len(drafts) and int(np.argmax(rows[a])) == drafts[a]:
            a += 1
        return a, int(np.argmax(rows[a]))
    for i, d in enumerate(drafts):
        p = distribution(rows[i], sp)
        qd = 1.0 if qs is None else float(qs[i][d])
        if rng.random() < min(1.0, p[d] / qd):
            continue
        if qs is None:
            res = p.copy()
            res[d] = 0.0
        else:
            res = np.maximum(p - qs[i], 0.0)
        return i, int(rng.choice(res.size, p=res / res.sum()))
    return len(drafts), choose(rows[len(drafts)], sp, rng)


def speculative_tokens(
    state: Any,
    ids: list[int],
    max_tokens: int,
    sp: SamplingParams,
    rng: np.random.Generator,
    draft: Any,
    num_draft: int,
    counts: SpeculativeCounts,
    check: Any,
) -> Iterator[int]:
    """The target's new tokens after the prompt ``ids`` (run on ``state``), one per
    ``next``, made by speculative steps of up to ``num_draft`` drafted tokens (module
    docstring); ``draft``: an LlmModel or an :class:`NgramDraft`. A step runs only when a
    token is asked for, and never drafts past ``max_tokens``. ``counts`` receives each
    step's drafted / accepted numbers; ``check(logits, step)`` is called on the target's
    logits (the prefill's as step 0)."""
    drafter: _ModelDrafter | _NgramDrafter = (
        _NgramDrafter(draft) if isinstance(draft, NgramDraft) else _ModelDrafter(draft, counts)
    )
    counts.start = time.perf_counter()
    logits = state.prefill(ids)
    counts.prefill_s = time.perf_counter() - counts.start
    check(logits, 0)
    ctx = list(ids)
    pending = deque([choose(logits, sp, rng)])
    emitted = 0
    while True:
        while pending:
            tok = pending.popleft()
            ctx.append(tok)
            emitted += 1
            yield tok
        # one more token is wanted; ctx[-1] has not run through the target yet
        k = min(num_draft, max_tokens - emitted - 1)
        drafts, qs = drafter.propose(ctx, k, sp, rng) if k > 0 else ([], None)
        base = len(ctx) - 1
        rows = state.verify([ctx[-1], *drafts]) if drafts else state.step(ctx[-1])[None]
        check(rows, emitted)
        a, nxt = accept_drafts(rows, drafts, qs, sp, rng)
        if a < len(drafts):
            state.truncate(base + a + 1)
        drafter.keep(len(ctx) + a)
        counts.drafted.append(len(drafts))
        counts.accepted.append(a)
        pending.extend(drafts[:a])
        pending.append(nxt)
