"""Threads (issue 13): the FMA-peak probe on every runnable target (its instructions
checked with objdump), and the thread-pool policy."""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import peak
from rlx.backends.cpu.native.cpu import Target
from rlx.errors import CompileError

needs_gcc = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

#: the multiply-add instruction each target's probe must use (objdump spelling)
_INSN = {
    Target.AVX512: ("vfmadd", "zmm"),
    Target.AVX2: ("vfmadd", "ymm"),
    Target.PORTABLE: ("mulps", "xmm"),
}


@needs_gcc
@pytest.mark.parametrize("target", native.runnable_targets())
@pytest.mark.parametrize("threads", [1, 2])
def test_fma_peak_probe_runs_on_every_target(target: Target, threads: int) -> None:
    m = peak.measure_peak(threads, target, seconds=0.005, tries=1)
    assert math.isfinite(m.gflops) and m.gflops > 0
    assert m.target is target and m.threads == threads and 1 <= m.ran <= threads
    assert (m.lanes, m.fused) == {
        Target.AVX512: (16, True),
        Target.AVX2: (8, True),
        Target.PORTABLE: (4, False),
    }[target]
    assert m.vector in m.describe()


@needs_gcc
def test_fma_peak_gflops_default_target() -> None:
    g = peak.fma_peak_gflops()
    assert math.isfinite(g) and g > 0
    assert peak.fma_peak_gflops(1) == g  # measured once per process


@needs_gcc
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump is not installed")
@pytest.mark.parametrize("target", native.runnable_targets())
def test_fma_peak_probe_instructions(target: Target) -> None:
    lib = native.build(peak.peak_source(), target, name="fma_peak")
    asm = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True
    ).stdout
    op, reg = _INSN[target]
    assert any(op in line and reg in line for line in asm.splitlines())
    if target is not Target.AVX512:
        assert "zmm" not in asm


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_fma_peak_rejects_bad_thread_counts(bad: object) -> None:
    with pytest.raises(CompileError, match="threads must be an int >= 1"):
        peak.measure_peak(bad)  # type: ignore[arg-type]
