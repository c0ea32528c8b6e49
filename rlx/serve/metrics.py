"""Prometheus metrics of one app, in their own registry (two apps in one process do not
share counters). ``/metrics`` serves :meth:`Metrics.render`. Every name starts ``rlx_``;
docs/serving.md lists them."""

from __future__ import annotations

import enum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["TokenKind", "Metrics", "CONTENT_TYPE"]

#: The content type of :meth:`Metrics.render` (Prometheus text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class TokenKind(enum.Enum):
    """The ``kind`` label of ``rlx_tokens_total``."""

    PROMPT = "prompt"
    COMPLETION = "completion"


class Metrics:
    """The server's counters, gauges and histograms (labels in braces):

    ``rlx_requests_total{model,endpoint,status}``, ``rlx_request_seconds{model,endpoint}``,
    ``rlx_queue_depth{model}`` (requests waiting or running), ``rlx_batch_size{model}``
    (rows per model call), ``rlx_tokens_total{model,kind}``,
    ``rlx_tokens_per_second{model}`` (of the last batch or step),
    ``rlx_kv_slots_in_use{model}``, ``rlx_time_to_first_token_seconds{model}``.
    """

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "rlx_requests", "HTTP requests answered", ["model", "endpoint", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "rlx_request_seconds",
            "Time from the request to its response (headers, for a stream)",
            ["model", "endpoint"],
            buckets=_LATENCY,
            registry=r,
        )
        self.queue_depth = Gauge(
            "rlx_queue_depth", "Requests accepted and not yet answered", ["model"], registry=r
        )
        self.batch_size = Histogram(
            "rlx_batch_size",
            "Rows (sequences) per model call",
            ["model"],
            buckets=_SIZES,
            registry=r,
        )
        self.tokens = Counter("rlx_tokens", "Tokens processed", ["model", "kind"], registry=r)
        self.tokens_per_second = Gauge(
            "rlx_tokens_per_second",
            "Tokens per second of the last model call",
            ["model"],
            registry=r,
        )
        self.kv_slots_in_use = Gauge(
            "rlx_kv_slots_in_use", "KV-cache slots holding a sequence", ["model"], registry=r
        )
        self.time_to_first_token = Histogram(
            "rlx_time_to_first_token_seconds",
            "Time from a generation request to its first token",
            ["model"],
            buckets=_LATENCY,
            registry=r,
        )

    def count_tokens(self, model: str, kind: TokenKind, n: int) -> None:
        """Add ``n`` tokens of ``kind`` to ``rlx_tokens_total``."""
        if n:
            self.tokens.labels(model, kind.value).inc(n)

    def observe_batch(self, model: str, rows: int, tokens: int, seconds: float) -> None:
        """One model call on ``rows`` sequences holding ``tokens`` real tokens."""
        self.batch_size.labels(model).observe(rows)
        if seconds > 0:
            self.tokens_per_second.labels(model).set(tokens / seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
