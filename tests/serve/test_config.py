"""The pieces around the app: ServeConfig checks, error objects, ``load_services``
(ids, ``ID=MODEL``, errors), the missing-extra message, ``rlx serve`` command-line
errors, and ``--precision`` (bf16 / int8 served bit for bit as SentenceEncoder computes
them at that precision)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import numpy as np
import pytest

import rlx.serve
from rlx.errors import ConfigError, ModelError, ServeError
from rlx.serve import ServeConfig, create_app, load_services
from rlx.serve.config import Precision
from rlx.serve.embeddings import EmbeddingService
from rlx.serve.errors import ApiError
from rlx.serve.loading import split_id
from rlx.serve.service import Endpoint, Service, ServiceKind
from tests.cli.conftest import run
from tests.serve.conftest import sentences
from tests.serve.live import LiveServer, wait_healthy


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"port": -1}, "ServeConfig.port must be an int >= 0, got -1"),
        ({"port": 70000}, "ServeConfig.port must be <= 65535, got 70000"),
        ({"max_batch": 0}, "ServeConfig.max_batch must be an int >= 1, got 0"),
        ({"max_batch": True}, "ServeConfig.max_batch must be an int >= 1, got True"),
        ({"max_wait_ms": "5"}, "ServeConfig.max_wait_ms must be a number >= 0.0, got '5'"),
        ({"num_threads": 0}, "ServeConfig.num_threads must be an int >= 1 or None, got 0"),
        ({"precision": "bf16"}, "ServeConfig.precision must be a Precision (F32, BF16, INT8)"),
        ({"api_key": ""}, "ServeConfig.api_key must be a non-empty string or None"),
        ({"host": ""}, "ServeConfig.host must be a non-empty string"),
    ],
)
def test_config_refuses_bad_values(kw: dict, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        ServeConfig(**kw)
    assert words in str(e.value)


def test_config_defaults_and_prompt_limit() -> None:
    c = ServeConfig()
    assert (c.host, c.port, c.api_key, c.precision) == ("127.0.0.1", 8000, None, Precision.F32)
    assert c.prompt_limit == 2048
    assert ServeConfig(ctx=512, max_prompt_tokens=100).prompt_limit == 100
    assert ServeConfig(ctx=512, max_prompt_tokens=1000).prompt_limit == 512


def test_api_error_objects() -> None:
    e = ApiError.too_many("queue full", retry_after=3)
    assert (e.status, e.headers) == (429, {"Retry-After": "3"})
    assert e.body() == {
        "error": {
            "message": "queue full",
            "type": "rate_limit_error",
            "param": None,
            "code": "queue_full",
        }
    }
    assert isinstance(e, ServeError)
    b = ApiError.bad_request("'n' must be an integer", param="n")
    assert (b.status, b.body()["error"]["param"]) == (400, "n")


def test_split_id(tmp_path: Path) -> None:
    assert split_id("mini=all-MiniLM-L6-v2") == ("mini", "all-MiniLM-L6-v2")
    assert split_id("all-MiniLM-L6-v2") == (None, "all-MiniLM-L6-v2")
    assert split_id("./a=b") == (None, "./a=b")
    odd = tmp_path / "x=y"
    odd.mkdir()
    assert split_id(str(odd)) == (None, str(odd))


def test_load_services_ids_and_errors(minilm_dir: Path, tmp_path: Path) -> None:
    config = ServeConfig()
    a, b = load_services(["all-MiniLM-L6-v2", f"local={minilm_dir}"], config)
    assert (a.id, b.id) == ("all-MiniLM-L6-v2", "local")
    assert a.kind is ServiceKind.EMBEDDING and a.endpoints == {Endpoint.EMBEDDINGS}
    assert isinstance(a, Service) and not a.ready()  # loads when the app starts
    with pytest.raises(ServeError, match="two models have the id 'all-MiniLM-L6-v2'"):
        load_services(["all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"], config)
    with pytest.raises(ServeError, match="two models have the id 'all-MiniLM-L6-v2'"):
        create_app([a, a], config)
    with pytest.raises(ModelError, match="neither a directory nor a known model name"):
        load_services(["no-such-model"], config)
    with pytest.raises(ServeError, match="no such GGUF file"):
        load_services([str(tmp_path / "missing.gguf")], config)
    with pytest.raises(ServeError, match="no model given"):
        load_services([], config)
    with pytest.raises(ModelError):  # a directory that is no encoder, refused before serving
        load_services([str(tmp_path)], config)


def test_missing_extra_names_the_pip_command() -> None:
    with pytest.raises(ServeError) as e:
        rlx.serve.require("rlx_no_such_module_for_serve", what="rlx serve")
    assert "install the serve extra: pip install 'rlx[serve]'" in str(e.value)
    assert "rlx_no_such_module_for_serve" in str(e.value)


def test_cli_errors() -> None:
    r = run(["serve"])
    assert r.code == 2 and "Missing argument 'MODELS...'" in r.err
    r = run(["serve", "all-MiniLM-L6-v2", "--precision", "fp8"])
    assert r.code == 2 and "--precision" in r.err
    r = run(["serve", "no-such-model"])
    assert r.code == 1
    assert r.err.startswith("rlx: error: model 'no-such-model' is neither a directory")
    r = run(["serve", "all-MiniLM-L6-v2", "--port", "99999"])
    assert r.code == 2 and "--port" in r.err


@pytest.mark.slow
@pytest.mark.parametrize("precision", [Precision.BF16, Precision.INT8])
def test_precision_is_served_as_the_encoder_computes_it(minilm_dir: Path, precision) -> None:
    from rlx.models import SentenceEncoder

    config = ServeConfig(precision=precision)
    (service,) = load_services([str(minilm_dir)], config, background=False)
    assert service.encoder.precision == precision.value  # type: ignore[attr-defined]
    oracle = SentenceEncoder(minilm_dir, precision=precision.value)
    texts = sentences(3, seed=11)
    with LiveServer(create_app([service], config)) as live:
        r = httpx.post(
            f"{live.url}/v1/embeddings",
            json={"model": service.id, "input": texts, "encoding_format": "float"},
            timeout=60,
        )
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    np.testing.assert_array_equal(got, oracle.encode(texts))


def test_health_says_loading_then_ok_or_error(oracle) -> None:
    release = threading.Event()

    def slow_load() -> Any:
        assert release.wait(120)
        return oracle

    def broken_load() -> Any:
        raise ModelError("model.safetensors: truncated")

    config = ServeConfig()
    slow = EmbeddingService(slow_load, "slow", config)
    with LiveServer(create_app([slow], config), wait=False) as live:
        health = httpx.get(f"{live.url}/health", timeout=60)
        assert health.status_code == 503 and health.json() == {
            "status": "loading",
            "loading": ["slow"],
        }
        r = httpx.post(
            f"{live.url}/v1/embeddings", json={"model": "slow", "input": "a"}, timeout=60
        )
        assert r.status_code == 503 and r.json()["error"]["code"] == "loading"
        release.set()
        wait_healthy(live.url)
        r = httpx.post(
            f"{live.url}/v1/embeddings", json={"model": "slow", "input": "a"}, timeout=60
        )
        assert r.status_code == 200, r.text
    broken = EmbeddingService(broken_load, "broken", config)
    with LiveServer(create_app([broken], config), wait=False) as live:
        deadline = time.monotonic() + 120
        while broken.load_error is None:
            assert time.monotonic() < deadline, "the loader never ran"
            time.sleep(0.01)
        health = httpx.get(f"{live.url}/health", timeout=60)
        assert health.status_code == 503 and health.json() == {
            "status": "error",
            "failed": ["broken"],
        }
        r = httpx.post(
            f"{live.url}/v1/embeddings", json={"model": "broken", "input": "a"}, timeout=60
        )
        err = r.json()["error"]
        assert r.status_code == 503 and err["code"] == "load_failed"
        assert err["message"] == "model 'broken' failed to load: model.safetensors: truncated"
