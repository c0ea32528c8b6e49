"""CPU features and build targets. In: /proc/cpuinfo flags and ``RLX_ISA``. Out: the
:class:`Target` native code is built for (its gcc flags and the CPU features it relies
on) and the int8 GEMM path (:class:`Isa`) that target can run.

Targets (``-march`` never says ``native``: a library is built for a named target, so a
cache shared between machines never hands one CPU another's instructions, and the
target's flags are part of every cache key):

==========  ======================================  ========================================
target      gcc flags                               CPU features required
==========  ======================================  ========================================
PORTABLE    ``-march=x86-64 -mtune=generic``        none (x86-64 baseline; on other
            (no ``-march`` off x86-64)              architectures gcc's default)
AVX2        ``-march=x86-64-v3``                    AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE
AVX512      ``-march=x86-64-v4`` plus               AVX-512 F/BW/CD/DQ/VL and the v3 set;
            ``-mavx512vnni`` / ``-mavx512bf16``     VNNI / BF16 added when the CPU has
                                                    them (they change the flags, so the key)
==========  ======================================  ========================================

:func:`selected_target` takes ``rlx.config.isa()``: ``auto`` picks the best target this
CPU runs; ``avx512`` / ``avx2`` / ``portable`` force one (forcing one the CPU lacks is a
:class:`ConfigError` naming the missing features).

AMX (``amx_tile`` with ``amx_int8`` / ``amx_bf16``) is not a target of its own: the int8
and bf16 GEMM libraries of the AVX512 target take AMX tiles at run time when the CPU and
kernel grant them. ``RLX_AMX=0`` (``rlx.config.amx()``) keeps them off: those libraries
are then built from a source that starts with :func:`amx_prelude` (``#define
RLX_NO_AMX 1``), which compiles the AMX paths out (a separate cache entry).
"""

from __future__ import annotations

import enum
import functools
import platform
from dataclasses import dataclass

from rlx import config
from rlx.errors import ConfigError

__all__ = [
    "Isa",
    "Target",
    "TargetSpec",
    "cpu_flags",
    "target_spec",
    "runnable_targets",
    "selected_target",
    "target_description",
    "detect_isa",
    "supported_isas",
    "isas_for",
    "gcc_flags",
    "has_amx",
    "amx_enabled",
    "amx_prelude",
]


class Isa(enum.Enum):
    """Instruction set of the int8 GEMM (the value is the C ``RLX_ISA`` macro)."""

    PLAIN = 0
    AVX2 = 1
    VNNI512 = 2


class Target(enum.Enum):
    """What native code is compiled for (the value is the ``RLX_ISA`` spelling)."""

    PORTABLE = "portable"
    AVX2 = "avx2"
    AVX512 = "avx512"


@dataclass(frozen=True)
class TargetSpec:
    """A target resolved on a CPU: its gcc flags and the CPU features they rely on."""

    target: Target
    flags: tuple[str, ...]
    requires: frozenset[str]
    vnni: bool = False
    bf16: bool = False

    @property
    def label(self) -> str:
        """Short human name, e.g. ``AVX-512 (VNNI, BF16)``."""
        base = {"portable": "portable C", "avx2": "AVX2", "avx512": "AVX-512"}[self.target.value]
        extra = [n for n, on in (("VNNI", self.vnni), ("BF16", self.bf16)) if on]
        return f"{base} ({', '.join(extra)})" if extra else base


# /proc/cpuinfo names of what -march=x86-64-v2/v3/v4 assume (gcc's definition of the
# levels; "abm" is LZCNT, "pni" SSE3)
_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_VNNI = "avx512_vnni"
_BF16 = "avx512_bf16"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The host CPU's feature flags from /proc/cpuinfo (empty when unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _x86_64() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def target_spec(target: Target, flags: frozenset[str] | None = None) -> TargetSpec:
    """``target``'s gcc flags on a CPU with ``flags`` (default: this CPU). VNNI and BF16
    are added to AVX512 only when ``flags`` has them."""
    f = cpu_flags() if flags is None else flags
    return _target_spec(target, f, _x86_64())


@functools.lru_cache(maxsize=64)
def _target_spec(target: Target, f: frozenset[str], x86_64: bool) -> TargetSpec:
    """:func:`target_spec` (memoized: kernel factories ask for it on every schedule)."""
    if not x86_64:
        if target is not Target.PORTABLE:
            raise ConfigError(
                f"RLX_ISA={target.value}: target {target.name} exists only on x86-64, "
                f"this machine is {platform.machine()}"
            )
        return TargetSpec(target, (), frozenset())
    if target is Target.PORTABLE:
        return TargetSpec(target, ("-march=x86-64", "-mtune=generic"), frozenset())
    if target is Target.AVX2:
        return TargetSpec(target, ("-march=x86-64-v3", "-mtune=generic"), _V3)
    vnni, bf16 = _VNNI in f, _BF16 in f
    extra = ("-mavx512vnni",) * vnni + ("-mavx512bf16",) * bf16
    req = _V4 | {n for n, on in ((_VNNI, vnni), (_BF16, bf16)) if on}
    return TargetSpec(target, ("-march=x86-64-v4", "-mtune=generic", *extra), req, vnni, bf16)


def runnable_targets(flags: frozenset[str] | None = None) -> list[Target]:
    """Every target a CPU with ``flags`` (default: this CPU) runs, best last."""
    f = cpu_flags() if flags is None else flags
    return list(_runnable(f, _x86_64()))


