"""Gemma-3-270M Q4_K_M with f32 activations (RLX_DQ_ACT=f32) against transformers'
Gemma3ForCausalLM on the same decoded weights (stored references, see conftest.py):
logits of the prefill and the first decode steps within f32 accumulation noise, greedy
continuations identical."""

from __future__ import annotations

import pytest

from tests.models.llm.conftest import gemma_f32, greedy, logit_error, references

# f32 products in another order over 18 layers: |error| / max|logit| measured 3e-7..1e-6
TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    with gemma_f32(max_context=704) as m:
        yield m


@pytest.fixture(scope="module")
def refs():
    return references()["torch"]


def test_france_prefill_and_decode_logits_and_greedy(model, refs) -> None:
    r = refs["france"]
    toks, seen = greedy(model, r["ids"], 16)
    for logits, top in zip(seen, r["steps"], strict=False):
        assert logit_error(logits, top) < TOL
    assert toks == r["greedy"][:16]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["france", "story", "code", "water"])
def test_greedy_32_tokens_match_torch(model, refs, name) -> None:
    r = refs[name]
    toks, seen = greedy(model, r["ids"], 32)
    errs = [logit_error(lg, top) for lg, top in zip(seen, r["steps"], strict=False)]
    assert max(errs) < TOL, errs
    assert toks == r["greedy"]


@pytest.mark.slow
def test_past_the_sliding_window_matches_torch(model, refs) -> None:
    r = refs["long"]  # 625 tokens: the sliding-window layers see only the last 512
    toks, seen = greedy(model, r["ids"], 4)
    errs = [logit_error(lg, top) for lg, top in zip(seen, r["steps"], strict=False)]
    assert max(errs) < TOL, errs
    assert toks == r["greedy"][:4]
