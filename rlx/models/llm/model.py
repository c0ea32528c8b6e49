"""A loaded decoder. In: a GGUF file or a Hugging Face directory. Out: :class:`LlmModel`:
the compiled decoder graph (``graph.py``) with its KV cache, the tokenizer, and the
token-level steps generation is made of (:meth:`LlmModel.prefill`, :meth:`LlmModel.step`,
:meth:`LlmModel.logits`).

One CompiledGraph (symbolic ``seq``) runs every step; the runtime keeps one schedule per
length it has seen (decode is ``seq`` = 1; a prompt is padded to the next multiple of
:data:`LENGTH_STEP` tokens, at least 8, so its cost follows its real length, 129 tokens
run as 144, and prompts share a few schedules; a prompt longer than
``LlmModel.prefill_chunk`` runs in chunks of that many tokens on the KV cache, each chunk
attending over the rows the earlier ones wrote; :meth:`SequenceState.verify`, the check of
speculative decoding's drafted tokens, runs its exact length and returns every row's
logits), so a decode step never re-plans. The KV
cache is the ``kv.*`` params the runtime allocates once (``[1, max_context, Hkv*D]`` per
layer and k / v, f32 or, with ``kv_dtype``, bf16 / f16: half the memory, rows rounded
when written; or int8: a quarter, plus an f32 scale per row and kv head, rows quantized
when written and dequantized for the attention, ``rlx/ops/kvcache.py``); a step writes only its own rows. Padding rows of a prompt land in
the cache beyond the prompt and are overwritten by the decode steps before any query can
see them (a query at position ``p`` reads rows ``<= p`` only).

Per-call state: a :class:`SequenceState` is one token sequence's place in the model (its
position and step times). ``generate`` and ``logits`` make their own, so calls from
several threads, and streams left half-read while other calls run, never see each
other's tokens. The one KV cache holds the rows of the state that ran last; a lock
serialises the steps, and when another state runs its rows are first copied out of the
cache (only the rows in use, on a switch only) and copied back when it runs again: the
results are those of the calls made one after the other. ``prefill`` / ``step`` /
``extend`` / ``position`` / ``times`` of the model itself use its default state.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError, ModelError
from rlx.models.llm.config import LlmConfig, read_config
from rlx.models.llm.graph import build_decoder
from rlx.models.llm.lowp import use_threads

if TYPE_CHECKING:
    from rlx.models.llm.batch import BatchedDecoder
    from rlx.models.llm.quantize import LogitError, QuantReport

__all__ = ["LlmModel", "SequenceState", "StepTimes", "check_token_ids", "open_model"]

_MIN_CLASS = 8
#: A prompt's run length is rounded up to a multiple of this (one schedule per class).
LENGTH_STEP = 16
#: The longest prompt run at once: longer prompts run in chunks of this many tokens.
DEFAULT_PREFILL_CHUNK = 512
#: The KV cache size when none is given (capped by the model's context length).
DEFAULT_CONTEXT = 2048
#: ``kv_dtype`` names -> the cache dtype.
KV_DTYPES = {"f32": DType.F32, "bf16": DType.BF16, "f16": DType.F16, "int8": DType.I8}


@dataclass
class StepTimes:
    """Seconds and tokens spent in prefill and decode runs since the last reset."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0


