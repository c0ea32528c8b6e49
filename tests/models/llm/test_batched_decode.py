"""Batched decode (rlx/models/llm/batch.py): several sequences in KV-cache slots, decoded
together in one compiled step, against single-stream decode of each sequence
(``LlmModel.prefill`` / ``step``) and greedy ``LlmModel.generate``; sequences join and
leave between steps; slot reuse, sharing of the weights, bad input. The tiny llama file
(tiny_llama.py) is the fast tier, Gemma-3-270M the real one (slow)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("gguf")

import rlx.models.llm as llm  # noqa: E402
from rlx.errors import InputError  # noqa: E402
from tests.models.llm.conftest import gemma_f32  # noqa: E402
from tests.models.llm.tiny_llama import hf_weights, write_gguf  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny llama (f32 activations) and a 4-slot BatchedDecoder over it."""
    path = tmp_path_factory.mktemp("batched") / "tiny.gguf"
    write_gguf(path, hf_weights(seed=3, arch="llama"), arch="llama")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLX_DQ_ACT", "f32")
        m = llm.load(path, max_context=64, num_threads=1)
        yield m, m.batched(4)


def single_stream(model, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """Logits of ``model`` (one sequence at a time) after the prompt and after each of
    ``tokens`` fed in turn."""
    st = model.new_state()
    out = [st.prefill(prompt)]
    out += [st.step(t) for t in tokens]
    return out


def run_schedule(model, bd, prompts: list[list[int]], joins: list[int], leaves: list[int],
                 steps: int) -> None:  # fmt: skip
    """Prompt i joins (prefill into a fresh slot) before step ``joins[i]`` and leaves after
    step ``leaves[i]``; every slot is decoded greedily together with the others. Each
    sequence's logits at every step must equal single-stream decode of the same tokens,
    and its greedy tokens must be ``model.generate``'s."""
    slot: dict[int, int] = {}
    toks: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    seen: dict[int, list[np.ndarray]] = {i: [] for i in range(len(prompts))}
    for t in range(steps + 1):
        for i, p in enumerate(prompts):
            if joins[i] == t:
                s = bd.acquire()
                assert s is not None
                slot[i] = s
                seen[i].append(bd.prefill(s, p))
                toks[i].append(int(seen[i][-1].argmax()))
                assert bd.position(s) == len(p)
        live = [i for i in slot if leaves[i] > t]
        if live:
            out = bd.step([slot[i] for i in live], [toks[i][-1] for i in live])
            assert out.shape == (len(live), model.config.vocab) and out.dtype == np.float32
            for row, i in zip(out, live, strict=True):
                seen[i].append(row)
                toks[i].append(int(row.argmax()))
        for i in list(slot):
            if leaves[i] == t:
                bd.release(slot.pop(i))
    assert bd.in_use() == 0
    for i, p in enumerate(prompts):
        want = single_stream(model, p, toks[i][:-1])
        assert len(want) == len(seen[i]) > 1
        for k, (got, ref) in enumerate(zip(seen[i], want, strict=True)):
            np.testing.assert_allclose(got, ref, **TOL, err_msg=f"sequence {i}, step {k}")
        gen = model.generate(p, max_tokens=len(toks[i]), temperature=0.0, stop_at_eos=False)
        assert gen.token_ids == toks[i], f"sequence {i}"


def test_tiny_llama_slots_join_and_leave_match_single_stream(tiny) -> None:
    m, bd = tiny
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, m.config.vocab, n).tolist() for n in (3, 11, 1, 6, 17)]
    # 5 sequences through 4 slots: the last one reuses the slot the first one released
    run_schedule(m, bd, prompts, joins=[0, 0, 2, 5, 9], leaves=[8, 17, 12, 17, 17], steps=17)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_bf16_cache_and_other_architectures(tmp_path, monkeypatch, arch) -> None:
    """qwen2 (q / k / v biases) and qwen3 (per-head q / k norms) with a bf16 KV cache: the
    batched slots round their rows as the single-stream cache does."""
    monkeypatch.setenv("RLX_DQ_ACT", "f32")
    write_gguf(tmp_path / "t.gguf", hf_weights(seed=5, arch=arch), arch=arch)
    m = llm.load(tmp_path / "t.gguf", max_context=48, num_threads=1, kv_dtype="bf16")
    bd = m.batched(3)
    prompts = [[1, 5, 9, 13, 2], [7], [40, 41, 42, 43, 44, 45, 46, 47, 48]]
    run_schedule(m, bd, prompts, joins=[0, 1, 1], leaves=[6, 6, 4], steps=6)


