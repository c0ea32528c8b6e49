"""Prefill without power-of-two padding and chunked prefill, on a tiny random llama GGUF
file against transformers' LlamaForCausalLM (f32 activations: RLX_DQ_ACT=f32): a
129-token prompt runs at a length class of at most 144 (not 256) and gives transformers'
logits; a prompt run in chunks on the KV cache gives the one-shot logits and the same
greedy tokens; the real Gemma-3-270M (slow) keeps its greedy text when chunked."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import rlx.models.llm as llm  # noqa: E402
from rlx.errors import InputError  # noqa: E402
from tests.models.llm.tiny_llama import CFG, hf_model, hf_weights, write_gguf  # noqa: E402

CTX = 320


def _prompt(n: int) -> list[int]:
    return [1] + [(7 * i + 3) % (CFG["vocab"] - 2) + 2 for i in range(n - 1)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):  # noqa: ANN201
    path = tmp_path_factory.mktemp("prefill") / "tiny.gguf"
    used = write_gguf(path, hf_weights(seed=3), meta={"{arch}.context_length": CTX})
    return path, hf_model(used)


def _load(path, monkeypatch):  # noqa: ANN001, ANN202
    monkeypatch.setenv("RLX_DQ_ACT", "f32")  # f32 products, as transformers computes
    return llm.load(path, max_context=CTX, num_threads=1)


def _seen_lengths(model) -> list[int]:  # noqa: ANN001
    """Wrap ``model.compiled.run`` to record the ``seq`` length of every run."""
    seen: list[int] = []
    run = model.compiled.run

    def recording(feed, **kw):  # noqa: ANN001, ANN003, ANN202
        out = run(feed, **kw)
        seen.append(int(model.compiled._last.bindings["seq"]))
        assert seen[-1] == feed["input_ids"].shape[1]
        return out

    model.compiled.run = recording
    return seen


def test_129_tokens_run_at_their_length_and_match_transformers(tiny, monkeypatch) -> None:
    path, ref = tiny
    m = _load(path, monkeypatch)
    seen = _seen_lengths(m)
    ids = _prompt(129)
    got = m.prefill(ids)
    assert seen == [144]  # the next multiple of 16, not the power of two 256
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # small prompts share the class of 8; a 17-token prompt runs as 32
    m.prefill(_prompt(5))
    m.prefill(_prompt(17))
    assert seen[1:] == [8, 32]


@pytest.mark.parametrize("chunk", [32, 50])
def test_chunked_prefill_equals_one_shot(tiny, monkeypatch, chunk) -> None:
    path, ref = tiny
    m = _load(path, monkeypatch)
    ids = _prompt(129)
    whole = m.prefill(ids)
    toks_whole = [int(whole.argmax())]
    for _ in range(6):
        toks_whole.append(int(m.step(toks_whole[-1]).argmax()))
    m.prefill_chunk = chunk
    seen = _seen_lengths(m)
    before = m.times.prefill_tokens
    parts = m.prefill(ids)
    n_chunks = -(-129 // chunk)
    assert len(seen) == n_chunks and max(seen) <= -(-chunk // 16) * 16
    assert m.position == 129 and m.times.prefill_tokens - before == 129
    np.testing.assert_allclose(parts, whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max())
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(parts, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    toks = [int(parts.argmax())]
    for _ in range(6):
        toks.append(int(m.step(toks[-1]).argmax()))
    assert toks == toks_whole
    # extend past a chunk on a non-empty context: the same as the whole prompt at once
    m.prefill(ids[:40])
    np.testing.assert_allclose(
        m.extend(ids[40:]), whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max()
    )


def test_bad_prefill_chunk_is_named(tiny, monkeypatch) -> None:
    m = _load(tiny[0], monkeypatch)
    m.prefill_chunk = 0
    with pytest.raises(InputError, match=r"prefill_chunk must be an int >= 1, given 0"):
        m.prefill([1, 2, 3])


@pytest.mark.slow
def test_gemma_greedy_text_unchanged_when_chunked() -> None:
    from tests.models.llm.conftest import gemma_f32, greedy

    with gemma_f32(256) as m:
        ids = m.encode("The capital of France is a city that has been home to many artists, "
                       "writers and scientists over the centuries, and its museums")  # fmt: skip
        whole, _ = greedy(m, ids, 12)
        m.prefill_chunk = 8
        chunked, _ = greedy(m, ids, 12)
    assert chunked == whole
