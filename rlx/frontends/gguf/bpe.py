"""The two BPE algorithms a GGUF vocabulary names in ``tokenizer.ggml.model``. In: a text
fragment (special tokens already cut out). Out: token ids.

* ``"llama"`` (SentencePiece BPE, llama.cpp ``llm_tokenizer_spm``): spaces become ``▁``;
  the fragment starts as one symbol per character; the adjacent pair whose
  concatenation is a vocabulary token with the highest score merges first (ties: the
  leftmost); a final symbol that is not a token falls back to its UTF-8 bytes
  (``<0xNN>`` tokens), else the unknown token.
* ``"gpt2"`` (byte-level BPE, llama.cpp ``llm_tokenizer_bpe``): the fragment is split by
  the pre-tokenizer regex of ``tokenizer.ggml.pre``, each piece's UTF-8 bytes are spelled
  in GPT-2's byte alphabet (``bytes_to_unicode``) and merged by the rank of
  ``tokenizer.ggml.merges`` (every occurrence of the best pair at once, as GPT-2 does;
  with the Llama 3 pre-tokenizers a piece that is a token whole is taken as is).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from rlx.errors import GgufError

__all__ = ["spm_encode", "ByteLevelBpe", "bytes_to_unicode", "PRE_TOKENIZER_SPLITS"]


def spm_encode(
    text: str,
    vocab: dict[str, int],
    scores: list[float],
    byte_ids: list[int] | None,
    unk_id: int,
) -> list[int]:
    """SentencePiece-BPE ids of ``text`` (spaces already ``▁``)."""
    if not text:
        return []
    syms = list(text)
    n = len(syms)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap: list[tuple[float, int, str, str]] = []

    def push(i: int) -> None:
        j = nxt[i]
        if j < n:
            tok = vocab.get(syms[i] + syms[j])
            if tok is not None:
                heapq.heappush(heap, (-scores[tok], i, syms[i], syms[j]))

    for i in range(n - 1):
        push(i)
    while heap:
        _, i, left, right = heapq.heappop(heap)
        j = nxt[i] if alive[i] else n
        if j >= n or syms[i] != left or syms[j] != right:
            continue  # stale: one side merged since
        syms[i] = left + right
        alive[j] = False
        nxt[i] = nxt[j]
        if nxt[i] < n:
            prv[nxt[i]] = i
        if prv[i] >= 0:
            push(prv[i])
        push(i)
    out: list[int] = []
    i = 0
    while i < n:
        s = syms[i]
        tok = vocab.get(s)
        if tok is not None:
            out.append(tok)
        elif byte_ids is not None:
            out.extend(byte_ids[b] for b in s.encode("utf-8"))
        else:
            out.append(unk_id)
        i = nxt[i]
    return out


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (printable Latin-1 bytes map to themselves,
    the rest to U+0100 upwards)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=True)}


_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: ``tokenizer.ggml.pre`` -> the regex that splits text before byte-level BPE
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    "default": _GPT2,
    "gpt2": _GPT2,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "llama-bpe": _LLAMA3,
    "smollm": _GPT2,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
}


def _compile(pattern: str) -> Callable[[str], list[str]]:
    try:
        import regex  # \p{L} / \p{N} classes, which the stdlib re lacks
    except ImportError:  # pragma: no cover - installed with transformers / tokenizers
        raise GgufError(
            "a byte-level BPE (tokenizer.ggml.model 'gpt2') tokenizer needs the 'regex' "
            "package for its pre-tokenizer: pip install regex"
        ) from None
    return regex.compile(pattern).findall


class ByteLevelBpe:
    """GPT-2-style byte-level BPE over a vocabulary and its ranked merges."""

    def __init__(self, vocab: dict[str, int], merges: list[str], pre: str, unk_id: int):
        split = PRE_TOKENIZER_SPLITS.get(pre)
        if split is None:
            raise GgufError(
                f"tokenizer.ggml.pre {pre!r} is not a pre-tokenizer rlx knows; known: "
                f"{sorted(PRE_TOKENIZER_SPLITS)}"
            )
        self.vocab = vocab
        self.unk_id = unk_id
        self.ranks: dict[tuple[str, str], int] = {}
        for r, m in enumerate(merges):
            a, sep, b = m.partition(" ")
            if not sep:
                raise GgufError(f"tokenizer.ggml.merges[{r}] {m!r} is not 'left right'")
            self.ranks.setdefault((a, b), r)
        self.split = _compile(split)
        # llama.cpp (and Meta's tokenizer.json) take a piece that is a token whole for the
        # Llama 3 pre-tokenizers only ("ignore_merges")
        self.whole_first = split is _LLAMA3
        self.byte_chars = bytes_to_unicode()
        self.cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        """Ids of a fragment (no special tokens in it)."""
        out: list[int] = []
        cache = self.cache
        for piece in self.split(text):
            ids = cache.get(piece)
            if ids is None:
                ids = self._piece(piece)
                if len(cache) < 100_000:
                    cache[piece] = ids
            out.extend(ids)
        return out

    def _piece(self, piece: str) -> list[int]:
        word = [self.byte_chars[b] for b in piece.encode("utf-8")]
        whole = "".join(word)
        if self.whole_first and whole in self.vocab:
            return [self.vocab[whole]]
        ranks = self.ranks
        while len(word) > 1:
            best, at = None, -1
            for i in range(len(word) - 1):
                r = ranks.get((word[i], word[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            a, b = word[at], word[at + 1]
            merged: list[str] = []
            i = 0
            while i < len(word):  # merge every (a, b) left to right, as GPT-2 does
                if i < len(word) - 1 and word[i] == a and word[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return [self.vocab.get(w, self.unk_id) for w in word]
