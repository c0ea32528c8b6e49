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
NEON        ``-march=armv8-a``                      asimd (every aarch64 CPU)
DOTPROD     ``-march=armv8.2-a+dotprod``            asimd, asimddp (SDOT / UDOT)
I8MM        ``-march=armv8.2-a+dotprod+i8mm+bf16``  asimd, asimddp, i8mm, bf16 (SMMLA,
                                                    BFMMLA / BFDOT)
==========  ======================================  ========================================

Which targets exist depends on the machine (:class:`Arch`): PORTABLE / AVX2 / AVX512 on
x86-64, NEON / DOTPROD / I8MM on aarch64 (Linux ``aarch64``, macOS ``arm64``), PORTABLE
alone elsewhere. I8MM is ``armv8.2-a`` plus the three extensions, not ``armv8.6-a``: a
Neoverse V1 (Graviton3) has i8mm and bf16 but is an Armv8.4-A core, and ``armv8.6-a``
would let gcc use v8.5 instructions (FRINT32Z & co.) that it lacks.

CPU features (:func:`cpu_flags`): on x86-64 the ``flags`` line of /proc/cpuinfo; on
Linux aarch64 its ``Features`` line (the kernel's HWCAP names: ``asimd``, ``asimddp``,
``i8mm``, ``bf16``), or, when /proc/cpuinfo has none (qemu-user shows the host's), the
HWCAPs themselves from ``getauxval``; on macOS ``sysctl hw.optional.arm.FEAT_DotProd /
FEAT_I8MM / FEAT_BF16`` translated to the same names (:func:`parse_sysctl`).

:func:`selected_target` takes ``rlx.config.isa()``: ``auto`` picks the best target this
CPU runs; ``avx512`` / ``avx2`` / ``portable`` (x86-64) and ``neon`` / ``dotprod`` /
``i8mm`` (aarch64) force one (forcing one the CPU lacks is a
:class:`ConfigError` naming the missing features).

AMX (``amx_tile`` with ``amx_int8`` / ``amx_bf16``) is not a target of its own: the int8
and bf16 GEMM libraries of the AVX512 target take AMX tiles at run time when the CPU and
kernel grant them. ``RLX_AMX=0`` (``rlx.config.amx()``) keeps them off: those libraries
are then built from a source that starts with :func:`amx_prelude` (``#define
RLX_NO_AMX 1``), which compiles the AMX paths out (a separate cache entry).
"""

from __future__ import annotations

import ctypes
import enum
import functools
import platform
import subprocess
import sys
from dataclasses import dataclass

from rlx import config
from rlx.errors import ConfigError

__all__ = [
    "Arch",
    "Isa",
    "Target",
    "TargetSpec",
    "machine_arch",
    "targets_of",
    "parse_cpuinfo",
    "hwcap_features",
    "parse_sysctl",
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
    """Instruction set of the int8 GEMM (the value is the C ``RLX_ISA`` macro): the x86
    paths AVX2 / VNNI512 and the aarch64 ones NEON (SMULL + SADALP), SDOT (dotprod) and
    SMMLA (i8mm); PLAIN is plain C anywhere."""

    PLAIN = 0
    AVX2 = 1
    VNNI512 = 2
    NEON = 3
    SDOT = 4
    SMMLA = 5


class Arch(enum.Enum):
    """The machine's instruction set family (it decides which targets exist)."""

    X86_64 = "x86_64"
    AARCH64 = "aarch64"
    OTHER = "other"


class Target(enum.Enum):
    """What native code is compiled for (the value is the ``RLX_ISA`` spelling)."""

    PORTABLE = "portable"
    AVX2 = "avx2"
    AVX512 = "avx512"
    NEON = "neon"
    DOTPROD = "dotprod"
    I8MM = "i8mm"


_TARGETS = {
    Arch.X86_64: (Target.PORTABLE, Target.AVX2, Target.AVX512),
    Arch.AARCH64: (Target.NEON, Target.DOTPROD, Target.I8MM),
    Arch.OTHER: (Target.PORTABLE,),
}


def machine_arch(machine: str | None = None) -> Arch:
    """The :class:`Arch` of ``machine`` (a ``platform.machine()`` string; default: this
    machine's): ``x86_64`` / ``AMD64`` are X86_64, ``aarch64`` / ``arm64`` AARCH64."""
    m = platform.machine() if machine is None else machine
    if m in ("x86_64", "AMD64", "amd64"):
        return Arch.X86_64
    if m in ("aarch64", "arm64", "ARM64"):
        return Arch.AARCH64
    return Arch.OTHER


def _x86_64() -> bool:
    return machine_arch() is Arch.X86_64


def targets_of(arch: Arch) -> tuple[Target, ...]:
    """The targets that exist on ``arch``, baseline first."""
    return _TARGETS[arch]


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
        """Short human name, e.g. ``AVX-512 (VNNI, BF16)`` or ``NEON + dotprod``."""
        base = {
            Target.PORTABLE: "portable C",
            Target.AVX2: "AVX2",
            Target.AVX512: "AVX-512",
            Target.NEON: "aarch64 NEON",
            Target.DOTPROD: "aarch64 NEON + dotprod",
            Target.I8MM: "aarch64 NEON + dotprod + i8mm + bf16",
        }[self.target]
        if self.target is not Target.AVX512:
            return base
        extra = [n for n, on in (("VNNI", self.vnni), ("BF16", self.bf16)) if on]
        return f"{base} ({', '.join(extra)})" if extra else base


# /proc/cpuinfo names of what -march=x86-64-v2/v3/v4 assume (gcc's definition of the
# levels; "abm" is LZCNT, "pni" SSE3)
_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_VNNI = "avx512_vnni"
_BF16 = "avx512_bf16"

# aarch64: the kernel's HWCAP names (the /proc/cpuinfo ``Features`` words) each target
# relies on, and the gcc flags that allow exactly those
_ARM = {
    Target.NEON: (("-march=armv8-a",), frozenset({"asimd"})),
    Target.DOTPROD: (("-march=armv8.2-a+dotprod",), frozenset({"asimd", "asimddp"})),
    Target.I8MM: (
        ("-march=armv8.2-a+dotprod+i8mm+bf16",),
        frozenset({"asimd", "asimddp", "i8mm", "bf16"}),
    ),
}
# AT_HWCAP / AT_HWCAP2 bits (linux arch/arm64/include/uapi/asm/hwcap.h) -> names
_HWCAP = {"fp": 0, "asimd": 1, "atomics": 8, "asimdhp": 10, "asimdrdm": 12, "asimddp": 20}
_HWCAP2 = {"sve2": 1, "i8mm": 13, "bf16": 14}
_AT_HWCAP, _AT_HWCAP2 = 16, 26
# macOS sysctl hw.optional.arm.FEAT_* (and the older hw.optional.* names) -> HWCAP names
_SYSCTL = {
    "hw.optional.arm.FEAT_DotProd": "asimddp",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.arm.FEAT_LSE": "atomics",
    "hw.optional.arm.FEAT_RDM": "asimdrdm",
    "hw.optional.arm.FEAT_FP16": "asimdhp",
    "hw.optional.AdvSIMD": "asimd",
    "hw.optional.neon": "asimd",
    "hw.optional.armv8_2_dotprod": "asimddp",
}


def parse_cpuinfo(text: str) -> frozenset[str]:
    """The feature words of /proc/cpuinfo text: its first ``flags`` line (x86) or
    ``Features`` line (aarch64); empty when it has neither."""
    for line in text.splitlines():
        if line.startswith(("flags", "Features")) and ":" in line:
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def hwcap_features(hwcap: int, hwcap2: int) -> frozenset[str]:
    """The aarch64 feature names (as /proc/cpuinfo spells them) set in the ``AT_HWCAP``
    and ``AT_HWCAP2`` words."""
    out = {n for n, b in _HWCAP.items() if hwcap >> b & 1}
    return frozenset(out | {n for n, b in _HWCAP2.items() if hwcap2 >> b & 1})


def parse_sysctl(text: str) -> frozenset[str]:
    """The aarch64 feature names (as /proc/cpuinfo spells them) of ``sysctl`` output
    lines ``hw.optional.arm.FEAT_DotProd: 1``; every Apple arm64 CPU has AdvSIMD."""
    out = {"asimd", "fp"}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        name = _SYSCTL.get(key.strip())
        if name is not None and value.strip() == "1":
            out.add(name)
    return frozenset(out)


def _read_hwcaps() -> frozenset[str]:
    try:
        libc = ctypes.CDLL(None)
        getauxval = libc.getauxval
    except (OSError, AttributeError):
        return frozenset()
    getauxval.restype = ctypes.c_ulong
    getauxval.argtypes = [ctypes.c_ulong]
    return hwcap_features(int(getauxval(_AT_HWCAP)), int(getauxval(_AT_HWCAP2)))


def _read_sysctl() -> frozenset[str]:
    try:
        r = subprocess.run(
            ["sysctl", *_SYSCTL], capture_output=True, text=True, check=False, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return frozenset({"asimd", "fp"})
    return parse_sysctl(r.stdout)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The host CPU's feature flags (empty when unreadable): /proc/cpuinfo's ``flags``
    (x86-64) or ``Features`` (aarch64) line; on aarch64 without one, the ``getauxval``
    HWCAPs (Linux) or ``sysctl hw.optional`` (macOS), under the same names."""
    arch = machine_arch()
    if sys.platform == "darwin" and arch is Arch.AARCH64:
        return _read_sysctl()
    try:
        with open("/proc/cpuinfo") as f:
            got = parse_cpuinfo(f.read())
    except OSError:
        got = frozenset()
    if arch is Arch.AARCH64 and "asimd" not in got:
        got = _read_hwcaps()
    return got


def target_spec(
    target: Target, flags: frozenset[str] | None = None, machine: str | None = None
) -> TargetSpec:
    """``target``'s gcc flags on a CPU with ``flags`` (default: this CPU) of the kind
    ``machine`` names (default: this machine). VNNI and BF16 are added to AVX512 only
    when ``flags`` has them. ConfigError for a target that does not exist there."""
    f = cpu_flags() if flags is None else flags
    return _target_spec(target, f, machine_arch(machine))


@functools.lru_cache(maxsize=64)
def _target_spec(target: Target, f: frozenset[str], arch: Arch) -> TargetSpec:
    """:func:`target_spec` (memoized: kernel factories ask for it on every schedule)."""
    if target not in _TARGETS[arch]:
        raise ConfigError(
            f"RLX_ISA={target.value}: target {target.name} does not exist on {arch.value} "
            f"(this machine's targets: {', '.join(t.value for t in _TARGETS[arch])})"
        )
    if arch is Arch.AARCH64:
        flags, req = _ARM[target]
        # vnni / bf16 name the x86 paths (vpdpbusd / vdpbf16ps) kernels pick by them;
        # the aarch64 ones (SDOT, SMMLA, BFMMLA) are the target itself
        return TargetSpec(target, flags, req)
    if arch is Arch.OTHER:
        return TargetSpec(target, (), frozenset())
    if target is Target.PORTABLE:
        return TargetSpec(target, ("-march=x86-64", "-mtune=generic"), frozenset())
    if target is Target.AVX2:
        return TargetSpec(target, ("-march=x86-64-v3", "-mtune=generic"), _V3)
    vnni, bf16 = _VNNI in f, _BF16 in f
    extra = ("-mavx512vnni",) * vnni + ("-mavx512bf16",) * bf16
    req = _V4 | {n for n, on in ((_VNNI, vnni), (_BF16, bf16)) if on}
    return TargetSpec(target, ("-march=x86-64-v4", "-mtune=generic", *extra), req, vnni, bf16)


def runnable_targets(
    flags: frozenset[str] | None = None, machine: str | None = None
) -> list[Target]:
    """Every target a CPU with ``flags`` (default: this CPU) of the kind ``machine``
    names (default: this machine) runs, best last. On aarch64 the NEON baseline is
    always there (every aarch64 CPU has AdvSIMD, even when its features are unreadable)."""
    f = cpu_flags() if flags is None else flags
    return list(_runnable(f, machine_arch(machine)))


@functools.lru_cache(maxsize=16)
def _runnable(f: frozenset[str], arch: Arch) -> tuple[Target, ...]:
    if arch is Arch.AARCH64:
        f = f | {"asimd"}
    return tuple(t for t in _TARGETS[arch] if _target_spec(t, f, arch).requires <= f)


def _missing(target: Target, f: frozenset[str], arch: Arch) -> list[str]:
    return sorted(_target_spec(target, f, arch).requires - f)


def selected_target(flags: frozenset[str] | None = None, machine: str | None = None) -> Target:
    """The target native code is built for now: ``RLX_ISA`` (``rlx.config.isa()``) on a
    CPU with ``flags`` (default: this CPU) of the kind ``machine`` names (default: this
    machine). ConfigError when RLX_ISA forces a target that does not exist on this
    machine or that the CPU cannot run (naming the missing features)."""
    f = cpu_flags() if flags is None else flags
    arch = machine_arch(machine)
    want = config.isa()
    usable = runnable_targets(f, machine)
    if want == "auto":
        return usable[-1]
    target = Target(want)
    if target not in usable:
        if target not in _TARGETS[arch]:
            why = f"it does not exist on {arch.value}"
        else:
            why = f"missing {', '.join(_missing(target, f, arch))}"
        raise ConfigError(
            f"RLX_ISA={want}: this CPU cannot run the {target.name} target ({why}); "
            f"usable: {', '.join(t.value for t in usable)} (or auto)"
        )
    return target


def target_description(flags: frozenset[str] | None = None, machine: str | None = None) -> str:
    """One line for reports: the selected target, its gcc flags and why it was chosen,
    e.g. ``AVX-512 (VNNI, BF16): gcc -march=x86-64-v4 ...; selected by RLX_ISA=auto on a
    CPU with AVX-512 (VNNI, BF16)``."""
    f = cpu_flags() if flags is None else flags
    spec = target_spec(selected_target(f, machine), f, machine)
    best = target_spec(runnable_targets(f, machine)[-1], f, machine)
    gcc = " ".join(spec.flags) or "(gcc defaults)"
    qgemm = isas_for(spec.target, f, machine)[-1].name
    return (
        f"{spec.label}: gcc {gcc}, int8 GEMM {qgemm}; selected by RLX_ISA={config.isa()} "
        f"on a CPU with {best.label}"
    )


def isas_for(
    target: Target, flags: frozenset[str] | None = None, machine: str | None = None
) -> list[Isa]:
    """The int8 GEMM paths code built for ``target`` can hold (on a CPU with ``flags``),
    best last: PLAIN always, AVX2 from the AVX2 target, VNNI512 on AVX512 with VNNI;
    NEON on every aarch64 target, SDOT from DOTPROD, SMMLA on I8MM."""
    spec = target_spec(target, cpu_flags() if flags is None else flags, machine)
    out = [Isa.PLAIN]
    if target in _ARM_ISAS:
        return out + list(_ARM_ISAS[target])
    if target in (Target.AVX2, Target.AVX512):
        out.append(Isa.AVX2)
    if spec.vnni:
        out.append(Isa.VNNI512)
    return out


# the int8 GEMM paths each aarch64 target adds to PLAIN, best last
_ARM_ISAS = {
    Target.NEON: (Isa.NEON,),
    Target.DOTPROD: (Isa.NEON, Isa.SDOT),
    Target.I8MM: (Isa.NEON, Isa.SDOT, Isa.SMMLA),
}


def detect_isa(flags: frozenset[str] | None = None) -> Isa:
    """The best int8 GEMM path: for explicit ``flags``, the best that CPU has; by
    default, the best the :func:`selected_target` holds (so ``RLX_ISA`` applies)."""
    if flags is None:
        return isas_for(selected_target())[-1]
    if "asimd" in flags:  # aarch64 HWCAP names
        if {"asimddp", "i8mm"} <= flags:
            return Isa.SMMLA
        return Isa.SDOT if "asimddp" in flags else Isa.NEON
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
    if best is Isa.PLAIN:
        return [Isa.PLAIN]
    chain = _ARM_ISAS[Target.I8MM] if best in _ARM_ISAS[Target.I8MM] else (Isa.AVX2, Isa.VNNI512)
    return [Isa.PLAIN, *chain[: chain.index(best) + 1]]


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
