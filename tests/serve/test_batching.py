"""The invariant the embedding batcher rests on: a row's embedding does not depend on the
other rows of its batch, on the batch size, or on how far it is padded. Checked against
``SentenceEncoder.encode`` of each text alone, bit for bit, on rows of mixed lengths
padded to their own bucket and to 128 tokens, in batches of 1 to 12 rows; and a large request
through the service cut into small batches equals one ``encode`` call; two models in
one app each answer their own requests."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
import numpy as np
import pytest

from rlx.serve import ServeConfig, create_app
from rlx.serve.embeddings import EmbeddingService
from tests.serve.conftest import sentences
from tests.serve.live import LiveServer
from tests.serve.test_embeddings import metric_samples


@pytest.fixture(scope="module")
def served(minilm_dir: Path):
    from rlx.models import SentenceEncoder

    return SentenceEncoder(minilm_dir)


def test_rows_do_not_depend_on_batch_or_padding(served, oracle) -> None:
    texts = sentences(12, seed=21, longest=80) + ["hi", "a short one"]
    alone = np.stack([oracle.encode([t])[0] for t in texts])
    encs = served.model.tokenizer.tokenize(texts)
    lengths = np.array([len(ids) for ids, _ in encs])
    assert lengths.min() <= 8 and lengths.max() > 64  # several buckets
    rng = np.random.default_rng(0)
    checked = 0
    for size in (1, 3, 6, 12):
        idx = rng.choice(len(texts), size, replace=False)
        if size == 1:
            idx = np.array([len(texts) - 2])  # "hi": 3 tokens padded to 8 and to 128
        own = next(b for b in served.buckets if b >= int(lengths[idx].max()))
        for pad in sorted({own, 128}):
            feed = served.model.tokenizer.pad([encs[i] for i in idx], pad)
            out = np.asarray(served.compiled.run(feed)[1], np.float32)
            np.testing.assert_array_equal(out, alone[idx], err_msg=f"{size} rows at {pad}")
            checked += 1
    got = served.encode_tokenized([encs[i] for i in range(5)])  # the batcher's call
    np.testing.assert_array_equal(got, alone[:5])
    assert checked == 8


def test_a_large_request_in_small_batches_equals_one_encode(served, oracle) -> None:
    config = ServeConfig(max_batch=4, max_batch_tokens=256, max_wait_ms=0.0)
    service = EmbeddingService(served, "m", config)
    texts = sentences(30, seed=22, longest=60)
    with LiveServer(create_app([service], config)) as live:
        r = httpx.post(
            f"{live.url}/v1/embeddings",
            json={"model": "m", "input": texts, "encoding_format": "float"},
            timeout=120,
        )
        m = metric_samples(live.url)
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    np.testing.assert_array_equal(got, oracle.encode(texts))
    assert m[("rlx_batch_size_sum", (("model", "m"),))] == 30
    assert m[("rlx_batch_size_count", (("model", "m"),))] >= 30 / 4  # max_batch held
    big = ("rlx_batch_size_bucket", (("le", "4.0"), ("model", "m")))
    assert m[big] == m[("rlx_batch_size_count", (("model", "m"),))]  # no batch above 4


def test_two_models_each_answered_by_its_own(served, oracle, tmp_path: Path) -> None:
    from rlx.models import SentenceEncoder
    from rlx.serve import load_services
    from tests.models import tiny_checkpoints as tc

    tiny_dir = tc.build("bert", tmp_path / "tiny-bert")
    config = ServeConfig()
    (tiny,) = load_services([f"tiny={tiny_dir}"], config, background=False)
    mini = EmbeddingService(served, "mini", config)
    tiny_oracle = SentenceEncoder(tiny_dir)
    texts = ["a man plays a guitar", "someone plays music"]
    with LiveServer(create_app([mini, tiny], config)) as live:
        models = httpx.get(f"{live.url}/v1/models", timeout=60).json()
        answers = {
            m: httpx.post(
                f"{live.url}/v1/embeddings",
                json={"model": m, "input": texts, "encoding_format": "float"},
                timeout=60,
            ).json()
            for m in ("mini", "tiny")
        }
    assert [m["id"] for m in models["data"]] == ["mini", "tiny"]
    for m, enc in (("mini", oracle), ("tiny", tiny_oracle)):
        assert answers[m]["model"] == m
        got = np.array([d["embedding"] for d in answers[m]["data"]], np.float32)
        np.testing.assert_array_equal(got, enc.encode(texts))
    assert tiny_oracle.dim != oracle.dim


def test_length_and_batch_classes() -> None:
    from rlx.serve.embeddings import LENGTH_CLASSES, batch_class, length_class

    for n in range(1, 600):
        c = length_class(n, 256)
        assert c == 256 if n >= 256 else (n <= c <= 256 and c in LENGTH_CLASSES)
    assert {length_class(n, 512) for n in range(1, 513)} == set(LENGTH_CLASSES)
    for top in (1, 5, 32):
        sizes = {batch_class(n, top) for n in range(1, 100)}
        assert all(1 <= batch_class(n, top) <= min(n, top) for n in range(1, 100))
        assert sizes == {1 << k for k in range(top.bit_length()) if 1 << k < top} | {top}


def test_three_workers_answer_concurrent_mixed_requests_bit_for_bit(served, oracle) -> None:
    from concurrent.futures import ThreadPoolExecutor

    config = ServeConfig(max_batch=6, max_batch_tokens=512, max_wait_ms=2.0, workers=3)
    service = EmbeddingService(served, "m", config)
    distinct = [sentences(1 + i % 3, seed=300 + i, longest=90) for i in range(12)]
    requests = [distinct[(5 * i) % 12] for i in range(36)]
    with LiveServer(create_app([service], config)) as live:

        def call(texts: list[str]) -> np.ndarray:
            r = httpx.post(
                f"{live.url}/v1/embeddings",
                json={"model": "m", "input": texts, "encoding_format": "float"},
                timeout=120,
            )
            assert r.status_code == 200, r.text
            return np.array([d["embedding"] for d in r.json()["data"]], np.float32)

        with ThreadPoolExecutor(36) as pool:
            results = list(pool.map(call, requests))
        m = metric_samples(live.url)
    assert len(service._threads) == 2  # two replicas beside the encoder itself
    for i, got in enumerate(results):
        want = np.stack([oracle.encode([t])[0] for t in requests[i]])
        np.testing.assert_array_equal(got, want, err_msg=f"request {i}")
    rows = sum(len(t) for t in requests)
    assert m[("rlx_batch_size_sum", (("model", "m"),))] == rows  # every row ran once
    count = m[("rlx_batch_size_count", (("model", "m"),))]
    assert m[("rlx_batch_size_bucket", (("le", "8.0"), ("model", "m")))] == count  # max_batch
    assert m[("rlx_queue_depth", (("model", "m"),))] == 0


class _AllBlas(dict):
    """A recorded-choice table in which BLAS won every f32 product's shape class."""

    def get(self, key, default=None):
        return "blas"


