"""Fixtures of the distributed tests: the real all-MiniLM-L6-v2 directory (as the Hugging
Face tests find it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.models.conftest import minilm_path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return minilm_path()
