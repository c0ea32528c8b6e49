"""The generation loop. In: an :class:`~rlx.models.llm.model.LlmModel`, a prompt (text or
token ids) and sampling settings. Out: :class:`Generation` (text, token ids, why it
stopped, prefill / decode tokens/s), or with ``stream=True`` a :class:`TextStream` that
yields the text as it is made and holds the Generation afterwards.

One prefill of the prompt, then one decode step per new token. Generation stops at a stop
token (the tokenizer's end-of-generation ids: eos / end-of-turn), at a stop string (the
text is cut before it and never streamed past it), or after ``max_tokens``. Streamed
pieces hold back what may still change: an incomplete UTF-8 character (decoded as
U+FFFD) and the last ``len(longest stop string) - 1`` characters.

Every argument is checked when ``generate`` is called (also with ``stream=True``, before
the first ``next``): an InputError names the argument, what it must be and what was
given. Each call runs on its own :class:`~rlx.models.llm.model.SequenceState`, so calls
from several threads and interleaved streams give the text they would give one after
the other. Logits that are not finite (NaN / inf: a broken weight) end the generation
with a ModelError naming the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.errors import InputError, ModelError
from rlx.models.llm.model import check_token_ids
from rlx.models.llm.sampling import SamplingParams, choose
from rlx.models.llm.speculative import (
    NgramDraft,
    SpeculativeCounts,
    check_draft_model,
    speculative_tokens,
)

__all__ = ["Generation", "GenerationStats", "TextStream", "generate"]


@dataclass(frozen=True)
class GenerationStats:
    """Token counts and seconds of the prefill run and the decode steps."""

    prompt_tokens: int
    generated_tokens: int
    prefill_s: float
    decode_steps: int
    decode_s: float
    #: speculative decoding: per target run, the tokens drafted and accepted (else empty)
    drafted: tuple[int, ...] = ()
    accepted: tuple[int, ...] = ()

    @property
    def tokens_per_target_run(self) -> float:
        """Speculative decoding: tokens each target run of the decode made on average
        (accepted drafts + the target's own token); nan without drafting."""
        n = len(self.accepted)
        return (sum(self.accepted) + n) / n if n else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """Speculative decoding: accepted / drafted tokens (nan when nothing was drafted)."""
        d = sum(self.drafted)
        return sum(self.accepted) / d if d else float("nan")

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s > 0 else float("nan")

    def __str__(self) -> str:
        out = (
            f"prefill {self.prompt_tokens} tokens: {self.prefill_tokens_per_s:.1f} tokens/s; "
            f"decode {self.decode_steps} tokens: {self.decode_tokens_per_s:.1f} tokens/s"
        )
        if self.accepted:
            out += (
                f"; speculative: {len(self.accepted)} target runs, "
                f"{self.tokens_per_target_run:.2f} tokens per run, accepted "
                f"{sum(self.accepted)} of {sum(self.drafted)} drafted"
            )
        return out


@dataclass(frozen=True)
class Generation:
    """``text`` (the new text only), ``token_ids`` (new tokens, a stop token excluded),
    ``prompt_ids``, ``finish_reason`` ("stop_token", "stop_string" or "max_tokens")."""

    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    finish_reason: str
    stats: GenerationStats


@dataclass
class TextStream:
    """Iterate for the text pieces; ``result`` is the :class:`Generation` once done."""

    _pieces: Iterator[str]
    result: Generation | None = field(default=None)

    def __iter__(self) -> Iterator[str]:
        return self._pieces


def _prompt_ids(model: Any, prompt: str | Sequence[int], add_bos: bool | None) -> list[int]:
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ModelError(f"{model.path}: no tokenizer in the file; pass token ids")
        ids = model.encode(prompt, add_bos=add_bos)
    else:
        ids = check_token_ids(prompt, model.config.vocab, "generate: prompt").tolist()
    if not ids:
        raise InputError("generate: the prompt has no tokens (an empty text without a BOS)")
    return ids


def _stop_strings(stop: str | Sequence[str] | None) -> list[str]:
    """``stop`` as a list of non-empty stop strings: a str is one stop string."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, bytes) or not isinstance(stop, Iterable):
        raise InputError(
            f"stop must be a str or a list of str, given {type(stop).__name__} ({stop!r:.40})"
        )
    out = list(stop)
    for i, s in enumerate(out):
        if not isinstance(s, str):
            raise InputError(f"stop[{i}] is {s!r:.40} ({type(s).__name__}), expected a str")
    return [s for s in out if s]


def _extra_stop_ids(stop_ids: int | Sequence[int] | None, vocab: int) -> set[int]:
    """``stop_ids`` (one id or a sequence of ids) checked against the vocabulary."""
    if stop_ids is None:
        return set()
    if isinstance(stop_ids, (int, np.integer)) and not isinstance(stop_ids, bool):
        stop_ids = [stop_ids]
    return set(check_token_ids(stop_ids, vocab, "generate: stop_ids").tolist())


def _number(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} must be a number, given {v!r:.40} ({type(v).__name__})")
    return float(v)


def _stop_ids(model: Any) -> frozenset[int]:
    tok = model.tokenizer
    if tok is None:
        return frozenset()
    ids = getattr(tok, "stop_ids", None)
    if ids is None:
        ids = [getattr(tok, "eos_id", None)]
    return frozenset(int(i) for i in ids if i is not None)


def generate(
    model: Any,
    prompt: str | Sequence[int],
    max_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: str | Sequence[str] | None = (),
    stream: bool = False,
    on_text: Callable[[str], None] | None = None,
    add_bos: bool | None = None,
    stop_at_eos: bool = True,
    stop_ids: int | Sequence[int] | None = (),
    draft: Any = None,
    num_draft: int = 4,
) -> Generation | TextStream:
    """Generate up to ``max_tokens`` tokens after ``prompt`` (text, or token ids used as
    given) (module docstring). ``temperature`` 0 is greedy; ``seed`` (an int >= 0) makes
    sampling reproducible; ``stop``: a stop string or a list of them; ``on_text`` is
    called with each piece of text; ``add_bos``: None puts a BOS before a text prompt when
    the file says so (``tokenizer.ggml.add_bos_token``), True / False always / never (a
    text that starts with the BOS, as a chat template renders it, never gets a second
    one); ``stop_at_eos=False`` ignores the tokenizer's stop tokens; ``stop_ids``: more
    stop tokens (an id or a list of ids in ``[0, vocab)``); ``draft``: speculative decoding
    (:mod:`rlx.models.llm.speculative`) with a draft LlmModel of the same tokenizer,
    ``"ngram"`` (prompt lookup, no second model) or an ``NgramDraft``, proposing up to
    ``num_draft`` tokens per target run (greedy output equals plain decoding; with
    ``temperature > 0`` speculative sampling keeps the distribution; ``stats.accepted``
    holds the accepted tokens per run). InputError for a bad argument, a draft model of
    another vocabulary, and when the prompt plus ``max_tokens`` does not fit the model's
    (or the draft model's) ``max_context``."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InputError(f"max_tokens must be an int >= 1, given {max_tokens!r}")
    sp = SamplingParams(_number("temperature", temperature), top_k, _number("top_p", top_p), seed)
    if on_text is not None and not callable(on_text):
        raise InputError(f"on_text must be a callable or None, given {on_text!r:.40}")
    stops = _stop_strings(stop)
    extra = _extra_stop_ids(stop_ids, model.config.vocab)
    ids = _prompt_ids(model, prompt, add_bos)
    need = len(ids) + max_tokens - 1  # the last new token is never run through the model
    if need > model.max_context:
        raise InputError(
            f"generate: prompt of {len(ids)} tokens + max_tokens={max_tokens} needs "
            f"{need} positions, more than max_context={model.max_context}"
        )
    drafter = _drafter(model, draft, num_draft, need)
    stream_obj = TextStream(iter(()))
    ends = (_stop_ids(model) if stop_at_eos else frozenset()) | extra
    rng = np.random.default_rng(sp.seed)
    state = model.new_state()
    counts = SpeculativeCounts()

    def check(logits: np.ndarray, step: int) -> None:
        _check_finite(logits, step, len(ids))

    tokens = (
        _plain_tokens(state, ids, sp, rng, check)
        if drafter is None
        else speculative_tokens(state, ids, max_tokens, sp, rng, drafter, num_draft, counts, check)
    )

    def stats(generated: int) -> GenerationStats:
        if drafter is None:
            t = state.times
            return GenerationStats(len(ids), generated, t.prefill_s, t.decode_tokens, t.decode_s)
        # prefill: the target's and the draft model's; decode: the rest of the wall time
        prefill = counts.prefill_s + counts.draft_prefill_s
        total = time.perf_counter() - counts.start
        return GenerationStats(
            len(ids), generated, prefill, max(generated - 1, 0), total - prefill,
            tuple(counts.drafted), tuple(counts.accepted),
        )  # fmt: skip

    pieces = _loop(model, tokens, ids, max_tokens, stops, stream_obj, frozenset(ends), stats)
    if on_text is not None:
        pieces = _tee(pieces, on_text)
    if stream:
        stream_obj._pieces = pieces
        return stream_obj
    for _ in pieces:
        pass
    assert stream_obj.result is not None
    return stream_obj.result


def _tee(pieces: Iterator[str], fn: Callable[[str], None]) -> Iterator[str]:
    for p in pieces:
        fn(p)
        yield p


def _check_finite(logits: np.ndarray, step: int, prompt_tokens: int) -> None:
    """ModelError when ``logits`` hold NaN / inf; ``step`` 0 is the prompt's prefill."""
    flat = logits.reshape(-1)
    # a finite sum of squares means every value is finite (a NaN / inf makes it NaN / inf);
    # one BLAS pass instead of a boolean array per step. Not finite (an overflow of huge
    # but finite values, too): the exact check decides.
    with np.errstate(over="ignore", invalid="ignore"):
        fast = np.isfinite(np.dot(flat, flat))
    if fast or np.isfinite(logits).all():
        return
    nan = int(np.isnan(logits).sum())
    if step == 0:
        where = f"after the prompt of {prompt_tokens} tokens (step 0, the prefill)"
    else:
        at = prompt_tokens + step - 1
        where = f"at step {step} (after generated token {step}, at position {at})"
    raise ModelError(
        f"generate: the logits {where} are not finite: {nan} NaN and "
        f"{logits.size - nan - int(np.isfinite(logits).sum())} inf of {logits.size} values "
        f"(a NaN / inf weight, or a config value the model cannot run with)"
    )


def _drafter(model: Any, draft: Any, num_draft: Any, need: int) -> Any:
    """``draft`` checked: None, an NgramDraft, or a draft LlmModel fit for ``model``."""
    if draft is None:
        return None
    if isinstance(num_draft, bool) or not isinstance(num_draft, int) or not 1 <= num_draft <= 16:
        raise InputError(f"num_draft must be an int in [1, 16], given {num_draft!r}")
    if isinstance(draft, str):
        if draft == "ngram":
            return NgramDraft()
        raise InputError(
            f'draft must be a loaded draft model (rlx.models.llm.load(path)), "ngram" or an '
            f"NgramDraft, given the str {draft!r:.60}"
        )
    if isinstance(draft, NgramDraft):
        return draft
    if not all(hasattr(draft, a) for a in ("config", "new_state", "max_context", "file")):
        raise InputError(
            f'draft must be a loaded draft model, "ngram" or an NgramDraft, given '
            f"{type(draft).__name__} ({draft!r:.40})"
        )
    check_draft_model(model, draft)
    if need > draft.max_context:
        raise InputError(
            f"generate: the draft model's max_context={draft.max_context} is smaller than "
            f"the {need} positions the prompt + max_tokens need"
        )
    return draft


def _plain_tokens(
    state: Any, ids: list[int], sp: SamplingParams, rng: np.random.Generator, check: Any
) -> Iterator[int]:
    """Plain decoding: the prefill, then one step per token asked for."""
    logits = state.prefill(ids)
    check(logits, 0)
    step = 0
    while True:
        tok = choose(logits, sp, rng)
        yield tok
        step += 1
        logits = state.step(tok)
        check(logits, step)


def _loop(
    model: Any,
    tokens: Iterator[int],
    ids: list[int],
    max_tokens: int,
    stops: list[str],
    sink: TextStream,
    stop_ids: frozenset[int],
    stats: Callable[[int], GenerationStats],
) -> Iterator[str]:
    hold = max((len(s) for s in stops), default=1) - 1
    has_text = model.tokenizer is not None
    out: list[int] = []
    text, emitted, finish = "", 0, "max_tokens"
    for _ in range(max_tokens):
        tok = next(tokens)
        if tok in stop_ids:
            finish = "stop_token"
            break
        out.append(tok)
        if has_text:
            text = model.decode(out)
            cut = min((j for j in (text.find(s, max(0, emitted - hold)) for s in stops) if j >= 0),
                      default=-1)  # fmt: skip
            if cut >= 0:
                text, finish = text[:cut], "stop_string"
                break
            safe = len(text.rstrip("\ufffd")) - hold
            if safe > emitted:
                yield text[emitted:safe]
                emitted = safe
    if len(text) > emitted:
        yield text[emitted:]
    sink.result = Generation(text, out, list(ids), finish, stats(len(out)))
