"""``/v1/completions`` and ``/v1/chat/completions`` through the official ``openai`` client
against a live server (uvicorn in a thread, a free port): greedy output streamed and not
equals ``generate()`` of each prompt alone, also with many requests at once; usage
counts; logprobs equal NumPy's log-softmax of a lone sequence's logits; bad requests are
400s naming the field or limit; a full queue is a 429 with Retry-After; a client that
disconnects frees its KV slot."""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("regex")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

import rlx.models.llm as llm  # noqa: E402
from rlx.serve.app import create_app  # noqa: E402
from rlx.serve.config import ServeConfig  # noqa: E402
from rlx.serve.generation import GenerationService  # noqa: E402
from rlx.serve.templates import ChatTemplate  # noqa: E402
from tests.serve.gen_helpers import Server, tiny_gguf, wait_for  # noqa: E402

CTX = 256
PROMPTS = [
    "The capital of France is",
    "Hello",
    "The quick brown fox jumps over the lazy dog. It's 2026; we'll see 123 items.",
    "café 日本語 🙂",
    "def f(x):\n    return x ** 2",
    "new\nlines\n\n\nand\ttabs",
]
CHATS = [
    [{"role": "user", "content": "The capital of France is"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🙂"}],
    [
        {
            "role": "user",
            "content": [{"type": "text", "text": "two"}, {"type": "text", "text": " parts"}],
        }
    ],
]
FINISH = {"stop_token": "stop", "stop_string": "stop", "max_tokens": "length"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tiny_gguf(tmp_path_factory.mktemp("api") / "tiny.gguf")
    return llm.load(path, max_context=CTX, num_threads=1)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tiny_gguf(tmp_path_factory.mktemp("plain") / "plain.gguf", template=None)
    return llm.load(path, max_context=64, num_threads=1)


def _config(**kw) -> ServeConfig:
    base = dict(parallel=4, ctx=CTX, max_queue=16, max_tokens_limit=200, max_prompt_tokens=200)
    return ServeConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def server(model, plain):
    cfg = _config()
    services = [GenerationService(model, "tiny", cfg), GenerationService(plain, "plain", cfg)]
    with Server(create_app(services, cfg)) as s:
        yield s


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _aclient(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _chat_ids(model, messages) -> list[int]:
    t = ChatTemplate.from_gguf(model.file.metadata)
    assert t is not None
    return model.encode(t.render(messages))


@pytest.mark.parametrize("stream", [False, True])
def test_completions_greedy_equal_generate(server, model, stream) -> None:
    c = _client(server)
    cases = [(p, 12, None) for p in PROMPTS] + [(PROMPTS[0], 30, [" ", "e"]),
                                                (model.encode(PROMPTS[1]), 7, None)]  # fmt: skip
    for prompt, n, stop in cases:
        want = model.generate(prompt, max_tokens=n, stop=stop)
        kw = dict(model="tiny", prompt=prompt, max_tokens=n, temperature=0, stop=stop)
        if not stream:
            r = c.completions.create(**kw)
            assert r.object == "text_completion" and r.model == "tiny"
            assert r.choices[0].text == want.text
            assert r.choices[0].finish_reason == FINISH[want.finish_reason]
            usage = r.usage
        else:
            chunks = list(c.completions.create(**kw, stream=True,
                                               stream_options={"include_usage": True}))  # fmt: skip
            assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want.text
            assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == (
                FINISH[want.finish_reason]
            )
            assert chunks[-1].choices == [] and all(ch.usage is None for ch in chunks[:-1])
            usage = chunks[-1].usage
        assert usage.prompt_tokens == len(want.prompt_ids)
        assert usage.completion_tokens == len(want.token_ids)
        assert usage.total_tokens == len(want.prompt_ids) + len(want.token_ids)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_greedy_equals_generate_of_the_rendered_prompt(server, model, stream) -> None:
    c = _client(server)
    for messages in CHATS:
        ids = _chat_ids(model, messages)
        want = model.generate(ids, max_tokens=10)
        kw = dict(model="tiny", messages=messages, max_tokens=10, temperature=0)
        if not stream:
            r = c.chat.completions.create(**kw)
            assert r.object == "chat.completion"
            assert r.choices[0].message.role == "assistant"
            assert r.choices[0].message.content == want.text
            assert r.choices[0].finish_reason == FINISH[want.finish_reason]
            assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (
                len(ids), len(want.token_ids))  # fmt: skip
        else:
            chunks = list(c.chat.completions.create(**kw, stream=True))
            assert chunks[0].choices[0].delta.role == "assistant"
            assert all(ch.object == "chat.completion.chunk" for ch in chunks)
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
            assert text == want.text
            assert chunks[-1].choices[0].finish_reason == FINISH[want.finish_reason]


def test_chat_default_max_tokens_fills_the_context(server, model) -> None:
    messages = CHATS[0]
    ids = _chat_ids(model, messages)
    r = _client(server).chat.completions.create(model="tiny", messages=messages, temperature=0)
    want = model.generate(ids, max_tokens=CTX - len(ids) + 1)
    assert r.choices[0].message.content == want.text
    assert r.usage.completion_tokens == len(want.token_ids)


def test_many_concurrent_requests_each_equal_generate_alone(server, model) -> None:
    lengths = [12, 3, 20, 1, 9, 16, 5, 25]
    prompts = PROMPTS + PROMPTS[:2]

    async def main():
        c = _aclient(server)

        async def one(i: int, prompt: str, n: int) -> str:
            if i % 2:
                r = await c.completions.create(model="tiny", prompt=prompt, max_tokens=n,
                                               temperature=0)  # fmt: skip
                return r.choices[0].text
            s = await c.completions.create(model="tiny", prompt=prompt, max_tokens=n,
                                           temperature=0, stream=True)  # fmt: skip
            return "".join([ch.choices[0].text async for ch in s])

        try:
            return await asyncio.gather(*[one(i, p, n) for i, (p, n)
                                          in enumerate(zip(prompts, lengths, strict=True))])  # fmt: skip
        finally:
            await c.close()

    got = asyncio.run(main())
    for prompt, n, text in zip(prompts, lengths, got, strict=True):
        assert text == model.generate(prompt, max_tokens=n).text


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    return z - z.max() - np.log(np.exp(z - z.max()).sum())


def test_completion_logprobs_are_the_log_softmax_of_a_lone_sequence(server, model) -> None:
    prompt = PROMPTS[0]
    r = _client(server).completions.create(model="tiny", prompt=prompt, max_tokens=5,
                                           temperature=0, logprobs=3)  # fmt: skip
    want = model.generate(prompt, max_tokens=5)
    lp = r.choices[0].logprobs
    ids = list(want.prompt_ids)
    tok = model.tokenizer
    assert len(lp.token_logprobs) == len(want.token_ids) == 5
    for i, t in enumerate(want.token_ids):
        ref = _log_softmax(model.logits(ids + want.token_ids[:i]))
        assert lp.tokens[i] == tok.token_bytes(t).decode("utf-8", errors="replace")
        assert lp.token_logprobs[i] == pytest.approx(ref[t], abs=2e-5)
        top = np.argsort(-ref, kind="stable")[:3]
        assert list(lp.top_logprobs[i].values()) == pytest.approx(ref[top].tolist(), abs=2e-5)
    assert lp.text_offset[0] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_top_k(server, model, stream) -> None:
    messages = CHATS[1]
    ids = _chat_ids(model, messages)
    want = model.generate(ids, max_tokens=4)
    kw = dict(model="tiny", messages=messages, max_tokens=4, temperature=0, logprobs=True,
              top_logprobs=2)  # fmt: skip
    c = _client(server)
    if stream:
        content = [x for ch in c.chat.completions.create(**kw, stream=True)
                   if ch.choices and ch.choices[0].logprobs for x in ch.choices[0].logprobs.content]  # fmt: skip
    else:
        content = c.chat.completions.create(**kw).choices[0].logprobs.content
    assert len(content) == len(want.token_ids)
    tok = model.tokenizer
    for i, (item, t) in enumerate(zip(content, want.token_ids, strict=True)):
        ref = _log_softmax(model.logits(ids + want.token_ids[:i]))
        assert bytes(item.bytes) == tok.token_bytes(t)
        assert item.logprob == pytest.approx(ref[t], abs=2e-5)
        top = np.argsort(-ref, kind="stable")[:2]
        assert [bytes(x.bytes) for x in item.top_logprobs] == [tok.token_bytes(int(j)) for j in top]
        assert [x.logprob for x in item.top_logprobs] == pytest.approx(ref[top].tolist(), abs=2e-5)


def test_seeded_sampling_is_reproducible_and_equals_generate(server, model) -> None:
    c = _client(server)
    kw = dict(model="tiny", prompt=PROMPTS[2], max_tokens=12, temperature=0.8, top_p=0.9)
    a = c.completions.create(**kw, seed=7).choices[0].text
    assert a == c.completions.create(**kw, seed=7).choices[0].text
    assert a == model.generate(PROMPTS[2], max_tokens=12, temperature=0.8, top_p=0.9, seed=7).text


BAD = [
    ("completions", dict(prompt="x", n=2), "n", "'n' must be 1"),
    ("completions", dict(prompt="x", temperature="hot"), "temperature", "must be a number"),
    ("completions", dict(prompt="x", temperature=3), "temperature", "between 0.0 and 2.0"),
    ("completions", dict(prompt="x", top_p=0), "top_p", "> 0"),
    ("completions", dict(prompt="x", max_tokens=0), "max_tokens", ">= 1"),
    ("completions", dict(prompt="x", max_tokens=201), "max_tokens", "max_tokens_limit"),
    ("completions", dict(prompt="x", max_tokens=True), "max_tokens", "must be an integer"),
    ("completions", dict(prompt="x", seed=-1), "seed", ">= 0"),
    ("completions", dict(prompt="x", stop=["a", "b", "c", "d", "e"]), "stop", "at most 4"),
    ("completions", dict(prompt="x", stop=[1]), "stop", "must be a string"),
    ("completions", dict(prompt="x", logprobs=21), "logprobs", "<= 20"),
    ("completions", dict(prompt="x", echo=True), "echo", "not supported"),
    ("completions", dict(prompt="x", presence_penalty=0.5), "presence_penalty", "penalties"),
    ("completions", dict(prompt="x", stream_options={"include_usage": True}), "stream_options",
     "only allowed with 'stream'"),
    ("completions", dict(prompt=["a", "b"]), "prompt", "one per request"),
    ("completions", dict(prompt=[1, 10**6]), "prompt", "token id in [0,"),
    ("completions", dict(prompt=3), "prompt", "must be a string or"),
    ("completions", dict(), "prompt", "'prompt' is required"),
    ("completions", dict(prompt="word " * 300), "prompt", "max_prompt_tokens"),
    ("completions", dict(prompt=[5] * 201), "prompt", "holds 201 tokens"),
    ("completions", dict(prompt=[5] * 150, max_tokens=150), "max_tokens",
     "needs 299 positions, more than the context of 256"),
    ("chat", dict(messages=[]), "messages", "non-empty"),
    ("chat", dict(messages=[{"role": "robot", "content": "x"}]), "messages", "'messages[0].role'"),
    ("chat", dict(messages=[{"role": "user", "content": 5}]), "messages",
     "'messages[0].content' must be"),
    ("chat", dict(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages",
     "text models only"),
    ("chat", dict(messages=[{"role": "tool", "content": "x"}]), "messages", "Unknown role: tool"),
    ("chat", dict(messages=[{"role": "user", "content": "x"}], top_logprobs=2), "top_logprobs",
     "needs 'logprobs': true"),
    ("chat", dict(messages=[{"role": "user", "content": "x"}], tools=[{"type": "function"}]),
     "tools", "not supported"),
]  # fmt: skip


@pytest.mark.parametrize("endpoint, body, param, message", BAD)
def test_bad_requests_are_400_naming_the_field(server, endpoint, body, param, message) -> None:
    import httpx2 as httpx

    r = httpx.post(f"{server.url}/v1/{'chat/completions' if endpoint == 'chat' else endpoint}",
                   json={"model": "tiny", **body}, timeout=60)  # fmt: skip
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"], err
    assert err["type"] == "invalid_request_error"


def test_the_openai_client_sees_400s(server) -> None:
    c = _client(server)
    with pytest.raises(openai.BadRequestError, match="'n' must be 1"):
        c.completions.create(model="tiny", prompt="x", n=3)
    with pytest.raises(openai.BadRequestError, match="has no chat template"):
        c.chat.completions.create(model="plain", messages=CHATS[0])
    # the same model still completes
    r = c.completions.create(model="plain", prompt="Hello", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens <= 2


class Gated:
    """A BatchedDecoder whose ``step`` waits for a permit from ``permits`` (the test
    decides how far each stream gets)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.permits = threading.Semaphore(0)

    def step(self, slots, tokens):
        self.permits.acquire()
        return self.inner.step(slots, tokens)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def gated(model, monkeypatch):
    """A server of its own over a gated decoder with one slot and a queue of one."""
    made: list[Gated] = []
    real = model.batched

    def batched(slots, max_context=None):
        made.append(Gated(real(slots, max_context)))
        return made[0]

    monkeypatch.setattr(model, "batched", batched)
    cfg = _config(parallel=1, max_queue=1, retry_after_s=3)
    svc = GenerationService(model, "tiny", cfg)
    try:
        with Server(create_app([svc], cfg)) as s:
            yield s, svc, made[0]
    finally:
        if made:
            made[0].permits.release(10_000)


def _first_token(lines) -> None:
    """Read SSE lines until the first chunk with text."""
    for line in lines:
        if line.startswith("data: {"):
            choice = json.loads(line[6:])["choices"][0]
            if choice.get("text") or choice.get("delta", {}).get("content"):
                return


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_disconnect_mid_stream_frees_the_slot(gated, endpoint) -> None:
    import httpx2 as httpx

    server, svc, dec = gated
    body = {"model": "tiny", "max_tokens": 100, "temperature": 0, "stream": True}
    body.update({"prompt": PROMPTS[0]} if endpoint == "completions" else {"messages": CHATS[0]})
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{server.url}/v1/{endpoint}", json=body) as r:
            assert r.status_code == 200
            _first_token(r.iter_lines())
            assert dec.in_use() == 1
    sched = svc.scheduler
    wait_for(lambda: sched.cancelling() == 1 or dec.in_use() == 0, "the cancel to arrive")
    dec.permits.release(10_000)  # the step it waits in runs; then the slot goes
    wait_for(lambda: dec.in_use() == 0, "the slot to be released")
    metrics = server.app.state.metrics.registry
    done = metrics.get_sample_value("rlx_tokens_total", {"model": "tiny", "kind": "completion"})
    assert done == 1  # the token from the prefill; the blocked step's token is dropped
    assert metrics.get_sample_value("rlx_kv_slots_in_use", {"model": "tiny"}) == 0


def test_full_queue_is_429_with_retry_after(gated) -> None:
    import httpx2 as httpx

    server, svc, dec = gated
    url = f"{server.url}/v1/completions"
    body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 3, "temperature": 0}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", url, json={**body, "stream": True}) as first:
            lines = first.iter_lines()
            _first_token(lines)  # running, blocked before its first step
            answers: list[int] = []
            waiting = threading.Thread(
                target=lambda: answers.append(httpx.post(url, json=body, timeout=60).status_code)
            )
            waiting.start()
            wait_for(lambda: svc.scheduler.counts() == (1, 1), "the second request to queue")
            r = client.post(url, json=body)
            assert r.status_code == 429
            assert r.headers["Retry-After"] == "3"
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert "max_queue" in r.json()["error"]["message"]
            with pytest.raises(openai.RateLimitError):
                _client(server).completions.create(**body)
            dec.permits.release(10_000)
            rest = "".join(lines)
        waiting.join(timeout=60)
    assert "[DONE]" in rest and answers == [200]
    wait_for(lambda: dec.in_use() == 0, "the slots to be released")


def test_disconnect_while_waiting_for_a_json_answer_frees_the_slot(gated) -> None:
    import socket
    from urllib.parse import urlparse

    server, svc, dec = gated
    url = urlparse(server.url)
    body = json.dumps({"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 100,
                       "temperature": 0}).encode()  # fmt: skip
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(head.encode() + body)
        wait_for(lambda: dec.in_use() == 1, "the request to take the slot")
    sched = svc.scheduler
    wait_for(lambda: sched.cancelling() == 1 or dec.in_use() == 0, "the cancel to arrive")
    dec.permits.release(10_000)
    wait_for(lambda: dec.in_use() == 0, "the slot to be released")
    metrics = server.app.state.metrics.registry
    done = metrics.get_sample_value("rlx_tokens_total", {"model": "tiny", "kind": "completion"})
    assert (done or 0) <= 1  # cancelled in its prefill, or at its first (blocked) step


def test_metrics_count_tokens_and_first_tokens(server, model) -> None:
    reg = server.app.state.metrics.registry

    def value(name: str, **labels: str) -> float:
        return reg.get_sample_value(name, {"model": "tiny", **labels}) or 0.0

    before = (value("rlx_tokens_total", kind="prompt"), value("rlx_tokens_total", kind="completion"),
              value("rlx_time_to_first_token_seconds_count"), value("rlx_batch_size_count"))  # fmt: skip
    r = _client(server).completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6,
                                           temperature=0)  # fmt: skip
    after = (value("rlx_tokens_total", kind="prompt"), value("rlx_tokens_total", kind="completion"),
             value("rlx_time_to_first_token_seconds_count"), value("rlx_batch_size_count"))  # fmt: skip
    assert after[0] - before[0] == r.usage.prompt_tokens
    assert after[1] - before[1] == r.usage.completion_tokens
    assert after[2] - before[2] == 1
    assert after[3] - before[3] >= 1 + (r.usage.completion_tokens - 1)  # prefill + steps
    assert value("rlx_kv_slots_in_use") == 0 and value("rlx_queue_depth") == 0


def test_a_gguf_path_loads_in_the_background_and_serves(tmp_path, model) -> None:
    from rlx.serve.loading import load_services

    path = tiny_gguf(tmp_path / "bg.gguf")
    cfg = _config(ctx=100_000)  # more than the file's 512: the model's own length is used
    (svc,) = load_services([f"bg={path}"], cfg)
    assert isinstance(svc, GenerationService) and not svc.ready()
    with Server(create_app([svc], cfg)) as server:
        assert svc.scheduler is not None and svc.scheduler.decoder.max_context == 512
        r = _client(server).completions.create(model="bg", prompt=PROMPTS[0], max_tokens=6,
                                               temperature=0)  # fmt: skip
    assert r.choices[0].text == model.generate(PROMPTS[0], max_tokens=6).text


def test_a_broken_gguf_reports_its_load_error(tmp_path) -> None:
    from rlx.serve.metrics import Metrics

    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 20)
    svc = GenerationService(path, "broken", _config())

    async def main() -> None:
        await svc.start(Metrics())
        while svc.load_error is None:
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert not svc.ready() and "broken.gguf" in str(svc.load_error)
    svc.close()


def test_a_model_failure_is_500_or_an_error_event(model, monkeypatch) -> None:
    from tests.serve.gen_helpers import Broken

    real = model.batched
    monkeypatch.setattr(model, "batched", lambda n, max_context=None: Broken(real(n), 0))
    cfg = _config(parallel=1)
    with Server(create_app([GenerationService(model, "tiny", cfg)], cfg)) as server:
        c = _client(server)
        kw = dict(model="tiny", prompt=PROMPTS[0], max_tokens=5, temperature=0)
        with pytest.raises(openai.InternalServerError, match="not finite"):
            c.completions.create(**kw)
        with pytest.raises(openai.APIError, match="not finite"):
            list(c.completions.create(**kw, stream=True))
        ok = c.completions.create(**{**kw, "max_tokens": 1})  # no decode step: fine
        assert ok.choices[0].text == model.generate(PROMPTS[0], max_tokens=1).text


def test_a_chat_template_file_serves_a_model_without_one(tmp_path) -> None:
    from click.testing import CliRunner

    from rlx.cli import cli
    from rlx.serve.loading import load_services
    from tests.serve.gen_helpers import CHATML

    (tmp_path / "chatml.jinja").write_text(CHATML)
    path = tiny_gguf(tmp_path / "plain.gguf", template=None)
    cfg = _config(chat_template=str(tmp_path / "chatml.jinja"))
    (svc,) = load_services([f"plain={path}"], cfg)
    with Server(create_app([svc], cfg)) as server:
        r = _client(server).chat.completions.create(model="plain", messages=CHATS[1],
                                                    max_tokens=6, temperature=0)  # fmt: skip
    text = ChatTemplate.from_path(tmp_path / "chatml.jinja").render(CHATS[1])
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    oracle = llm.load(path, max_context=CTX, num_threads=1)
    assert r.choices[0].message.content == oracle.generate(text, max_tokens=6).text
    res = CliRunner().invoke(cli, ["serve", str(path), "--chat-template", str(tmp_path / "no")])
    assert res.exit_code == 2 and "does not exist" in res.output
