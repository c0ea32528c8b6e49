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

Per path (:class:`PeakPath`, :func:`path_for`, :func:`path_peak`): the peak of the
instruction a precision's GEMM multiplies with on the selected target, measured the
same way (``measure_lowp_peak``): f32 -> the FMA peak; int8 -> ``vpdpbusd`` (AVX-512
VNNI), on AVX2 ``vpmaddwd`` (8-bit weights) or ``vpmaddubsw + vpmaddwd`` (7-bit
weights, ``rlx.quantize(reduce_range=True)``), none on the portable target (plain C);
bf16 -> ``vdpbf16ps`` (AVX512_BF16), else the FMA peak (bf16 runs through f32 panels).
There is no AMX probe: AMX rows are compared with the VNNI / BF16 peak, and can pass
100 %.

On aarch64 (targets neon, dotprod, i8mm): f32 -> ``FMLA .4s``; int8 -> ``SMMLA`` on
i8mm, ``SDOT`` on dotprod, none on neon; bf16 -> ``BFMMLA`` on i8mm (+bf16), else the
FMA peak. The estimate assumes two 128-bit FMLA pipes (Neoverse N1: 16 FLOP/cycle;
V1 / V2 and Apple cores have four, so it is low there); an aarch64 /proc/cpuinfo has no
clock, so the estimate is usually absent and the measured figure stands alone.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlx.backends.cpu.native.cpu import Target, TargetSpec

__all__ = [
    "Peak",
    "PeakPath",
    "fma_peak",
    "estimated_peak",
    "cpu_mhz",
    "flops_per_cycle",
    "path_for",
    "path_peak",
]

#: FLOPs per cycle per core by native target, assuming two FMA units.
_PER_CYCLE = {"avx512": 64, "avx2": 32, "portable": 16, "neon": 16, "dotprod": 16, "i8mm": 16}


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


class PeakPath(enum.Enum):
    """The multiply a GEMM runs on (the value is its name in reports)."""

    FMA = "f32 FMA"
    VNNI = "int8 vpdpbusd"
    MADDWD = "int8 vpmaddwd"
    MADDUBSW = "int8 vpmaddubsw"
    BF16 = "bf16 vdpbf16ps"
    SDOT = "int8 sdot"
    SMMLA = "int8 smmla"
    BFMMLA = "bf16 bfmmla"
    BFDOT = "bf16 bfdot"


def path_for(precision: str, spec: TargetSpec, seven_bit: bool = False) -> PeakPath | None:
    """The path ``precision`` ("f32", "bf16", "int8") multiplies on with the target
    ``spec``; ``seven_bit``: the int8 weights lie in [-64, 64] (the AVX2 vpmaddubsw
    kernel). None for int8 on the portable target (plain C: no probe)."""
    from rlx.backends.cpu.native.cpu import Target

    if spec.target in (Target.NEON, Target.DOTPROD, Target.I8MM):
        return _path_aarch64(precision, spec.target)
    if precision == "bf16":
        return PeakPath.BF16 if spec.bf16 else PeakPath.FMA
    if precision != "int8":
        return PeakPath.FMA
    if spec.vnni:
        return PeakPath.VNNI
    if spec.target is Target.PORTABLE:
        return None
    return PeakPath.MADDUBSW if seven_bit else PeakPath.MADDWD


def _path_aarch64(precision: str, target: Target) -> PeakPath | None:
    """:func:`path_for` on an aarch64 target: SMMLA / BFMMLA on i8mm, SDOT on dotprod."""
    from rlx.backends.cpu.native.cpu import Target

    if precision == "bf16":
        return PeakPath.BFMMLA if target is Target.I8MM else PeakPath.FMA
    if precision != "int8":
        return PeakPath.FMA
    return {Target.I8MM: PeakPath.SMMLA, Target.DOTPROD: PeakPath.SDOT}.get(target)


@functools.cache
def path_peak(path: PeakPath, threads: int, tries: int = 10, seconds: float = 0.02) -> Peak:
    """The measured peak of ``path`` on ``threads`` threads for the selected target, in
    10^9 ops/s (a multiply-add = 2); NaN with the reason in ``how`` when it cannot be
    measured (no gcc, a build failure, the target lacks the instruction)."""
    if path is PeakPath.FMA:
        return fma_peak(threads, tries, seconds)
    from rlx.backends.cpu import native
    from rlx.backends.cpu.native.peak import PeakKind, measure_lowp_peak
    from rlx.errors import CompileError

    kind = {
        PeakPath.VNNI: PeakKind.INT8,
        PeakPath.MADDUBSW: PeakKind.INT8,
        PeakPath.MADDWD: PeakKind.INT16,
        PeakPath.BF16: PeakKind.BF16,
        PeakPath.SMMLA: PeakKind.INT8,
        PeakPath.SDOT: PeakKind.INT8_DOT,
        PeakPath.BFMMLA: PeakKind.BF16,
        PeakPath.BFDOT: PeakKind.BF16_DOT,
    }[path]
    if not native.available():
        return Peak(float("nan"), threads, False, "unknown (no gcc to measure with)")
    try:
        m = measure_lowp_peak(kind, threads, seconds=seconds * tries, tries=tries)
    except CompileError as e:
        return Peak(float("nan"), threads, False, f"measuring failed ({str(e).splitlines()[0]})")
    if not m.available:
        return Peak(float("nan"), threads, False, m.describe())
    return Peak(m.gops, threads, True, m.describe())
