"""Gemma-3-270M Q4_K_M: the issue's anchor (llama.cpp's greedy continuation of "The capital
of France is", which transformers' f32 model also gives), generation (sampling, stop
strings and tokens, streaming), the command line, and bad input. With f32 activations
(RLX_DQ_ACT=f32, the default): the opt-in int8 activations of the decode GEMVs
(RLX_DQ_ACT=auto) change the text after a few tokens (see test_gemma3_llama_cpp.py)."""

from __future__ import annotations

import pytest

from rlx.errors import InputError
from tests.models.llm.conftest import gemma_f32, gemma_path

FRANCE = [2, 818, 5279, 529, 7001, 563]
# llama.cpp: " the capital of the country of France. It is the largest city in France."
LLAMA_CPP = [506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207, 528, 7001]


@pytest.fixture(scope="module")
def model():
    with gemma_f32(max_context=96) as m:
        yield m


def test_tokenizer_and_greedy_text_match_llama_cpp(model) -> None:
    assert model.encode("The capital of France is") == FRANCE
    r = model.generate("The capital of France is", max_tokens=15)
    assert r.prompt_ids == FRANCE
    assert r.token_ids == LLAMA_CPP
    assert r.text == " the capital of the country of France. It is the largest city in France"
    assert r.finish_reason == "max_tokens"
    s = r.stats
    assert (s.prompt_tokens, s.generated_tokens, s.decode_steps) == (6, 15, 14)
    assert s.prefill_tokens_per_s > 0 and s.decode_tokens_per_s > 0
    # one schedule for the 6-token prompt (padded to 8) and one for every decode step
    assert sorted(p["seq"] for p in model.compiled.shape_plans) == [1, 8]


def test_sampling_is_reproducible_and_streams_the_same_text(model) -> None:
    kw = dict(max_tokens=10, temperature=0.9, top_k=40, top_p=0.95, seed=123)
    a = model.generate(FRANCE, **kw)
    pieces: list[str] = []
    s = model.generate(FRANCE, stream=True, on_text=pieces.append, **kw)
    streamed = list(s)
    assert s.result is not None and s.result.token_ids == a.token_ids
    assert "".join(streamed) == "".join(pieces) == a.text == s.result.text
    assert len(streamed) > 1
    # top_k=1 is greedy whatever the temperature
    g = model.generate(FRANCE, max_tokens=5, temperature=1.5, top_k=1, seed=1)
    assert g.token_ids == LLAMA_CPP[:5]


def test_stop_string_cuts_the_text(model) -> None:
    r = model.generate(FRANCE, max_tokens=15, stop=["France."])
    assert r.finish_reason == "stop_string"
    assert r.text == " the capital of the country of "
    pieces = list(model.generate(FRANCE, max_tokens=15, stop=["France."], stream=True))
    assert "".join(pieces) == r.text


def test_stop_token_ends_generation(model) -> None:
    # the file's eos (1) and <end_of_turn> (106, by its text as llama.cpp does) stop
    assert {1, 106} <= model.tokenizer.stop_ids
    r = model.generate(FRANCE, max_tokens=15, stop_ids=[7001])  # " France"
    assert r.finish_reason == "stop_token"
    assert r.token_ids == LLAMA_CPP[:6] and r.text == " the capital of the country of"


def test_context_longer_than_max_is_an_error_naming_the_lengths(model) -> None:
    with pytest.raises(InputError, match=r"prompt of 6 tokens \+ max_tokens=100 needs 105 "
                       r"positions, more than max_context=96"):  # fmt: skip
        model.generate(FRANCE, max_tokens=100)
    model.prefill(FRANCE)
    with pytest.raises(InputError, match=r"6 tokens in the context \+ 91 new tokens = 97 exceeds"):
        model.extend([5] * 91)
    assert model.position == 6  # unchanged


def test_cli_streams_text_then_tokens_per_second() -> None:
    from click.testing import CliRunner

    from rlx.cli import cli

    res = CliRunner().invoke(
        cli, ["generate", gemma_path(), "The capital of France is", "--max-tokens", "6",
              "--threads", "1", "--max-context", "64"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(" the capital of the country of")
    assert "prefill 6 tokens" in res.stderr and "tokens/s" in res.stderr
