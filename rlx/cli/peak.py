"""The machine's f32 FMA peak. In: a thread count. Out: :class:`Peak`: GFLOP/s, measured
with a short FMA loop built by rlx's native build (``native.build``, the selected
target's flags), and the paper estimate beside it.

Measured: :mod:`rlx.backends.cpu.native.peak` (``native/csrc/fma_peak.c``: 12
independent multiply-add chains per thread on the widest vectors the native target has,
AVX-512 16 f32 lanes, AVX2 + FMA 8, portable 4-lane SSE mul + add; a multiply-add counts
2 FLOPs; best of ``tries`` tries of about ``seconds`` each, OpenMP over the threads).

Estimated: cores x GHz x FLOPs/cycle, with the clock from /proc/cpuinfo's ``cpu MHz``
(the current clock: turbo and AVX-512 down-clocking make the real one differ) and
FLOPs/cycle from the target assuming two FMA units: AVX-512 2 x 16 x 2 = 64, AVX2
2 x 8 x 2 = 32, portable (SSE2 mul + add, two units) 2 x 4 x 2 = 16.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Peak", "fma_peak", "estimated_peak", "cpu_mhz", "flops_per_cycle"]

#: FLOPs per cycle per core by native target, assuming two FMA units.
_PER_CYCLE = {"avx512": 64, "avx2": 32, "portable": 16}


@dataclass(frozen=True)
class Peak:
    """``gflops`` for ``threads`` threads; ``how`` says how it was obtained."""

    gflops: float
    threads: int
    measured: bool
    how: str


def cpu_mhz(cpuinfo: Path = Path("/proc/cpuinfo")) -> float | None:
    """The first ``cpu MHz`` value of /proc/cpuinfo (None when absent)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def flops_per_cycle(target: str) -> int:
    """f32 FLOPs per cycle per core for a native target name, two FMA units assumed."""
    return _PER_CYCLE.get(target, 16)


def _target() -> str:
    from rlx.backends.cpu import native

    try:
        return native.selected_target().value
    except Exception:  # an invalid RLX_ISA: the estimate falls back to portable
        return "portable"


def estimated_peak(threads: int) -> Peak | None:
    """cores x GHz x FLOPs/cycle (see the module docstring); None without a clock."""
    mhz = cpu_mhz()
    if mhz is None:
        return None
    target = _target()
    per = flops_per_cycle(target)
    g = threads * mhz / 1e3 * per
    how = (
        f"estimate: {threads} core(s) x {mhz / 1e3:.2f} GHz (/proc/cpuinfo) x {per} "
        f"FLOP/cycle ({target}, 2 FMA units assumed)"
    )
    return Peak(g, threads, False, how)


def _measured(threads: int, tries: int, seconds: float) -> Peak:
    from rlx.backends.cpu.native.peak import measure_peak

    m = measure_peak(threads, seconds=seconds * tries, tries=tries)
    return Peak(m.gflops, threads, True, m.describe())


@functools.cache
def fma_peak(threads: int, tries: int = 10, seconds: float = 0.02) -> Peak:
    """The measured f32 FMA peak on ``threads`` threads (best of ``tries`` runs of about
    ``seconds``); the estimate when no native build is possible (no gcc)."""
    from rlx.backends.cpu import native
    from rlx.errors import CompileError

    if not native.available():
        est = estimated_peak(threads)
        if est is None:
            return Peak(float("nan"), threads, False, "unknown (no gcc to measure, no cpu MHz)")
        return est
    try:
        return _measured(threads, tries, seconds)
    except CompileError as e:
        est = estimated_peak(threads)
        why = f"measuring failed ({str(e).splitlines()[0]})"
        if est is None:
            return Peak(float("nan"), threads, False, why)
        return Peak(est.gflops, threads, False, f"{est.how}; {why}")
