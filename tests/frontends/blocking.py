"""Run a loader that might block on a FIFO without letting it hang the suite."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def run_guarded(load: Callable[[], Any], fifo: Path, what: str, timeout: float = 10.0) -> dict:
    """``load()`` in a daemon thread. In: the call, the FIFO it might block on, a name for
    the failure message. Out: ``{"value": result}`` or ``{"error": exception}``. A call
    still blocked after ``timeout`` seconds fails the test and is released (a writer opens
    and closes the FIFO)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = load()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        th.join(timeout)
        pytest.fail(f"{what} blocked for {timeout} s on the FIFO {str(fifo)!r}")
    return out
