"""rlx.gguf.load on a path that is not a regular file (issue 29): a named pipe (FIFO) is a
GgufError at once instead of blocking forever in open(), waiting for a writer; a
directory is a GgufError too."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gguf")

import rlx  # noqa: E402
from rlx.errors import GgufError, ModelError  # noqa: E402


def load_guarded(path: Path, timeout: float = 10.0) -> dict[str, Any]:
    """rlx.gguf.load(path) in a thread; a load still blocked after ``timeout`` seconds
    fails the test, and is released (a writer opens and closes the FIFO) so the suite
    does not hang."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["file"] = rlx.gguf.load(path)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        th.join(timeout)
        pytest.fail(f"rlx.gguf.load blocked for {timeout} s on the FIFO {str(path)!r}")
    return out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no os.mkfifo")
def test_fifo_is_a_gguf_error_not_a_hang(tmp_path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    out = load_guarded(fifo)
    err = out.get("error")
    assert isinstance(err, GgufError) and isinstance(err, ModelError), out
    assert str(fifo) in str(err) and "not a regular file" in str(err)


def test_directory_is_a_gguf_error(tmp_path) -> None:
    d = tmp_path / "model.gguf"
    d.mkdir()
    with pytest.raises(GgufError, match="not a regular file"):
        rlx.gguf.load(d)
