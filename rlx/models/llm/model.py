"""A loaded decoder. In: a GGUF file. Out: :class:`LlmModel`: the compiled decoder graph
(``graph.py``) with its KV cache, the tokenizer, and the token-level steps generation is
made of (:meth:`LlmModel.prefill`, :meth:`LlmModel.step`, :meth:`LlmModel.logits`).

One CompiledGraph (symbolic ``seq``) runs every step; the runtime keeps one schedule per
length it has seen (decode is ``seq`` = 1; a prompt is padded to the next power of two,
at least 8, so prompts share a few schedules), so a decode step never re-plans. The KV
cache is the ``kv.*`` params the runtime allocates once (``[1, max_context, Hkv*D]`` per
layer and k / v, f32 or, with ``kv_dtype``, bf16 / f16: half the memory, rows rounded
when written); a step writes only its own rows. Padding rows of a prompt land in
the cache beyond the prompt and are overwritten by the decode steps before any query can
see them (a query at position ``p`` reads rows ``<= p`` only).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError
from rlx.models.llm.config import LlmConfig, read_config
from rlx.models.llm.graph import build_decoder

__all__ = ["LlmModel", "StepTimes", "open_model"]

_MIN_CLASS = 8
#: The KV cache size when none is given (capped by the model's context length).
DEFAULT_CONTEXT = 2048
#: ``kv_dtype`` names -> the cache dtype.
KV_DTYPES = {"f32": DType.F32, "bf16": DType.BF16, "f16": DType.F16}


@dataclass
class StepTimes:
    """Seconds and tokens spent in prefill and decode runs since the last reset."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0


def _length_class(n: int, room: int) -> int:
    """The padded prefill length of ``n`` tokens: the next power of two >= 8, at most
    ``room`` (what is left of the context); ``n`` itself for one token."""
    if n <= 1:
        return n
    c = max(_MIN_CLASS, 1 << (n - 1).bit_length())
    return max(n, min(c, room))


class LlmModel:
    """A decoder language model from a GGUF file (see :func:`rlx.models.llm.load`).

    ``config``: the :class:`LlmConfig`; ``tokenizer``: the file's tokenizer; ``compiled``:
    the CompiledGraph; ``position``: tokens in the KV cache now."""

    def __init__(
        self,
        path: Path,
        gguf_file: Any,
        config: LlmConfig,
        tokenizer: Any,
        max_context: int,
        num_threads: int | None,
        kv_dtype: str = "f32",
    ) -> None:
        from rlx.options import CompileOptions
        from rlx.runtime.session import Session

        self.path = path
        self.file = gguf_file
        self.config = config
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.num_threads = num_threads
        self.kv_dtype = kv_dtype
        dec = build_decoder(config, gguf_file.tensors, max_context, KV_DTYPES[kv_dtype])
        self.graph = dec.graph
        opts = CompileOptions(num_threads=num_threads, max_shape_plans=16, use_cache=False)
        self.compiled = Session("cpu").compile(self.graph, opts)
        self.compiled.set_params(dec.params)
        self.position = 0
        self.times = StepTimes()

    # ---- token-level steps -----------------------------------------------------------

    def reset(self) -> None:
        """Empty the KV cache (the next :meth:`prefill` starts at position 0)."""
        self.position = 0

    def _run(self, ids: Sequence[int]) -> np.ndarray:
        n = len(ids)
        start = self.position
        if n == 0:
            raise InputError("llm: no tokens to run (an empty prompt needs at least a BOS)")
        if start + n > self.max_context:
            raise InputError(
                f"llm: {start} tokens in the context + {n} new tokens = {start + n} exceeds "
                f"max_context={self.max_context} (load with a larger max_context, at most "
                f"the model's {self.config.context_length})"
            )
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        if arr.min() < 0 or arr.max() >= self.config.vocab:
            bad = int(arr[(arr < 0) | (arr >= self.config.vocab)][0])
            raise InputError(
                f"llm: token id {bad} is outside the vocabulary of {self.config.vocab}"
            )
        length = _length_class(n, self.max_context - start)
        padded = np.zeros((1, length), np.int64)
        padded[0, :n] = arr
        feed = {
            "input_ids": padded,
            "positions": np.arange(start, start + length, dtype=np.int64),
            "last": np.array([n - 1], np.int64),
        }
        t0 = time.perf_counter()
        (logits,) = self.compiled.run(feed)
        dt = time.perf_counter() - t0
        self.position = start + n
        if n == 1 and start > 0:
            self.times.decode_tokens += 1
            self.times.decode_s += dt
        else:
            self.times.prefill_tokens += n
            self.times.prefill_s += dt
        return logits.reshape(-1)

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Reset the cache, run ``ids`` (a prompt, BOS included if wanted) and return the
        next-token logits f32 ``[vocab]``."""
        self.reset()
        return self._run(ids)

    def step(self, token: int) -> np.ndarray:
        """Append one token to the context and return the next-token logits."""
        return self._run([int(token)])

    def extend(self, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` to the context (no reset) and return the next-token logits."""
        return self._run(ids)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """The next-token logits after ``ids`` from an empty cache (f32 ``[vocab]``)."""
        return self.prefill(ids)

    # ---- text ------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of ``text`` (with the BOS the file asks for when ``add_bos``)."""
        return list(self.tokenizer.encode(text, add_bos=add_bos))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (special tokens dropped)."""
        return str(self.tokenizer.decode(list(ids), skip_special=True))

    def generate(self, prompt: str | Sequence[int], **kw: Any) -> Any:
        """Generate from ``prompt`` (text or token ids): see
        :func:`rlx.models.llm.generate.generate` for the keywords and the result."""
        from rlx.models.llm.generate import generate

        return generate(self, prompt, **kw)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"LlmModel({c.arch.name}, layers={c.num_layers}, d={c.hidden}, "
            f"heads={c.num_heads}/{c.num_kv_heads}x{c.head_dim}, vocab={c.vocab}, "
            f"max_context={self.max_context}, kv_dtype={self.kv_dtype}, path={str(self.path)!r})"
        )


def open_model(
    path: str | Path,
    max_context: int | None = None,
    num_threads: int | None = None,
    kv_dtype: str = "f32",
) -> LlmModel:
    """Read the GGUF file at ``path`` and build its :class:`LlmModel` (see
    :func:`rlx.models.llm.load`)."""
    from rlx.frontends import gguf

    if kv_dtype not in KV_DTYPES:
        raise InputError(f"kv_dtype must be one of {sorted(KV_DTYPES)}, given {kv_dtype!r}")
    p = Path(path)
    f = gguf.load(p)
    cfg = read_config(f.architecture, f.metadata, f.tensors)
    if max_context is None:
        max_context = min(DEFAULT_CONTEXT, cfg.context_length)
    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 2:
        raise InputError(f"max_context must be an int >= 2, given {max_context!r}")
    if max_context > cfg.context_length:
        raise InputError(
            f"max_context={max_context} exceeds the model's context length "
            f"{cfg.context_length} ({cfg.arch.name}.context_length)"
        )
    tok = (
        gguf.GgufTokenizer.from_metadata(f.metadata)
        if "tokenizer.ggml.tokens" in f.metadata
        else None
    )
    return LlmModel(p, f, cfg, tok, max_context, num_threads, kv_dtype)
