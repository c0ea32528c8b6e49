"""The aarch64 peak probes of ``csrc/fma_peak.c`` (issue 37): FMLA, SDOT, SMMLA, BFMMLA and
BFDOT chains behind the ACLE feature macros. On x86-64 they are cross-compiled per
aarch64 target (objdump: each probe's loop is its instruction, no loads or stores) and
run under qemu-user, their integer checksums checked against the arithmetic the
instructions define (computed here in Python); on any machine, the probes of every
runnable target name the instruction ``rlx bench`` reports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import peak
from rlx.backends.cpu.native.cpu import Target, TargetSpec, gcc_flags, target_spec
from rlx.backends.cpu.native.peak import PeakKind
from rlx.cli.peak import PeakPath, path_for

CROSS = shutil.which("aarch64-linux-gnu-gcc")
OBJDUMP = shutil.which("aarch64-linux-gnu-objdump")
QEMU = shutil.which("qemu-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")
needs_cross = pytest.mark.skipif(
    CROSS is None or OBJDUMP is None, reason="needs aarch64-linux-gnu-gcc and objdump"
)

#: target -> (qemu CPU with exactly its features, {probe: instruction or None})
A64 = {
    Target.NEON: ("cortex-a72", {"rlx_peak_run": "fmla", "rlx_peak_int8_run": None}),
    Target.DOTPROD: (
        "neoverse-n1",
        {"rlx_peak_run": "fmla", "rlx_peak_int8_run": "sdot", "rlx_peak_int8dot_run": "sdot"},
    ),
    Target.I8MM: (
        "max,pauth-impdef=on",
        {
            "rlx_peak_run": "fmla",
            "rlx_peak_int8_run": "smmla",
            "rlx_peak_int8dot_run": "sdot",
            "rlx_peak_bf16_run": "bfmmla",
            "rlx_peak_bf16dot_run": "bfdot",
        },
    ),
}

DRIVER = r"""
#include <stdio.h>
#include <stdint.h>
int rlx_peak_chains(void), rlx_peak_lanes(void), rlx_peak_fused(void);
int rlx_peak_int8_ops(void), rlx_peak_int8dot_ops(void), rlx_peak_bf16_ops(void),
    rlx_peak_bf16dot_ops(void);
double rlx_peak_int8_run(int64_t, int, int *), rlx_peak_int8dot_run(int64_t, int, int *),
    rlx_peak_bf16_run(int64_t, int, int *);
int main(void) {
    int used = 0;
    printf("chains %d lanes %d fused %d\n", rlx_peak_chains(), rlx_peak_lanes(), rlx_peak_fused());
    printf("ops %d %d %d %d\n", rlx_peak_int8_ops(), rlx_peak_int8dot_ops(), rlx_peak_bf16_ops(),
           rlx_peak_bf16dot_ops());
    printf("int8 %.0f\n", rlx_peak_int8_run(1000, 1, &used));
    printf("int8dot %.0f\n", rlx_peak_int8dot_run(1000, 1, &used));
    printf("bf16 %.6f\n", rlx_peak_bf16_run(1000, 1, &used));
    return 0;
}
"""


def _spec(target: Target) -> TargetSpec:
    """``target``'s flags on an aarch64 CPU that has every feature (for cross builds)."""
    return target_spec(target, frozenset({"asimd", "asimddp", "i8mm", "bf16"}), "aarch64")


def _loop_body(asm: str, fn: str) -> list[str]:
    """The mnemonics of the innermost backward-branching loop of probe ``fn``'s body (the
    static ``<kind>_body`` that ``team_run`` calls on each thread: ``rlx_peak_run`` ->
    ``fma_body``, ``rlx_peak_int8_run`` -> ``int8_body``)."""
    kind = fn.removeprefix("rlx_peak_").removesuffix("run").rstrip("_") or "fma"
    block = re.search(rf"<{kind}_body>:\n(.*?)\n\n", asm, re.S)
    assert block, fn
    lines = [ln.split("\t") for ln in block.group(1).splitlines() if "\t" in ln]
    insns = [(int(p[0].strip().rstrip(":"), 16), p[1].strip(), p[-1]) for p in lines if len(p) > 1]
    for addr, op, arg in insns:
        if op.startswith("b.") and "<" in arg:
            dest = int(arg.split()[0], 16)
            if dest < addr:
                return [o for a, o, _ in insns if dest <= a <= addr]
    return []