def test_released_slot_reused_by_a_shorter_prompt_has_no_stale_rows(tiny) -> None:
    m, bd = tiny
    s = bd.acquire()
    long_prompt = list(range(5, 45))
    bd.prefill(s, long_prompt)
    for t in (7, 8, 9):
        bd.step([s], [t])
    bd.release(s)
    bd.release(s)  # idempotent
    assert bd.acquire() == s and bd.position(s) == 0
    short = [3, 1, 4]
    got = [bd.prefill(s, short)] + [bd.step([s], [t])[0] for t in (15, 9, 2, 6)]
    for g, w in zip(got, single_stream(m, short, [15, 9, 2, 6]), strict=True):
        np.testing.assert_allclose(g, w, **TOL)
    bd.release(s)


def test_extend_is_a_chunked_prefill(tiny) -> None:
    m, bd = tiny
    s = bd.acquire()
    ids = [4, 8, 15, 16, 23, 42, 7, 1, 9, 30]
    bd.prefill(s, ids[:4])
    bd.extend(s, ids[4:5])
    got = bd.extend(s, ids[5:])
    assert bd.position(s) == len(ids)
    np.testing.assert_allclose(got, m.logits(ids), **TOL)
    bd.release(s)


def test_weights_are_shared_not_copied(tiny) -> None:
    m, bd = tiny
    mine, theirs = bd.compiled._store.params, m.compiled._store.params
    for name in ("blk.0.attn_q.weight", "output.weight", "token_embd.weight"):
        assert np.shares_memory(mine[name], theirs[name]), name


