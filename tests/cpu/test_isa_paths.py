"""Native build targets follow RLX_ISA (issue 19 fault 7): the selected target and its gcc
flags, separate cache keys per target, the instructions in the built code (checked with
objdump, an independent oracle), and the suite's fast tier under RLX_ISA=avx2 and
RLX_ISA=portable (slow: one run each, in a subprocess)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.cpu import Isa, Target
from rlx.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
INNER = "RLX_ISA_PATHS_INNER"
AVX2_ONLY = cpu._V3
AVX512_FULL = cpu._V4 | {"avx512_vnni", "avx512_bf16"}
X86 = cpu.targets_of(cpu.Arch.X86_64)
x86_only = pytest.mark.skipif(not cpu._x86_64(), reason="targets above portable are x86-64")
needs_gcc = pytest.mark.skipif(not native.available(), reason="gcc is not installed")


@x86_only
@pytest.mark.parametrize(
    ("isa", "flags", "want"),
    [
        ("auto", AVX512_FULL, Target.AVX512),
        ("auto", AVX2_ONLY, Target.AVX2),
        ("auto", frozenset({"sse2"}), Target.PORTABLE),
        ("avx2", AVX512_FULL, Target.AVX2),
        ("portable", AVX512_FULL, Target.PORTABLE),
        ("avx512", AVX512_FULL, Target.AVX512),
    ],
)
def test_selected_target_follows_rlx_isa(monkeypatch, isa, flags, want) -> None:
    monkeypatch.setenv("RLX_ISA", isa)
    assert native.selected_target(flags) is want
    assert f"RLX_ISA={isa}" in native.target_description(flags)


@x86_only
def test_forcing_a_target_the_cpu_lacks_names_it(monkeypatch) -> None:
    monkeypatch.setenv("RLX_ISA", "avx512")
    with pytest.raises(ConfigError, match=r"RLX_ISA=avx512.*AVX512.*avx512f"):
        native.selected_target(AVX2_ONLY)
    monkeypatch.setenv("RLX_ISA", "avx2")
    with pytest.raises(ConfigError, match=r"missing.*avx2"):
        native.selected_target(frozenset({"sse2"}))


@x86_only
def test_target_flags_never_native_and_carry_the_features() -> None:
    spec = {t: cpu.target_spec(t, AVX512_FULL).flags for t in X86}
    assert spec[Target.PORTABLE][0] == "-march=x86-64"
    assert spec[Target.AVX2][0] == "-march=x86-64-v3"
    assert spec[Target.AVX512][0] == "-march=x86-64-v4"
    assert {"-mavx512vnni", "-mavx512bf16"} <= set(spec[Target.AVX512])
    no_bf16 = cpu.target_spec(Target.AVX512, AVX512_FULL - {"avx512_bf16"}).flags
    assert "-mavx512bf16" not in no_bf16 and "-mavx512vnni" in no_bf16
    for t in X86:
        cmd = native.compile_command(Path("a.c"), Path("a.so"), Isa.PLAIN, t)
        assert "-march=native" not in cmd
        assert all(f in cmd for f in native.target_spec(t).flags)


@x86_only
def test_int8_gemm_paths_follow_the_target() -> None:
    assert cpu.isas_for(Target.PORTABLE, AVX512_FULL) == [Isa.PLAIN]
    assert cpu.isas_for(Target.AVX2, AVX512_FULL) == [Isa.PLAIN, Isa.AVX2]
    assert cpu.isas_for(Target.AVX512, AVX512_FULL)[-1] is Isa.VNNI512
    assert cpu.isas_for(Target.AVX512, AVX512_FULL - {"avx512_vnni"})[-1] is Isa.AVX2


@needs_gcc
def test_each_target_has_its_own_cache_entry(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    src = "int rlx_t(void) { return 1; }\n"
    paths = {t: native.build(src, t, "per_target") for t in native.runnable_targets()}
    assert len(set(paths.values())) == len(paths)
    if Target.AVX2 in paths:  # the same source and name, forced to another target
        monkeypatch.setenv("RLX_ISA", "avx2")
        assert native.build(src, Isa.PLAIN, "per_target2") != native.build(
            src, Isa.PLAIN, "per_target2", target=Target.PORTABLE
        )


@needs_gcc
def test_a_target_cannot_hold_a_wider_int8_path(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("RLX_ISA", "portable")
    with pytest.raises(Exception, match="not available on the PORTABLE target"):
        native.qgemm_lib(Isa.AVX2)
    assert native.qgemm_lib().isa is Isa.PLAIN


# In a fresh process under RLX_ISA: the libraries each native path loads, and what
# they report about themselves.
PROBE = textwrap.dedent(
    """
    import json
    import numpy as np
    import rlx
    from rlx.backends.cpu import native
    from rlx.backends.cpu.engines import lowp_lib as kl
    from rlx.options import CompileOptions
    g = rlx.Graph("p")
    x = g.input("x", (8, 64))
    y = g.softmax(g.mul(g.tanh(x), g.constant(np.float32(1.5))), -1)
    g.set_outputs([g.cast(g.cast(y, rlx.DType.BF16), rlx.DType.F32)])
    cg = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False))
    xv = np.linspace(-2, 2, 512, dtype=np.float32).reshape(8, 64)
    cg.run({"x": xv})
    lib = kl.lowp_lib()
    print(json.dumps({
        "target": native.selected_target().value,
        "lowp_level": int(lib.max_level), "dpbf16": lib.has_dpbf16,
        "qgemm": native.qgemm_lib().isa.name,
        "kinds": sorted({e.kind.value for e in cg.report().kernels}),
    }))
    """
)


def _disassembly_registers(d: Path) -> set[str]:
    regs: set[str] = set()
    for lib in (d / "native").glob("*.so"):
        out = subprocess.run(["objdump", "-d", str(lib)], capture_output=True, text=True)
        regs |= set(re.findall(r"%([xyz]mm)\d+", out.stdout))
    return regs


@pytest.mark.slow
@needs_gcc
@x86_only
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump is not installed")
@pytest.mark.parametrize("target", ["avx2", "portable"])
def test_forced_target_builds_only_its_instructions(tmp_path, target) -> None:
    if Target(target) not in native.runnable_targets():
        pytest.skip(f"this CPU cannot run the {target} target")
    env = {**os.environ, "RLX_ISA": target, "RLX_CACHE_DIR": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["target"] == target and "native" in got["kinds"]
    assert not got["dpbf16"]
    regs = _disassembly_registers(tmp_path)
    assert "zmm" not in regs  # no AVX-512 anywhere
    if target == "avx2":
        assert (got["lowp_level"], got["qgemm"]) == (1, "AVX2")
        assert "ymm" in regs
    else:
        assert (got["lowp_level"], got["qgemm"]) == (0, "PLAIN")
        assert "ymm" not in regs  # baseline x86-64: SSE only


# test paths the forced-target runs leave out (see test_full_suite_passes_on_forced_target)
ISA_INDEPENDENT = (
    "tests/serve",
    "tests/distributed",
    "tests/benchmarks",
    "tests/test_layout.py",
    "tests/test_docs.py",
)


@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get(INNER)), reason="inside the RLX_ISA suite run")
@pytest.mark.parametrize("target", ["avx2", "portable"])
def test_full_suite_passes_on_forced_target(target) -> None:
    """The suite's fast tier (everything not marked ``slow``, minus this file) with every
    native path forced to ``target`` (on one pytest-xdist worker when this run has several,
    so the two targets run side by side; on every core otherwise). The end-to-end
    ``slow`` tests run once, on the CPU's own target, and so do the tests in
    ``ISA_INDEPENDENT`` (the HTTP server, the Ray / gloo orchestration, the benchmark
    helpers and the static checks: the kernels they reach are the ones this run covers)."""
    if Target(target) not in native.runnable_targets():
        pytest.skip(f"this CPU cannot run the {target} target (flags lack its features)")
    env = {**os.environ, "RLX_ISA": target, INNER: "1"}
    for var in [v for v in env if v.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))]:
        del env[var]
    workers = "1" if "PYTEST_XDIST_WORKER" in os.environ else "auto"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
    cmd += ["-n", workers, "tests", "--ignore", str(Path(__file__).relative_to(ROOT))]
    for same in ISA_INDEPENDENT:
        cmd += ["--ignore", same]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    tail = "\n".join(r.stdout.strip().splitlines()[-30:])
    print(f"RLX_ISA={target}: {r.stdout.strip().splitlines()[-1] if r.stdout else ''}")
    assert r.returncode == 0, f"suite under RLX_ISA={target} failed:\n{tail}\n{r.stderr[-2000:]}"
