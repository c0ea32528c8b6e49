"""The generation loop. In: an :class:`~rlx.models.llm.model.LlmModel`, a prompt (text or
token ids) and sampling settings. Out: :class:`Generation` (text, token ids, why it
stopped, prefill / decode tokens/s), or with ``stream=True`` a :class:`TextStream` that
yields the text as it is made and holds the Generation afterwards.

One prefill of the prompt, then one decode step per new token. Generation stops at a stop
token (the tokenizer's end-of-generation ids: eos / end-of-turn), at a stop string (the
text is cut before it and never streamed past it), or after ``max_tokens``. Streamed
pieces hold back what may still change: an incomplete UTF-8 character (decoded as
U+FFFD) and the last ``len(longest stop string) - 1`` characters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.errors import InputError, ModelError
from rlx.models.llm.sampling import SamplingParams, choose

__all__ = ["Generation", "GenerationStats", "TextStream", "generate"]


@dataclass(frozen=True)
class GenerationStats:
    """Token counts and seconds of the prefill run and the decode steps."""

    prompt_tokens: int
    generated_tokens: int
    prefill_s: float
    decode_steps: int
    decode_s: float

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s > 0 else float("nan")

    def __str__(self) -> str:
        return (
            f"prefill {self.prompt_tokens} tokens: {self.prefill_tokens_per_s:.1f} tokens/s; "
            f"decode {self.decode_steps} tokens: {self.decode_tokens_per_s:.1f} tokens/s"
        )


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


def _prompt_ids(model: Any, prompt: str | Sequence[int], add_bos: bool) -> list[int]:
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ModelError(f"{model.path}: no tokenizer in the file; pass token ids")
        return model.encode(prompt, add_bos=add_bos)
    ids = [int(t) for t in prompt]
    if not ids:
        raise InputError("generate: the prompt has no tokens")
    return ids


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
    stop: Sequence[str] = (),
    stream: bool = False,
    on_text: Callable[[str], None] | None = None,
    add_bos: bool = True,
    stop_at_eos: bool = True,
    stop_ids: Sequence[int] = (),
) -> Generation | TextStream:
    """Generate up to ``max_tokens`` tokens after ``prompt`` (module docstring).
    ``temperature`` 0 is greedy; ``seed`` makes sampling reproducible; ``stop``: stop
    strings; ``on_text`` is called with each piece of text; ``add_bos``: a text prompt
    gets the file's BOS; ``stop_at_eos=False`` ignores the tokenizer's stop tokens;
    ``stop_ids``: more stop tokens. InputError when the
    prompt plus ``max_tokens`` does not fit the model's ``max_context``."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InputError(f"max_tokens must be an int >= 1, given {max_tokens!r}")
    sp = SamplingParams(float(temperature), top_k, float(top_p), seed)
    stops = [s for s in stop if s]
    ids = _prompt_ids(model, prompt, add_bos)
    need = len(ids) + max_tokens - 1  # the last new token is never run through the model
    if need > model.max_context:
        raise InputError(
            f"generate: prompt of {len(ids)} tokens + max_tokens={max_tokens} needs "
            f"{need} positions, more than max_context={model.max_context}"
        )
    stream_obj = TextStream(iter(()))
    ends = (_stop_ids(model) if stop_at_eos else frozenset()) | {int(i) for i in stop_ids}
    pieces = _loop(model, ids, max_tokens, sp, stops, stream_obj, frozenset(ends))
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


def _loop(
    model: Any,
    ids: list[int],
    max_tokens: int,
    sp: SamplingParams,
    stops: list[str],
    sink: TextStream,
    stop_ids: frozenset[int],
) -> Iterator[str]:
    rng = np.random.default_rng(sp.seed)
    hold = max((len(s) for s in stops), default=1) - 1
    has_text = model.tokenizer is not None
    times = model.times
    times.decode_tokens, times.decode_s = 0, 0.0
    times.prefill_tokens, times.prefill_s = 0, 0.0
    logits = model.prefill(ids)
    out: list[int] = []
    text, emitted, finish = "", 0, "max_tokens"
    for i in range(max_tokens):
        tok = choose(logits, sp, rng)
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
        if i + 1 < max_tokens:
            logits = model.step(tok)
    if len(text) > emitted:
        yield text[emitted:]
    stats = GenerationStats(
        len(ids), len(out), times.prefill_s, times.decode_tokens, times.decode_s
    )
    sink.result = Generation(text, out, list(ids), finish, stats)
