"""Next-token choice. In: f32 logits ``[vocab]`` and :class:`SamplingParams`. Out: a token
id: the argmax when ``temperature == 0`` (greedy), else a draw from
``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens and then
to the smallest set whose probability reaches ``top_p`` (the usual order: transformers'
and llama.cpp's). Draws come from ``numpy.random.default_rng(seed)``: one seed gives one
sequence of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlx.errors import InputError

__all__ = ["SamplingParams", "choose"]


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` 0 is greedy; ``top_k`` 0 keeps every token; ``top_p`` 1.0 keeps
    every token; ``seed`` None draws a fresh seed."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0 and np.isfinite(self.temperature)):
            raise InputError(f"temperature must be a finite number >= 0, given {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InputError(f"top_k must be an int >= 0 (0: no limit), given {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise InputError(f"top_p must be in (0, 1], given {self.top_p}")
        s = self.seed
        if s is not None and (
            isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or s < 0
        ):
            raise InputError(
                f"seed must be None (a fresh seed) or an int >= 0, given {s!r:.40} "
                f"({type(s).__name__})"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def choose(logits: np.ndarray, sp: SamplingParams, rng: np.random.Generator) -> int:
    """The next token id from ``logits`` (module docstring)."""
    z = np.asarray(logits, dtype=np.float32).reshape(-1)
    if sp.greedy:
        return int(np.argmax(z))
    k = z.size if sp.top_k == 0 else min(sp.top_k, z.size)
    top = np.argpartition(-z, k - 1)[:k] if k < z.size else np.arange(z.size)
    top = top[np.argsort(-z[top], kind="stable")]  # most likely first
    w = z[top].astype(np.float64) / sp.temperature
    p = np.exp(w - w.max())
    p /= p.sum()
    if sp.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), sp.top_p) + 1)
        p = p[:keep] / p[:keep].sum()
        top = top[:keep]
    return int(top[rng.choice(p.size, p=p)])
