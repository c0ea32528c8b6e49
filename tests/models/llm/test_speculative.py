"""Speculative decoding (rlx/models/llm/speculative.py): ``generate(..., draft=)`` with a
draft model (the target itself, which accepts every draft, and a different random model,
which rejects most) and with prompt lookup (``draft="ngram"``). Oracles: transformers'
greedy tokens and logits on the tiny llama (tiny_llama.py, f32 activations), plain greedy
``generate``, and NumPy's softmax for the speculative sampling rule. The slow tier runs
Gemma-3-270M against the transformers greedy references (tests/data/llm) and the CLI."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import rlx.models.llm as llm  # noqa: E402
from rlx.errors import InputError  # noqa: E402
from rlx.models.llm.sampling import SamplingParams  # noqa: E402
from rlx.models.llm.speculative import NgramDraft, accept_drafts, distribution  # noqa: E402
from tests.models.llm.conftest import gemma_f32, gemma_path, references  # noqa: E402
from tests.models.llm.tiny_llama import hf_model, hf_weights, write_gguf  # noqa: E402

PROMPTS = [
    [1, 17, 5, 42, 9, 33, 2],
    [7],
    [40, 41, 42, 43, 40, 41, 42, 43, 40, 41],
    [3, 60, 3, 60, 3, 60, 88, 12, 5, 3, 60],
]
NEW = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(target, transformers' target, a different draft model) on the tiny llama."""
    d = tmp_path_factory.mktemp("spec")
    used = write_gguf(d / "target.gguf", hf_weights(seed=3, arch="llama"), arch="llama")
    write_gguf(d / "draft.gguf", hf_weights(seed=11, arch="llama"), arch="llama")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLX_DQ_ACT", "f32")
        m = llm.load(d / "target.gguf", max_context=64, num_threads=1)
        other = llm.load(d / "draft.gguf", max_context=64, num_threads=1)
        yield m, hf_model(used, "llama"), other


@pytest.fixture(scope="module")
def want(tiny) -> list[list[int]]:
    """transformers' greedy tokens after each of PROMPTS; plain greedy ``generate`` gives
    them too."""
    m, ref, _ = tiny
    out = [torch_greedy(ref, p, NEW) for p in PROMPTS]
    for p, w in zip(PROMPTS, out, strict=True):
        assert m.generate(p, max_tokens=NEW, stop_at_eos=False).token_ids == w
    return out


def torch_greedy(ref, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]