class SequenceState:
    """One token sequence's place in an :class:`LlmModel`: ``position`` (tokens in its
    context) and ``times``; while another state runs, its KV rows are kept here. Make one
    with :meth:`LlmModel.new_state`; it runs through the model that made it."""

    __slots__ = ("model", "position", "times", "_saved", "__weakref__")

    def __init__(self, model: LlmModel):
        self.model = model
        self.position = 0
        self.times = StepTimes()
        self._saved: list[np.ndarray] | None = None  # its cache rows while another runs

    def reset(self) -> None:
        """Empty this state's context (the next :meth:`prefill` starts at position 0)."""
        self.position = 0
        self._saved = None

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Reset, run ``ids`` (a prompt, BOS included if wanted) and return the next-token
        logits f32 ``[vocab]``."""
        return self.model._run(self, ids, reset=True)

    def step(self, token: int) -> np.ndarray:
        """Append one token to the context and return the next-token logits."""
        return self.model._run(self, [token])

    def extend(self, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` to the context (no reset) and return the next-token logits."""
        return self.model._run(self, ids)

    def verify(self, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` to the context in one run of exactly ``len(ids)`` rows (no
        padding) and return the logits after each of them, f32 ``[len(ids), vocab]``:
        row ``i`` is the next-token logits after ``ids[i]`` (speculative decoding checks
        drafted tokens with it; :meth:`truncate` drops the rejected ones)."""
        return self.model._run(self, ids, every_row=True)

    def truncate(self, position: int) -> None:
        """Drop the context from ``position`` on (``0 <= position <= self.position``): the
        next token goes to ``position``, and the dropped rows of the KV cache are
        overwritten before any query can read them. InputError for another position."""
        if not _int_like(position) or not 0 <= int(position) <= self.position:
            raise InputError(
                f"llm: truncate position must be an int in [0, {self.position}] (the "
                f"tokens in the context), given {position!r}"
            )
        with self.model._lock:
            self.position = int(position)

    def __repr__(self) -> str:
        return f"SequenceState(position={self.position})"


def _int_like(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_token_ids(ids: object, vocab: int, what: str = "llm") -> np.ndarray:
    """``ids`` (a sequence of ints or an integer array) as i64 ``[n]``; InputError naming
    the first entry that is not an int (a float, a str, a bool: never coerced) or lies
    outside ``[0, vocab)``."""
    if isinstance(ids, np.ndarray):
        if ids.dtype.kind not in "iu":
            raise InputError(f"{what}: token ids must be integers, given an array of {ids.dtype}")
        flat = ids.reshape(-1)
        bad = np.flatnonzero((flat < 0) | (flat >= vocab))
        if len(bad):
            i = int(bad[0])
            raise InputError(
                f"{what}: token id [{i}] = {flat[i]} is outside the vocabulary [0, {vocab})"
            )
        return flat.astype(np.int64)
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise InputError(
            f"{what}: token ids must be a sequence of ints, given {type(ids).__name__} "
            f"({ids!r:.40})"
        )
    items = list(ids)
    for i, t in enumerate(items):
        if not _int_like(t):
            raise InputError(
                f"{what}: token id [{i}] is {t!r:.40} ({type(t).__name__}), expected an int "
                f"in [0, {vocab})"
            )
        if not 0 <= t < vocab:
            raise InputError(f"{what}: token id [{i}] = {t} is outside the vocabulary [0, {vocab})")
    return np.array(items, dtype=np.int64)


def _length_class(n: int, room: int) -> int:
    """The padded prefill length of ``n`` tokens: 8 for up to 8 tokens, else the next
    multiple of :data:`LENGTH_STEP`, at most ``room`` (what is left of the context);
    ``n`` itself for one token."""
    if n <= 1:
        return n
    c = _MIN_CLASS if n <= _MIN_CLASS else -(-n // LENGTH_STEP) * LENGTH_STEP
    return max(n, min(c, room))


class LlmModel:
    """A decoder language model from a GGUF file or a Hugging Face directory (see
    :func:`rlx.models.llm.load`).

    ``config``: the :class:`LlmConfig`; ``file``: the GGUF file or the
    :class:`~rlx.models.llm.hf.HfCheckpoint` (``tensors`` by GGUF name, ``metadata``);
    ``tokenizer``: the file's tokenizer; ``compiled``:
    the CompiledGraph; ``position``: tokens in the default state's context (module
    docstring: ``generate`` and ``logits`` have their own state and are thread-safe);
    ``quantization``: the :class:`~rlx.models.llm.quantize.QuantReport` of a model
    loaded with ``precision=`` (None otherwise); ``prefill_chunk``: the longest run of
    prompt tokens (longer prompts run in chunks of that many on the KV cache; an int >= 1,
    settable)."""

    def __init__(
        self,
        path: Path,
        gguf_file: Any,
        config: LlmConfig,
        tokenizer: Any,
        max_context: int,
        num_threads: int | None,
        kv_dtype: str = "f32",
        kv_group: int = 0,
    ) -> None:
        from rlx.backends.cpu import threads
        from rlx.backends.cpu.program import compile_program
        from rlx.options import CompileOptions
        from rlx.runtime.compiled import CompiledGraph

        self.path = path
        self.file = gguf_file
        self.config = config
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.num_threads = num_threads
        self.kv_dtype = kv_dtype
        self.quantization: QuantReport | None = None
        self.kv_group = kv_group
        self.prefill_chunk = DEFAULT_PREFILL_CHUNK
        dec = build_decoder(
            config, gguf_file.tensors, max_context, KV_DTYPES[kv_dtype], kv_group=kv_group
        )
        self.graph = dec.graph
        opts = CompileOptions(num_threads=num_threads, max_shape_plans=24, use_cache=False)
        # The params go to the compile itself, which seeds its probe executor with them
        # (no zero-filled stand-in per weight: that was a second, quantized-model-sized
        # allocation left resident in the heap). The program is compiled here rather than
        # through Session.compile(params=), whose compile-cache key hashes every weight's
        # bytes even with use_cache=False (a read of the whole model, ~0.6 s per GB).
        # CompiledGraph checks each param's name, dtype and dims as set_params does.
        threads.resolve_threads(num_threads)  # CompileError for a bad count, as compile
        program = compile_program(self.graph, opts, dec.params)
        self.compiled = CompiledGraph(program, dec.params, opts)
        self._kv_names = [n for n in dec.params if n.startswith("kv.")]
        self._lock = threading.RLock()
        self._holder: weakref.ref[SequenceState] | None = None  # whose rows the cache holds
        self._state = SequenceState(self)

    # ---- token-level steps -----------------------------------------------------------

    def new_state(self) -> SequenceState:
        """A fresh :class:`SequenceState` (an empty context) of this model."""
        return SequenceState(self)

    @property
    def position(self) -> int:
        """Tokens in the default state's context."""
        return self._state.position

    @property
    def times(self) -> StepTimes:
        """Step times of the default state (``prefill`` / ``step`` / ``extend``)."""
        return self._state.times

    def reset(self) -> None:
        """Empty the default state (the next :meth:`prefill` starts at position 0)."""
        self._state.reset()

    def _cache(self, name: str) -> np.ndarray:
        own = self.compiled._store.private(name)
        assert own is not None, f"the KV cache {name} has no private storage"
        return own

    def _hold(self, state: SequenceState) -> None:
        """Make the cache hold ``state``'s rows (module docstring); under the lock."""
        held = self._holder() if self._holder is not None else None
        if held is state:
            return
        if held is not None and held.position > 0:
            held._saved = [self._cache(n)[:, : held.position].copy() for n in self._kv_names]
        if state._saved is not None:
            for n, rows in zip(self._kv_names, state._saved, strict=True):
                self._cache(n)[:, : rows.shape[1]] = rows
            state._saved = None
        self._holder = weakref.ref(state)

    def _run(
        self, state: SequenceState, ids: Sequence[int], reset: bool = False, every_row: bool = False
    ) -> np.ndarray:
        if state.model is not self:
            raise InputError("llm: a SequenceState runs only through the model that made it")
        arr = check_token_ids(ids, self.config.vocab)
        n = len(arr)
        if n == 0:
            raise InputError("llm: no tokens to run (an empty prompt needs at least a BOS)")
        chunk = n if every_row else self._chunk()
        with self._lock:
            if reset:
                state.reset()
            start = state.position
            if start + n > self.max_context:
                raise InputError(
                    f"llm: {start} tokens in the context + {n} new tokens = {start + n} "
                    f"exceeds max_context={self.max_context} (load with a larger max_context, "
                    f"at most the model's {self.config.context_length})"
                )
            self._hold(state)
            dt, pos = 0.0, start
            for c0 in range(0, n, chunk):
                part = arr[c0 : c0 + chunk]
                t0 = time.perf_counter()
                logits = self._forward(part, pos, every_row)
                dt += time.perf_counter() - t0
                pos += len(part)
            state.position = start + n
        times = state.times
        if n == 1 and start > 0:
            times.decode_tokens += 1
            times.decode_s += dt
        else:
            times.prefill_tokens += n
            times.prefill_s += dt
        return logits.reshape(n, -1) if every_row else logits.reshape(-1)

    def _chunk(self) -> int:
        c = self.prefill_chunk
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise InputError(f"llm: prefill_chunk must be an int >= 1, given {c!r}")
        return c

    def _forward(self, arr: np.ndarray, start: int, every_row: bool) -> np.ndarray:
        """One run of the tokens ``arr`` at positions ``start..``: padded to their length
        class unless ``every_row``; the logits of the last token (of every token with
        ``every_row``), as the compiled graph returns them. Under the lock."""
        n = len(arr)
        length = n if every_row else _length_class(n, self.max_context - start)
        padded = np.zeros((1, length), np.int64)
        padded[0, :n] = arr
        feed = {
            "input_ids": padded,
            "positions": np.arange(start, start + length, dtype=np.int64),
            "last": np.arange(n, dtype=np.int64) if every_row else np.array([n - 1], np.int64),
        }
        with use_threads(self.compiled.num_threads):  # the bf16 / f16 products' kernel
            (logits,) = self.compiled.run(feed)
        return logits

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Reset the default state, run ``ids`` (a prompt, BOS included if wanted) and
        return the next-token logits f32 ``[vocab]``."""
        return self._state.prefill(ids)

    def step(self, token: int) -> np.ndarray:
        """Append one token to the default state's context and return the next-token
        logits."""
        return self._state.step(token)

    def extend(self, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` to the default state's context (no reset) and return the
        next-token logits."""
        return self._state.extend(ids)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """The next-token logits after ``ids`` from an empty context (f32 ``[vocab]``; a
        state of its own: the default state is not touched)."""
        return self.new_state().prefill(ids)

    # ---- text ------------------------------------------------------------------------

    def encode(
        self, text: str, add_bos: bool | None = None, add_eos: bool | None = None
    ) -> list[int]:
        """Token ids of a prompt ``text``. ``add_bos`` None follows the file
        (``tokenizer.ggml.add_bos_token``, as llama.cpp and transformers do), True puts a
        BOS first, False none; a text that already starts with the BOS (a chat template
        that renders one) does not get a second one. ``add_eos`` likewise at the end
        (``tokenizer.ggml.add_eos_token``, usually absent: no EOS). InputError for a text
        that is not a str or holds a lone surrogate."""
        tok = self.tokenizer
        if tok is None:
            raise ModelError(f"{self.path}: no tokenizer in the file; pass token ids")
        for name, flag in (("add_bos", add_bos), ("add_eos", add_eos)):
            if flag is not None and not isinstance(flag, bool):
                raise InputError(
                    f"{name} must be None (as the file says) or a bool, given {flag!r}"
                )
        ids = list(tok.encode(text, add_bos=False, add_eos=False))
        bos = tok.add_bos if add_bos is None else add_bos
        if bos and tok.bos_id is not None and ids[:1] != [tok.bos_id]:
            ids.insert(0, tok.bos_id)
        eos = tok.add_eos if add_eos is None else add_eos
        if eos and tok.eos_id is not None and ids[-1:] != [tok.eos_id]:
            ids.append(tok.eos_id)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (special tokens dropped)."""
        return str(self.tokenizer.decode(list(ids), skip_special=True))

    @property
    def chat_template(self) -> str | None:
        """The model's Jinja chat template (a GGUF file's ``tokenizer.chat_template``, a
        Hugging Face directory's tokenizer_config.json / chat_template.jinja), or None."""
        t = self.file.metadata.get("tokenizer.chat_template")
        return t if isinstance(t, str) else None

    def quantization_error(self, ids: Sequence[int]) -> LogitError:
        """The next-token logits after ``ids`` against those of the same checkpoint
        loaded without ``precision=`` (f32 products of the stored weights; loaded for
        this call, then dropped). InputError for a model not loaded with ``precision=``."""
        from rlx.models.llm.quantize import compare_logits

        if self.quantization is None:
            raise InputError("llm: this model was not quantized at load (precision=None)")
        ref = open_model(self.path, self.max_context, self.num_threads, self.kv_dtype)
        want = ref.logits(ids)
        del ref
        return compare_logits(self.logits(ids), want, len(ids))

    def batched(self, slots: int, max_context: int | None = None) -> BatchedDecoder:
        """A :class:`~rlx.models.llm.batch.BatchedDecoder` of ``slots`` KV-cache slots of
        ``max_context`` positions (None: this model's) over this model's weights."""
        from rlx.models.llm.batch import BatchedDecoder

        return BatchedDecoder(self, slots, max_context)

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
    precision: str | None = None,
    kv_group: int = 0,
) -> LlmModel:
    """Read the GGUF file or Hugging Face directory at ``path`` and build its
    :class:`LlmModel` (see :func:`rlx.models.llm.load`)."""
    from rlx.frontends import gguf

    if kv_dtype not in KV_DTYPES:
        raise InputError(f"kv_dtype must be one of {sorted(KV_DTYPES)}, given {kv_dtype!r}")
    p = Path(path)
    f: Any
    tok: Any = None
    report = None
    if precision is not None and not p.is_dir():
        raise InputError(
            f"precision={precision!r} quantizes Hugging Face directories at load; {p} is "
            f"not a directory (a GGUF file keeps the types it was written with)"
        )
    if p.is_dir():  # a Hugging Face directory (config.json + safetensors)
        from rlx.models.llm.hf import open_checkpoint
        from rlx.models.llm.hf_tokenizer import HfTokenizer

        f = open_checkpoint(p)
        if precision is not None:
            from rlx.models.llm.quantize import quantize_checkpoint

            report = quantize_checkpoint(f, precision)
        cfg = f.config
        if (p / "tokenizer.json").is_file():
            tok = HfTokenizer(p)
    else:
        f = gguf.load(p)
        cfg = read_config(f.architecture, f.metadata, f.tensors)
        if "tokenizer.ggml.tokens" in f.metadata:
            tok = gguf.GgufTokenizer.from_metadata(f.metadata)
    if max_context is None:
        max_context = min(DEFAULT_CONTEXT, cfg.context_length)
    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 2:
        raise InputError(f"max_context must be an int >= 2, given {max_context!r}")
    if max_context > cfg.context_length:
        raise InputError(
            f"max_context={max_context} exceeds the model's context length "
            f"{cfg.context_length} ({cfg.arch.name}.context_length)"
        )
    if isinstance(kv_group, bool) or not isinstance(kv_group, int) or kv_group < 0:
        raise InputError(
            f"kv_group must be an int >= 0 (0: one scale per head), given {kv_group!r}"
        )
    if kv_group and (kv_dtype != "int8" or cfg.head_dim % kv_group):
        raise InputError(
            f"kv_group={kv_group} needs kv_dtype='int8' (given {kv_dtype!r}) and must divide "
            f"the head dim {cfg.head_dim}"
        )
    model = LlmModel(p, f, cfg, tok, max_context, num_threads, kv_dtype, kv_group)
    model.quantization = report
    return model
