"""The aarch64 build targets (``native/cpu.py``) on any host: feature detection from
injected /proc/cpuinfo text, HWCAP words and macOS ``sysctl`` output, target selection
under ``RLX_ISA``, the gcc flags, and the errors for a target the CPU lacks or that does
not exist on the machine. The oracle is the Linux kernel's HWCAP table and gcc's flag
spelling, written out here; nothing is emulated."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from rlx.backends.cpu.native import cpu, schedule
from rlx.backends.cpu.native.cpu import Arch, Target
from rlx.errors import ConfigError

# a Neoverse N1 (Graviton2) and a Neoverse V1 (Graviton3) as their kernels print them
N1 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU part\t: 0xd0c
"""
V1 = """processor\t: 0
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
CPU part\t: 0xd40
"""
A72 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid\n"
# sysctl output of an Apple M1 (no I8MM / BF16) and an M2
M1 = """hw.optional.arm.FEAT_DotProd: 1
hw.optional.arm.FEAT_I8MM: 0
hw.optional.arm.FEAT_BF16: 0
hw.optional.arm.FEAT_LSE: 1
hw.optional.AdvSIMD: 1
"""
M2 = M1.replace("FEAT_I8MM: 0", "FEAT_I8MM: 1").replace("FEAT_BF16: 0", "FEAT_BF16: 1")


def test_machine_names():
    assert cpu.machine_arch("x86_64") is Arch.X86_64
    assert cpu.machine_arch("aarch64") is Arch.AARCH64
    assert cpu.machine_arch("arm64") is Arch.AARCH64  # macOS
    assert cpu.machine_arch("riscv64") is Arch.OTHER
    assert cpu.targets_of(Arch.AARCH64) == (Target.NEON, Target.DOTPROD, Target.I8MM)


def test_cpuinfo_features_line():
    assert {"asimd", "asimddp"} <= cpu.parse_cpuinfo(N1)
    assert "i8mm" not in cpu.parse_cpuinfo(N1)
    assert {"i8mm", "bf16", "asimddp"} <= cpu.parse_cpuinfo(V1)
    assert cpu.parse_cpuinfo("processor : 0\n") == frozenset()


def test_hwcap_bits():
    # linux arch/arm64/include/uapi/asm/hwcap.h: HWCAP_ASIMD 1 << 1, HWCAP_ASIMDDP 1 << 20,
    # HWCAP2_I8MM 1 << 13, HWCAP2_BF16 1 << 14
    assert cpu.hwcap_features(1 << 1, 0) >= {"asimd"}
    assert cpu.hwcap_features((1 << 1) | (1 << 20), 0) >= {"asimd", "asimddp"}
    got = cpu.hwcap_features((1 << 1) | (1 << 20), (1 << 13) | (1 << 14))
    assert {"asimd", "asimddp", "i8mm", "bf16"} <= got
    assert "i8mm" not in cpu.hwcap_features(1 << 1, 1 << 14)


def test_sysctl():
    assert {"asimd", "asimddp"} <= cpu.parse_sysctl(M1)
    assert not {"i8mm", "bf16"} & cpu.parse_sysctl(M1)
    assert {"asimd", "asimddp", "i8mm", "bf16"} <= cpu.parse_sysctl(M2)


@pytest.mark.parametrize(
    "features, best",
    [
        (cpu.parse_cpuinfo(A72), Target.NEON),
        (cpu.parse_cpuinfo(N1), Target.DOTPROD),
        (cpu.parse_cpuinfo(V1), Target.I8MM),
        (cpu.parse_sysctl(M1), Target.DOTPROD),
        (cpu.parse_sysctl(M2), Target.I8MM),
        (frozenset(), Target.NEON),  # unreadable features: the baseline all have
    ],
)
def test_auto_picks_the_best(monkeypatch, features, best):
    monkeypatch.setenv("RLX_ISA", "auto")
    assert cpu.selected_target(features, "aarch64") is best
    assert cpu.runnable_targets(features, "aarch64")[-1] is best


def test_flags():
    v1 = cpu.parse_cpuinfo(V1)
    assert cpu.target_spec(Target.NEON, v1, "aarch64").flags == ("-march=armv8-a",)
    assert cpu.target_spec(Target.DOTPROD, v1, "aarch64").flags == ("-march=armv8.2-a+dotprod",)
    spec = cpu.target_spec(Target.I8MM, v1, "aarch64")
    assert spec.flags == ("-march=armv8.2-a+dotprod+i8mm+bf16",)
    assert spec.requires == {"asimd", "asimddp", "i8mm", "bf16"}
    assert not spec.bf16 and not spec.vnni  # the x86 vdpbf16ps / vpdpbusd paths
    out = cpu.gcc_flags(spec, None, openmp=False)
    assert out[:2] == ("-O3", "-march=armv8.2-a+dotprod+i8mm+bf16") and "-fopenmp" not in out
    assert cpu.isas_for(Target.I8MM, v1, "aarch64")[-1] is cpu.Isa.SMMLA


@pytest.mark.parametrize("isa", ["neon", "dotprod", "i8mm"])
def test_forcing_each(monkeypatch, isa):
    monkeypatch.setenv("RLX_ISA", isa)
    assert cpu.selected_target(cpu.parse_cpuinfo(V1), "aarch64") is Target(isa)
    assert "selected by RLX_ISA=" + isa in cpu.target_description(cpu.parse_cpuinfo(V1), "aarch64")