def test_slots_are_handed_out_once_across_threads(tiny) -> None:
    _, bd = tiny
    got: list[int | None] = []
    lock = threading.Lock()

    def take() -> None:
        s = bd.acquire()
        with lock:
            got.append(s)

    threads = [threading.Thread(target=take) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held = [s for s in got if s is not None]
    assert sorted(held) == list(range(bd.capacity)) and got.count(None) == 2
    assert bd.in_use() == bd.capacity and bd.acquire() is None
    for s in held:
        bd.release(s)
    assert bd.in_use() == 0


def test_bad_input_is_named_and_changes_nothing(tiny) -> None:
    m, bd = tiny
    a, b = bd.acquire(), bd.acquire()
    la = bd.prefill(a, [5, 6, 7])
    bd.prefill(b, [9])
    free = next(s for s in range(bd.capacity) if s not in (a, b))
    vocab = m.config.vocab
    cases = [
        (lambda: bd.step([a, a], [1, 2]), "twice"),
        (lambda: bd.step([a, free], [1, 2]), f"slot {free} is free"),
        (lambda: bd.step([a, 99], [1, 2]), "slot 99"),
        (lambda: bd.step([a, b], [1, vocab]), f"{vocab} is outside the vocabulary"),
        (lambda: bd.step([a, b], [1]), "2 slots and 1 tokens"),
        (lambda: bd.step([], []), "at least one slot"),
        (lambda: bd.prefill(free, [1]), "is free"),
        (lambda: bd.extend(a, [-1]), "outside the vocabulary"),
        (lambda: bd.extend(a, list(range(62))), "max_context=64"),
        (lambda: bd.prefill(a, []), "no tokens"),
        (lambda: bd.position(free), "is free"),
        (lambda: bd.release(4), "slot 4"),
        (lambda: bd.step([a, b], [1.0, 2]), "expected an int"),
    ]
    for fn, text in cases:
        with pytest.raises(InputError, match=text):
            fn()
    assert (bd.position(a), bd.position(b), bd.in_use()) == (3, 1, 2)
    # nothing changed: slot a continues as if the bad calls never happened
    got = bd.step([a], [8])[0]
    np.testing.assert_allclose(got, single_stream(m, [5, 6, 7], [8])[1], **TOL)
    assert int(la.argmax()) == int(m.logits([5, 6, 7]).argmax())
    for s in (a, b):
        bd.release(s)
    with pytest.raises(InputError, match="slots must be an int >= 1"):
        m.batched(0)
    with pytest.raises(InputError, match="max_context"):
        m.batched(2, max_context=10**6)


def test_slot_cache_attention_op_matches_numpy() -> None:
    """The op's reference and its compiled kernel against per-token NumPy softmax
    attention over slot caches the test keeps (3 slots, GQA, decode tokens of two slots
    and a prefill run of a third in one call, then a second call reading those rows)."""
    import rlx

    h, d, hkv, nslots, cap = 4, 8, 2, 3, 16
    rng = np.random.default_rng(7)
    g = rlx.Graph("slots")
    t = g.sym("t", max=cap)
    q, k, v = (g.input(n, (1, t, w * d)) for n, w in (("q", h), ("k", hkv), ("v", hkv)))
    pos, sl = g.input("positions", (t,), "i64"), g.input("slots", (t,), "i64")
    kc, vc = (g.param(n, (nslots, cap, hkv * d)) for n in ("kc", "vc"))
    g.set_outputs([g.slot_cache_attention(q, k, v, kc, vc, pos, sl, h, d, hkv)])
    init = {n: rng.standard_normal((nslots, cap, hkv * d)).astype(np.float32) for n in ("kc", "vc")}
    cg = rlx.Session("cpu").compile(g)
    cg.set_params({n: a.copy() for n, a in init.items()})
    keys, vals = init["kc"].astype(np.float64), init["vc"].astype(np.float64)
    for positions, slots in (([5, 2, 0, 1, 2, 3], [0, 1, 2, 2, 2, 2]), ([6, 4], [0, 2])):
        n = len(positions)
        feed = {x: rng.standard_normal((1, n, w * d)).astype(np.float32)
                for x, w in (("q", h), ("k", hkv), ("v", hkv))}  # fmt: skip
        feed["positions"], feed["slots"] = np.array(positions), np.array(slots)
        before = {"kc": keys.astype(np.float32), "vc": vals.astype(np.float32)}
        keys[slots, positions], vals[slots, positions] = feed["k"][0], feed["v"][0]
        want = np.zeros((n, h * d))
        for i, (p, s) in enumerate(zip(positions, slots, strict=True)):
            for hh in range(h):
                kv = hh // (h // hkv)
                qh = feed["q"][0, i, hh * d : (hh + 1) * d].astype(np.float64)
                kk = keys[s, : p + 1, kv * d : (kv + 1) * d]
                e = np.exp((kk @ qh) / np.sqrt(d) - (kk @ qh).max() / np.sqrt(d))
                want[i, hh * d : (hh + 1) * d] = (
                    e @ vals[s, : p + 1, kv * d : (kv + 1) * d] / e.sum()
                )
        (ref,) = g.evaluate(feed, before)
        (got,) = cg.run(feed)
        np.testing.assert_allclose(ref[0], want, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(got[0], want, rtol=2e-5, atol=2e-5)
    bad = dict(feed, positions=np.array([6, 6]), slots=np.array([0, 0]))
    with pytest.raises(InputError, match="token 1 writes slot 0 position 6"):
        cg.run(bad)
    with pytest.raises(InputError, match="slot 3, outside the cache's 3 slots"):
        cg.run(dict(feed, slots=np.array([0, 3])))
    with pytest.raises(InputError, match="position 16, outside the cache of 16"):
        cg.run(dict(feed, positions=np.array([16, 1])))


@pytest.mark.slow
def test_gemma3_batched_decode_matches_single_stream() -> None:
    with gemma_f32(max_context=96) as m:
        bd = m.batched(4, max_context=96)
        prompts = [
            m.encode("The capital of France is"),
            m.encode("def fibonacci(n):\n    "),
            m.encode("List three colours of the rainbow: red,"),
            m.encode("1, 2, 3, 4,"),
            m.encode("Once upon a time"),
        ]
        run_schedule(m, bd, prompts, joins=[0, 0, 2, 3, 9], leaves=[7, 16, 10, 16, 16], steps=16)
