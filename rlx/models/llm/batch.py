"""Batched decode. In: a loaded :class:`~rlx.models.llm.model.LlmModel` and a number of
slots N. Out: :class:`BatchedDecoder`: N KV-cache slots, each one token sequence's
context, and decode steps that advance any set of them by one token in ONE compiled run.

The engine is a second compiled graph over the model's weights (``graph.py`` with
``slots`` = N: the very arrays the model's graph reads, no second copy) whose KV caches
are ``[N, max_context, Hkv*D]`` per layer, allocated once by the runtime. Its tokens are
rows of one ``[1, T]`` batch, each with its own position and slot (``slot_cache_attention``
in ``rlx/ops/kvcache.py``):

* :meth:`BatchedDecoder.step` runs one token for each of B slots: T = B rows, so every
  projection (q, k, v, o, the FFN and the LM head) is one ``dequant_matmul`` of B rows
  that reads each quantized weight once for all B sequences: that is where the
  throughput comes from (decode is bound by reading the weights).
* :meth:`BatchedDecoder.prefill` / :meth:`BatchedDecoder.extend` run a prompt (or a chunk
  of one) in one slot: T = the tokens padded to a length class, as ``LlmModel`` pads
  (padding rows land beyond the slot's context, where the next tokens overwrite them
  before any query can see them).

The symbolic ``seq`` / ``rows`` dims mean one compile; the runtime keeps a schedule per
(T, rows) seen: decode at each batch size 1..N, prefill at each length class. A slot's
context belongs to it alone: a query attends only to rows of its own slot, so sequences
joining and leaving between steps never see each other's tokens. :meth:`acquire` /
:meth:`release` hand out slots (thread-safe); a released slot's context is dropped at
once (its stale rows are never read: a new prompt starts at position 0 and overwrites
them in order). Runs are serialised by a lock (one compiled graph).

Bad input is an InputError naming it and changes nothing: an unknown or free slot, the
same slot twice in one step, a token id outside the vocabulary, a context that would
exceed ``max_context``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.errors import InputError
from rlx.models.llm.graph import build_decoder
from rlx.models.llm.lowp import use_threads
from rlx.models.llm.model import KV_DTYPES, _int_like, _length_class, check_token_ids

if TYPE_CHECKING:
    from rlx.models.llm.model import LlmModel

__all__ = ["BatchedDecoder"]

#: schedules the runtime keeps beyond one per batch size (the prefill length classes)
_PREFILL_PLANS = 24


class BatchedDecoder:
    """N KV-cache slots over one LlmModel's weights; decode steps run all given slots in
    one compiled step (module docstring). ``capacity``: the number of slots;
    ``max_context``: positions per slot (default: the model's)."""

    def __init__(self, model: LlmModel, slots: int, max_context: int | None = None) -> None:
        from rlx.options import CompileOptions
        from rlx.runtime.session import Session

        if not _int_like(slots) or int(slots) < 1:
            raise InputError(f"batched: slots must be an int >= 1, given {slots!r}")
        cfg = model.config
        if model.kv_dtype == "int8":
            raise InputError(
                "batched: an int8 KV cache is for single-stream decode; load the model with "
                "kv_dtype f32, bf16 or f16 for batched decode"
            )
        if max_context is None:
            max_context = model.max_context
        if not _int_like(max_context) or not 2 <= int(max_context) <= cfg.context_length:
            raise InputError(
                f"batched: max_context must be an int in [2, {cfg.context_length}] (the "
                f"model's context length), given {max_context!r}"
            )
        self.model = model
        self.capacity = int(slots)
        self.max_context = int(max_context)
        dec = build_decoder(
            cfg, model.file.tensors, self.max_context, KV_DTYPES[model.kv_dtype], self.capacity
        )
        # the arrays the model's own graph reads (shared, not copied), then the caches
        have = model.compiled._store.params
        params = {
            n: have.get(n, a) if not n.startswith("kv.") else a for n, a in dec.params.items()
        }
        opts = CompileOptions(
            num_threads=model.num_threads,
            max_shape_plans=self.capacity + _PREFILL_PLANS,
            use_cache=False,
        )
        self.compiled = Session("cpu").compile(dec.graph, opts)
        self.compiled.set_params(params)
        self._run_lock = threading.Lock()  # one compiled run at a time
        self._lock = threading.Lock()  # the slot table
        self._used = [False] * self.capacity
        self._pos = [0] * self.capacity
        self._epoch = [0] * self.capacity  # bumped on acquire / release

    # ---- slots -----------------------------------------------------------------------

    def acquire(self) -> int | None:
        """A free slot id (its context empty), now in use; None when all are in use."""
        with self._lock:
            for s, used in enumerate(self._used):
                if not used:
                    self._used[s] = True
                    self._pos[s] = 0
                    self._epoch[s] += 1
                    return s
        return None

    def release(self, slot: int) -> None:
        """Free ``slot`` at once, dropping its context (a free slot: nothing happens).
        InputError for a slot id outside ``[0, capacity)``."""
        s = self._slot_id(slot)
        with self._lock:
            if self._used[s]:
                self._used[s] = False
                self._pos[s] = 0
                self._epoch[s] += 1

    def in_use(self) -> int:
        """Slots currently acquired."""
        with self._lock:
            return sum(self._used)

    def position(self, slot: int) -> int:
        """Tokens in ``slot``'s context (InputError for an unknown or free slot)."""
        with self._lock:
            return self._pos[self._held(slot)]

    def _slot_id(self, slot: object) -> int:
        if not _int_like(slot) or not 0 <= int(slot) < self.capacity:  # type: ignore[call-overload]
            raise InputError(f"batched: slot {slot!r} is not a slot id in [0, {self.capacity})")
        return int(slot)  # type: ignore[call-overload]

    def _held(self, slot: object) -> int:
        """``slot`` as an acquired slot id; under ``_lock``."""
        s = self._slot_id(slot)
        if not self._used[s]:
            raise InputError(f"batched: slot {s} is free (acquire() a slot before using it)")
        return s

    # ---- runs ------------------------------------------------------------------------

    def _check_room(self, slot: int, start: int, n: int) -> None:
        if start + n > self.max_context:
            raise InputError(
                f"batched: slot {slot} has {start} tokens in its context + {n} new = "
                f"{start + n}, which exceeds max_context={self.max_context}"
            )

    def _run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        with use_threads(self.compiled.num_threads):  # the bf16 / f16 products' kernel
            (logits,) = self.compiled.run(feed)
        return np.asarray(logits).reshape(len(feed["last"]), -1)

    def _chunk(self, slot: int, ids: Sequence[int], reset: bool) -> np.ndarray:
        arr = check_token_ids(ids, self.model.config.vocab, "batched")
        n = len(arr)
        if n == 0:
            raise InputError("batched: no tokens to run (an empty prompt needs at least a BOS)")
        with self._run_lock:
            with self._lock:
                s = self._held(slot)
                start = 0 if reset else self._pos[s]
                self._check_room(s, start, n)
                epoch = self._epoch[s]
            length = _length_class(n, self.max_context - start)
            padded = np.zeros((1, length), np.int64)
            padded[0, :n] = arr
            feed = {
                "input_ids": padded,
                "positions": np.arange(start, start + length, dtype=np.int64),
                "slots": np.full(length, s, np.int64),
                "last": np.array([n - 1], np.int64),
            }
            logits = self._run(feed)[0]
            with self._lock:
                if self._epoch[s] == epoch:  # not released while it ran
                    self._pos[s] = start + n
        return logits

    def prefill(self, slot: int, ids: Sequence[int]) -> np.ndarray:
        """Empty ``slot``'s context, run ``ids`` (a prompt, BOS included if wanted) in it
        and return the next-token logits f32 ``[vocab]``."""
        return self._chunk(slot, ids, reset=True)

    def extend(self, slot: int, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` to ``slot``'s context (a chunk of a prompt) and return the
        next-token logits f32 ``[vocab]``."""
        return self._chunk(slot, ids, reset=False)

    def step(self, slots: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """One decode token for each of ``slots`` (``tokens[i]`` appended to slot
        ``slots[i]``), all in one compiled run; the next-token logits f32
        ``[len(slots), vocab]`` in the order of ``slots``."""
        sl = _as_list(slots, "slots")
        toks = check_token_ids(tokens, self.model.config.vocab, "batched: step tokens")
        if len(sl) != len(toks):
            raise InputError(
                f"batched: step got {len(sl)} slots and {len(toks)} tokens (one token per slot)"
            )
        if not sl:
            raise InputError("batched: step needs at least one slot")
        with self._run_lock:
            with self._lock:
                ids = [self._held(s) for s in sl]
                seen: set[int] = set()
                for s in ids:
                    if s in seen:
                        raise InputError(f"batched: slot {s} appears twice in one step")
                    seen.add(s)
                starts = [self._pos[s] for s in ids]
                for s, p in zip(ids, starts, strict=True):
                    self._check_room(s, p, 1)
                epochs = [self._epoch[s] for s in ids]
            b = len(ids)
            feed = {
                "input_ids": toks.reshape(1, b),
                "positions": np.array(starts, np.int64),
                "slots": np.array(ids, np.int64),
                "last": np.arange(b, dtype=np.int64),
            }
            logits = self._run(feed)
            with self._lock:
                for s, p, e in zip(ids, starts, epochs, strict=True):
                    if self._epoch[s] == e:
                        self._pos[s] = p + 1
        return logits

    def __repr__(self) -> str:
        return (
            f"BatchedDecoder(slots={self.capacity}, in_use={self.in_use()}, "
            f"max_context={self.max_context}, model={self.model.config.arch.name})"
        )


def _as_list(xs: Any, what: str) -> list[Any]:
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__"):
        raise InputError(f"batched: {what} must be a sequence of slot ids, given {xs!r:.40}")
    return list(xs)