def test_forcing_a_missing_feature(monkeypatch):
    monkeypatch.setenv("RLX_ISA", "i8mm")
    with pytest.raises(ConfigError, match=r"missing bf16, i8mm\); usable: neon, dotprod"):
        cpu.selected_target(cpu.parse_cpuinfo(N1), "aarch64")
    monkeypatch.setenv("RLX_ISA", "dotprod")
    with pytest.raises(ConfigError, match=r"missing asimddp\); usable: neon \(or auto\)"):
        cpu.selected_target(cpu.parse_cpuinfo(A72), "aarch64")


def test_other_architectures_targets(monkeypatch):
    monkeypatch.setenv("RLX_ISA", "avx2")
    with pytest.raises(ConfigError, match="does not exist on aarch64.*usable: neon, dotprod"):
        cpu.selected_target(cpu.parse_cpuinfo(N1), "aarch64")
    monkeypatch.setenv("RLX_ISA", "neon")
    with pytest.raises(ConfigError, match="does not exist on x86_64"):
        cpu.selected_target(frozenset({"avx2"}), "x86_64")
    with pytest.raises(ConfigError, match="does not exist on aarch64"):
        cpu.target_spec(Target.AVX512, frozenset(), "aarch64")


def test_unknown_value_lists_the_choices(monkeypatch):
    monkeypatch.setenv("RLX_ISA", "sve")
    with pytest.raises(ConfigError, match="RLX_ISA='sve'.*neon, dotprod, i8mm"):
        cpu.selected_target(cpu.parse_cpuinfo(V1), "aarch64")


def test_description_names_the_target(monkeypatch):
    monkeypatch.setenv("RLX_ISA", "auto")
    text = cpu.target_description(cpu.parse_cpuinfo(N1), "aarch64")
    assert text.startswith("aarch64 NEON + dotprod: gcc -march=armv8.2-a+dotprod")
    assert "RLX_ISA=auto" in text


def test_x86_unchanged(monkeypatch):
    monkeypatch.setenv("RLX_ISA", "auto")
    flags = frozenset({"avx2"}) | cpu._V3
    assert cpu.runnable_targets(flags, "x86_64") == [Target.PORTABLE, Target.AVX2]
    assert cpu.target_spec(Target.AVX2, flags, "x86_64").flags == (
        "-march=x86-64-v3",
        "-mtune=generic",
    )


def test_calling_conventions():
    assert schedule.call_convention("x86_64", "Linux") is schedule.CallConv.SYSV_X86_64
    assert schedule.call_convention("aarch64", "Linux") is schedule.CallConv.AAPCS64
    assert schedule.call_convention("arm64", "Darwin") is schedule.CallConv.APPLE_ARM64
    assert schedule.call_convention("riscv64", "Linux") is schedule.CallConv.NONE
    assert schedule.call_convention("x86_64", "Windows") is schedule.CallConv.NONE


def _fake(nargs: int, narrow_at: int) -> object:
    """A ctypes function (libc's ``abs``, never called) typed with ``nargs`` arguments,
    all 8-byte but the one at ``narrow_at`` (a 4-byte int), every argument bound."""
    fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.cast(ctypes.CDLL(None).abs, ctypes.c_void_p).value)
    fn.argtypes = [ctypes.c_int if i == narrow_at else ctypes.c_long for i in range(nargs)]
    fn.restype = ctypes.c_int
    import functools

    return functools.partial(fn, *range(nargs))


def test_apple_stack_arguments():
    """Apple arm64 packs stack arguments by size: a 4-byte int beyond the 8 integer
    registers cannot go through the int64 prototype, one in a register can."""
    for conv in (schedule.CallConv.SYSV_X86_64, schedule.CallConv.AAPCS64):
        assert schedule.native_call(_fake(10, 9), conv) is not None
    assert schedule.native_call(_fake(10, 9), schedule.CallConv.APPLE_ARM64) is None
    assert schedule.native_call(_fake(10, 3), schedule.CallConv.APPLE_ARM64) is not None


CROSS = shutil.which("aarch64-linux-gnu-gcc")


@pytest.mark.skipif(CROSS is None, reason="no aarch64 cross compiler (scripts/test_arm.sh)")
@pytest.mark.parametrize("target", [Target.DOTPROD, Target.I8MM])
def test_cross_compiler_takes_the_flags(tmp_path, target):
    """gcc accepts each target's flags and they enable the instructions they name."""
    spec = cpu.target_spec(target, cpu.parse_cpuinfo(V1), "aarch64")
    src = tmp_path / "t.c"
    body = "return vdotq_s32(a, b, c);"
    if target is Target.I8MM:
        body = "return vmmlaq_s32(a, b, c);"
    src.write_text(
        f"#include <arm_neon.h>\nint32x4_t f(int32x4_t a, int8x16_t b, int8x16_t c) {{ {body} }}\n"
    )
    r = subprocess.run(
        [CROSS, *cpu.gcc_flags(spec, None, False), "-c", str(src), "-o", str(tmp_path / "t.o")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
