"""Training on the IR. In: a model graph with a scalar loss output, its params, an
optimizer. Out: a compiled training step (forward, backward and the update in one graph,
params updated in place), optimizers, learning-rate schedules, losses and a ``fit`` loop.

``rlx.train.TrainStep`` (:mod:`rlx.train.step`), ``SGD`` / ``Adam`` / ``AdamW``
(:mod:`rlx.train.optim`), the schedules (:mod:`rlx.train.schedules`), ``cross_entropy`` /
``mse`` / ``accuracy`` (:mod:`rlx.ops.compose.losses`), ``fit`` and the progress bar
(:mod:`rlx.train.progress`). See docs/training.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "TrainStep": "rlx.train.step",
    "SGD": "rlx.train.optim",
    "Adam": "rlx.train.optim",
    "AdamW": "rlx.train.optim",
    "Optimizer": "rlx.train.optim",
    "clip_by_global_norm": "rlx.train.optim",
    "constant": "rlx.train.schedules",
    "step_decay": "rlx.train.schedules",
    "cosine": "rlx.train.schedules",
    "warmup_cosine": "rlx.train.schedules",
    "warmup_linear": "rlx.train.schedules",
    "cross_entropy": "rlx.ops.compose.losses",
    "mse": "rlx.ops.compose.losses",
    "accuracy": "rlx.ops.compose.losses",
    "fit": "rlx.train.progress",
    "progress": "rlx.train.progress",
    "recompute_activations": "rlx.train.recompute",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rlx.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value
