"""Fixtures shared by the engine tests."""

from __future__ import annotations

import pytest

from rlx.backends.cpu.engines import sgemm as ks


@pytest.fixture
def choice_dir(tmp_path, monkeypatch):
    """An empty private cache dir for the sgemm-vs-BLAS choices (RLX_CACHE_DIR), with the
    in-process choices forgotten before and after; yields the dir."""
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("RLX_CACHE_DIR", str(d))
    monkeypatch.delenv("RLX_SGEMM", raising=False)
    ks.forget_choices()
    yield d
    ks.forget_choices()
