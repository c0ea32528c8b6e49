"""Next-token choice (rlx/models/llm/sampling.py) against a plain re-implementation of the
filters: greedy is the argmax; samples come only from the top-k / top-p set; the draw
frequencies follow the filtered softmax; one seed gives one sequence."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.errors import InputError
from rlx.models.llm.sampling import SamplingParams, choose


def allowed(logits: np.ndarray, t: float, k: int, p: float) -> dict[int, float]:
    """The filtered distribution, one token at a time in plain Python."""
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    if k:
        order = order[:k]
    m = max(logits[i] for i in order)
    w = {i: float(np.exp((logits[i] - m) / t)) for i in order}
    tot = sum(w.values())
    out, acc = {}, 0.0
    for i in order:
        out[i] = w[i] / tot
        acc += out[i]
        if acc >= p:
            break
    s = sum(out.values())
    return {i: v / s for i, v in out.items()}


def test_greedy_is_the_argmax() -> None:
    z = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert choose(z, SamplingParams(), np.random.default_rng(0)) == int(np.argmax(z))


@pytest.mark.parametrize(
    ("t", "k", "p"), [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.6), (1.0, 4, 0.8)]
)
def test_draws_follow_the_filtered_softmax(t, k, p) -> None:
    z = np.array([2.0, 1.5, 1.4, 0.3, -0.2, -1.0, 0.9, 1.45], np.float32)
    want = allowed(z, t, k, p)
    rng = np.random.default_rng(5)
    sp = SamplingParams(t, k, p, 0)
    n = 8000
    counts = np.bincount([choose(z, sp, rng) for _ in range(n)], minlength=z.size)
    assert set(np.flatnonzero(counts)) <= set(want)
    for i, q in want.items():
        assert abs(counts[i] / n - q) < 4 * np.sqrt(q * (1 - q) / n) + 1e-3


def test_one_seed_one_sequence() -> None:
    z = np.random.default_rng(1).standard_normal(5000).astype(np.float32)
    sp = SamplingParams(0.8, 50, 0.9, 42)

    def run(seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        return [choose(z, sp, rng) for _ in range(30)]

    assert run(42) == run(42)
    assert run(42) != run(43)


@pytest.mark.parametrize(
    ("kw", "msg"),
    [({"temperature": -1.0}, "temperature"), ({"top_k": -2}, "top_k"), ({"top_p": 0.0}, "top_p")],
)
def test_bad_settings_are_named(kw, msg) -> None:
    with pytest.raises(InputError, match=msg):
        SamplingParams(**kw)
