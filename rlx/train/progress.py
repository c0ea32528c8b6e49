"""The training loop. In: a :class:`~rlx.train.step.TrainStep` and batches (dicts of the
model's inputs). Out: ``fit`` runs the steps epoch after epoch and returns every step's
loss; ``progress`` wraps an iterable in a tqdm progress bar that shows the running loss.
Needs ``tqdm`` (``pip install 'rlx[train]'``, the train extra) only when a bar is shown.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from rlx.errors import InputError, ModelError

if TYPE_CHECKING:
    from rlx.train.step import TrainStep

__all__ = ["progress", "fit"]

Batches = Iterable[Mapping[str, Any]] | Callable[[int], Iterable[Mapping[str, Any]]]


def _tqdm() -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError as e:
        raise ModelError(
            "the training progress bar needs the 'tqdm' package, which is not installed: "
            "pip install 'rlx[train]' (the train extra), or pass progress=False"
        ) from e
    return tqdm


def progress(iterable: Iterable[Any], *, total: int | None = None, desc: str = "train") -> Any:
    """``iterable`` wrapped in a tqdm bar (``bar.set_postfix(loss=...)`` shows a loss)."""
    return _tqdm()(iterable, total=total, desc=desc, file=sys.stderr, leave=True)


def _epoch(batches: Batches, epoch: int) -> Iterable[Mapping[str, Any]]:
    if callable(batches):
        return batches(epoch)
    if isinstance(batches, Iterator):
        raise InputError(
            "fit: batches must be re-iterable (a list) or a function epoch -> batches, "
            "not a one-shot iterator"
        )
    return batches


def fit(
    step: TrainStep,
    batches: Batches,
    epochs: int = 1,
    *,
    show: bool = True,
    on_epoch: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Run ``step`` over ``batches`` for ``epochs`` epochs; returns each step's loss.

    ``batches``: a re-iterable of input dicts, or ``epoch -> iterable`` (to reshuffle each
    epoch). ``show``: a progress bar per epoch with the epoch's running mean loss.
    ``on_epoch(epoch, mean_loss)`` is called after each epoch."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise InputError(f"fit: epochs must be an int >= 1, given {epochs!r}")
    tqdm = _tqdm() if show else None
    losses: list[float] = []
    for epoch in range(epochs):
        items = _epoch(batches, epoch)
        total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
        bar = tqdm(items, total=total, desc=f"epoch {epoch + 1}/{epochs}") if tqdm else None
        running, n = 0.0, 0
        for batch in bar if bar is not None else items:
            loss = step.step(batch)
            losses.append(loss)
            running, n = running + loss, n + 1
            if bar is not None:
                bar.set_postfix(loss=f"{running / n:.4f}", refresh=False)
        if bar is not None:
            bar.close()
        if n == 0:
            raise InputError(f"fit: epoch {epoch + 1} had no batches")
        if on_epoch is not None:
            on_epoch(epoch, running / n)
    return losses
