"""Every RLX_* environment flag, typed, validated and documented; read nowhere else.

RLX_VERBOSE=1|0          print the pass, fusion and dispatch reports after each compile
                         (true: 1, true, yes, on; false: 0, false, no, off, empty)
RLX_CACHE_DIR=path       where native kernels are cached (default ~/.cache/rlx when
                         unset; a relative path is taken from the working directory; an
                         empty value is an error: it is most often an unset shell variable,
                         and silently using the default would put the kernels somewhere
                         else than asked). See docs/security.md for what the cache trusts.
RLX_NUM_THREADS=n        default thread count for BLAS and native kernels (decimal digits,
                         >= 1; clamped to the CPUs this process may use, with a warning)
RLX_VERIFY=each|end|off  default graph verification mode of the compile pipeline (end
                         when unset; the test suite runs with each unless the run sets
                         it: tests/conftest.py)
RLX_ISA=auto|avx512|avx2|portable|neon|dotprod|i8mm
                         the instruction set native kernels are built for: auto (the
                         default) picks the best this CPU has; the others force a lower
                         path (a test and debugging aid): avx512 / avx2 / portable on
                         x86-64, neon / dotprod / i8mm on aarch64; asking for one the CPU
                         lacks, or one of another architecture, is an error
RLX_CC=compiler          the C compiler native kernels are built with (a command on PATH
                         or a path; default: gcc). For a cross toolchain such as
                         aarch64-linux-gnu-gcc when rlx runs under qemu-user, or clang
RLX_AMX=1|0              AMX tiles (the int8 and bf16 GEMMs on a CPU with amx_int8 /
                         amx_bf16): 1 (the default) uses them where the CPU and kernel
                         allow; 0 keeps every kernel off them (the VNNI / vdpbf16ps
                         paths most CPUs have; benchmarks measure both). No effect on a
                         CPU without AMX
RLX_OPENMP=auto|shim|off the threading runtime of the native kernels: auto (the default)
                         uses the compiler's OpenMP (-fopenmp: libgomp with gcc), else,
                         with a clang that has no libomp, rlx's own thread pool
                         (csrc/rlx_omp.c), else one thread; shim forces rlx's pool (a
                         clang is needed; a test and debugging aid); off builds without
                         threads (docs/platforms.md, "The compiler and threads")
RLX_CACHE_MAX_MB=n       size bound of the native cache, pruned oldest-first (decimal
                         digits, >= 1; default 512)
RLX_SGEMM=auto|native|blas
                         f32 matmuls: auto (the default) times rlx's packed sgemm against
                         BLAS once per shape class and records the winner; native / blas
                         force one (benchmarks, tests)
RLX_DQ_ACT=f32|auto|q8   activations of weight-only GGUF matmuls (every GGUF layout but Q8_K):
                         f32 (the default) keeps them exact; auto quantizes them to int8
                         per 32 inputs for integer dot products at batch < 4 (decode, as
                         llama.cpp) and keeps f32 above; q8 at every batch (error bound
                         and why f32 is the default: docs/weight_only.md)
RLX_DQ_REPACK=1|0        GGUF weights read in place from their file: 1 (the default)
                         repacks them once at load into rows interleaved 8 (AVX-512) or
                         4 (AVX2, portable) at a time, so a decode GEMV streams them in
                         one pass; 0 keeps them as stored (benchmarks, tests)
RLX_DQ_BF16=1|0          the exact (f32 activation) decode GEMV of Q4_0, Q4_1, Q5_0, Q5_1,
                         Q4_K, Q5_K, Q6_K weights: 1 (the default) runs the bf16 kernel
                         (csrc/dqgemm_bf16dot.c: activations split into exact bf16 parts;
                         Q8_0 there on f32 FMAs over whole row groups) where the CPU has
                         avx512_bf16; 0 keeps the f32 FMA kernels (comparisons). Results
                         stay within the f32 accumulation bound.
RLX_DQ_Q8_DIGITS=1|0     the exact decode GEMV of Q8_0 weights on interleaved rows (the
                         tied LM head): 1 (the default) runs the VNNI kernel
                         (csrc/dqgemm_q8dig.c: activations as exact 22-bit integers in
                         three int8 digits; blocks that would leave the bound take the f32
                         arithmetic) where the CPU has AVX-512 VNNI; 0 keeps the f32 group
                         kernel. Results stay within the f32 accumulation bound.

Each flag accepts exactly the values listed: words in any case, surrounding whitespace
ignored. An unset flag takes its default; a flag set to an empty value is an error (except
RLX_VERBOSE, where empty is documented as off). Anything else raises
:class:`rlx.errors.ConfigError` naming the variable, the value given and the values
accepted.
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
    "cc",
    "amx",
    "openmp",
    "cache_max_bytes",
    "sgemm",
    "dq_act",
    "dq_bf16",
    "physical_cores",
    "available_cpus",
    "clamp_threads",
]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_DIGITS = frozenset("0123456789")
ISA_CHOICES = ("auto", "avx512", "avx2", "portable", "neon", "dotprod", "i8mm")


def _get(name: str, allowed: str) -> str | None:
    """The value of ``name`` stripped of surrounding whitespace; None when unset.
    ConfigError when it is set but empty (``allowed`` says what to give instead)."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    v = raw.strip()
    if not v:
        raise ConfigError(f"{name}={raw!r} is empty; {allowed}")
    return v


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE or not v:
        return False
    raise ConfigError(
        f"{name}={raw!r} is not a boolean; use one of {', '.join(_TRUE)} for on or "
        f"{', '.join(_FALSE)} (or an empty value) for off, in any case"
    )


