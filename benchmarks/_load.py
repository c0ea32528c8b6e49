"""The bounded asyncio load generator of benchmarks/serve.py: OpenAI-style requests from a
fixed number of concurrent clients (aiohttp), every loop bounded in count and time, to a
server on this machine only.

- :func:`embeddings_level`: ``concurrency`` clients share a queue of ``requests`` POSTs to
  ``/v1/embeddings`` (one sentence each, taken round-robin from the inputs); each latency is
  the time from sending to the whole response read. Throughput = completed requests / wall
  time of the level.
- :func:`generation_level`: ``streams`` clients each run streaming ``/v1/completions``
  requests (``stream=True``, greedy) back to back until ``requests`` are done; each records
  the time to the first text chunk (TTFT), the completion tokens (``usage`` when the server
  sends it, else the text chunks) and the end time. Aggregate tokens/s = all completion
  tokens / wall time.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _check_url(base: str) -> None:
    host = base.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    if host not in LOOPBACK:
        raise ValueError(f"the load generator only targets this machine; got host {host!r}")


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass
class Level:
    """One concurrency level's result; latencies and TTFTs in seconds."""

    concurrency: int
    requests: int
    errors: int
    wall_s: float
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    replicas: dict[str, int] = field(default_factory=dict)
    first_error: str = ""

    def summary(self) -> dict[str, Any]:
        ok = len(self.latencies)
        out: dict[str, Any] = {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "ok": ok,
            "errors": self.errors,
            "first_error": self.first_error,
            "wall_s": round(self.wall_s, 4),
            "throughput_rps": ok / self.wall_s if self.wall_s > 0 else 0.0,
            "p50_ms": 1e3 * percentile(self.latencies, 50),
            "p99_ms": 1e3 * percentile(self.latencies, 99),
        }
        if self.ttfts:
            out["ttft_p50_ms"] = 1e3 * percentile(self.ttfts, 50)
            out["ttft_p99_ms"] = 1e3 * percentile(self.ttfts, 99)
            out["tokens"] = self.tokens
            out["tokens_per_s"] = self.tokens / self.wall_s if self.wall_s > 0 else 0.0
        if self.replicas:
            out["replicas"] = dict(self.replicas)
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _embed_one(
    session: aiohttp.ClientSession, url: str, model: str, text: str, level: Level
) -> None:
    t0 = time.perf_counter()
    async with session.post(url, json={"model": model, "input": text}) as r:
        body = await r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {body[:200]!r}")
        data = json.loads(body)
        if len(data["data"]) != 1:
            raise RuntimeError(f"expected one embedding, got {len(data['data'])}")
    level.latencies.append(time.perf_counter() - t0)
    rep = r.headers.get("x-rlx-replica")
    if rep:
        level.replicas[rep] = level.replicas.get(rep, 0) + 1


async def embeddings_level(
    base: str,
    model: str,
    texts: list[str],
    concurrency: int,
    requests: int,
    timeout_s: float = 300.0,
) -> Level:
    """``requests`` single-sentence embedding requests from ``concurrency`` clients."""
    _check_url(base)
    level = Level(concurrency, requests, 0, 0.0)
    url = base.rstrip("/") + "/v1/embeddings"
    counter = iter(range(requests))
    deadline = time.perf_counter() + timeout_s

    async def client(session: aiohttp.ClientSession) -> None:
        for i in counter:
            if time.perf_counter() > deadline:
                level.errors += 1
                continue
            try:
                await _embed_one(session, url, model, texts[i % len(texts)], level)
            except (TimeoutError, aiohttp.ClientError, RuntimeError) as e:
                level.errors += 1
                level.first_error = level.first_error or repr(e)

    conn = aiohttp.TCPConnector(limit=concurrency)
    tmo = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=conn, timeout=tmo) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        level.wall_s = time.perf_counter() - t0
    return level


async def _stream_one(
    session: aiohttp.ClientSession, url: str, payload: dict[str, Any], level: Level
) -> None:
    t0 = time.perf_counter()
    first: float | None = None
    chunks = 0
    usage: int | None = None
    async with session.post(url, json=payload) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.read())[:200]!r}")
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = int(ev["usage"].get("completion_tokens") or 0) or usage
            for ch in ev.get("choices") or []:
                if ch.get("text"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter()
    if first is None:
        raise RuntimeError("the stream carried no text")
    level.latencies.append(time.perf_counter() - t0)
    level.ttfts.append(first - t0)
    level.tokens += usage if usage is not None else chunks


async def generation_level(
    base: str,
    model: str,
    prompts: list[str],
    streams: int,
    requests: int,
    max_tokens: int,
    timeout_s: float = 900.0,
) -> Level:
    """``requests`` streaming completions from ``streams`` concurrent clients."""
    _check_url(base)
    level = Level(streams, requests, 0, 0.0)
    url = base.rstrip("/") + "/v1/completions"
    counter = iter(range(requests))
    deadline = time.perf_counter() + timeout_s

    async def client(session: aiohttp.ClientSession) -> None:
        for i in counter:
            if time.perf_counter() > deadline:
                level.errors += 1
                continue
            payload = {
                "model": model,
                "prompt": prompts[i % len(prompts)],
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            try:
                await _stream_one(session, url, payload, level)
            except (TimeoutError, aiohttp.ClientError, RuntimeError, ValueError) as e:
                level.errors += 1
                level.first_error = level.first_error or repr(e)

    conn = aiohttp.TCPConnector(limit=streams)
    tmo = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=tmo) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(streams)))
        level.wall_s = time.perf_counter() - t0
    return level
