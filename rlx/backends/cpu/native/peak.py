"""The f32 FMA peak of this CPU, measured. In: a thread count (and optionally a build
target). Out: GFLOP/s (:func:`fma_peak_gflops`) or the full :class:`PeakMeasurement`
(:func:`measure_peak`).

The probe is ``csrc/fma_peak.c`` built by :func:`rlx.backends.cpu.native.build` for the
selected target (so it runs at the vector width rlx's own kernels use: AVX-512 zmm, AVX2
ymm, or the portable target's 4-lane SSE mul + add): each thread runs 12 independent
multiply-add chains, a multiply-add counting 2 FLOPs. One try is calibrated to about
``seconds / tries``; the best of ``tries`` tries is kept (a busy machine only lowers a
try, so the best is the closest to the peak). Threads: OpenMP ``num_threads(threads)``;
without OpenMP one thread runs and the figure is scaled by the thread count (the
measurement says so). Results are cached per (threads, target) for the process.

:func:`measure_lowp_peak` runs the same loop on the instructions the int8 GEMM
(:attr:`PeakKind.INT8`: ``vpdpbusd`` zmm on AVX-512 with VNNI; ``vpmaddubsw`` +
``vpmaddwd`` ymm on AVX2, the 7-bit-weight kernel; :attr:`PeakKind.INT16`: ``vpmaddwd``
ymm alone, the AVX2 kernel for 8-bit weights) or the bf16 GEMM (:attr:`PeakKind.BF16`:
``vdpbf16ps`` zmm with AVX512_BF16) multiplies with; a multiply-add counts 2 ops. A target without that instruction gives
``available=False`` (bf16 then computes in f32: its peak is the FMA peak).

On aarch64 the probes run 24 chains of NEON instructions: f32 ``FMLA .4s``; INT8
``SMMLA`` on the i8mm target, ``SDOT .4s`` on dotprod, none on neon; INT8_DOT ``SDOT``
wherever dotprod is; BF16 ``BFMMLA`` and BF16_DOT ``BFDOT .4s`` on i8mm (+bf16). INT16,
INT8_DOT and BF16_DOT: x86-64's INT16 has no aarch64 counterpart and the two DOT kinds
none on x86-64 (``available=False`` there).
"""

from __future__ import annotations

import ctypes
import enum
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlx.backends.cpu.native import bindings
from rlx.backends.cpu.native.cpu import Target
from rlx.errors import CompileError

__all__ = [
    "PeakMeasurement",
    "PeakKind",
    "LowpPeak",
    "measure_peak",
    "measure_lowp_peak",
    "fma_peak_gflops",
    "peak_source",
]


@dataclass(frozen=True)
class PeakMeasurement:
    """``gflops`` on ``threads`` threads (``ran`` of them really ran), the loop's shape
    (``lanes`` per vector, ``chains``, ``fused`` FMA or mul + add) and the best try."""

    gflops: float
    threads: int
    ran: int
    target: Target
    lanes: int
    chains: int
    fused: bool
    best_seconds: float
    tries: int

    @property
    def vector(self) -> str:
        """``AVX-512 FMA`` / ``AVX2 FMA`` / ``NEON FMLA`` / ``4-lane mul+add``."""
        if self.target in _AARCH64:
            return "NEON FMLA .4s"
        if self.fused:
            return {16: "AVX-512 FMA", 8: "AVX2 FMA"}.get(self.lanes, f"{self.lanes}-lane FMA")
        return f"{self.lanes}-lane mul+add"

    def describe(self) -> str:
        """One line: how the figure was obtained."""
        how = (
            f"measured: {self.chains} independent {self.vector} chains per thread on "
            f"{self.ran} thread(s), best of {self.tries} x {self.best_seconds * 1e3:.1f} ms"
        )
        if self.ran != self.threads:
            how += f", scaled to {self.threads} threads (no OpenMP)"
        return how


def peak_source() -> str:
    """The probe's C source (``csrc/fma_peak.c``)."""
    from rlx.backends.cpu import native

    return (native.CSRC / "fma_peak.c").read_text()


@functools.cache
def _lib(target: Target) -> ctypes.CDLL:
    from rlx.backends.cpu import native

    source = peak_source()
    return bindings.typed(native.load(native.build(source, target, name="fma_peak")), source)


def measure_peak(
    threads: int = 1, target: Target | None = None, seconds: float = 0.08, tries: int = 5
) -> PeakMeasurement:
    """Run the probe on ``threads`` threads for about ``seconds`` in all (``tries`` tries,
    the best kept). CompileError when it cannot be built (no gcc, no usable cache) or
    ``threads`` / ``tries`` is not >= 1."""
    from rlx.backends.cpu import native

    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise CompileError(f"FMA peak probe: threads must be an int >= 1, given {threads!r}")
    if tries < 1:
        raise CompileError(f"FMA peak probe: tries must be >= 1, given {tries!r}")
    if not native.available():
        raise CompileError("FMA peak probe: gcc is not on PATH, nothing to measure with")
    target = native.selected_target() if target is None else target
    lib = _lib(target)
    iters, best, ran = _time_probe(lib.rlx_peak_run, threads, seconds, tries)
    lanes, chains = lib.rlx_peak_lanes(), lib.rlx_peak_chains()
    flops = ran * iters * chains * lanes * 2
    gflops = flops / best / 1e9 * (threads / ran)
    return PeakMeasurement(
        gflops, threads, ran, target, lanes, chains, bool(lib.rlx_peak_fused()), best, tries
    )


