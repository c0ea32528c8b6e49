"""Learning-rate schedules. In: the 0-based number of the step about to run. Out: its
learning rate (a Python float). The training step feeds it to the compiled graph as the
scalar input ``train.lr``, so changing it never recompiles.

* :func:`constant` -- ``lr`` always;
* :func:`step_decay` -- ``lr * gamma ** (step // every)`` (``torch.optim.lr_scheduler.StepLR``);
* :func:`cosine` -- from ``lr`` to ``min_lr`` over ``total`` steps along half a cosine
  (``CosineAnnealingLR``), ``min_lr`` after;
* :func:`warmup_cosine` / :func:`warmup_linear` -- linear warmup from 0 over ``warmup``
  steps, then cosine / linear decay to ``min_lr`` at step ``total`` (Hugging Face's
  ``get_cosine_schedule_with_warmup`` / ``get_linear_schedule_with_warmup`` when
  ``min_lr`` is 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlx.errors import InputError

__all__ = ["Schedule", "constant", "step_decay", "cosine", "warmup_cosine", "warmup_linear"]


def _count(what: str, v: int, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise InputError(f"{what} must be an int >= {lo}, given {v!r}")
    return v


def _rate(what: str, v: float) -> float:
    v = float(v)
    if not (math.isfinite(v) and v >= 0):
        raise InputError(f"{what} must be a finite float >= 0, given {v!r}")
    return v


@dataclass(frozen=True)
class Schedule:
    """A schedule: ``schedule(step) -> lr`` (``kind`` names the formula)."""

    kind: str
    lr: float
    min_lr: float = 0.0
    warmup: int = 0
    total: int = 0
    every: int = 1
    gamma: float = 1.0

    def __call__(self, step: int) -> float:
        step = _count("schedule step", step, 0)
        if self.kind == "constant":
            return self.lr
        if self.kind == "step":
            return self.lr * self.gamma ** (step // self.every)
        if step < self.warmup:
            return self.lr * step / self.warmup
        span = max(1, self.total - self.warmup)
        progress = min(1.0, (step - self.warmup) / span)
        if self.kind == "cosine":
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            factor = 1.0 - progress
        return self.min_lr + (self.lr - self.min_lr) * factor


def constant(lr: float) -> Schedule:
    """``lr`` at every step."""
    return Schedule("constant", _rate("constant: lr", lr))


def step_decay(lr: float, every: int, gamma: float = 0.1) -> Schedule:
    """``lr`` multiplied by ``gamma`` every ``every`` steps."""
    return Schedule(
        "step",
        _rate("step_decay: lr", lr),
        every=_count("step_decay: every", every, 1),
        gamma=_rate("step_decay: gamma", gamma),
    )


def cosine(lr: float, total: int, min_lr: float = 0.0) -> Schedule:
    """Half a cosine from ``lr`` (step 0) to ``min_lr`` (step ``total`` and after)."""
    return Schedule(
        "cosine",
        _rate("cosine: lr", lr),
        _rate("cosine: min_lr", min_lr),
        total=_count("cosine: total", total, 1),
    )


def _warmup(kind: str, lr: float, warmup: int, total: int, min_lr: float) -> Schedule:
    what = f"warmup_{'cosine' if kind == 'cosine' else 'linear'}"
    warmup = _count(f"{what}: warmup", warmup, 0)
    total = _count(f"{what}: total", total, 1)
    if warmup > total:
        raise InputError(f"{what}: warmup ({warmup}) is longer than total ({total})")
    return Schedule(kind, _rate(f"{what}: lr", lr), _rate(f"{what}: min_lr", min_lr), warmup, total)


def warmup_cosine(lr: float, warmup: int, total: int, min_lr: float = 0.0) -> Schedule:
    """Linear warmup 0 -> ``lr`` over ``warmup`` steps, then cosine to ``min_lr`` at
    ``total``."""
    return _warmup("cosine", lr, warmup, total, min_lr)


def warmup_linear(lr: float, warmup: int, total: int, min_lr: float = 0.0) -> Schedule:
    """Linear warmup 0 -> ``lr`` over ``warmup`` steps, then linear decay to ``min_lr``
    at ``total``."""
    return _warmup("linear", lr, warmup, total, min_lr)
