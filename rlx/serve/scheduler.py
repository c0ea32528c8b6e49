"""Continuous batching. In: generation requests (:class:`GenRequest`: prompt ids, sampling
settings, stops) from the event loop. Out: per request a :class:`Ticket` whose events
(:class:`Event`: new text, the token, its logprobs, the finish reason) arrive as the
tokens are made.

One worker thread owns a :class:`~rlx.models.llm.batch.BatchedDecoder` of ``parallel``
KV-cache slots. Each turn of its loop it

1. drops cancelled requests (a client gone: its slot is released at once);
2. admits waiting requests while slots are free (FIFO);
3. runs one prefill chunk of the oldest joining request: ``prefill_chunk`` tokens while
   other streams are decoding, so they keep their pace, the whole prompt when none is;
4. runs one decode step for every running request in ONE compiled run
   (:meth:`BatchedDecoder.step`) and samples each row for its own request.

Sampling, stop tokens, stop strings and the text held back are those of
:func:`rlx.models.llm.generate.generate` (``sampling.choose`` with a per-request
``numpy.random.default_rng(seed)``; text cut before a stop string and never streamed past
it; an incomplete UTF-8 character and the last ``len(longest stop) - 1`` characters held
back). The decoder computes each slot's logits as a lone sequence does, up to float
rounding (a prefill is bit for bit; a batched step differs by ~1e-5 from a one-row step:
another GEMM path), so a request's tokens and text equal ``generate()`` of the same
prompt alone (greedy, or sampled with the same seed) unless two tokens' logits tie within
that rounding. Events reach the event loop with
``loop.call_soon_threadsafe``. A full queue (``max_queue`` requests waiting for a slot)
refuses new requests with :class:`QueueFull`.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rlx.errors import InputError, ServeError
from rlx.models.llm.sampling import SamplingParams, choose
from rlx.serve.metrics import TokenKind

if TYPE_CHECKING:
    from rlx.serve.metrics import Metrics

__all__ = [
    "Decoder",
    "Event",
    "FinishReason",
    "GenRequest",
    "QueueFull",
    "Scheduler",
    "Ticket",
    "TokenLogprob",
]

log = logging.getLogger("rlx.serve")

#: Prompt tokens per prefill chunk while other streams decode.
PREFILL_CHUNK = 128


class QueueFull(ServeError):
    """``max_queue`` requests already wait for a slot."""


class FinishReason(enum.Enum):
    """Why a request ended: the value is OpenAI's ``finish_reason`` where it has one."""

    STOP = "stop"  # a stop token or a stop string
    LENGTH = "length"  # max_tokens
    CANCELLED = "cancelled"  # the client went away or the server closed
    ERROR = "error"  # the model failed (non-finite logits, a bug)


class Decoder(Protocol):
    """What the scheduler needs of :class:`~rlx.models.llm.batch.BatchedDecoder`."""

    capacity: int
    max_context: int

    def acquire(self) -> int | None: ...
    def release(self, slot: int) -> None: ...
    def in_use(self) -> int: ...
    def prefill(self, slot: int, ids: Sequence[int]) -> np.ndarray: ...
    def extend(self, slot: int, ids: Sequence[int]) -> np.ndarray: ...
    def step(self, slots: Sequence[int], tokens: Sequence[int]) -> np.ndarray: ...


