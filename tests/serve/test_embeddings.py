"""``/v1/embeddings`` through the official ``openai`` client on a live server: results
equal ``SentenceEncoder.encode`` of each request alone bit for bit (float and base64,
one or many texts, 64 concurrent clients of mixed lengths coalesced into batches), usage
counted as the model's own tokenizer counts, ``dimensions`` refused, and the
``/v1/models``, ``/health`` and ``/metrics`` endpoints."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rlx.serve import ServeConfig, create_app
from rlx.serve.embeddings import EmbeddingService
from tests.serve.conftest import sentences
from tests.serve.live import LiveServer

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def server(minilm_dir: Path) -> Iterator[LiveServer]:
    from rlx.models import SentenceEncoder

    config = ServeConfig(max_wait_ms=20.0, max_batch=16)
    service = EmbeddingService(SentenceEncoder(minilm_dir), MODEL, config)
    with LiveServer(create_app([service], config)) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def metric_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value of every sample on ``url/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=60).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def from_b64(item: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(item), dtype="<f4")


def test_float_equals_encode_alone_bit_for_bit(client, oracle) -> None:
    texts = sentences(5, seed=1)
    r = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert r.model == MODEL and r.object == "list"
    assert [d.index for d in r.data] == list(range(5))
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    np.testing.assert_array_equal(got, oracle.encode(texts))
    one = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    np.testing.assert_array_equal(
        np.array(one.data[0].embedding, np.float32), oracle.encode([texts[0]])[0]
    )


def test_base64_equals_encode_alone_bit_for_bit(server, oracle) -> None:
    texts = sentences(3, seed=2)
    raw = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"model": MODEL, "input": texts, "encoding_format": "base64"},
        timeout=60,
    ).json()
    got = np.stack([from_b64(d["embedding"]) for d in raw["data"]])
    np.testing.assert_array_equal(got, oracle.encode(texts))


def test_client_default_format_decodes_to_the_same_vectors(client, oracle) -> None:
    texts = sentences(2, seed=3)
    r = client.embeddings.create(model=MODEL, input=texts)  # the client picks the format
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    np.testing.assert_array_equal(got, oracle.encode(texts))


def test_usage_counts_the_tokenizer_s_tokens(client, minilm_dir) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)  # the model's max_seq_length (sentence_bert_config.json)
    texts = sentences(4, seed=4) + ["word " * 400]  # the last one is truncated
    r = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    want = sum(len(tok.encode(t).ids) for t in texts)
    assert r.usage.prompt_tokens == want and r.usage.total_tokens == want
    assert len(tok.encode("word " * 400).ids) == 256


def test_dimensions_is_refused_unless_it_is_the_model_s_size(client, oracle) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL, input="hi", dimensions=128)
    err = e.value.body
    assert err["param"] == "dimensions" and err["code"] == "unsupported_dimensions"
    assert "cannot truncate" in err["message"] and "384" in err["message"]
    r = client.embeddings.create(model=MODEL, input="hi", dimensions=384, encoding_format="float")
    np.testing.assert_array_equal(
        np.array(r.data[0].embedding, np.float32), oracle.encode(["hi"])[0]
    )


def test_64_concurrent_clients_are_batched_and_all_correct(server, client, oracle) -> None:
    before = metric_samples(server.url)
    distinct = [sentences(1 + i % 2, seed=100 + i, longest=30) for i in range(16)]
    requests = [distinct[(7 * i) % 16] for i in range(64)]  # the oracle runs 16 times

    def call(texts: list[str]) -> np.ndarray:
        r = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
        return np.array([d.embedding for d in r.data], dtype=np.float32)

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(call, requests))
    want = [oracle.encode(texts) for texts in distinct]
    for i, got in enumerate(results):
        np.testing.assert_array_equal(got, want[(7 * i) % 16])
    after = metric_samples(server.url)
    key = ("rlx_batch_size_count", (("model", MODEL),))
    rows_key = ("rlx_batch_size_sum", (("model", MODEL),))
    batches = after[key] - before.get(key, 0.0)
    rows = after[rows_key] - before.get(rows_key, 0.0)
    assert rows == sum(len(t) for t in requests)  # every row ran once
    assert batches < rows, f"{rows} rows ran in {batches} batches: nothing was coalesced"
    ok = ("rlx_requests_total", (("endpoint", "embeddings"), ("model", MODEL), ("status", "200")))
    assert after[ok] - before.get(ok, 0.0) == 64
    assert after[("rlx_queue_depth", (("model", MODEL),))] == 0


def test_models_health_and_metrics(server, client) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "rlx"
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    health = httpx.get(f"{server.url}/health", timeout=60)
    assert health.status_code == 200 and health.json() == {"status": "ok", "models": [MODEL]}
    client.embeddings.create(model=MODEL, input="count me", encoding_format="float")
    m = metric_samples(server.url)
    ok = ("rlx_requests_total", (("endpoint", "embeddings"), ("model", MODEL), ("status", "200")))
    assert m[ok] >= 1
    assert m[("rlx_tokens_total", (("kind", "prompt"), ("model", MODEL)))] >= 4
    assert m[("rlx_request_seconds_count", (("endpoint", "embeddings"), ("model", MODEL)))] >= 1
    assert m[("rlx_tokens_per_second", (("model", MODEL),))] > 0
