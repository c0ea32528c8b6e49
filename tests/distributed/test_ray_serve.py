"""``rlx.serve.deployment`` on a local Ray cluster (2 CPUs): two replicas of
all-MiniLM-L6-v2 behind Ray Serve's proxy, reached with the OpenAI client.

Oracle: the stored sentence-transformers embeddings (tests/data/hf/minilm.npz, made by
scripts/make_hf_references.py), not rlx. Requests spread over both replicas (the
``x-rlx-replica`` header), and killing one replica's actor mid-load loses no request the
client retries (the OpenAI client retries connection errors and 5xx: ``max_retries``)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from rlx.errors import ServeError
from tests.models.conftest import DATA, cosines, minilm_path

MODEL = "all-MiniLM-L6-v2"


def test_deployment_checks_its_arguments() -> None:
    from rlx.serve import ServeConfig, deployment

    with pytest.raises(ServeError, match="replicas must be an int >= 1, got 0"):
        deployment([MODEL], ServeConfig(), replicas=0)
    with pytest.raises(ServeError, match="cpus_per_replica must be a number > 0, got -1"):
        deployment([MODEL], ServeConfig(), cpus_per_replica=-1)
    with pytest.raises(ServeError, match="config must be a ServeConfig, got dict"):
        deployment([MODEL], {"port": 1})  # type: ignore[arg-type]
    with pytest.raises(ServeError, match="max_ongoing_requests must be an int >= 1, got 0"):
        deployment([MODEL], ServeConfig(), max_ongoing_requests=0)
    with pytest.raises(ServeError, match="no model given"):
        deployment([], ServeConfig())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """Two replicas (1 CPU each) on a local 2-CPU Ray; yields the proxy's base URL."""
    import ray
    from ray import serve

    from rlx.serve import ServeConfig, deployment

    # a machine shared with other jobs starts the proxy slowly: Ray's 5 s check is too short
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "120")
    os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "120")
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = deployment([f"{MODEL}={minilm_path()}"], ServeConfig(), replicas=2)
        serve.run(app, name="rlx", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _client(base: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=base + "/v1", api_key="unused", max_retries=10, timeout=120)


def _embed(client: Any, text: str) -> tuple[np.ndarray, str]:
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=text)
    vec = np.asarray(raw.parse().data[0].embedding, dtype=np.float32)
    return vec, raw.headers.get("x-rlx-replica", "")


def _replica_actor(replica: str) -> Any:
    import ray

    return ray.get_actor(f"SERVE_REPLICA::rlx#rlx#{replica}", namespace="serve")


@pytest.mark.slow
def test_two_replicas_spread_match_and_survive_a_kill(cluster: str) -> None:
    ref = dict(np.load(DATA / "minilm.npz"))
    texts = [str(t) for t in ref["texts"]]
    want = ref["st_embeddings"]
    client = _client(cluster)

    # spread: both replicas answer, each with the reference embeddings
    seen: dict[str, int] = {}
    got = np.zeros_like(want)
    deadline = time.monotonic() + 300
    i = 0
    while (len(seen) < 2 or i < len(texts)) and time.monotonic() < deadline:
        vec, replica = _embed(client, texts[i % len(texts)])
        got[i % len(texts)] = vec
        seen[replica] = seen.get(replica, 0) + 1
        i += 1
    assert len(seen) == 2 and "" not in seen, seen
    assert cosines(got, want).min() >= 0.99999
    assert np.abs(got - want).max() <= 1e-5

    # kill one replica's actor while 4 clients send 40 requests: every one is answered
    victim = next(iter(seen))
    n = 40
    results: list[tuple[np.ndarray, str] | None] = [None] * n
    started = threading.Event()

    def one(k: int) -> None:
        results[k] = _embed(client, texts[k % len(texts)])
        if k >= 4:
            started.set()

    import ray

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, k) for k in range(n)]
        assert started.wait(300), "no request was answered before the kill"
        ray.kill(_replica_actor(victim), no_restart=True)
        for f in futures:
            f.result()  # raises if a request failed after all its retries
    assert all(r is not None for r in results)
    vecs = np.stack([r[0] for r in results if r is not None])
    idx = [k % len(texts) for k in range(n)]
    assert cosines(vecs, want[idx]).min() >= 0.99999
    assert np.abs(vecs - want[idx]).max() <= 1e-5
    # the survivor (and any replacement Ray Serve started) answered after the kill
    after = {_embed(client, texts[0])[1] for _ in range(4)}
    assert after and victim not in after


class _Service:
    """A stand-in service: ready once ``loaded`` is set."""

    def __init__(self) -> None:
        self.loaded = False
        self.load_error: BaseException | None = None

    def ready(self) -> bool:
        return self.loaded


def test_replica_header_tags_responses_and_holds_startup_until_loaded() -> None:
    import asyncio

    from rlx.serve.ray import REPLICA_HEADER, ReplicaHeader

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await send({"type": "lifespan.startup.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> None:
        svc = _Service()
        mw = ReplicaHeader(app, "r1", [svc])  # type: ignore[list-item]
        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        startup = asyncio.ensure_future(mw({"type": "lifespan"}, None, send))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not startup.done() and sent == []  # held while the model loads
        svc.loaded = True
        await startup
        assert sent == [{"type": "lifespan.startup.complete"}]
        sent.clear()
        await mw({"type": "http"}, None, send)
        assert sent[0]["headers"] == [(b"a", b"b"), (REPLICA_HEADER.encode(), b"r1")]
        assert sent[1] == {"type": "http.response.body", "body": b"ok"}

    asyncio.run(main())
