"""Every RLX_* environment flag, typed and documented; read nowhere else.

RLX_VERBOSE=1         print the pass, fusion and dispatch reports after each compile
RLX_CACHE_DIR=path    where native kernels are cached (default ~/.cache/rlx)
RLX_NUM_THREADS=n     default thread count for BLAS and native kernels
RLX_VERIFY=each|end|off  default graph verification mode of the compile pipeline
"""

from __future__ import annotations

import os
from pathlib import Path


def verbose() -> bool:
    return os.environ.get("RLX_VERBOSE", "0") not in ("", "0", "false", "no")


def cache_dir() -> Path:
    return Path(os.environ.get("RLX_CACHE_DIR", Path.home() / ".cache" / "rlx"))


def num_threads() -> int | None:
    v = os.environ.get("RLX_NUM_THREADS")
    return int(v) if v else None


def verify_mode() -> str | None:
    return os.environ.get("RLX_VERIFY")


def physical_cores() -> int:
    """Physical core count (falls back to the logical count)."""
    try:
        cores = set()
        with open("/proc/cpuinfo") as f:
            phys = core = None
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                    cores.add((phys, core))
        if cores:
            return max(1, min(len(cores), os.cpu_count() or 1))
    except OSError:
        pass
    return os.cpu_count() or 1
