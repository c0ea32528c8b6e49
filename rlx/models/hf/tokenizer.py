"""Tokenizer glue. In: ``tokenizer.json`` (the ``tokenizers`` library's format) and the
longest sequence to keep. Out: :class:`Tokenizer`, which turns texts into the padded
integer arrays the encoder graph takes (``input_ids``, ``attention_mask`` and, when the
model has token types, ``token_type_ids``).

Truncation follows the tokenizer's own settings (strategy, direction, stride) with
``max_length`` set to the model's limit; padding is done here, to a length chosen by the
caller (the SentenceEncoder pads to a few bucket sizes), on the side the tokenizer file
says, with its pad id.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import InputError, ModelError
from rlx.models.hf.weights import extra_import

__all__ = ["Tokenizer", "check_texts"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_texts(texts: Any) -> list[str]:
    """``texts`` as a list of str; InputError naming the first non-string by its index
    (a single str is refused: it would be read as characters) or the first text holding a
    lone surrogate (what a shell argument or ``os.fsdecode`` makes of bytes that are not
    UTF-8: the tokenizer cannot take it), with the surrogate's position."""
    if isinstance(texts, (str, bytes)):
        raise InputError(f"texts must be a list of strings, got a single {type(texts).__name__}")
    try:
        out = list(texts)
    except TypeError:
        raise InputError(f"texts must be a list of strings, got {type(texts).__name__}") from None
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise InputError(f"texts[{i}] is a {type(t).__name__} ({t!r:.40}), expected a str")
        m = _SURROGATE.search(t)
        if m is not None:
            j = m.start()
            shown = (
                repr(t) if len(t) <= 40 else f"{t[:37]!r}... (near {t[max(0, j - 10) : j + 10]!r})"
            )
            raise InputError(
                f"texts[{i}] {shown} holds a lone surrogate U+{ord(m.group()):04X} at "
                f"position {j}: not valid Unicode, it cannot be encoded as UTF-8 (bytes that "
                f"were not UTF-8, e.g. a shell argument; decode them with errors='replace')"
            )
    return out


class Tokenizer:
    """A ``tokenizers.Tokenizer`` read from ``path`` truncating at ``max_length`` tokens
    (special tokens included)."""

    def __init__(self, path: Path, max_length: int, pad_id: int, token_types: bool):
        tk = extra_import("tokenizers")
        if not path.is_file():
            raise ModelError(f"tokenizer: {path} does not exist (rlx reads tokenizer.json)")
        try:
            tok = tk.Tokenizer.from_file(str(path))  # type: ignore[attr-defined]
        except Exception as e:  # the library raises a bare Exception on a bad file
            raise ModelError(f"tokenizer: {path} could not be read ({e})") from None
        trunc = tok.truncation or {}
        tok.enable_truncation(
            max_length,
            stride=trunc.get("stride", 0),
            strategy=trunc.get("strategy", "longest_first"),
            direction=trunc.get("direction", "right"),
        )
        pad = tok.padding or {}
        self.pad_id = int(pad.get("pad_id", pad_id))
        self.pad_left = str(pad.get("direction", "right")).lower() == "left"
        tok.no_padding()
        self._tok = tok
        self.max_length = max_length
        self.token_types = token_types
        self.path = path

    def tokenize(self, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """(token ids, type ids) of each text, truncated, special tokens included."""
        return [(e.ids, e.type_ids) for e in self._tok.encode_batch(list(texts))]

    def tokenize_with_special(self, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """(token ids, special-tokens mask: 1 where the template added the token) of each
        text, truncated."""
        return [(e.ids, e.special_tokens_mask) for e in self._tok.encode_batch(list(texts))]

    def tokenize_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        """(token ids, type ids) of each ``(first, second)`` text pair, framed by the
        tokenizer's pair template (``[CLS] a [SEP] b [SEP]`` with type ids 0 / 1 for BERT)
        and truncated together as the tokenizer file says (longest first by default)."""
        return [(e.ids, e.type_ids) for e in self._tok.encode_batch([tuple(p) for p in pairs])]

    def pad(
        self, encs: Sequence[tuple[list[int], list[int]]], pad_to: int | None = None
    ) -> dict[str, np.ndarray]:
        """Padded i64 arrays [len(encs), L] for the graph, L = ``pad_to`` or the longest."""
        longest = max((len(ids) for ids, _ in encs), default=0)
        n = longest if pad_to is None else pad_to
        if n < longest:
            raise InputError(f"pad_to={pad_to} is shorter than the longest text ({longest} tokens)")
        ids = np.full((len(encs), n), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encs), n), dtype=np.int64)
        types = np.zeros((len(encs), n), dtype=np.int64)
        for i, (tid, ttype) in enumerate(encs):
            k = len(tid)
            sl = slice(n - k, n) if self.pad_left else slice(0, k)
            ids[i, sl] = tid
            mask[i, sl] = 1
            types[i, sl] = ttype
        out = {"input_ids": ids, "attention_mask": mask}
        if self.token_types:
            out["token_type_ids"] = types
        return out

    def encode(self, texts: Sequence[str], pad_to: int | None = None) -> dict[str, np.ndarray]:
        """:meth:`tokenize` then :meth:`pad`."""
        return self.pad(self.tokenize(texts), pad_to)

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.path)!r}, max_length={self.max_length})"
