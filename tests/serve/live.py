"""Live servers for the tests: :class:`LiveServer` runs an app on uvicorn in a thread of
the test process (on a port the OS picks), :func:`spawn` runs ``python -m rlx serve`` in a
subprocess on a free port. Both wait until ``/health`` says ok."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import uvicorn

ROOT = Path(__file__).resolve().parents[2]
#: How long a server may take to load and answer /health (a guard against a hang, not a
#: measurement: the test fails with the server's log when it runs out).
STARTUP_S = 180.0


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, alive: Any = None, log: Any = None) -> None:
    """Poll ``url/health`` until it answers 200; fail with ``log()`` when ``alive()`` is
    false or :data:`STARTUP_S` passes."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise AssertionError(f"the server exited before it was ready:\n{log() if log else ''}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"the server at {url} was not ready:\n{log() if log else ''}")


class LiveServer:
    """``app`` on uvicorn in a daemon thread of this process, at :attr:`url`; entering
    waits until ``/health`` says ok (``wait=False``: only until it listens)."""

    def __init__(self, app: Any, wait: bool = True):
        self.wait = wait
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        self.thread.start()
        if self.wait:
            wait_healthy(self.url, self.thread.is_alive)
        else:
            while not self.server.started:  # listening (the lifespan has run)
                assert self.thread.is_alive(), "the server thread died"
                time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()


@dataclass
class Spawned:
    """A ``python -m rlx serve`` subprocess at ``url``; its output goes to ``log_path``."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self) -> int:
        """The server's resident set size, from /proc."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc status")

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def spawn(args: Sequence[str], log_path: Path) -> Spawned:
    """``python -m rlx serve ARGS --port P`` with this checkout first on the path."""
    port = free_port()
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    out = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlx", "serve", *args, "--port", str(port)],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    out.close()
    s = Spawned(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        wait_healthy(s.url, lambda: proc.poll() is None, s.log)
    except BaseException:
        s.stop()
        raise
    return s
