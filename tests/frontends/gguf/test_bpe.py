"""GgufTokenizer "gpt2" (byte-level BPE) vs the ``tokenizers`` library: a small BPE trained
here with each pre-tokenizer regex (Llama 3, Qwen 2, GPT-2), written into a GGUF file
with gguf.GGUFWriter as llama.cpp's converter does (tokens, types, merges, pre,
special ids), read back with GgufTokenizer.from_file; ids and decoded text must equal
the library's on unicode, whitespace, digits and special tokens."""

from __future__ import annotations

import pytest

from rlx.frontends.gguf import GgufTokenizer
from rlx.frontends.gguf.bpe import PRE_TOKENIZER_SPLITS
from tests.frontends.gguf.blocks import finish, gguf

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("regex")
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers  # noqa: E402

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2026; we'll see 123 of 4567 items.",
    "Le café est fermé le dimanche, naïve résumé façade Ångström.",
    "日本語のテキストと中文文本，还有한국어 텍스트。 🙂🚀🎉",
    "def f(x):\n    return x ** 2  # square\n\n\tindented\ttabs\r\nwindows",
    "Русский текст, ελληνικά, العربية, हिन्दी — dashes… quotes “like” ‘these’",
] * 20
TEXTS = [
    "The capital of France is Paris.",
    "The quick brown fox jumps over the lazy dog. It's 2026; we'll see 123 items.",
    "  leading spaces and trailing   ",
    "digits 1234567 and 3.14159 and 2026-11-25",
    "I'm sure they've said 'hello' and THEY'LL go",
    "café 日本語 🙂 👨\u200d👩\u200d👧 \U00020001 unseen: ŉ ǅ ẞ",
    "new\nlines\n\n\nand\ttabs\t\t and\r\nwindows\n",
    "<|begin_of_text|>special<|eot_id|> tokens <|end_of_text|>",
    "     ",
    "",
    "emoji🎉🎉🎉glued, punctuation!!!??? ... ---",
]


def trained(pre: str):
    whole_first = PRE_TOKENIZER_SPLITS[pre] is PRE_TOKENIZER_SPLITS["llama-bpe"]
    tk = tokenizers.Tokenizer(models.BPE(ignore_merges=whole_first))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIALS,
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS, trainer)
    return tk


def write_gguf(path, tk, pre: str):
    import json

    model = json.loads(tk.to_str())["model"]
    vocab = tk.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|begin_of_text|>"])
    w.add_eos_token_id(vocab["<|end_of_text|>"])
    w.add_add_bos_token(True)
    finish(w)
    return path


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt2"])
def test_byte_level_bpe_matches_tokenizers(tmp_path, pre):
    tk = trained(pre)
    tok = GgufTokenizer.from_file(write_gguf(tmp_path / f"{pre}.gguf", tk, pre))
    bos, eot = tk.token_to_id("<|begin_of_text|>"), tk.token_to_id("<|eot_id|>")
    assert tok.model == "gpt2" and tok.bos_id == bos
    assert eot in tok.stop_ids and tok.eos_id in tok.stop_ids
    for text in TEXTS:
        want = tk.encode(text).ids
        assert tok.encode(text, add_bos=False) == want, repr(text)
        assert tok.encode(text) == [bos, *want]
        assert tok.decode(want) == tk.decode(want, skip_special_tokens=False) == text
        assert "".join(tok.decode_stream(want, skip_special=False)) == text
    # digits: Llama 3 groups up to three, Qwen 2 one by one
    ids = tok.encode("1234567", add_bos=False)
    assert "".join(tok.tokens[i] for i in ids) == "1234567"
    if pre == "qwen2":
        assert len(ids) == 7
