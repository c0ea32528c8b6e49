"""Helpers shared by the benchmark scripts: BLAS environment unpinning, timing, the
small graphs several benchmarks measure, what a worker process reports about itself, and the
JSON-lines :class:`Worker` process handle.

Import this module before NumPy: :func:`reexec_without_blas_pins` must run before
OpenBLAS is loaded. NumPy and rlx are therefore imported lazily here. Importing it also
puts the repository root on ``sys.path`` so the scripts find ``rlx`` without installing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlx.ir.mir import Graph

ROOT = Path(__file__).resolve().parents[1]
#: where the scripts write their ``BENCHMARKS_*.md`` reports (linked from BENCHMARKS.md)
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Environment variables that pin OpenBLAS to a kernel / cache size at load time.
BLAS_PINS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_REMOVED_ENV = "RLX_BENCH_REMOVED_BLAS_ENV"


#: aarch64 /proc/cpuinfo "CPU part" (implementer 0x41, Arm) -> core name
_ARM_PARTS = {
    "0xd08": "Cortex-A72",
    "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse N1",
    "0xd40": "Neoverse V1",
    "0xd49": "Neoverse N2",
    "0xd4f": "Neoverse V2",
}


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (on aarch64, which has none: the core its
    ``CPU part`` names), else what :mod:`platform` says."""
    import platform

    part = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
            if line.startswith("CPU part") and part is None:
                part = line.split(":", 1)[1].strip()
    except OSError:
        pass
    if part is not None:
        return f"aarch64 {_ARM_PARTS.get(part, 'CPU part ' + part)}"
    return platform.processor() or platform.machine() or "?"


def reexec_without_blas_pins() -> None:
    """If any of :data:`BLAS_PINS` is set, re-execute this script without them (OpenBLAS
    reads them when it loads), recording what was removed for :func:`removed_blas_pins`."""
    if any(k in os.environ for k in BLAS_PINS):
        removed = ";".join(f"{k}={os.environ.pop(k)}" for k in BLAS_PINS if k in os.environ)
        os.environ[_REMOVED_ENV] = removed
        os.execv(sys.executable, [sys.executable, *sys.argv])


def removed_blas_pins() -> dict[str, str]:
    """The BLAS pins :func:`reexec_without_blas_pins` removed, name -> former value."""
    raw = os.environ.get(_REMOVED_ENV, "")
    return dict(item.split("=", 1) for item in raw.split(";") if item)


def best_time(
    fn: Callable[[], object], repeat: int = 7, number: int = 1, warmup: bool = False
) -> float:
    """Seconds per call: the best of ``repeat`` rounds of ``number`` calls (as timeit
    recommends: on a shared machine the slower rounds measure the other jobs). With
    ``warmup``, one untimed call first."""
    if warmup:
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def chain(n: int, dims: tuple[object, ...] = (4,), name: str = "chain") -> Graph:
    """``n`` elementwise nodes after the input: add, mul, tanh, relu in turn. A string in
    ``dims`` is the symbolic dim ``batch`` (max 4096)."""
    from rlx.ir.mir import Graph

    g = Graph(name)
    if any(isinstance(d, str) for d in dims):
        g.sym("batch", max=4096)
    y = g.input("x", dims)
    for i in range(n - 1):
        k = i % 4
        if k == 0:
            y = g.add(y, 0.5)
        elif k == 1:
            y = g.mul(y, 0.9)
        elif k == 2:
            y = g.tanh(y)
        else:
            y = g.relu(y)
    g.set_outputs([y])
    return g


def mlp(batch: int = 64, dims: tuple[int, ...] = (512, 2048, 2048, 512)) -> Graph:
    """``linear -> gelu -> ... -> linear`` with params ``w{k}`` [in, out], ``b{k}`` [out]."""
    from rlx.ir.mir import Graph

    g = Graph("mlp")
    x = g.input("x", (batch, dims[0]))
    for k, (i, o) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        x = g.linear(x, g.param(f"w{k}", (i, o)), g.param(f"b{k}", (o,)))
        if k < len(dims) - 2:
            x = g.gelu(x)
    g.set_outputs([x])
    return g


def thread_pools() -> list[dict[str, object]]:
    """The BLAS / OpenMP pools loaded in this process (threadpoolctl; [] without it): API,
    implementation, version, kernel architecture, library file name and thread count."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [
        {k: i.get(k) for k in ("user_api", "internal_api", "version", "architecture")}
        | {"file": Path(str(i.get("filepath"))).name, "num_threads": i.get("num_threads")}
        for i in threadpool_info()
    ]


def versions(dists: Sequence[str]) -> dict[str, str]:
    """Python's version and that of each distribution in ``dists`` whose module (its name
    with ``-`` as ``_``) this process has imported -> {name: version}."""
    import importlib.metadata as md
    import platform

    out = {"python": platform.python_version()}
    for dist in dists:
        mod = dist.replace("-", "_")
        if mod in sys.modules:
            try:
                out[dist] = md.version(dist)
            except md.PackageNotFoundError:
                out[dist] = getattr(sys.modules[mod], "__version__", "?")
    return out


def process_stats(dists: Sequence[str]) -> dict[str, Any]:
    """What a benchmark worker reports about its own process: :func:`versions` of ``dists``,
    :func:`thread_pools` and the peak RSS in MiB."""
    import resource

    return {
        "versions": versions(dists),
        "pools": thread_pools(),
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


@dataclass
class Worker:
    """One engine's process speaking JSON lines; :meth:`ask` sends a command and waits.

    ``proc=None`` (with ``error`` set) stands for a worker that could not be started. After
    the first failed reply the worker is marked failed and later replies repeat that error.
    """

    engine: str
    proc: subprocess.Popen[str] | None
    error: str | None = None

    def send(self, cmd: dict[str, Any]) -> None:
        """Write one command line (nothing once the worker has failed)."""
        if self.error is None:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()

    def recv(self) -> dict[str, Any]:
        """Read one reply line -> dict with ``ok`` (and ``error`` when not ok)."""
        if self.error is not None:
            return {"ok": False, "error": self.error}
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        reply = json.loads(line) if line else {"ok": False, "error": "worker exited"}
        if not reply["ok"]:
            self.error = reply["error"]
        return reply

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """:meth:`send` then :meth:`recv`."""
        self.send(cmd)
        return self.recv()

    def close(self) -> None:
        """Ask the worker to quit (also after an error); kill it if it does not."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
