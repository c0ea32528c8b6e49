"""The tokenizer a GGUF file's metadata describes. In: the ``tokenizer.ggml.*`` keys (tokens,
scores, token types, merges, special ids, flags) of a GGUF file or its metadata dict.
Out: :class:`GgufTokenizer`: ``encode(text) -> ids``, ``decode(ids) -> text``, streaming
decode (:class:`StreamDecoder`, text pieces as ids arrive, whole UTF-8 characters only),
``bos_id`` / ``eos_id`` / ``stop_ids``.

Encoding follows llama.cpp (``llama-vocab.cpp``): first the control and user-defined
tokens (token types 3 and 4, e.g. ``<start_of_turn>``, ``\\n\\n``) are cut out of the text
as whole strings (leftmost, longest first; control tokens only with ``parse_special``),
then each piece of plain text goes through the BPE of ``tokenizer.ggml.model`` (see
:mod:`rlx.frontends.gguf.bpe`): ``"llama"`` (SentencePiece BPE by scores with byte
fallback, used by Gemma and Llama 2) or ``"gpt2"`` (byte-level BPE with merges, used by
Llama 3, Qwen, SmolLM). ``add_space_prefix`` puts a space before plain text at the start
or after a special token (and decoding drops it again after a leading BOS).

Decoding maps each id to its bytes (``▁`` -> space, ``<0xNN>`` -> the byte, byte-level
characters -> their bytes, control tokens -> their text unless ``skip_special``) and
decodes UTF-8, invalid bytes as U+FFFD.
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import GgufError, InputError
from rlx.frontends.gguf.bpe import ByteLevelBpe, bytes_to_unicode, spm_encode

__all__ = ["GgufTokenizer", "StreamDecoder", "check_text"]

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text: object, what: str = "text") -> str:
    """``text`` itself when it is a str of valid Unicode; InputError for another type or
    for a lone surrogate (what ``os.fsdecode`` / a shell argument makes of bytes that are
    not UTF-8), naming the text (shortened) and the surrogate's position."""
    if not isinstance(text, str):
        raise InputError(f"{what} must be a str, given {type(text).__name__} ({text!r:.40})")
    m = _SURROGATE.search(text)
    if m is not None:
        i = m.start()
        shown = (
            repr(text)
            if len(text) <= 40
            else f"{text[:37]!r}... (near {text[max(0, i - 10) : i + 10]!r})"
        )
        raise InputError(
            f"{what} {shown} holds a lone surrogate U+{ord(m.group()):04X} at position {i}: "
            f"not valid Unicode, it cannot be encoded as UTF-8 (bytes that were not UTF-8, "
            f"e.g. a shell argument; decode them with errors='replace')"
        )
    return text


#: texts llama.cpp also treats as end of generation when they are control tokens
_EOG_TEXTS = (
    "<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|end|>", "<eot>",
    "<|end_of_text|>", "<EOT>", "<|eom_id|>", "<end_of_utterance>", "_<EOT>",
)  # fmt: skip