@dataclass(frozen=True)
class GenRequest:
    """One generation: ``prompt_ids``, at most ``max_tokens`` new tokens, ``sampling``,
    ``stop`` strings, ``stop_ids`` (ending tokens, not part of the output) and
    ``logprobs`` (None: none; k: the chosen token's logprob and the k most likely)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    stop_ids: frozenset[int] = frozenset()
    logprobs: int | None = None


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the logits it was drawn from (f32 log-softmax)
    and the ``top`` (id, logprob) pairs, most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Event:
    """What one turn made for a request: ``text`` (new text, maybe empty), ``token_id``
    and ``logprob`` of a new token (None when no token came with it), and on the last
    event ``finish`` with ``completion_tokens`` (the request's new tokens, stop tokens
    excluded) and ``error`` (a message, for ERROR)."""

    text: str = ""
    token_id: int | None = None
    logprob: TokenLogprob | None = None
    finish: FinishReason | None = None
    completion_tokens: int = 0
    error: str | None = None


class Ticket:
    """A submitted request on the event loop's side: iterate :meth:`events`; ``cancel``
    frees its slot."""

    def __init__(self, sched: Scheduler, request: GenRequest, loop: asyncio.AbstractEventLoop):
        self.id = next(_ids)
        self.request = request
        self.submitted = time.perf_counter()
        self.first_token_s: float | None = None  # seconds from submit to the first token
        self._sched = sched
        self._loop = loop
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self.done = False

    def cancel(self) -> None:
        """Stop generating; the slot is released before the next decode step."""
        if not self.done:
            self._sched._cancel(self)

    async def events(self) -> AsyncIterator[Event]:
        """The events until (and with) the one carrying ``finish``."""
        while True:
            ev = await self._queue.get()
            yield ev
            if ev.finish is not None:
                self.done = True
                return

    def _deliver(self, ev: Event) -> bool:
        """From the worker: queue ``ev`` on the loop; False when the loop is gone."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, ev)
        except RuntimeError:  # the loop is closed: nobody listens any more
            return False
        return True


_ids = itertools.count(1)


@dataclass(eq=False)
class _Seq:
    """A request in the worker: its slot, prompt progress, output and text state."""

    ticket: Ticket
    slot: int
    rng: np.random.Generator
    stream: Any  # the tokenizer's StreamDecoder, None without a tokenizer
    hold: int
    prefilled: int = 0
    out: list[int] = field(default_factory=list)
    text: str = ""  # decoded so far (complete characters)
    emitted: int = 0
    next_token: int = -1


def _logprob(logits: np.ndarray, token: int, k: int) -> TokenLogprob:
    """log-softmax of ``logits`` (f32) at ``token`` and its ``k`` largest entries."""
    z = np.asarray(logits, np.float32)
    m = z.max()
    lse = m + np.log(np.sum(np.exp(z - m), dtype=np.float32))
    lp = z - lse
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        k = min(k, z.size)
        idx = np.argpartition(-lp, k - 1)[:k]
        idx = idx[np.argsort(-lp[idx], kind="stable")]
        top = tuple((int(i), float(lp[i])) for i in idx)
    return TokenLogprob(int(token), float(lp[token]), top)