@functools.lru_cache(maxsize=16)
def _runnable(f: frozenset[str], x86_64: bool) -> tuple[Target, ...]:
    if not x86_64:
        return (Target.PORTABLE,)
    return tuple(t for t in Target if _target_spec(t, f, x86_64).requires <= f)


def _missing(target: Target, f: frozenset[str]) -> list[str]:
    if not _x86_64():
        return [f"an x86-64 CPU (this is {platform.machine()})"]
    return sorted(target_spec(target, f).requires - f)


def selected_target(flags: frozenset[str] | None = None) -> Target:
    """The target native code is built for now: ``RLX_ISA`` (``rlx.config.isa()``) on a
    CPU with ``flags`` (default: this CPU). ConfigError when RLX_ISA forces a target the
    CPU cannot run."""
    f = cpu_flags() if flags is None else flags
    want = config.isa()
    usable = runnable_targets(f)
    if want == "auto":
        return usable[-1]
    target = Target(want)
    if target not in usable:
        raise ConfigError(
            f"RLX_ISA={want}: this CPU cannot run the {target.name} target "
            f"(missing {', '.join(_missing(target, f))}); usable: "
            f"{', '.join(t.value for t in usable)} (or auto)"
        )
    return target


def target_description(flags: frozenset[str] | None = None) -> str:
    """One line for reports: the selected target, its gcc flags and why it was chosen,
    e.g. ``AVX-512 (VNNI, BF16): gcc -march=x86-64-v4 ...; selected by RLX_ISA=auto on a
    CPU with AVX-512 (VNNI, BF16)``."""
    f = cpu_flags() if flags is None else flags
    spec = target_spec(selected_target(f), f)
    best = target_spec(runnable_targets(f)[-1], f)
    gcc = " ".join(spec.flags) or "(gcc defaults)"
    qgemm = isas_for(spec.target, f)[-1].name
    return (
        f"{spec.label}: gcc {gcc}, int8 GEMM {qgemm}; selected by RLX_ISA={config.isa()} "
        f"on a CPU with {best.label}"
    )


def isas_for(target: Target, flags: frozenset[str] | None = None) -> list[Isa]:
    """The int8 GEMM paths code built for ``target`` can hold (on a CPU with ``flags``),
    best last: PLAIN always, AVX2 from the AVX2 target, VNNI512 on AVX512 with VNNI."""
    spec = target_spec(target, cpu_flags() if flags is None else flags)
    out = [Isa.PLAIN]
    if target in (Target.AVX2, Target.AVX512):
        out.append(Isa.AVX2)
    if spec.vnni:
        out.append(Isa.VNNI512)
    return out


def detect_isa(flags: frozenset[str] | None = None) -> Isa:
    """The best int8 GEMM path: for explicit ``flags``, the best that CPU has; by
    default, the best the :func:`selected_target` holds (so ``RLX_ISA`` applies)."""
    if flags is None:
        return isas_for(selected_target())[-1]
    if {_VNNI, "avx512bw", "avx512f"} <= flags:
        return Isa.VNNI512
    if "avx2" in flags:
        return Isa.AVX2
    return Isa.PLAIN


def supported_isas(flags: frozenset[str] | None = None) -> list[Isa]:
    """Every int8 GEMM path usable now (default: the selected target's), or on a CPU
    with ``flags``; the plain-C one always."""
    if flags is None:
        return isas_for(selected_target())
    best = detect_isa(flags)
    return [i for i in Isa if i.value <= best.value]


def gcc_flags(spec: TargetSpec, isa: Isa | None, openmp: bool) -> tuple[str, ...]:
    """The gcc options (no compiler, source or output) every native library is built
    with for the target ``spec``: ``-O3``, the target's flags, ``-fPIC -shared
    -ffp-contract=off -fno-math-errno``, ``-fopenmp`` when ``openmp``, and
    ``-DRLX_ISA=<isa>`` for the int8 GEMM path ``isa`` (None: not defined). Used by the
    run-time build and the install-time one (``native/prebuilt.py``) alike."""
    # -fno-math-errno: sqrt & co. never set errno (nothing reads it), so loops with them
    # vectorize (the result bits are the same: sqrt is correctly rounded either way)
    out = ["-O3", *spec.flags, "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno"]
    if openmp:
        out.append("-fopenmp")
    if isa is not None:
        out.append(f"-DRLX_ISA={isa.value}")
    return tuple(out)


_AMX = ("amx_tile", "amx_int8", "amx_bf16")


def has_amx(flags: frozenset[str] | None = None) -> bool:
    """Whether a CPU with ``flags`` (default: this CPU) has AMX tiles (``amx_tile`` and
    ``amx_int8`` or ``amx_bf16`` in /proc/cpuinfo)."""
    f = cpu_flags() if flags is None else flags
    return _AMX[0] in f and bool(f & set(_AMX[1:]))


def amx_enabled(flags: frozenset[str] | None = None) -> bool:
    """Whether kernels may take AMX tiles: the CPU has them and ``RLX_AMX`` is on."""
    return config.amx() and has_amx(flags)


def amx_prelude() -> str:
    """The text the int8 / bf16 GEMM sources start with: ``#define RLX_NO_AMX 1`` when
    ``RLX_AMX=0`` (their AMX paths compiled out), else nothing (the same source, so the
    same cache entry and prebuilt library as before)."""
    return "" if config.amx() else "#define RLX_NO_AMX 1 /* RLX_AMX=0 */\n"
