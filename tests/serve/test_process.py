"""``python -m rlx serve`` as a process: SIGTERM under load lets the running requests
finish (bit for bit right), refuses new ones with 503, and exits 0; the resident memory
stays flat over 5,000 embedding requests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import numpy as np
import pytest

from tests.serve.conftest import sentences
from tests.serve.live import ROOT, free_port, spawn
from tests.serve.test_embeddings import metric_samples

MODEL = "all-MiniLM-L6-v2"


def embed(url: str, texts: list[str], client: Any = httpx, fmt: str = "float") -> Any:
    return client.post(
        f"{url}/v1/embeddings",
        json={"model": MODEL, "input": texts, "encoding_format": fmt},
        timeout=120,
    )


def wait_for(what: str, check: Any, log: Any) -> None:
    """Poll ``check()`` until it is true (a guard against a hang, not a measurement)."""
    deadline = time.monotonic() + 120
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}\n{log()}"
        time.sleep(0.02)


@pytest.mark.slow
def test_sigterm_drains_running_requests_refuses_new_ones_and_exits_0(
    tmp_path: Path, oracle
) -> None:
    # a long --max-wait-ms keeps the accepted requests waiting for their batch while the
    # test sends SIGTERM and checks that a new request is refused
    server = spawn([MODEL, "--max-wait-ms", "8000", "--max-batch", "64"], tmp_path / "log")
    try:
        requests = [sentences(1 + i % 3, seed=300 + i, longest=20) for i in range(6)]
        with ThreadPoolExecutor(len(requests)) as pool:
            running = [pool.submit(embed, server.url, texts) for texts in requests]
            depth = ("rlx_queue_depth", (("model", MODEL),))
            wait_for(
                "6 requests queued",
                lambda: metric_samples(server.url).get(depth) == len(requests),
                server.log,
            )
            server.terminate()
            wait_for(
                "/health says draining",
                lambda: httpx.get(f"{server.url}/health", timeout=60).status_code == 503,
                server.log,
            )
            assert httpx.get(f"{server.url}/health", timeout=60).json() == {"status": "draining"}
            refused = embed(server.url, ["too late"])
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "draining"
            answers = [f.result(timeout=120) for f in running]
        for texts, r in zip(requests, answers):
            assert r.status_code == 200, r.text
            got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
            np.testing.assert_array_equal(got, oracle.encode(texts))
        assert server.proc.wait(timeout=120) == 0, server.log()
        assert "draining" in server.log()
    finally:
        server.stop()


@pytest.mark.slow
def test_rss_is_flat_over_5000_requests(tmp_path: Path) -> None:
    server = spawn([MODEL, "--max-wait-ms", "2"], tmp_path / "log")
    try:
        texts = sentences(50, seed=7, longest=12)

        def burst(n: int) -> None:
            def worker(k: int) -> None:
                with httpx.Client() as client:
                    for i in range(k, n, 8):
                        r = embed(server.url, [texts[i % len(texts)]], client, "base64")
                        assert r.status_code == 200, r.text

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(worker, range(8)))

        burst(500)  # warm-up: shapes planned, pools filled
        warm = server.rss_bytes()
        burst(5000)
        end = server.rss_bytes()
        growth = end - warm
        print(
            f"server RSS after warm-up {warm / 2**20:.1f} MiB, after 5,000 more {end / 2**20:.1f} MiB"
        )
        assert growth < max(0.10 * warm, 20 << 20), (
            f"RSS grew {growth / 2**20:.1f} MiB (from {warm / 2**20:.1f} MiB) over 5,000 requests"
        )
        ok = (
            "rlx_requests_total",
            (("endpoint", "embeddings"), ("model", MODEL), ("status", "200")),
        )
        assert metric_samples(server.url)[ok] == 5500
        server.terminate()
        assert server.proc.wait(timeout=120) == 0, server.log()
    finally:
        server.stop()


@pytest.mark.slow
def test_a_model_that_fails_to_load_stops_the_server_with_status_1(
    tmp_path: Path, minilm_dir: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in minilm_dir.iterdir():  # the real directory with its weights cut short
        (broken / f.name).symlink_to(f)
    (broken / "model.safetensors").unlink()
    (broken / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    port = str(free_port())
    r = subprocess.run(
        [sys.executable, "-m", "rlx", "serve", str(broken), "--port", port],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=ROOT,
    )
    assert r.returncode == 1, r.stderr
    assert "model broken failed to load" in r.stderr, r.stderr