class Scheduler:
    """Continuous batching over ``decoder`` (module docstring). ``tokenizer`` decodes the
    text (None: token ids only); ``max_queue`` requests may wait for a slot;
    ``metrics`` (optional) are updated under the label ``model_id``."""

    def __init__(
        self,
        decoder: Decoder,
        tokenizer: Any,
        max_queue: int,
        metrics: Metrics | None = None,
        model_id: str = "",
        prefill_chunk: int = PREFILL_CHUNK,
    ) -> None:
        if (
            isinstance(prefill_chunk, bool)
            or not isinstance(prefill_chunk, int)
            or prefill_chunk < 1
        ):
            raise InputError(f"prefill_chunk must be an int >= 1, given {prefill_chunk!r}")
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.max_queue = max_queue
        self.metrics = metrics
        self.model_id = model_id
        self.prefill_chunk = prefill_chunk
        self._cond = threading.Condition()
        self._waiting: deque[Ticket] = deque()
        self._joining: deque[_Seq] = deque()  # slot held, prompt not fully run
        self._running: list[_Seq] = []
        self._cancelled: set[Ticket] = set()
        self._closing = False
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._work, name="rlx-serve-gen", daemon=True)
        self._thread.start()

    # ---- the event loop's side ---------------------------------------------------------

    def submit(self, request: GenRequest) -> Ticket:
        """Queue ``request`` (call on the event loop); QueueFull when ``max_queue``
        requests wait already, InputError when it cannot fit a slot's context."""
        need = len(request.prompt_ids) + request.max_tokens - 1
        if not request.prompt_ids or need > self.decoder.max_context:
            raise InputError(
                f"scheduler: prompt of {len(request.prompt_ids)} tokens + max_tokens="
                f"{request.max_tokens} needs {need} positions, the context holds "
                f"{self.decoder.max_context}"
            )
        ticket = Ticket(self, request, asyncio.get_running_loop())
        with self._cond:
            if self._closing:
                raise ServeError("the scheduler is closed")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(
                    f"{len(self._waiting)} requests wait for a slot (the limit, max_queue)"
                )
            self._waiting.append(ticket)
            self._idle.clear()
            self._gauges()
            self._cond.notify()
        return ticket

    def _cancel(self, ticket: Ticket) -> None:
        with self._cond:
            self._cancelled.add(ticket)
            self._cond.notify()

    def idle(self) -> bool:
        """Whether no request waits or runs."""
        return self._idle.is_set()

    def wait_idle(self, timeout: float) -> bool:
        """Block until no request waits or runs, at most ``timeout`` seconds; returns
        :meth:`idle`. A request's last event reaches its ticket before the worker thread
        comes back to see the queue empty, so a caller that has all its results may still
        find ``idle()`` false for a moment."""
        return self._idle.wait(timeout)

    def counts(self) -> tuple[int, int]:
        """(requests waiting for a slot, requests holding one)."""
        with self._cond:
            return len(self._waiting), len(self._joining) + len(self._running)

    def cancelling(self) -> int:
        """Requests cancelled whose slots the worker has not yet released."""
        with self._cond:
            return len(self._cancelled)

    def close(self) -> None:
        """Cancel every request and stop the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=60)

    # ---- the worker ----------------------------------------------------------------------

    def _gauges(self) -> None:
        """Queue depth and slots in use (under ``_cond``)."""
        m = self.metrics
        if m is not None:
            held = len(self._joining) + len(self._running)
            m.queue_depth.labels(self.model_id).set(len(self._waiting) + held)
            m.kv_slots_in_use.labels(self.model_id).set(held)

    def _work(self) -> None:
        while True:
            with self._cond:
                self._drop_cancelled()
                if self._closing:
                    self._shutdown()
                    return
                self._admit()
                if not self._joining and not self._running:
                    self._idle.set()
                    self._cond.wait()
                    continue
                joining = self._joining[0] if self._joining else None
            if joining is not None:
                self._guarded(self._prefill, joining, [joining])
            if self._running:
                self._guarded(self._step, None, self._running)

    def _guarded(self, run: Any, arg: _Seq | None, hit: list[_Seq]) -> None:
        """``run(arg)`` (or ``run()``); when it raises (a model failure or a bug) the
        requests in ``hit`` end with ERROR and the worker goes on."""
        try:
            run(arg) if arg is not None else run()
        except Exception as e:
            log.exception("generation on %s failed", self.model_id or "?")
            with self._cond:
                for seq in list(hit):
                    if seq in self._joining or seq in self._running:
                        self._finish(seq, FinishReason.ERROR, error=f"{type(e).__name__}: {e}")

    def _drop_cancelled(self) -> None:
        if not self._cancelled:
            return
        for t in [t for t in self._waiting if t in self._cancelled]:
            self._waiting.remove(t)
            t._deliver(Event(finish=FinishReason.CANCELLED))
        for seq in [s for s in (*self._joining, *self._running) if s.ticket in self._cancelled]:
            self._finish(seq, FinishReason.CANCELLED)
        self._cancelled.clear()
        self._gauges()

    def _shutdown(self) -> None:
        for t in self._waiting:
            t._deliver(Event(finish=FinishReason.CANCELLED, error="the server is shutting down"))
        self._waiting.clear()
        for seq in (*self._joining, *self._running):
            self._finish(seq, FinishReason.CANCELLED, error="the server is shutting down")
        self._gauges()
        self._idle.set()

    def _admit(self) -> None:
        while self._waiting:
            slot = self.decoder.acquire()
            if slot is None:
                break
            t = self._waiting.popleft()
            r = t.request
            stream = self.tokenizer.stream(skip_special=True) if self.tokenizer else None
            hold = max((len(s) for s in r.stop), default=1) - 1
            rng = np.random.default_rng(r.sampling.seed)
            self._joining.append(_Seq(t, slot, rng, stream, hold))
        self._gauges()

    def _prefill(self, seq: _Seq) -> None:
        ids = seq.ticket.request.prompt_ids
        start = seq.prefilled
        n = len(ids) - start
        if self._running:
            n = min(n, self.prefill_chunk)
        t0 = time.perf_counter()
        chunk = list(ids[start : start + n])
        if start == 0:
            logits = self.decoder.prefill(seq.slot, chunk)
        else:
            logits = self.decoder.extend(seq.slot, chunk)
        dt = time.perf_counter() - t0
        seq.prefilled = start + n
        m = self.metrics
        if m is not None:
            m.count_tokens(self.model_id, TokenKind.PROMPT, n)
            m.observe_batch(self.model_id, 1, n, dt)
        if seq.prefilled < len(ids):
            return
        with self._cond:
            if self._joining and self._joining[0] is seq:
                self._joining.popleft()
            if seq.ticket in self._cancelled:
                self._finish(seq, FinishReason.CANCELLED)
                return
            self._running.append(seq)
            self._advance(seq, logits, step=0)

    def _step(self) -> None:
        with self._cond:
            batch = [s for s in self._running if s.ticket not in self._cancelled]
        if not batch:
            return
        t0 = time.perf_counter()
        logits = self.decoder.step([s.slot for s in batch], [s.next_token for s in batch])
        dt = time.perf_counter() - t0
        m = self.metrics
        if m is not None:
            m.observe_batch(self.model_id, len(batch), len(batch), dt)
        with self._cond:
            for i, seq in enumerate(batch):
                if seq.ticket not in self._cancelled:
                    self._advance(seq, logits[i], step=len(seq.out))

    def _advance(self, seq: _Seq, logits: np.ndarray, step: int) -> None:
        """Sample the next token of ``seq`` from ``logits`` and deliver it, as one turn of
        generate()'s loop (under ``_cond``)."""
        r = seq.ticket.request
        if not np.isfinite(logits).all():
            where = "the prefill" if step == 0 else f"step {step}"
            self._finish(seq, FinishReason.ERROR, error=f"the logits after {where} are not finite")
            return
        tok = choose(logits, r.sampling, seq.rng)
        if seq.ticket.first_token_s is None:
            seq.ticket.first_token_s = time.perf_counter() - seq.ticket.submitted
            if self.metrics is not None:
                self.metrics.time_to_first_token.labels(self.model_id).observe(
                    seq.ticket.first_token_s
                )
        if tok in r.stop_ids:
            self._finish(seq, FinishReason.STOP)
            return
        lp = _logprob(logits, tok, r.logprobs) if r.logprobs is not None else None
        seq.out.append(tok)
        piece = ""
        if seq.stream is not None:
            seq.text += seq.stream.push(tok)
            text, start = seq.text, max(0, seq.emitted - seq.hold)
            cut = min((j for j in (text.find(s, start) for s in r.stop) if j >= 0), default=-1)
            if cut >= 0:
                piece = text[seq.emitted : cut] if cut > seq.emitted else ""
                self._finish(seq, FinishReason.STOP, piece, tok, lp)
                return
            safe = len(text.rstrip("\ufffd")) - seq.hold
            if safe > seq.emitted:
                piece = text[seq.emitted : safe]
                seq.emitted = safe
        if len(seq.out) >= r.max_tokens:
            self._finish(seq, FinishReason.LENGTH, piece, tok, lp)
            return
        seq.next_token = tok
        if not seq.ticket._deliver(Event(piece, tok, lp)):
            self._cancelled.add(seq.ticket)

    def _finish(
        self,
        seq: _Seq,
        reason: FinishReason,
        piece: str | None = None,
        token: int | None = None,
        lp: TokenLogprob | None = None,
        error: str | None = None,
    ) -> None:
        """End ``seq``: release its slot, deliver the last event (under ``_cond``). With
        ``piece`` None the held-back text (and an incomplete character) goes out."""
        self.decoder.release(seq.slot)
        if seq in self._running:
            self._running.remove(seq)
        if seq in self._joining:
            self._joining.remove(seq)
        if piece is None:
            piece = ""
            if seq.stream is not None and reason in (FinishReason.STOP, FinishReason.LENGTH):
                seq.text += seq.stream.flush()
                piece = seq.text[seq.emitted :]
        elif reason is FinishReason.LENGTH and seq.stream is not None:
            seq.text += seq.stream.flush()
            piece = piece + seq.text[seq.emitted :]
        if self.metrics is not None:  # before the event: the answer implies the counts
            self.metrics.count_tokens(self.model_id, TokenKind.COMPLETION, len(seq.out))
        self._gauges()
        seq.ticket._deliver(Event(piece, token, lp, reason, len(seq.out), error))
