"""Helpers the op tests share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import rlx
from rlx import DType


def run(build: Callable[..., Any], *arrays: np.ndarray) -> Any:
    """Build a graph over inputs x0, x1, ... with ``build(g, *ids)``, verify, evaluate.
    One output array, or a list of them when ``build`` returns several node ids."""
    g = rlx.Graph("t")
    ids = [g.input(f"x{i}", a.shape, DType.from_numpy(a.dtype)) for i, a in enumerate(arrays)]
    out = build(g, *ids)
    multi = isinstance(out, (list, tuple))
    g.set_outputs(list(out) if multi else [out])
    g.verify()
    res = g.evaluate({f"x{i}": a for i, a in enumerate(arrays)})
    return res if multi else res[0]
