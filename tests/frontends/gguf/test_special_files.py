"""rlx.gguf.load on a path that is not a regular file (issue 29): a named pipe (FIFO) is a
GgufError at once instead of blocking forever in open(), waiting for a writer; a
directory is a GgufError too."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("gguf")

import rlx  # noqa: E402
from rlx.errors import GgufError, ModelError  # noqa: E402
from tests.frontends.blocking import run_guarded  # noqa: E402


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no os.mkfifo")
def test_fifo_is_a_gguf_error_not_a_hang(tmp_path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    out = run_guarded(lambda: rlx.gguf.load(fifo), fifo, "rlx.gguf.load")
    err = out.get("error")
    assert isinstance(err, GgufError) and isinstance(err, ModelError), out
    assert str(fifo) in str(err) and "not a regular file" in str(err)


def test_directory_is_a_gguf_error(tmp_path) -> None:
    d = tmp_path / "model.gguf"
    d.mkdir()
    with pytest.raises(GgufError, match="not a regular file"):
        rlx.gguf.load(d)