def _int(name: str, minimum: int, default: str) -> int | None:
    allowed = f"use an integer >= {minimum} (decimal digits), or unset it for {default}"
    v = _get(name, allowed)
    if v is None:
        return None
    if not set(v) <= _DIGITS or int(v) < minimum:  # not int(): it takes "+4", "1_0", "٤"
        raise ConfigError(f"{name}={os.environ[name]!r} is not an integer >= {minimum}; {allowed}")
    return int(v)


def _choice(
    name: str, choices: tuple[str, ...], default: str | None, shown: str | None = None
) -> str | None:
    """One of ``choices`` (any case), or ``default`` when unset (``shown``: the default
    as messages name it, when ``default`` is None)."""
    allowed = (
        f"use one of {', '.join(choices)} (any case), or unset it for the default "
        f"({shown or default})"
    )
    v = _get(name, allowed)
    if v is None:
        return default
    if v.lower() not in choices:
        raise ConfigError(
            f"{name}={os.environ[name]!r} is not one of {', '.join(choices)}; {allowed}"
        )
    return v.lower()


def verbose() -> bool:
    """RLX_VERBOSE as a bool (default off)."""
    return _flag("RLX_VERBOSE", False)


def cache_dir() -> Path:
    """RLX_CACHE_DIR, or ``~/.cache/rlx`` when unset; ConfigError when set but empty.
    Always absolute: a relative value is taken relative to the working directory at the
    time of the call."""
    raw = _get("RLX_CACHE_DIR", "give a directory path, or unset it for the default (~/.cache/rlx)")
    cwd = os.getcwd() if raw and not raw.startswith(("/", "~")) else ""
    key = (raw, os.environ.get("HOME"), cwd)  # memoized: kernel builds ask often
    got = _CACHE_DIRS.get(key)
    if got is None:
        got = Path(raw).expanduser().absolute() if raw else Path.home() / ".cache" / "rlx"
        _CACHE_DIRS[key] = got
    return got


_CACHE_DIRS: dict[tuple[str | None, str | None, str], Path] = {}


def num_threads() -> int | None:
    """RLX_NUM_THREADS (None when unset), validated (>= 1) and clamped to
    :func:`available_cpus` with a warning."""
    v = _int("RLX_NUM_THREADS", 1, "the default (the physical cores)")
    return None if v is None else clamp_threads(v, "RLX_NUM_THREADS")


VERIFY_CHOICES = ("each", "end", "off")


def verify_mode() -> str | None:
    """RLX_VERIFY (each, end or off), None when unset."""
    return _choice("RLX_VERIFY", VERIFY_CHOICES, None, shown="end")


def isa() -> str:
    """RLX_ISA: 'auto' (default), 'avx512', 'avx2', 'portable', 'neon', 'dotprod' or
    'i8mm'."""
    return _choice("RLX_ISA", ISA_CHOICES, "auto") or "auto"


def cc() -> str:
    """RLX_CC: the C compiler command for native kernels ('gcc' when unset)."""
    return _get("RLX_CC", "give a compiler command or path, or unset it for gcc") or "gcc"


def amx() -> bool:
    """RLX_AMX as a bool (default on: AMX tiles where the CPU has them)."""
    return _flag("RLX_AMX", True)


OPENMP_CHOICES = ("auto", "shim", "off")


def openmp() -> str:
    """RLX_OPENMP: 'auto' (default), 'shim' or 'off'."""
    return _choice("RLX_OPENMP", OPENMP_CHOICES, "auto") or "auto"


SGEMM_CHOICES = ("auto", "native", "blas")


def sgemm() -> str:
    """RLX_SGEMM: 'auto' (default), 'native' or 'blas'."""
    return _choice("RLX_SGEMM", SGEMM_CHOICES, "auto") or "auto"


DQ_ACT_CHOICES = ("auto", "q8", "f32")


def dq_act() -> str:
    """RLX_DQ_ACT: 'f32' (default), 'auto' or 'q8'."""
    return _choice("RLX_DQ_ACT", DQ_ACT_CHOICES, "f32") or "f32"


def dq_repack() -> bool:
    """RLX_DQ_REPACK as a bool (default on: GGUF weights repacked at load)."""
    return _flag("RLX_DQ_REPACK", True)


def dq_bf16() -> bool:
    """RLX_DQ_BF16 as a bool (default on: the bf16 dot-product decode GEMV where the CPU
    has avx512_bf16)."""
    return _flag("RLX_DQ_BF16", True)


def dq_q8_digits() -> bool:
    """RLX_DQ_Q8_DIGITS as a bool (default on: Q8_0's exact decode GEMV on the VNNI digit
    kernel where the CPU has AVX-512 VNNI)."""
    return _flag("RLX_DQ_Q8_DIGITS", True)


def cache_max_bytes() -> int:
    """RLX_CACHE_MAX_MB in bytes (default 512 MiB)."""
    v = _int("RLX_CACHE_MAX_MB", 1, "the default (512)")
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
