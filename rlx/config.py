"""Every RLX_* environment flag, typed, validated and documented; read nowhere else.

RLX_VERBOSE=1|0          print the pass, fusion and dispatch reports after each compile
                         (true: 1, true, yes, on; false: 0, false, no, off, empty)
RLX_CACHE_DIR=path       where native kernels are cached (default ~/.cache/rlx; an empty
                         value means the default). See docs/security.md for what the
                         cache trusts.
RLX_NUM_THREADS=n        default thread count for BLAS and native kernels (>= 1; clamped
                         to the CPUs this process may use, with a warning)
RLX_VERIFY=each|end|off  default graph verification mode of the compile pipeline
RLX_ISA=auto|avx512|avx2|portable
                         the instruction set native kernels are built for: auto (the
                         default) picks the best this CPU has; the others force a lower
                         path (a test and debugging aid); asking for one the CPU lacks
                         is an error
RLX_CACHE_MAX_MB=n       size bound of the native cache, pruned oldest-first (default 512)
RLX_SGEMM=auto|native|blas
                         f32 matmuls: auto (the default) times rlx's packed sgemm against
                         BLAS once per shape class and records the winner; native / blas
                         force one (benchmarks, tests)
RLX_DQ_ACT=f32|auto|q8   activations of weight-only GGUF matmuls (Q8_0, Q5_0, Q4_K, Q6_K):
                         f32 (the default) keeps them exact; auto quantizes them to int8
                         per 32 inputs for integer dot products at batch < 4 (decode, as
                         llama.cpp) and keeps f32 above; q8 at every batch (error bound
                         and why f32 is the default: docs/weight_only.md)

A value that does not parse raises :class:`rlx.errors.ConfigError` naming the variable,
the value given and what is accepted.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from rlx.errors import ConfigError

__all__ = [
    "verbose",
    "cache_dir",
    "num_threads",
    "verify_mode",
    "isa",
    "cache_max_bytes",
    "sgemm",
    "dq_act",
    "physical_cores",
    "available_cpus",
    "clamp_threads",
]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
ISA_CHOICES = ("auto", "avx512", "avx2", "portable")


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(
        f"{name}={raw!r} is not a boolean; use one of "
        f"{sorted(_TRUE)} for on or {sorted(_FALSE - {''})} for off"
    )


def _int(name: str, minimum: int) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        v = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if v < minimum:
        raise ConfigError(f"{name}={raw!r} must be >= {minimum}")
    return v


def verbose() -> bool:
    """RLX_VERBOSE as a bool (default off)."""
    return _flag("RLX_VERBOSE", False)


def cache_dir() -> Path:
    """RLX_CACHE_DIR, or ``~/.cache/rlx`` when unset or empty. Always absolute: a
    relative value is taken relative to the working directory at the time of the call."""
    raw = os.environ.get("RLX_CACHE_DIR", "").strip()
    cwd = os.getcwd() if raw and not raw.startswith(("/", "~")) else ""
    key = (raw, os.environ.get("HOME"), cwd)  # memoized: kernel builds ask often
    got = _CACHE_DIRS.get(key)
    if got is None:
        got = Path(raw).expanduser().absolute() if raw else Path.home() / ".cache" / "rlx"
        _CACHE_DIRS[key] = got
    return got


_CACHE_DIRS: dict[tuple[str, str | None, str], Path] = {}


def num_threads() -> int | None:
    """RLX_NUM_THREADS (None when unset), validated (>= 1) and clamped to
    :func:`available_cpus` with a warning."""
    v = _int("RLX_NUM_THREADS", 1)
    return None if v is None else clamp_threads(v, "RLX_NUM_THREADS")


def verify_mode() -> str | None:
    """RLX_VERIFY (each, end or off), None when unset."""
    raw = os.environ.get("RLX_VERIFY")
    if raw is None or raw.strip() == "":
        return None
    v = raw.strip().lower()
    if v not in ("each", "end", "off"):
        raise ConfigError(f"RLX_VERIFY={raw!r} is not one of 'each', 'end', 'off'")
    return v


def isa() -> str:
    """RLX_ISA: 'auto' (default), 'avx512', 'avx2' or 'portable'."""
    raw = os.environ.get("RLX_ISA")
    if raw is None or raw.strip() == "":
        return "auto"
    v = raw.strip().lower()
    if v not in ISA_CHOICES:
        raise ConfigError(f"RLX_ISA={raw!r} is not one of {', '.join(ISA_CHOICES)}")
    return v


SGEMM_CHOICES = ("auto", "native", "blas")


def sgemm() -> str:
    """RLX_SGEMM: 'auto' (default), 'native' or 'blas'."""
    raw = os.environ.get("RLX_SGEMM")
    if raw is None or raw.strip() == "":
        return "auto"
    v = raw.strip().lower()
    if v not in SGEMM_CHOICES:
        raise ConfigError(f"RLX_SGEMM={raw!r} is not one of {', '.join(SGEMM_CHOICES)}")
    return v


DQ_ACT_CHOICES = ("auto", "q8", "f32")


def dq_act() -> str:
    """RLX_DQ_ACT: 'f32' (default), 'auto' or 'q8'."""
    raw = os.environ.get("RLX_DQ_ACT")
    if raw is None or raw.strip() == "":
        return "f32"
    v = raw.strip().lower()
    if v not in DQ_ACT_CHOICES:
        raise ConfigError(f"RLX_DQ_ACT={raw!r} is not one of {', '.join(DQ_ACT_CHOICES)}")
    return v


def cache_max_bytes() -> int:
    """RLX_CACHE_MAX_MB in bytes (default 512 MiB)."""
    v = _int("RLX_CACHE_MAX_MB", 1)
    return (512 if v is None else v) << 20


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask; the logical count otherwise)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_warned_clamp: set[tuple[str, int]] = set()


def clamp_threads(n: int, what: str) -> int:
    """``n`` limited to :func:`available_cpus`; warns once per (what, n) when it clamps."""
    cap = available_cpus()
    if n > cap:
        if (what, n) not in _warned_clamp:
            _warned_clamp.add((what, n))
            warnings.warn(
                f"{what}={n} exceeds the {cap} CPUs this process may use; using {cap}",
                RuntimeWarning,
                stacklevel=3,
            )
        return cap
    return n


def physical_cores() -> int:
    """Physical core count (falls back to the logical count), at most available_cpus()."""
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
            return max(1, min(len(cores), available_cpus()))
    except OSError:
        pass
    return available_cpus()