def test_one_thread_replicas_keep_rows_bit_for_bit_whatever_blas_won(
    minilm_dir: Path, oracle, monkeypatch
) -> None:
    # a server's workers run one thread each, where rlx picks BLAS or its own sgemm per
    # shape class by timing: the encoder compiles batch-invariant, so a row keeps its
    # bits (those of the 2-thread oracle alone) in every batch and padding
    from rlx.backends.cpu.engines import sgemm as ks
    from rlx.models import SentenceEncoder

    monkeypatch.setattr(ks, "_read", lambda: _AllBlas())
    ks.forget_choices()
    try:
        one = SentenceEncoder(minilm_dir, num_threads=1)
        twin = one.replica(1)
        texts = [t for i in range(6) for t in sentences(1 + i % 3, seed=300 + i, longest=20)]
        alone = np.stack([oracle.encode([t])[0] for t in texts])
        encs = one.model.tokenizer.tokenize(texts)
        for enc in (one, twin):
            for rows in (1, 2, 4, 8, 12):
                for length in (None, 16, 32):
                    got = np.concatenate(
                        [
                            enc.encode_tokenized(encs[i : i + rows], length=length)
                            for i in range(0, len(encs), rows)
                        ]
                    )
                    np.testing.assert_array_equal(got, alone, err_msg=f"{rows} rows, {length}")
    finally:
        ks.forget_choices()
