"""The helpers of benchmarks/serve.py (no timing, no real model): the percentile (against
NumPy), the loopback-only guard, the load generator against a stub OpenAI server on
127.0.0.1 (every request counted once, replica headers tallied, streamed tokens counted),
and the report's ratios on made-up results."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _module(name: str) -> Any:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


load = _module("_load")
report = _module("_serve_report")


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 100])
def test_percentile_matches_numpy(q: float) -> None:
    values = list(np.random.default_rng(0).exponential(size=37))
    assert load.percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_only_loopback_targets() -> None:
    with pytest.raises(ValueError, match="only targets this machine"):
        asyncio.run(load.embeddings_level("http://10.0.0.1:8000", "m", ["x"], 1, 1))


async def _stub(seen: list[str]) -> tuple[Any, str]:
    from aiohttp import web

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body["input"])
        data = {"data": [{"embedding": [0.0, 1.0], "index": 0}]}
        return web.json_response(data, headers={"x-rlx-replica": f"r{len(seen) % 2}"})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body["prompt"])
        resp = web.StreamResponse()
        await resp.prepare(request)
        for tok in ["a", "b", "c"]:
            await resp.write(f"data: {json.dumps({'choices': [{'text': tok}]})}\n\n".encode())
        usage = {"choices": [], "usage": {"completion_tokens": 3}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def test_load_generator_sends_each_request_once() -> None:
    async def main() -> tuple[Any, Any, list[str]]:
        seen: list[str] = []
        runner, base = await _stub(seen)
        try:
            texts = [f"t{i}" for i in range(7)]
            emb = await load.embeddings_level(base, "m", texts, 4, 20)
            gen = await load.generation_level(base, "m", ["p0", "p1"], 3, 5, 8)
        finally:
            await runner.cleanup()
        return emb, gen, seen

    emb, gen, seen = asyncio.run(main())
    assert emb.errors == 0 and len(emb.latencies) == 20
    assert sorted(seen[:20]) == sorted(f"t{i % 7}" for i in range(20))
    assert emb.replicas == {"r0": 10, "r1": 10}
    assert gen.errors == 0 and len(gen.ttfts) == 5 and gen.tokens == 15
    assert sorted(seen[20:]) == sorted(f"p{i % 2}" for i in range(5))
    s = emb.summary()
    assert s["ok"] == 20 and s["throughput_rps"] == pytest.approx(20 / emb.wall_s)


def _level(c: int, rps: float, cpu_ms: float) -> dict[str, Any]:
    return {
        "concurrency": c, "throughput_rps": rps, "errors": 0, "ok": 10,
        "latencies_ms": [10.0, 20.0], "server_cpu_ms_per_request": cpu_ms,
        "server_cpu_share": 1.0, "server_cpu_s": cpu_ms / 100,
    }  # fmt: skip


def test_report_ratios(tmp_path: Path) -> None:
    data = {
        "kind": "embeddings", "command": "cmd", "date": "d", "threads": 2,
        "machine": {"cpu": "cpu", "cpus": 2, "native": {}}, "removed_blas_pins": {},
        "engines": {
            "rlx serve": {"rounds": [[_level(1, 10.0, 30.0), _level(32, 40.0, 20.0)]]},
            "peer": {"rounds": [[_level(1, 8.0, 30.0), _level(32, 20.0, 40.0)]]},
        },
    }  # fmt: skip
    (tmp_path / "serve_embeddings.json").write_text(json.dumps(data))
    out = tmp_path / "report.md"
    report.write_report(tmp_path, out)
    text = out.read_text()
    assert "rlx at concurrency 32 / at 1: 4.00x (target >= 3x: met)" in text
    assert "peak 40.0 vs 20.0 req/s = 2.00x; at concurrency 32: 2.00x" in text
    assert "1: 1.00x, 32: 2.00x" in text  # peer CPU per request / rlx's
    assert "## Generation" in text and "Not run yet." in text