class GgufTokenizer:
    """Encode and decode text with a GGUF vocabulary (build with :meth:`from_file` or
    :meth:`from_metadata`; the tables are built once)."""

    def __init__(self, md: Mapping[str, Any]):
        model = md.get("tokenizer.ggml.model")
        tokens = md.get("tokenizer.ggml.tokens")
        if model not in ("llama", "gpt2"):
            raise GgufError(
                f"tokenizer.ggml.model {model!r} is not supported: rlx reads 'llama' "
                f"(SentencePiece BPE) and 'gpt2' (byte-level BPE)"
            )
        if not isinstance(tokens, list) or not tokens:
            raise GgufError("the GGUF metadata has no tokenizer.ggml.tokens list")
        n = len(tokens)
        types = md.get("tokenizer.ggml.token_type") or [NORMAL] * n
        if len(types) != n:
            raise GgufError(f"tokenizer.ggml.token_type has {len(types)} entries, tokens {n}")
        self.model: str = model
        self.tokens: list[str] = tokens
        self.token_types: list[int] = types
        # the first id of a duplicated string wins (inserted last)
        self.vocab: dict[str, int] = dict(zip(reversed(tokens), range(n - 1, -1, -1)))

        def tid(key: str, default: int | None = None) -> int | None:
            v = md.get(f"tokenizer.ggml.{key}", default)
            if v is not None and not 0 <= v < n:
                raise GgufError(f"tokenizer.ggml.{key} = {v} is outside the vocabulary [0, {n})")
            return v

        self.bos_id: int | None = tid("bos_token_id")
        self.eos_id: int | None = tid("eos_token_id")
        self.eot_id: int | None = tid("eot_token_id")
        self.eom_id: int | None = tid("eom_token_id")
        self.pad_id: int | None = tid("padding_token_id")
        self.unk_id: int = tid("unknown_token_id", 0 if model == "llama" else None) or 0
        is_spm = model == "llama"
        self.add_bos: bool = bool(md.get("tokenizer.ggml.add_bos_token", is_spm))
        self.add_eos: bool = bool(md.get("tokenizer.ggml.add_eos_token", False))
        self.add_space_prefix: bool = bool(md.get("tokenizer.ggml.add_space_prefix", is_spm))
        self.stop_ids: frozenset[int] = frozenset(
            {i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None}
            | {
                self.vocab[t]
                for t in _EOG_TEXTS
                if t in self.vocab and types[self.vocab[t]] == CONTROL
            }
        )
        ty = np.asarray(types)
        special = np.flatnonzero((ty == CONTROL) | (ty == USER_DEFINED)).tolist()
        self._specials = _SpecialMatcher({tokens[i]: i for i in special if tokens[i]})
        control = (ty == CONTROL) | (ty == UNKNOWN) | (ty == UNUSED)
        self._control: set[int] = set(np.flatnonzero(control).tolist())
        if is_spm:
            self.scores: list[float] = md.get("tokenizer.ggml.scores") or [0.0] * n
            byte_ids = [self.vocab.get(f"<0x{b:02X}>", -1) for b in range(256)]
            self._byte_ids = byte_ids if all(i >= 0 for i in byte_ids) else None
        else:
            merges = md.get("tokenizer.ggml.merges")
            if not isinstance(merges, list):
                raise GgufError("a 'gpt2' tokenizer needs tokenizer.ggml.merges; there is none")
            pre = md.get("tokenizer.ggml.pre", "default")
            self._bpe = ByteLevelBpe(self.vocab, merges, pre, self.unk_id)
        self._bytes = self._token_bytes()

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> GgufTokenizer:
        """A tokenizer from a GGUF metadata dict (``GgufFile.metadata``)."""
        return cls(md)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> GgufTokenizer:
        """The tokenizer of the GGUF file at ``path`` (cached per path, size and mtime)."""
        p = Path(path).resolve()
        try:
            st = p.stat()
        except OSError as e:
            raise GgufError(f"cannot open GGUF file {str(p)!r}: {e}") from None
        return _cached(str(p), st.st_size, st.st_mtime_ns)

    @property
    def vocab_size(self) -> int:
        """Number of tokens."""
        return len(self.tokens)

    # -- encoding -------------------------------------------------------------------------

    def encode(
        self,
        text: str,
        add_bos: bool | None = None,
        add_eos: bool | None = None,
        parse_special: bool = True,
    ) -> list[int]:
        """Token ids of ``text``; BOS / EOS as the file says unless given. Control tokens
        written in the text (``<start_of_turn>``) are matched only with ``parse_special``.
        As llama.cpp's ``llama_tokenize``, a text that starts with the BOS token's text
        and gets a BOS has two (``LlmModel.encode`` puts one). InputError for a text that
        is not a str or holds a lone surrogate (:func:`check_text`)."""
        check_text(text)
        ids: list[int] = []
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.append(self.bos_id)
        prev_special = True
        for piece, special in self._specials.split(text, None if parse_special else self._control):
            if special is not None:
                ids.append(special)
                prev_special = True
                continue
            if self.model == "llama":
                if self.add_space_prefix and prev_special:
                    piece = " " + piece
                ids.extend(
                    spm_encode(
                        piece.replace(" ", "\u2581"),
                        self.vocab,
                        self.scores,
                        self._byte_ids,
                        self.unk_id,
                    )
                )
            else:
                ids.extend(self._bpe.encode(piece))
            prev_special = False
        if (self.add_eos if add_eos is None else add_eos) and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    # -- decoding -------------------------------------------------------------------------

    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        """The bytes one token stands for (b"" for a control token with ``skip_special``)."""
        if not 0 <= token_id < len(self._bytes):
            raise GgufError(
                f"token id {token_id} is outside the vocabulary [0, {len(self.tokens)})"
            )
        if skip_special and token_id in self._control:
            return b""
        return self._bytes[token_id]

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of ``ids`` (control tokens spelled out unless ``skip_special``)."""
        s = StreamDecoder(self, skip_special)
        return "".join(s.push(i) for i in ids) + s.flush()

    def stream(self, skip_special: bool = True) -> StreamDecoder:
        """A :class:`StreamDecoder` for ids that arrive one at a time."""
        return StreamDecoder(self, skip_special)

    def decode_stream(self, ids: Iterable[int], skip_special: bool = True) -> Iterator[str]:
        """Yield text pieces as ``ids`` arrive (whole characters only; empty pieces are
        not yielded). Joined, the pieces are ``decode(ids, skip_special)``."""
        s = StreamDecoder(self, skip_special)
        for i in ids:
            piece = s.push(i)
            if piece:
                yield piece
        tail = s.flush()
        if tail:
            yield tail

    def _token_bytes(self) -> list[bytes]:
        out: list[bytes] = []
        types = self.token_types
        if self.model == "llama":
            joined = "\x00".join(self.tokens)
            if joined.count("\x00") == len(self.tokens) - 1:  # no token holds a NUL
                out = joined.replace("\u2581", " ").encode("utf-8").split(b"\x00")
            else:
                out = [t.replace("\u2581", " ").encode("utf-8") for t in self.tokens]
            for i in np.flatnonzero(np.asarray(types) == BYTE).tolist():
                t = self.tokens[i]
                if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                    out[i] = bytes([int(t[3:5], 16)])
            return out
        inv = {c: b for b, c in bytes_to_unicode().items()}
        for t, ty in zip(self.tokens, types, strict=True):
            if ty != CONTROL and all(c in inv for c in t):
                out.append(bytes(inv[c] for c in t))
            else:  # control and user-defined tokens may be stored as plain text
                out.append(t.encode("utf-8"))
        return out

    def __repr__(self) -> str:
        return (
            f"GgufTokenizer(model={self.model!r}, vocab={len(self.tokens)}, bos={self.bos_id}, "
            f"eos={self.eos_id}, stop={sorted(self.stop_ids)})"
        )


class StreamDecoder:
    """Incremental decoding: ``push(id)`` returns the text that is complete so far (bytes of
    a character split over several byte-fallback tokens are held until it is whole),
    ``flush()`` the rest (an incomplete character as U+FFFD). With ``add_space_prefix``,
    a stream that starts with BOS (a text encoded from its start) drops the space the
    encoder put before the first word; a continuation (no BOS) keeps its spaces."""

    def __init__(self, tok: GgufTokenizer, skip_special: bool = True):
        self.tok = tok
        self.skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip: bool | None = None  # decided by the first id

    def push(self, token_id: int) -> str:
        """Feed one id -> the newly complete text (possibly empty)."""
        tok = self.tok
        b = tok.token_bytes(token_id, self.skip_special)
        if self._strip is None:
            self._strip = tok.model == "llama" and tok.add_space_prefix and token_id == tok.bos_id
        elif self._strip and token_id not in tok._control:
            self._strip = False
            if b.startswith(b" "):
                b = b[1:]
        return self._utf8.decode(b)

    def flush(self) -> str:
        """End of the stream -> text still held back."""
        return self._utf8.decode(b"", final=True)


class _SpecialMatcher:
    """Cuts whole special-token strings out of text: leftmost match, longest first."""

    def __init__(self, specials: dict[str, int]):
        self.specials = specials
        lengths: dict[str, set[int]] = {}
        for t in specials:
            lengths.setdefault(t[0], set()).add(len(t))
        self.lengths = {c: sorted(ls, reverse=True) for c, ls in lengths.items()}

    def split(self, text: str, skip: set[int] | None) -> Iterator[tuple[str, int | None]]:
        """Yield (plain text, None) and (token text, id) pieces in order; ids in ``skip``
        are not matched."""
        specials, lengths = self.specials, self.lengths
        start = i = 0
        n = len(text)
        while i < n:
            ls = lengths.get(text[i])
            hit = None
            if ls is not None:
                for ln in ls:
                    tid = specials.get(text[i : i + ln])
                    if tid is not None and (skip is None or tid not in skip):
                        hit = (ln, tid)
                        break
            if hit is None:
                i += 1
                continue
            if start < i:
                yield text[start:i], None
            yield text[i : i + hit[0]], hit[1]
            i += hit[0]
            start = i
        if start < n:
            yield text[start:], None


@lru_cache(maxsize=2)
def _cached(path: str, size: int, mtime_ns: int) -> GgufTokenizer:
    from rlx.frontends.gguf.reader import load

    return GgufTokenizer(load(path).metadata)
