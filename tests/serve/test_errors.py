"""Bad requests get OpenAI error objects naming the field or limit, and change nothing:
401 (missing or wrong API key), 404 (unknown model or path), 400 (invalid JSON, a field
of the wrong type or value, an endpoint the model does not serve, too many inputs), 413
(body too large), 429 with Retry-After (queue full), 405; a slow or vanished client does
not hold up the others. The queue is held full deterministically by an encoder wrapper
that blocks inside the model until the test releases it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import numpy as np
import openai
import pytest

from rlx.serve import ServeConfig, create_app
from rlx.serve.embeddings import EmbeddingService
from tests.serve.live import LiveServer
from tests.serve.test_embeddings import metric_samples

MODEL = "mini"
KEY = "sk-test-key"


class Gated:
    """A SentenceEncoder whose model call waits for ``open`` (set: runs at once)."""

    def __init__(self, encoder: Any):
        self.encoder = encoder
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)

    def encode_tokenized(
        self, encs: Sequence[Any], normalize: bool | None = None, **kw: Any
    ) -> np.ndarray:
        self.entered.set()
        assert self.open.wait(120), "the test never released the gate"
        return self.encoder.encode_tokenized(encs, normalize, **kw)


@pytest.fixture(scope="module")
def gated(minilm_dir: Path) -> Gated:
    from rlx.models import SentenceEncoder

    return Gated(SentenceEncoder(minilm_dir))


@pytest.fixture(scope="module")
def server(gated: Gated) -> Iterator[LiveServer]:
    # one batcher: a second one would run on a replica of the encoder, past the gate
    config = ServeConfig(api_key=KEY, max_queue=2, max_body_bytes=4096, max_inputs=4, workers=1)
    service = EmbeddingService(gated, MODEL, config)  # type: ignore[arg-type]
    with LiveServer(create_app([service], config)) as live:
        yield live


def post(server: LiveServer, body: Any, path: str = "/v1/embeddings", **kw: Any) -> Any:
    headers = {"Authorization": f"Bearer {KEY}", **kw.pop("headers", {})}
    kw.setdefault("timeout", 60)
    if isinstance(body, bytes | str) or hasattr(body, "__next__"):
        return httpx.post(f"{server.url}{path}", content=body, headers=headers, **kw)
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, **kw)


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_missing_or_wrong_api_key_is_401(server: LiveServer, oracle) -> None:
    for key in (None, "wrong"):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        r = httpx.post(
            f"{server.url}/v1/embeddings",
            json={"model": MODEL, "input": "a"},
            headers=headers,
            timeout=60,
        )
        err = error_of(r, 401)
        assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
    with pytest.raises(openai.AuthenticationError):
        client.embeddings.create(model=MODEL, input="a")
    assert httpx.get(f"{server.url}/health", timeout=60).status_code == 200  # /health needs no key
    good = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    r2 = good.embeddings.create(model=MODEL, input="a", encoding_format="float")
    np.testing.assert_array_equal(
        np.array(r2.data[0].embedding, np.float32), oracle.encode(["a"])[0]
    )


def test_unknown_model_and_path_are_404(server: LiveServer) -> None:
    err = error_of(post(server, {"model": "gpt-4", "input": "a"}), 404)
    assert err["param"] == "model" and err["code"] == "model_not_found"
    assert "'gpt-4'" in err["message"] and MODEL in err["message"]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="gpt-4", input="a")
    assert error_of(post(server, {}, path="/v1/nothing"), 404)["code"] == "unknown_url"
    r = httpx.get(
        f"{server.url}/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert "GET" in error_of(r, 405)["message"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (b"{not json", None, "not valid JSON: Expecting property name"),
        (b"\xff\xfe", None, "not UTF-8"),
        (b"[1, 2]", None, "must be a JSON object, got an array"),
        (b"[" * 2000 + b"]" * 2000, None, "nests arrays or objects too deeply"),
        ({"input": "a"}, "model", "'model' is required"),
        ({"model": 7, "input": "a"}, "model", "'model' must be a string, got an integer (7)"),
        ({"model": MODEL}, "input", "'input' is required"),
        ({"model": MODEL, "input": {"a": 1}}, "input", "must be a string or an array of strings"),
        ({"model": MODEL, "input": []}, "input", "must not be an empty array"),
        ({"model": MODEL, "input": ["a", 3]}, "input", "'input[1]' must be a string"),
        ({"model": MODEL, "input": [[1, 2]]}, "input", "token arrays are not supported"),
        ({"model": MODEL, "input": ["a"] * 5}, "input", "limit of 4 per request (max_inputs)"),
        (
            {"model": MODEL, "input": "a", "encoding_format": "hex"},
            "encoding_format",
            "'float', 'base64'",
        ),
        ({"model": MODEL, "input": "a", "dimensions": "8"}, "dimensions", "must be an integer"),
        ({"model": MODEL, "input": "a", "dimensions": True}, "dimensions", "must be an integer"),
    ],
)
def test_bad_body_is_400_naming_the_field(
    server: LiveServer, body: Any, param: Any, words: str
) -> None:
    before = metric_samples(server.url)
    err = error_of(post(server, body), 400)
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert words in err["message"], err["message"]
    after = metric_samples(server.url)
    depth = ("rlx_queue_depth", (("model", MODEL),))
    assert after[depth] == 0
    rows = ("rlx_batch_size_sum", (("model", MODEL),))
    assert after.get(rows, 0.0) == before.get(rows, 0.0)  # nothing ran


def test_endpoint_the_model_does_not_serve_is_400(server: LiveServer) -> None:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
    err = error_of(post(server, body, path="/v1/completions"), 400)
    assert err["param"] == "model" and err["code"] == "unsupported_endpoint"
    assert (
        err["message"]
        == f"model '{MODEL}' does not serve /v1/completions; it serves /v1/embeddings"
    )


def test_body_over_the_limit_is_413(server: LiveServer) -> None:
    body = {"model": MODEL, "input": "word " * 1000}
    err = error_of(post(server, body), 413)
    assert "limit of 4096 bytes (max_body_bytes)" in err["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        yield b'{"model": "mini", "input": "'
        for _ in range(100):
            yield b"x" * 100
        yield b'"}'

    err = error_of(post(server, chunks()), 413)
    assert err["code"] == "request_too_large"


def depth(server: LiveServer) -> float:
    return metric_samples(server.url)[("rlx_queue_depth", (("model", MODEL),))]


def wait_until(what: str, check: Any) -> None:
    """Poll ``check()`` until true (a guard against a hang, not a measurement)."""
    deadline = time.monotonic() + 120
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def raw_request(server: LiveServer, body: bytes) -> socket.socket:
    """A socket that has sent one embeddings request with ``body``."""
    host, port = server.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip
    return s


def test_full_queue_is_429_with_retry_after(server: LiveServer, gated: Gated, oracle) -> None:
    gated.open.clear()
    gated.entered.clear()
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(
                post, server, {"model": MODEL, "input": "first", "encoding_format": "float"}
            )
            assert gated.entered.wait(120)  # "first" is inside the model
            second = pool.submit(
                post, server, {"model": MODEL, "input": "second", "encoding_format": "float"}
            )
            wait_until("2 requests queued", lambda: depth(server) == 2)  # max_queue
            r = post(server, {"model": MODEL, "input": "third"})
            err = error_of(r, 429)
            assert r.headers["retry-after"] == "1"
            assert "2 requests queued" in err["message"] and "max_queue" in err["message"]
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
            with pytest.raises(openai.RateLimitError):
                client.embeddings.create(model=MODEL, input="fourth")
            gated.open.set()
            done = [first.result(timeout=120), second.result(timeout=120)]
    finally:
        gated.open.set()
    for text, r in zip(["first", "second"], done):
        assert r.status_code == 200
        got = np.array(r.json()["data"][0]["embedding"], np.float32)
        np.testing.assert_array_equal(got, oracle.encode([text])[0])


def test_vanished_client_s_rows_are_dropped(server: LiveServer, gated: Gated, oracle) -> None:
    rows = ("rlx_batch_size_sum", (("model", MODEL),))
    gone = ("rlx_requests_total", (("endpoint", "embeddings"), ("model", MODEL), ("status", "499")))
    before = metric_samples(server.url)
    gated.open.clear()
    gated.entered.clear()
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(
                post, server, {"model": MODEL, "input": "stays", "encoding_format": "float"}
            )
            assert gated.entered.wait(120)  # "stays" is inside the model
            s = raw_request(server, b'{"model": "mini", "input": ["vanishing", "twice"]}')
            wait_until("2 requests queued", lambda: depth(server) == 2)
            s.close()  # the client is gone while its rows wait
            wait_until(
                "the server saw the client go",
                lambda: metric_samples(server.url).get(gone, 0.0) == before.get(gone, 0.0) + 1,
            )
            gated.open.set()
            r = first.result(timeout=120)
    finally:
        gated.open.set()
    assert r.status_code == 200
    np.testing.assert_array_equal(
        np.array(r.json()["data"][0]["embedding"], np.float32), oracle.encode(["stays"])[0]
    )
    wait_until("the queue is empty", lambda: depth(server) == 0)
    assert metric_samples(server.url)[rows] == before.get(rows, 0.0) + 1  # only "stays" ran


def test_a_slow_client_does_not_block_others(server: LiveServer, oracle) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    slow = socket.create_connection((host, int(port)))
    slow.sendall(  # headers and half a body, then nothing
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"model\": "
    )  # fmt: skip
    try:
        r = post(server, {"model": MODEL, "input": "still served", "encoding_format": "float"})
        assert r.status_code == 200
        got = np.array(r.json()["data"][0]["embedding"], np.float32)
        np.testing.assert_array_equal(got, oracle.encode(["still served"])[0])
    finally:
        slow.close()