def test_verify_rows_and_truncate_match_transformers(tiny) -> None:
    m, ref, _ = tiny
    prompt, a, b = [1, 17, 5, 42, 9], [8, 30, 2, 77], [50, 51]
    st = m.new_state()
    st.prefill(prompt)
    rows = st.verify(a)
    assert rows.shape == (4, m.config.vocab) and st.position == 9
    with torch.no_grad():
        want = ref(torch.tensor([prompt + a])).logits[0].numpy()
    tol = dict(rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(rows, want[5:], **tol)
    # drop the last two drafted tokens: their rows are overwritten by the next run
    st.truncate(7)
    rows = st.verify(b)
    with torch.no_grad():
        want = ref(torch.tensor([prompt + a[:2] + b])).logits[0].numpy()
    np.testing.assert_allclose(rows, want[7:], **tol)
    np.testing.assert_allclose(st.step(3), ref_last(ref, prompt + a[:2] + b + [3]), **tol)
    with pytest.raises(InputError, match=r"truncate position must be an int in \[0, 10\]"):
        st.truncate(11)


def ref_last(ref, seq: list[int]) -> np.ndarray:
    with torch.no_grad():
        return ref(torch.tensor([seq])).logits[0, -1].numpy()


@pytest.mark.parametrize("which", ["ngram", "self", "other"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_equals_plain_and_transformers(tiny, want, which, k) -> None:
    m, _, other = tiny
    draft = {"ngram": "ngram", "self": m, "other": other}[which]
    drafted = accepted = 0
    for p, w in zip(PROMPTS, want, strict=True):
        spec = m.generate(p, max_tokens=NEW, stop_at_eos=False, draft=draft, num_draft=k)
        assert spec.token_ids == w, f"prompt {p}"
        s = spec.stats
        assert s.generated_tokens == NEW and s.decode_steps == NEW - 1
        assert len(s.accepted) == len(s.drafted) and max(s.drafted) <= k
        # every target run adds its accepted drafts and one token of its own
        assert sum(s.accepted) + len(s.accepted) == NEW - 1
        drafted += sum(s.drafted)
        accepted += sum(s.accepted)
        if which == "self":  # the target drafting for itself: every draft is accepted
            assert s.accepted == s.drafted and min(s.drafted[:-1]) == k
    if which == "self":
        assert drafted > 0
    elif which == "other":  # another random model: most drafts are rejected
        assert 0 < drafted and accepted < drafted / 2
    else:
        assert 0 < accepted <= drafted


def test_stop_tokens_and_a_full_context(tiny) -> None:
    m, ref, other = tiny
    p = PROMPTS[2]
    plain = m.generate(p, max_tokens=NEW, stop_at_eos=False)
    stop = plain.token_ids[9]
    first = plain.token_ids.index(stop)
    for draft in ("ngram", m, other):
        r = m.generate(p, max_tokens=NEW, stop_ids=stop, draft=draft, num_draft=4)
        assert r.finish_reason == "stop_token" and r.token_ids == plain.token_ids[:first]
    # prompt + max_tokens - 1 == max_context: the drafts never run past the cache
    n = 64 - len(p) + 1
    want = m.generate(p, max_tokens=n, stop_at_eos=False).token_ids
    for draft in ("ngram", m, other):
        got = m.generate(p, max_tokens=n, stop_at_eos=False, draft=draft, num_draft=8)
        assert got.token_ids == want
    s = m.generate(p, max_tokens=10, stop_at_eos=False, draft="ngram", stream=True)
    assert s.result is None
    list(s)
    assert s.result is not None and s.result.token_ids == want[:10]


def test_bad_drafts_are_named(tiny, tmp_path, monkeypatch) -> None:
    m, _, _ = tiny
    monkeypatch.setenv("RLX_DQ_ACT", "f32")
    write_gguf(tmp_path / "v.gguf", hf_weights(seed=1, vocab=100), arch="llama")
    wide = llm.load(tmp_path / "v.gguf", max_context=64, num_threads=1)
    with pytest.raises(InputError, match=r"vocabulary of 100 tokens, the target .* 96"):
        m.generate([1, 2], max_tokens=4, draft=wide)
    with pytest.raises(InputError, match="'ngrams'"):
        m.generate([1, 2], max_tokens=4, draft="ngrams")
    with pytest.raises(InputError, match=r"num_draft must be an int in \[1, 16\], given 0"):
        m.generate([1, 2], max_tokens=4, draft="ngram", num_draft=0)
    short = llm.load(m.path, max_context=8, num_threads=1)
    with pytest.raises(InputError, match="draft model's max_context=8 is smaller than the 10"):
        m.generate([1, 2, 3, 4, 5], max_tokens=6, draft=short)
    with pytest.raises(InputError, match="min_ngram=3 exceeds max_ngram=2"):
        NgramDraft(max_ngram=2, min_ngram=3)


def test_ngram_lookup_takes_the_latest_longest_match() -> None:
    nd = NgramDraft(max_ngram=3)
    assert nd.lookup([5, 6, 7, 1, 5, 6, 7, 2, 9, 6, 7], 3) == [2, 9, 6]  # "6 7": latest
    assert nd.lookup([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 2) == [9, 2]  # "1 2 3" beats "2 3"
    assert nd.lookup([1, 2, 3], 4) == []
    assert nd.lookup([4, 4], 5) == [4]


@pytest.mark.parametrize("top_k", [0, 3])
@pytest.mark.parametrize("with_q", [True, False])
def test_speculative_sampling_keeps_the_target_distribution(top_k, with_q) -> None:
    """The first token out of a step (an accepted draft, or the draw after a rejection) is
    distributed as the target's softmax(logits / T) restricted to its top-k (NumPy)."""
    rng = np.random.default_rng(0)
    vocab, temp, n = 6, 0.8, 20000
    logits = rng.standard_normal((2, vocab)).astype(np.float32) * 2
    z = logits[0].astype(np.float64) / temp
    if top_k:
        z[np.argsort(-z)[top_k:]] = -np.inf
    want = np.exp(z - z.max())
    want /= want.sum()
    sp = SamplingParams(temperature=temp, top_k=top_k, seed=1)
    np.testing.assert_allclose(distribution(logits[0], sp), want, rtol=1e-12, atol=1e-15)
    q = rng.dirichlet(np.ones(vocab))
    counts = np.zeros(vocab)
    for _ in range(n):
        d = int(rng.choice(vocab, p=q)) if with_q else 2
        a, nxt = accept_drafts(logits, [d], [q] if with_q else None, sp, rng)
        counts[d if a == 1 else nxt] += 1
    got = counts / n
    bound = 5 * np.sqrt(want * (1 - want) / n) + 1e-12
    assert (np.abs(got - want) <= bound).all(), (got, want)


@pytest.mark.slow
def test_gemma3_greedy_equals_transformers_with_ngram_and_self_draft() -> None:
    refs = references()["torch"]
    with gemma_f32(max_context=96) as m, gemma_f32(max_context=96) as d:
        for name in ("france", "story", "code", "water"):
            r = refs[name]
            for draft in ("ngram", d):
                got = m.generate(r["ids"], max_tokens=32, stop_at_eos=False, draft=draft)
                assert got.token_ids == r["greedy"], (name, draft)
                s = got.stats
                assert sum(s.accepted) + len(s.accepted) == 31
                if draft is d:
                    assert s.accepted == s.drafted


@pytest.mark.slow
def test_gemma3_cli_draft_gives_the_plain_text() -> None:
    from click.testing import CliRunner

    from rlx.cli.generate import command

    path = gemma_path()
    args = [path, "Repeat: the quick brown fox. Again: the quick", "--max-tokens", "16"]
    runner = CliRunner()
    plain = runner.invoke(command, [*args, "--threads", "1"])
    spec = runner.invoke(
        command, [*args, "--threads", "1", "--draft", "ngram", "--num-draft", "3", "--verbose"]
    )
    assert plain.exit_code == 0 and spec.exit_code == 0, spec.output
    assert spec.stdout == plain.stdout
    assert "speculative:" in spec.stderr and "accepted/drafted per target run:" in spec.stderr


def test_sampling_with_a_draft_runs_and_is_reproducible(tiny) -> None:
    m, _, other = tiny
    for draft in ("ngram", other):
        kw = dict(max_tokens=NEW, stop_at_eos=False, temperature=0.8, top_k=20, seed=5)
        a = m.generate(PROMPTS[2], draft=draft, **kw)
        b = m.generate(PROMPTS[2], draft=draft, **kw)
        assert a.token_ids == b.token_ids and len(a.token_ids) == NEW
        assert sum(a.stats.accepted) + len(a.stats.accepted) == NEW - 1
