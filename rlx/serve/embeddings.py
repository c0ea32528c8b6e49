"""``/v1/embeddings``: an :class:`EmbeddingService` serving one
:class:`~rlx.models.SentenceEncoder`, with batchers that coalesce the rows of concurrent
requests.

A request's texts are tokenized (long ones in a worker thread, off the event loop), checked
against the limits and queued as rows, longest first (as ``SentenceEncoder.encode`` orders
them, so a large request is cut into batches of similar lengths). ``workers`` batcher
threads per model (each with its own CompiledGraph, a :meth:`SentenceEncoder.replica`, of
``threads / workers`` threads: the compiled graph runs without the GIL, so they compute at
once) share the queue. Once the queue holds ``max_batch`` rows or ``max_batch_tokens``
padded tokens, or its oldest row has waited ``max_wait_ms``, a free batcher takes the
oldest row and the other waiting rows of its length class (:data:`LENGTH_CLASSES`: the row
padded to 16, 24, 32, 48, 64, ... tokens), up to ``max_batch`` rows and
``max_batch_tokens`` padded tokens, cut to a batch class (1, 2, 4, 8, ... rows, or
``max_batch``; the rest stay queued for the next batch), and runs them as one batch padded
to that length class (:meth:`SentenceEncoder.encode_tokenized`) and hands each request its
rows back. Length and batch classes bound the shapes the encoder plans (a new shape costs a
re-plan of ~10 ms; the encoder keeps 64 plans) and keep rows of similar lengths together.

Results are bit for bit those of ``SentenceEncoder.encode`` on each request alone: the
compiled encoder computes every row independently of the other rows of its batch and of
the padding after it (masked positions add exact zeros); tests/serve/test_batching.py
checks that invariant on mixed lengths, batch sizes and buckets, the other server tests
check the answers. A request whose client goes away while its rows wait is answered 499
and its rows are dropped.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rlx.serve.config import ServeConfig
from rlx.serve.errors import ApiError
from rlx.serve.metrics import Metrics, TokenKind
from rlx.serve.schema import choice, integer, type_name
from rlx.serve.service import Endpoint, ServiceKind, unless_disconnected

if TYPE_CHECKING:
    from rlx.models import SentenceEncoder

__all__ = ["EmbeddingService", "ENCODING_FORMATS"]

log = logging.getLogger("rlx.serve")

#: ``encoding_format`` values: a JSON array of floats, or base64 of little-endian float32.
ENCODING_FORMATS = ("float", "base64")

#: Requests with more characters than this are tokenized in a worker thread (shorter
#: ones take less time than the hand-off).
INLINE_CHARS = 4096

#: Lengths a batch is padded to (capped at the model's ``max_length``; longer rows pad to
#: it): about 1.5x apart, so at most a few plans per batch size.
LENGTH_CLASSES = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)

#: How far into the queue a batcher looks for rows of the oldest row's length class.
SCAN_ROWS = 4096

#: Shape plans the served encoders keep (length classes x batch classes fit).
SHAPE_PLANS = 64

Tokens = tuple[list[int], list[int]]


def length_class(length: int, max_length: int) -> int:
    """The padded length of a batch whose longest row has ``length`` tokens."""
    c = next((c for c in LENGTH_CLASSES if c >= length), length)
    return min(c, max_length)


def batch_class(n: int, max_batch: int) -> int:
    """The most rows <= ``n`` a batch runs: a power of two, or ``max_batch``."""
    if n >= max_batch:
        return max_batch
    return 1 << (n.bit_length() - 1)


def worker_layout(config: ServeConfig) -> tuple[int, int]:
    """(batcher threads per embedding model, threads of each one's compiled encoder):
    ``config.workers`` (default: 2 when there are 2 threads or more, else 1) sharing
    ``config.num_threads`` (default: rlx's)."""
    from rlx.backends.cpu.threads import resolve_threads

    total = resolve_threads(config.num_threads)
    workers = config.workers if config.workers is not None else min(2, total)
    return workers, max(1, total // workers)


@dataclass(eq=False)
class _Job:
    """One request's rows: filled by the batcher, resolved on the event loop."""

    encs: list[Tokens]
    out: np.ndarray
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop
    remaining: int
    error: BaseException | None = None


@dataclass(frozen=True, eq=False)
class _Row:
    job: _Job
    index: int
    length: int
    padded: int  # its length class


@dataclass(eq=False)
class _Queue:
    """Rows waiting for the batcher, guarded by ``cond``."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    rows: deque[_Row] = field(default_factory=deque)
    jobs: int = 0  # requests accepted and not yet answered
    closing: bool = False


def _longest(row: _Row) -> int:
    return -row.length


def _resolve(job: _Job) -> None:
    """On the event loop: hand the request its embeddings (or the error)."""
    if job.future.done():
        return
    if job.error is not None:
        job.future.set_exception(job.error)
    else:
        job.future.set_result(job.out)


class EmbeddingService:
    """Serves ``/v1/embeddings`` for ``encoder`` (a SentenceEncoder, or a function that
    loads one: it then loads in a thread when the app starts, and the service is not
    :meth:`ready` until it has) under the model id ``id``."""

    kind = ServiceKind.EMBEDDING
    endpoints = frozenset({Endpoint.EMBEDDINGS})

    def __init__(
        self,
        encoder: SentenceEncoder | Callable[[], SentenceEncoder],
        id: str,
        config: ServeConfig,
    ):
        self.id = id
        self.config = config
        self.created = int(time.time())
        self._loader: Callable[[], SentenceEncoder] | None = None
        self.encoder: SentenceEncoder | None = None
        if callable(encoder) and not hasattr(encoder, "encode_tokenized"):
            self._loader = encoder
        else:
            self.encoder = encoder  # type: ignore[assignment]
        self.load_error: BaseException | None = None
        self._queue = _Queue()
        self._metrics: Metrics | None = None
        self._thread: threading.Thread | None = None
        self._threads: list[threading.Thread] = []
        self._busy = 0  # batches running (guarded by the queue's lock)
        self._idle = threading.Event()
        self._idle.set()

    # ---- the Service protocol --------------------------------------------------------

    def ready(self) -> bool:
        return self.encoder is not None and self._thread is not None

    async def start(self, metrics: Metrics) -> None:
        self._metrics = metrics
        metrics.queue_depth.labels(self.id).set(0)
        self._thread = threading.Thread(
            target=self._work, name=f"rlx-serve-embed-{self.id}", daemon=True
        )
        self._thread.start()

    async def handle(self, endpoint: Endpoint, body: dict[str, Any], request: Request) -> Response:
        enc = self.encoder
        assert enc is not None and self._metrics is not None
        texts = self._inputs(body)
        fmt = choice(body, "encoding_format", ENCODING_FORMATS, "float")
        dims = integer(body, "dimensions", None)
        if dims is not None and dims != enc.dim:
            raise ApiError.bad_request(
                f"model {self.id!r} cannot truncate its embeddings: 'dimensions' must be "
                f"{enc.dim} (its size) or absent, got {dims}",
                param="dimensions",
                code="unsupported_dimensions",
            )
        if sum(len(t) for t in texts) > INLINE_CHARS:  # off the event loop
            encs = await asyncio.to_thread(enc.model.tokenizer.tokenize, texts)
        else:
            encs = enc.model.tokenizer.tokenize(texts)
        vectors = await self._submit(encs, request)
        n_tokens = sum(len(ids) for ids, _ in encs)
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(v, fmt)}
            for i, v in enumerate(vectors)
        ]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": self.id,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            }
        )

    async def drain(self) -> None:
        while not self._idle.is_set():
            await asyncio.sleep(0.01)

    def close(self) -> None:
        q = self._queue
        with q.cond:
            q.closing = True
            q.cond.notify_all()
        for t in [self._thread, *self._threads]:
            if t is not None and t is not threading.current_thread():
                t.join(timeout=30)

    # ---- requests --------------------------------------------------------------------

    def _inputs(self, body: dict[str, Any]) -> list[str]:
        """``input``: a string or a non-empty array of strings, at most ``max_inputs``."""
        value = body.get("input")
        if value is None:
            raise ApiError.bad_request("'input' is required", param="input", code="missing_field")
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list):
            raise ApiError.bad_request(
                f"'input' must be a string or an array of strings, got {type_name(value)}",
                param="input",
                code="invalid_type",
            )
        if not value:
            raise ApiError.bad_request(
                "'input' must not be an empty array", param="input", code="invalid_value"
            )
        limit = self.config.max_inputs
        if len(value) > limit:
            raise ApiError.bad_request(
                f"'input' holds {len(value)} texts, more than the server's limit of {limit} "
                "per request (max_inputs)",
                param="input",
                code="limit_exceeded",
            )
        for i, t in enumerate(value):
            if not isinstance(t, str):
                what = "token arrays are not supported; " if isinstance(t, int | list) else ""
                raise ApiError.bad_request(
                    f"'input[{i}]' must be a string ({what}got {type_name(t)})",
                    param="input",
                    code="invalid_type",
                )
        return value

    async def _submit(self, encs: list[Tokens], request: Request) -> np.ndarray:
        """Queue the rows of one request and wait for their embeddings (429 when
        ``max_queue`` requests are already waiting); when the client goes first, its rows
        are dropped."""
        enc, q, m = self.encoder, self._queue, self._metrics
        assert enc is not None and m is not None
        loop = asyncio.get_running_loop()
        job = _Job(
            encs, np.empty((len(encs), enc.dim), np.float32), loop.create_future(), loop, len(encs)
        )
        with q.cond:
            if q.closing:
                raise ApiError.unavailable("the server is shutting down", code="draining")
            if q.jobs >= self.config.max_queue:
                raise ApiError.too_many(
                    f"model {self.id!r} has {q.jobs} requests queued, the server's limit "
                    f"(max_queue); retry after {self.config.retry_after_s} s",
                    self.config.retry_after_s,
                )
            q.jobs += 1
            self._idle.clear()
            # longest first, as SentenceEncoder.encode orders a request: a long request is
            # cut into batches of similar lengths
            top = enc.max_length
            rows = sorted(
                (
                    _Row(job, i, len(ids), length_class(len(ids), top))
                    for i, (ids, _) in enumerate(encs)
                ),
                key=_longest,
            )
            q.rows.extend(rows)
            m.queue_depth.labels(self.id).set(q.jobs)
            q.cond.notify()
        m.count_tokens(self.id, TokenKind.PROMPT, sum(len(ids) for ids, _ in encs))
        try:
            return await unless_disconnected(job.future, request)
        finally:
            if not job.future.done():  # cancelled: the batcher skips its rows
                job.future.cancel()

    # ---- the batcher thread ----------------------------------------------------------

    def _work(self) -> None:
        if self._loader is not None:
            try:
                self.encoder = self._loader()
            except BaseException as e:  # reported by /health and every request
                log.exception("model %s failed to load", self.id)
                self.load_error = e
                return
        enc = self.encoder
        assert enc is not None
        workers, _ = worker_layout(self.config)
        if workers > 1 and getattr(enc, "precision", "f32") != "int8":
            for k in range(1, workers):
                try:
                    twin = enc.replica()
                except Exception:  # serve with the workers there are
                    log.exception("model %s: batch worker %d failed to compile", self.id, k)
                    break
                t = threading.Thread(
                    target=self._loop,
                    args=(twin,),
                    name=f"rlx-serve-embed-{self.id}-{k}",
                    daemon=True,
                )
                t.start()
                self._threads.append(t)
        self._loop(enc)

    def _loop(self, enc: SentenceEncoder) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if batch:
                try:
                    self._run(enc, batch)
                finally:
                    with self._queue.cond:
                        self._busy -= 1
                        if not self._queue.rows and not self._busy:
                            self._idle.set()

    def _take(self) -> list[_Row] | None:
        """The next batch: the oldest row and the queued rows of its length class (cut to
        a batch class), [] for a round that found only rows of cancelled requests, None
        once closing with nothing left."""
        q, cfg = self._queue, self.config
        with q.cond:
            while not q.rows:
                if q.closing:
                    return None
                if not self._busy:
                    self._idle.set()
                q.cond.wait()
            deadline = time.monotonic() + cfg.max_wait_ms / 1000
            while not q.closing and len(q.rows) < cfg.max_batch:
                left = deadline - time.monotonic()
                head = list(itertools.islice(q.rows, cfg.max_batch))
                if left <= 0 or self._padded(head) >= cfg.max_batch_tokens:
                    break
                q.cond.wait(left)
            while q.rows and q.rows[0].job.future.done():  # cancelled: skip its rows
                self._finish(q.rows.popleft().job, count_only=True)
            if not q.rows:
                return []
            pad = q.rows[0].padded
            limit = min(cfg.max_batch, max(1, cfg.max_batch_tokens // pad))
            picked: list[_Row] = []
            for row in itertools.islice(q.rows, SCAN_ROWS):
                if row.padded == pad and not row.job.future.done():
                    picked.append(row)
                    if len(picked) == limit:
                        break
            batch = picked[: batch_class(len(picked), cfg.max_batch)]
            taken = {id(r) for r in batch}
            q.rows = deque(r for r in q.rows if id(r) not in taken)
            self._busy += 1
            if q.rows:
                q.cond.notify()  # another batcher may take the rest
        batch.sort(key=_longest)
        return batch

    def _padded(self, rows: list[_Row]) -> int:
        return max(r.padded for r in rows) * len(rows) if rows else 0

    def _run(self, enc: SentenceEncoder, batch: list[_Row]) -> None:
        m = self._metrics
        assert m is not None
        t0 = time.perf_counter()
        error: BaseException | None = None
        try:
            encs = [r.job.encs[r.index] for r in batch]
            vectors = enc.encode_tokenized(encs, length=batch[0].padded)
        except Exception as e:  # answer every request of the batch with a 500
            log.exception("embedding batch of %d rows on %s failed", len(batch), self.id)
            error = ApiError.server_error(f"{type(e).__name__}: {e}")
        dt = time.perf_counter() - t0
        m.observe_batch(self.id, len(batch), sum(r.length for r in batch), dt)
        done: list[_Job] = []
        with self._queue.cond:  # rows of one request may run in two batchers at once
            for i, row in enumerate(batch):
                job = row.job
                if error is None:
                    job.out[row.index] = vectors[i]
                else:
                    job.error = error
                job.remaining -= 1
                if job.remaining == 0:
                    done.append(job)
        for job in done:
            job.loop.call_soon_threadsafe(_resolve, job)
            self._finish(job)

    def _finish(self, job: _Job, count_only: bool = False) -> None:
        """One request fewer in the queue (a cancelled job counts once, at its last row)."""
        if count_only:
            job.remaining -= 1
            if job.remaining:
                return
        q, m = self._queue, self._metrics
        assert m is not None
        with q.cond:
            q.jobs -= 1
            m.queue_depth.labels(self.id).set(q.jobs)


def _encode(vector: np.ndarray, fmt: str) -> Any:
    """One embedding as a list of floats, or base64 of its little-endian float32 bytes."""
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
