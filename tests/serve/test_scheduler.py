"""rlx.serve.scheduler: continuous batching over the BatchedDecoder. Every request's
tokens, text and finish reason equal ``generate()`` of its prompt alone (greedy and
seeded sampling, stop strings, chunked prefill joining running streams); logprobs are
NumPy's log-softmax of the logits a lone sequence sees; a joining prompt is prefilled in
chunks with a decode step of the running streams between them; a cancelled request frees
its slot; a full queue refuses; a model failure ends only the requests it hit."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("regex")
pytest.importorskip("prometheus_client")

import rlx.models.llm as llm  # noqa: E402
from rlx.errors import ServeError  # noqa: E402
from rlx.models.llm.sampling import SamplingParams  # noqa: E402
from rlx.serve.scheduler import FinishReason, GenRequest, QueueFull, Scheduler  # noqa: E402
from tests.serve.gen_helpers import Broken, tiny_gguf  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "Hello",
    "The quick brown fox jumps over the lazy dog. It's 2026; we'll see 123 items, and then "
    "some more text so that this prompt runs in several chunks of prefill.",
    "café 日本語 🙂",
    "def f(x):\n    return x ** 2",
    "new\nlines\n\n\nand\ttabs",
]
REASONS = {"stop_token": FinishReason.STOP, "stop_string": FinishReason.STOP,
           "max_tokens": FinishReason.LENGTH}  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tiny_gguf(tmp_path_factory.mktemp("sched") / "tiny.gguf")
    return llm.load(path, max_context=128, num_threads=1)


def _request(model, prompt: str, max_tokens: int, **kw) -> GenRequest:
    sp = SamplingParams(kw.pop("temperature", 0.0), 0, kw.pop("top_p", 1.0), kw.pop("seed", None))
    return GenRequest(
        tuple(model.encode(prompt)), max_tokens, sp, tuple(kw.pop("stop", ())),
        kw.pop("stop_ids", frozenset(model.tokenizer.stop_ids)), kw.pop("logprobs", None),
    )  # fmt: skip


async def _collect(ticket):
    text, toks, events = "", [], []
    async for ev in ticket.events():
        events.append(ev)
        text += ev.text
        if ev.token_id is not None:
            toks.append(ev.token_id)
    return text, toks, events


def _run(sched: Scheduler, requests: list[GenRequest]):
    async def main():
        tickets = [sched.submit(r) for r in requests]
        return await asyncio.gather(*[_collect(t) for t in tickets])

    return asyncio.run(main())


def _check_equal(model, req: GenRequest, got, **gen_kw) -> None:
    text, toks, events = got
    want = model.generate(
        list(req.prompt_ids), max_tokens=req.max_tokens, temperature=req.sampling.temperature,
        top_p=req.sampling.top_p, seed=req.sampling.seed, stop=list(req.stop),
    )  # fmt: skip
    assert toks == want.token_ids
    assert text == want.text
    assert events[-1].finish is REASONS[want.finish_reason]
    assert events[-1].completion_tokens == len(want.token_ids)
    assert all(ev.finish is None for ev in events[:-1])


@pytest.mark.parametrize("parallel, chunk", [(3, 4), (8, 128)])
def test_concurrent_greedy_streams_equal_generate_alone(model, parallel, chunk) -> None:
    dec = model.batched(parallel)
    sched = Scheduler(dec, model.tokenizer, max_queue=16, prefill_chunk=chunk)
    try:
        lengths = [12, 3, 20, 1, 9, 16]
        reqs = [_request(model, p, n) for p, n in zip(PROMPTS, lengths, strict=True)]
        reqs.append(_request(model, PROMPTS[0], 20, stop=[" ", "e"]))  # stop strings
        for req, got in zip(reqs, _run(sched, reqs), strict=True):
            _check_equal(model, req, got)
        assert dec.in_use() == 0 and sched.wait_idle(30.0)
    finally:
        sched.close()


def test_seeded_sampling_equals_generate(model) -> None:
    sched = Scheduler(model.batched(4), model.tokenizer, max_queue=8)
    try:
        reqs = [_request(model, p, 10, temperature=0.9, top_p=0.9, seed=i)
                for i, p in enumerate(PROMPTS[:4])]  # fmt: skip
        for req, got in zip(reqs, _run(sched, reqs), strict=True):
            _check_equal(model, req, got)
    finally:
        sched.close()


def test_logprobs_are_the_log_softmax_of_a_lone_sequence(model) -> None:
    sched = Scheduler(model.batched(2), model.tokenizer, max_queue=8)
    try:
        reqs = [_request(model, p, 6, logprobs=5) for p in PROMPTS[:3]]
        for req, (_, toks, events) in zip(reqs, _run(sched, reqs), strict=True):
            lps = [ev.logprob for ev in events if ev.logprob is not None]
            assert [lp.token_id for lp in lps] == toks
            for i, lp in enumerate(lps):
                z = model.logits(list(req.prompt_ids) + toks[:i]).astype(np.float64)
                want = z - z.max() - np.log(np.exp(z - z.max()).sum())
                top = np.argsort(-want, kind="stable")[:5]
                assert [t for t, _ in lp.top] == top.tolist()
                np.testing.assert_allclose([v for _, v in lp.top], want[top], atol=2e-5)
                np.testing.assert_allclose(lp.logprob, want[toks[i]], atol=2e-5)
    finally:
        sched.close()


def test_cancel_frees_the_slot_and_others_go_on(model) -> None:
    dec = model.batched(2)
    sched = Scheduler(dec, model.tokenizer, max_queue=8)

    async def main():
        long = sched.submit(_request(model, PROMPTS[0], 100))
        other = sched.submit(_request(model, PROMPTS[1], 30))
        waiting = sched.submit(_request(model, PROMPTS[3], 5))
        seen = 0
        async for ev in long.events():
            seen += ev.token_id is not None
            if seen == 3:
                long.cancel()
            if ev.finish is not None:
                assert ev.finish is FinishReason.CANCELLED
        rest = await asyncio.gather(_collect(other), _collect(waiting))
        return seen, rest

    try:
        seen, rest = asyncio.run(main())
        assert 3 <= seen < 100
        _check_equal(model, _request(model, PROMPTS[1], 30), rest[0])
        _check_equal(model, _request(model, PROMPTS[3], 5), rest[1])
        assert dec.in_use() == 0
    finally:
        sched.close()


def test_full_queue_refuses_and_close_cancels(model) -> None:
    # the running request cannot end on its own before close: no stop tokens, its decode
    # steps held until the scheduler is closing (whatever tokens the model picks)
    dec = _Recording(model.batched(1))
    sched = Scheduler(dec, model.tokenizer, max_queue=2)

    async def main():
        first = sched.submit(_request(model, PROMPTS[0], 100, stop_ids=frozenset()))
        async for _ev in first.events():  # running: the queue is now empty
            break
        queued = [sched.submit(_request(model, PROMPTS[1], 5)) for _ in range(2)]
        with pytest.raises(QueueFull, match="max_queue"):
            sched.submit(_request(model, PROMPTS[1], 5))
        closing = asyncio.create_task(asyncio.to_thread(sched.close))
        while True:  # a full queue refuses until close marks the scheduler closed
            try:
                sched.submit(_request(model, PROMPTS[1], 5))
            except QueueFull:
                await asyncio.sleep(0)
                continue
            except ServeError as e:
                assert "closed" in str(e)
                break
        dec.go.set()  # the held step runs, then the worker shuts down
        await closing
        ends = [[ev async for ev in t.events()][-1] for t in [first, *queued]]
        return ends

    try:
        ends = asyncio.run(main())
    finally:
        dec.go.set()
        sched.close()
    assert [e.finish for e in ends] == [FinishReason.CANCELLED] * 3
    assert dec.in_use() == 0


def test_non_finite_logits_end_that_request_with_an_error_only(model) -> None:
    dec = Broken(model.batched(2), slot=0)
    sched = Scheduler(dec, model.tokenizer, max_queue=8)
    try:
        reqs = [_request(model, PROMPTS[0], 8), _request(model, PROMPTS[1], 8)]
        (bad_text, bad_toks, bad), good = _run(sched, reqs)
        assert bad[-1].finish is FinishReason.ERROR and "not finite" in bad[-1].error
        assert len(bad_toks) == 1  # the prefill's token, then the NaN step
        _check_equal(model, reqs[1], good)
        assert dec.in_use() == 0
        # the worker goes on: the next request (slot 0 again) fails alone, slot 1 works
        (_, _, again), ok = _run(sched, reqs)
        assert again[-1].finish is FinishReason.ERROR
        _check_equal(model, reqs[1], ok)
    finally:
        sched.close()


class _Recording:
    """A decoder that logs its runs: ("prefill" | "extend", slot, tokens) and ("step", slots)."""

    def __init__(self, inner) -> None:
        self.inner, self.log = inner, []
        self.go = threading.Event()  # decode steps wait for it

    def prefill(self, slot, ids):
        self.log.append(("prefill", slot, len(ids)))
        return self.inner.prefill(slot, ids)

    def extend(self, slot, ids):
        self.log.append(("extend", slot, len(ids)))
        return self.inner.extend(slot, ids)

    def step(self, slots, tokens):
        self.go.wait()
        self.log.append(("step", tuple(slots)))
        return self.inner.step(slots, tokens)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_joining_prompt_is_prefilled_in_chunks_between_decode_steps(model) -> None:
    dec = _Recording(model.batched(2))
    sched = Scheduler(dec, model.tokenizer, max_queue=8, prefill_chunk=4)
    long_prompt = _request(model, PROMPTS[2], 3)
    n = len(long_prompt.prompt_ids)
    assert n > 12

    async def main():
        running = sched.submit(_request(model, PROMPTS[1], 60))
        events = running.events()
        await events.__anext__()  # running: its prefill is done, its first step waits
        joiner = sched.submit(long_prompt)
        dec.go.set()
        rest = await asyncio.gather(_collect(joiner), _consume(events))
        return rest[0]

    async def _consume(events):
        async for _ in events:
            pass

    try:
        got = asyncio.run(main())
        _check_equal(model, long_prompt, got)
    finally:
        dec.go.set()
        sched.close()
    a_slot = dec.log[0][1]
    chunks = [i for i, e in enumerate(dec.log) if e[0] in ("prefill", "extend") and e[1] != a_slot]
    assert sum(dec.log[i][2] for i in chunks) == n
    assert all(dec.log[i][2] <= 4 for i in chunks)  # the other stream was running throughout
    for i, j in zip(chunks, chunks[1:]):  # a decode step of the running stream between chunks
        assert any(e[0] == "step" and a_slot in e[1] for e in dec.log[i + 1 : j])
