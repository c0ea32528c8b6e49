"""The tokenizer of a Hugging Face decoder directory. In: ``tokenizer.json`` (read by the
``tokenizers`` library), ``tokenizer_config.json`` and ``generation_config.json``. Out:
:class:`HfTokenizer`, with the interface :class:`~rlx.models.llm.model.LlmModel` uses
for GGUF vocabularies (``encode`` / ``decode`` / ``stream``, ``bos_id``, ``add_bos``,
``stop_ids``).

BOS / EOS are the tokens tokenizer_config.json names (``bos_token`` / ``eos_token``);
whether a prompt gets a BOS is ``add_bos_token`` there, else what the tokenizer's own
post-processor does (Llama's adds one, Qwen's none), as transformers does. The stop ids
are the EOS plus generation_config.json's ``eos_token_id`` (an id or a list).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rlx.errors import ModelError
from rlx.frontends.gguf.tokenizer import check_text

__all__ = ["HfTokenizer", "HfStreamDecoder"]


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: not a readable JSON file ({e})") from None
    return data if isinstance(data, dict) else {}


def _ids(v: Any) -> list[int]:
    if isinstance(v, bool):
        return []
    if isinstance(v, int):
        return [v]
    if isinstance(v, list):
        return [i for i in v if isinstance(i, int) and not isinstance(i, bool)]
    return []


class HfTokenizer:
    """The tokenizer of the Hugging Face directory ``folder`` (module docstring)."""

    def __init__(self, folder: Path):
        import tokenizers

        file = folder / "tokenizer.json"
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # the library raises a bare Exception on a bad file
            raise ModelError(f"{file}: the tokenizer could not be read ({e})") from None
        cfg = _json(folder / "tokenizer_config.json")
        gen = _json(folder / "generation_config.json")
        self.bos_id: int | None = self._token_id(cfg.get("bos_token"))
        self.eos_id: int | None = self._token_id(cfg.get("eos_token"))
        if self.bos_id is None and _ids(gen.get("bos_token_id")):
            self.bos_id = _ids(gen.get("bos_token_id"))[0]
        if self.eos_id is None and _ids(gen.get("eos_token_id")):
            self.eos_id = _ids(gen.get("eos_token_id"))[0]
        if isinstance(cfg.get("add_bos_token"), bool):
            self.add_bos: bool = cfg["add_bos_token"]
        else:
            probe = self._tok.encode("a", add_special_tokens=True).ids
            self.add_bos = self.bos_id is not None and probe[:1] == [self.bos_id]
        self.add_eos: bool = bool(cfg.get("add_eos_token", False))
        stops = {self.eos_id, *_ids(gen.get("eos_token_id"))}
        self.stop_ids: frozenset[int] = frozenset(i for i in stops if i is not None)

    def _token_id(self, tok: Any) -> int | None:
        if isinstance(tok, Mapping):
            tok = tok.get("content")
        if not isinstance(tok, str):
            return None
        i = self._tok.token_to_id(tok)
        return None if i is None else int(i)

    @property
    def vocab_size(self) -> int:
        """Number of tokens (added tokens included)."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(
        self, text: str, add_bos: bool | None = None, add_eos: bool | None = None
    ) -> list[int]:
        """Token ids of ``text`` (special tokens written in it are matched); BOS / EOS as
        the tokenizer config says unless given."""
        check_text(text)
        ids = list(self._tok.encode(text, add_special_tokens=False).ids)
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        if (self.add_eos if add_eos is None else add_eos) and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of ``ids``."""
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special))

    def stream(self, skip_special: bool = True) -> HfStreamDecoder:
        """An :class:`HfStreamDecoder` for ids that arrive one at a time."""
        return HfStreamDecoder(self, skip_special)

    def decode_stream(self, ids: Iterable[int], skip_special: bool = True) -> Iterator[str]:
        """Yield text pieces as ``ids`` arrive; joined, they are ``decode(ids)``."""
        s = self.stream(skip_special)
        for i in ids:
            piece = s.push(i)
            if piece:
                yield piece
        tail = s.flush()
        if tail:
            yield tail

    def __repr__(self) -> str:
        return (
            f"HfTokenizer(vocab={self.vocab_size}, bos={self.bos_id}, eos={self.eos_id}, "
            f"stop={sorted(self.stop_ids)})"
        )


class HfStreamDecoder:
    """Incremental decoding: ``push(id)`` returns the text completed so far (a character
    still split over byte tokens, decoded as U+FFFD at the end, is held back)."""

    def __init__(self, tok: HfTokenizer, skip_special: bool = True):
        self.tok, self.skip_special = tok, skip_special
        self._ids: list[int] = []
        self._sent = 0  # characters of the decoded text already returned

    def push(self, token_id: int) -> str:
        """Feed one id -> the newly complete text (possibly empty)."""
        self._ids.append(int(token_id))
        text = self.tok.decode(self._ids, self.skip_special)
        if text.endswith("\ufffd"):
            return ""
        out, self._sent = text[self._sent :], len(text)
        return out

    def flush(self) -> str:
        """End of the stream -> text still held back."""
        text = self.tok.decode(self._ids, self.skip_special)
        out, self._sent = text[self._sent :], len(text)
        return out