@needs_cross
@pytest.mark.parametrize("target", list(A64), ids=lambda t: t.value)
def test_cross_built_probe_loops(tmp_path: Path, target: Target) -> None:
    so = tmp_path / "fma_peak.so"
    flags = gcc_flags(_spec(target), None, True)
    src = native.CSRC / "fma_peak.c"
    subprocess.run([CROSS, *flags, str(src), "-o", str(so)], check=True)
    asm = subprocess.run(
        [OBJDUMP, "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True, check=True
    ).stdout
    for fn, insn in A64[target][1].items():
        body = _loop_body(asm, fn)
        if insn is None:
            assert not any(o in ("sdot", "smmla") for o in body), (fn, body)
            continue
        assert body.count(insn) == 24, (fn, body)  # 24 chains, nothing spilled
        assert not any(o.startswith(("ldr", "str", "ld1", "st1")) for o in body), (fn, body)


@needs_cross
@pytest.mark.skipif(QEMU is None or not SYSROOT.is_dir(), reason="needs qemu-aarch64")
@pytest.mark.parametrize("target", list(A64), ids=lambda t: t.value)
def test_probes_run_under_qemu(tmp_path: Path, target: Target) -> None:
    exe = tmp_path / "probe"
    (tmp_path / "drv.c").write_text(DRIVER)
    flags = [f for f in gcc_flags(_spec(target), None, True) if f not in ("-shared", "-fPIC")]
    subprocess.run(
        [CROSS, *flags, str(tmp_path / "drv.c"), str(native.CSRC / "fma_peak.c"), "-o", str(exe)],
        check=True,
    )
    cpu = A64[target][0]
    out = subprocess.run(
        [QEMU, "-L", str(SYSROOT), "-cpu", cpu, str(exe)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    got = dict(line.split(" ", 1) for line in out.splitlines())
    assert got["chains"] == "24 lanes 4 fused 1"
    ops = [int(v) for v in got["ops"].split()]
    assert (
        ops
        == {
            Target.NEON: [0, 0, 0, 0],
            Target.DOTPROD: [16, 16, 0, 0],
            Target.I8MM: [32, 16, 16, 8],
        }[target]
    )
    # chain j starts at j in each of 4 int32 lanes; a step adds, per lane, the products of
    # 3 and -2 over the instruction's depth: SDOT 4, SMMLA 8 (a 2x8 by 8x2 tile)
    start = 4 * sum(range(24))
    depth = {32: 8, 16: 4, 0: 0}
    for name, macs in (("int8", ops[0]), ("int8dot", ops[1])):
        want = start + 24 * 4 * 1000 * depth[macs] * (3 * -2) if macs else 0
        assert float(got[name]) == want, (name, got[name], want)


@pytest.mark.parametrize("target", native.runnable_targets(), ids=lambda t: t.value)
def test_probe_names_and_bench_paths(target: Target) -> None:
    """Each runnable target's probes name their instruction; ``rlx bench``'s paths map
    onto them (x86 names unchanged)."""
    spec = target_spec(target)
    p8 = peak.measure_lowp_peak(PeakKind.INT8, 1, target, seconds=0.004, tries=1)
    bf = peak.measure_lowp_peak(PeakKind.BF16, 1, target, seconds=0.004, tries=1)
    dot = peak.measure_lowp_peak(PeakKind.INT8_DOT, 1, target, seconds=0.004, tries=1)
    f32 = peak.measure_peak(1, target, seconds=0.004, tries=1)
    want = {
        Target.NEON: ("none", "none", "none", PeakPath.FMA, None),
        Target.DOTPROD: ("SDOT .4s", "none", "SDOT .4s", PeakPath.FMA, PeakPath.SDOT),
        Target.I8MM: ("SMMLA", "BFMMLA", "SDOT .4s", PeakPath.BFMMLA, PeakPath.SMMLA),
        Target.PORTABLE: ("none", "none", "none", PeakPath.FMA, None),
    }
    if target in want:
        i8, b16, d8, bf_path, i8_path = want[target]
        assert (p8.instruction, bf.instruction, dot.instruction) == (i8, b16, d8)
        assert path_for("bf16", spec) is bf_path and path_for("int8", spec) is i8_path
    else:  # AVX2 / AVX-512: unchanged
        assert not dot.available and p8.instruction.startswith("vp")
    assert path_for("f32", spec) is PeakPath.FMA and f32.gflops > 0
    if target in A64:
        assert f32.vector == "NEON FMLA .4s" and f32.chains == 24