def _time_probe(
    run: Callable[..., float], threads: int, seconds: float, tries: int
) -> tuple[int, float, int]:
    """Calibrate ``run(iters, threads, &used)`` to about ``seconds / tries`` per try and
    keep the best of ``tries``: (iters, best seconds, threads that ran)."""
    used = ctypes.c_int(0)
    per_try = seconds / tries
    iters = 1000
    run(iters, threads, ctypes.byref(used))  # start the threads
    while True:  # calibrate: a quarter of a try at least
        t0 = time.perf_counter()
        run(iters, threads, ctypes.byref(used))
        dt = time.perf_counter() - t0
        if dt >= per_try / 4 or iters >= 1 << 34:
            break
        iters *= 4
    iters = max(1, int(iters * per_try / max(dt, 1e-7)))
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        run(iters, threads, ctypes.byref(used))
        best = min(best, time.perf_counter() - t0)
    return iters, best, max(1, used.value)


class PeakKind(enum.Enum):
    """Which low-precision multiply :func:`measure_lowp_peak` probes."""

    INT8 = "int8"
    INT16 = "int16"
    BF16 = "bf16"
    INT8_DOT = "int8 dot"
    BF16_DOT = "bf16 dot"


@dataclass(frozen=True)
class LowpPeak:
    """``gops`` (10^9 ops/s, a multiply-add = 2 ops) of ``instruction`` on ``threads``
    threads (``ran`` really ran); ``available`` False (``gops`` 0) when the target has no
    such instruction."""

    kind: PeakKind
    gops: float
    instruction: str
    macs_per_instruction: int
    threads: int
    ran: int
    target: Target
    best_seconds: float
    tries: int
    chains: int = 12

    @property
    def available(self) -> bool:
        """Whether the target has the instruction (else nothing was measured)."""
        return self.macs_per_instruction > 0

    def describe(self) -> str:
        """One line: how the figure was obtained."""
        if not self.available:
            return f"no {self.kind.value} multiply instruction on the {self.target.name} target"
        return (
            f"measured: {self.chains} independent {self.instruction} chains per thread on {self.ran} "
            f"thread(s), best of {self.tries} x {self.best_seconds * 1e3:.1f} ms"
        )


_AARCH64 = (Target.NEON, Target.DOTPROD, Target.I8MM)
_INSTRUCTIONS = {
    (PeakKind.INT8, 64): "vpdpbusd zmm",
    (PeakKind.INT8, 32): "vpmaddubsw + vpmaddwd ymm",
    (PeakKind.INT16, 16): "vpmaddwd ymm",
    (PeakKind.BF16, 32): "vdpbf16ps zmm",
}
#: aarch64: (kind, multiply-adds per instruction) -> its name
_INSTRUCTIONS_A64 = {
    (PeakKind.INT8, 32): "SMMLA",
    (PeakKind.INT8, 16): "SDOT .4s",
    (PeakKind.INT8_DOT, 16): "SDOT .4s",
    (PeakKind.BF16, 16): "BFMMLA",
    (PeakKind.BF16_DOT, 8): "BFDOT .4s",
}


def measure_lowp_peak(
    kind: PeakKind,
    threads: int = 1,
    target: Target | None = None,
    seconds: float = 0.08,
    tries: int = 5,
) -> LowpPeak:
    """The int8 or bf16 multiply peak of ``target`` (default: the selected one) on
    ``threads`` threads, measured like :func:`measure_peak`. CompileError as there."""
    from rlx.backends.cpu import native

    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise CompileError(
            f"{kind.value} peak probe: threads must be an int >= 1, given {threads!r}"
        )
    if tries < 1:
        raise CompileError(f"{kind.value} peak probe: tries must be >= 1, given {tries!r}")
    if not native.available():
        raise CompileError(f"{kind.value} peak probe: gcc is not on PATH, nothing to measure with")
    target = native.selected_target() if target is None else target
    lib = _lib(target)
    ops_fn, run = {
        PeakKind.INT8: (lib.rlx_peak_int8_ops, lib.rlx_peak_int8_run),
        PeakKind.INT16: (lib.rlx_peak_int16_ops, lib.rlx_peak_int16_run),
        PeakKind.BF16: (lib.rlx_peak_bf16_ops, lib.rlx_peak_bf16_run),
        PeakKind.INT8_DOT: (lib.rlx_peak_int8dot_ops, lib.rlx_peak_int8dot_run),
        PeakKind.BF16_DOT: (lib.rlx_peak_bf16dot_ops, lib.rlx_peak_bf16dot_run),
    }[kind]
    macs = int(ops_fn())
    if macs == 0:
        return LowpPeak(kind, 0.0, "none", 0, threads, 0, target, 0.0, 0)
    iters, best, ran = _time_probe(run, threads, seconds, tries)
    chains = int(lib.rlx_peak_chains())
    ops = ran * iters * chains * macs * 2
    gops = ops / best / 1e9 * (threads / ran)
    names = _INSTRUCTIONS_A64 if target in _AARCH64 else _INSTRUCTIONS
    return LowpPeak(kind, gops, names[kind, macs], macs, threads, ran, target, best, tries, chains)


@functools.cache
def _cached(threads: int, target: Target) -> float:
    return measure_peak(threads, target).gflops


def fma_peak_gflops(threads: int = 1, target: Target | None = None) -> float:
    """The f32 FMA peak in GFLOP/s on ``threads`` threads for ``target`` (default: the
    selected one), measured once per process (about 0.1 s). CompileError when the probe
    cannot be built."""
    from rlx.backends.cpu import native

    return _cached(threads, native.selected_target() if target is None else target)
