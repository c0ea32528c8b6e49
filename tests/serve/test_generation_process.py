"""Generation end to end (slow): ``python -m rlx serve tiny.gguf`` keeps its resident
memory flat over 500 generations and exits 0 on SIGTERM; Gemma-3-270M with Gemma 3's
chat template serves concurrent chat streams, each equal to ``generate()`` of its
rendered prompt alone."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("regex")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from tests.serve.gen_helpers import GEMMA3, Server, tiny_gguf  # noqa: E402
from tests.serve.live import spawn  # noqa: E402


@pytest.mark.slow
def test_rss_is_flat_over_500_generations(tmp_path: Path) -> None:
    path = tiny_gguf(tmp_path / "tiny.gguf")
    server = spawn([f"tiny={path}", "--parallel", "4", "--ctx", "256", "--threads", "1"],
                   tmp_path / "log")  # fmt: skip
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        prompts = ["The capital of France is", "Hello", "café 日本語 🙂", "def f(x):"]

        def one(i: int) -> None:
            p = prompts[i % len(prompts)]
            if i % 3 == 0:
                r = client.completions.create(model="tiny", prompt=p, max_tokens=4, temperature=0)
                assert r.choices[0].finish_reason in ("stop", "length")
            elif i % 3 == 1:
                s = client.completions.create(model="tiny", prompt=p, max_tokens=4, stream=True,
                                              seed=i)  # fmt: skip
                assert [c for c in s]
            else:
                r = client.chat.completions.create(model="tiny", max_tokens=4,
                                                   messages=[{"role": "user", "content": p}])  # fmt: skip
                assert r.usage.completion_tokens <= 4

        def burst(n: int) -> None:
            with ThreadPoolExecutor(6) as pool:
                list(pool.map(one, range(n)))

        burst(100)  # warm-up: every batch size and prompt length class planned
        warm = server.rss_bytes()
        burst(500)
        end = server.rss_bytes()
        growth = end - warm
        print(f"server RSS after warm-up {warm / 2**20:.1f} MiB, after 500 more "
              f"generations {end / 2**20:.1f} MiB")  # fmt: skip
        assert growth < max(0.10 * warm, 20 << 20), (
            f"RSS grew {growth / 2**20:.1f} MiB (from {warm / 2**20:.1f} MiB) over 500 generations"
        )
        server.terminate()
        assert server.proc.wait(timeout=120) == 0, server.log()
    finally:
        server.stop()


@pytest.mark.slow
def test_gemma3_concurrent_chat_streams_equal_generate() -> None:
    import rlx.models.llm as llm
    from rlx.serve.app import create_app
    from rlx.serve.config import ServeConfig
    from rlx.serve.generation import GenerationService
    from rlx.serve.templates import ChatTemplate
    from tests.models.llm.conftest import gemma_path

    model = llm.load(gemma_path(), max_context=256, num_threads=1)
    template = ChatTemplate.from_gguf(model.file.metadata, GEMMA3)
    assert template is not None
    cfg = ServeConfig(parallel=4, ctx=256)
    chats = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Answer in one word."},
         {"role": "user", "content": "Name a colour of the rainbow."}],
        [{"role": "user", "content": "Write a Python function that adds two numbers."}],
        [{"role": "user", "content": "Count from 1 to 5."}],
        [{"role": "user", "content": "Say hello in French."}],
    ]  # fmt: skip
    svc = GenerationService(model, "gemma", cfg, chat_template=template)
    with Server(create_app([svc], cfg)) as server:

        async def main() -> list[str]:
            c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)

            async def one(messages: list) -> str:
                s = await c.chat.completions.create(model="gemma", messages=messages,
                                                    max_tokens=16, temperature=0, stream=True)  # fmt: skip
                return "".join([ch.choices[0].delta.content or "" async for ch in s])

            try:
                return await asyncio.gather(*[one(m) for m in chats])
            finally:
                await c.close()

        got = asyncio.run(main())
    for messages, text in zip(chats, got, strict=True):
        want = model.generate(model.encode(template.render(messages)), max_tokens=16)
        assert text == want.text, messages
