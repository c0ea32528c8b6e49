"""Fixtures of the server tests: the all-MiniLM-L6-v2 directory, an oracle SentenceEncoder
compiled apart from the served one, and sentences of mixed lengths."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.models.conftest import minilm_path

WORDS = (
    "the a man woman dog cat plays guitar runs quickly over under beautiful sky river "
    "mountain compiler kernel tensor embedding server request batch token"
).split()


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return minilm_path()


@pytest.fixture(scope="session")
def oracle(minilm_dir: Path):
    """A SentenceEncoder of its own: ``oracle.encode([text])`` is the reference."""
    from rlx.models import SentenceEncoder

    return SentenceEncoder(minilm_dir)


def sentences(n: int, seed: int, longest: int = 90) -> list[str]:
    """``n`` sentences of 1 to ``longest`` words (several padding buckets)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, longest))) for _ in range(n)]
