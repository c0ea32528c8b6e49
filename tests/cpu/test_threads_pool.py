"""Threads (issue 13): the FMA-peak probe on every runnable target (its instructions
checked with objdump); the OpenMP wait policy as libgomp itself reports it
(``omp_display_env``) in fresh processes, the user's variables winning; BLAS threads as
threadpoolctl reports them (num_threads only for a schedule that calls BLAS); and the
regions / rows that now get a team at MiniLM sizes giving the one-thread bits (the
reference interpreter as the oracle)."""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.backends.cpu import native, threads
from rlx.backends.cpu.kernels import KernelKind
from rlx.backends.cpu.native import peak
from rlx.backends.cpu.native.cpu import Target
from rlx.errors import CompileError
from rlx.options import CompileOptions
from rlx.runtime.session import Session

needs_gcc = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

#: the multiply-add instruction each target's probe must use (objdump spelling)
_INSN = {
    Target.AVX512: ("vfmadd", "zmm"),
    Target.AVX2: ("vfmadd", "ymm"),
    Target.PORTABLE: ("mulps", "xmm"),
    Target.NEON: ("fmla", ".4s"),
    Target.DOTPROD: ("fmla", ".4s"),
    Target.I8MM: ("fmla", ".4s"),
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
        Target.NEON: (4, True),
        Target.DOTPROD: (4, True),
        Target.I8MM: (4, True),
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
    if target in (Target.AVX2, Target.PORTABLE):
        assert "zmm" not in asm


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_fma_peak_rejects_bad_thread_counts(bad: object) -> None:
    with pytest.raises(CompileError, match="threads must be an int >= 1"):
        peak.measure_peak(bad)  # type: ignore[arg-type]


# ---- the OpenMP wait policy (a fresh process each: libgomp reads it once) -----------------

_POLICY_SCRIPT = (
    "import ctypes, json\n"
    "from rlx.backends.cpu import native\n"
    "native.load(native.build('int f(void){return 1;}', native.Isa.PLAIN, 'policy_probe'))\n"
    "print(json.dumps(native.wait_policy()), flush=True)\n"
    "ctypes.CDLL('libgomp.so.1').omp_display_env(1)\n"
)


_POLICY_CASES: dict[str, tuple[dict[str, str], str]] = {
    "default": ({}, ""),
    "active": ({"OMP_WAIT_POLICY": "ACTIVE"}, ""),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, ""),
    "spin123": ({"GOMP_SPINCOUNT": "123"}, ""),
    "preloaded": ({}, "import ctypes; ctypes.CDLL('libgomp.so.1')\n"),
}


@pytest.fixture(scope="module")
def policy_runs() -> dict[str, tuple[dict, str]]:
    """Each case of _POLICY_CASES in its own fresh process, all started at once."""
    import json
    import os
    import sys

    procs = {}
    for name, (extra, first) in _POLICY_CASES.items():
        env = {
            k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
        }
        env.update(extra)
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", first + _POLICY_SCRIPT],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    out = {}
    for name, pr in procs.items():
        so, se = pr.communicate(timeout=120)
        assert pr.returncode == 0, se
        out[name] = (json.loads(so.splitlines()[0]), so + se)
    return out


needs_openmp = pytest.mark.skipif(
    not native.available() or not native.openmp_supported(), reason="no OpenMP gcc here"
)


@pytest.mark.slow  # fresh processes (libgomp reads its variables once)
@needs_openmp
def test_wait_policy_short_spin_by_default(policy_runs: dict) -> None:
    rec, text = policy_runs["default"]
    assert rec == {
        "libgomp_preloaded": False,
        "set_by_rlx": True,
        "OMP_WAIT_POLICY": None,
        "GOMP_SPINCOUNT": str(native.SPIN_COUNT),
    }
    assert f"GOMP_SPINCOUNT = '{native.SPIN_COUNT}'" in text  # what libgomp itself uses


@pytest.mark.slow  # fresh processes (libgomp reads its variables once)
@needs_openmp
@pytest.mark.parametrize(
    ("case", "shown"),
    [
        ("active", "OMP_WAIT_POLICY = 'ACTIVE'"),
        ("passive", "GOMP_SPINCOUNT = '0'"),
        ("spin123", "GOMP_SPINCOUNT = '123'"),
    ],
)
def test_wait_policy_the_users_setting_wins(policy_runs: dict, case: str, shown: str) -> None:
    rec, text = policy_runs[case]
    assert rec["set_by_rlx"] is False
    assert shown in text
    for k, v in _POLICY_CASES[case][0].items():
        assert rec[k] == v


@pytest.mark.slow  # fresh processes (libgomp reads its variables once)
@needs_openmp
def test_wait_policy_records_a_libgomp_loaded_before_rlx(policy_runs: dict) -> None:
    rec, text = policy_runs["preloaded"]
    assert rec["libgomp_preloaded"] is True
    assert "GOMP_SPINCOUNT = '300000'" in text  # libgomp's default: it read the env first


# ---- BLAS threads: num_threads only for schedules that call BLAS --------------------------


def _blas_threads() -> set[int]:
    from threadpoolctl import threadpool_info

    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


@dataclass
class _Entry:
    kind: KernelKind
    notes: tuple[str, ...] = ()


def test_calls_blas_from_kind_and_notes() -> None:
    assert not threads.calls_blas([_Entry(KernelKind.NATIVE, ("native: 3 ops in one C loop",))])
    assert threads.calls_blas([_Entry(KernelKind.BLAS)])
    assert threads.calls_blas(
        [_Entry(KernelKind.NATIVE, ("BLAS matmul, then the native bias/activation pass",))]
    )
    assert threads.calls_blas([_Entry(KernelKind.NATIVE, ("blas (not rlx sgemm (avx2): x)",))])
    assert not threads.calls_blas([_Entry(KernelKind.NATIVE, ("rlx sgemm 8x8x8",))])


@pytest.fixture
def _restore_blas() -> Iterator[None]:
    before = threads._current
    yield
    threads.ensure_blas_threads(before or threads.resolve_threads(None), force=True)


@pytest.mark.usefixtures("_restore_blas")
def test_blas_threads_follow_the_schedule() -> None:
    n = threads.resolve_threads(None)
    if not _blas_threads():
        pytest.skip("threadpoolctl finds no BLAS library")
    g = rlx.Graph("mm")
    x = g.input("x", (16, 32))
    w = g.param("w", (32, 8))
    g.set_outputs([g.matmul(x, w)])
    wv = np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)
    xv = np.random.default_rng(1).standard_normal((16, 32)).astype(np.float32)
    blas = Session("cpu").compile(
        g, params={"w": wv}, options=CompileOptions(num_threads=n, native=False)
    )
    blas.run({"x": xv})
    assert _blas_threads() == {n}
    e = rlx.Graph("ew")
    y = e.input("y", (64,))
    e.set_outputs([e.tanh(e.add(y, 1.0))])
    own = Session("cpu").compile(e, options=CompileOptions(num_threads=n))
    (got,) = own.run({"y": np.ones(64, np.float32)})
    np.testing.assert_allclose(got, np.tanh(np.full(64, 2.0, np.float32)), rtol=1e-6)
    assert _blas_threads() == {1}  # no BLAS kernel: OpenBLAS's workers stay asleep
    blas.run({"x": xv})
    assert _blas_threads() == {n}


# ---- 1 vs 2 threads: the parallel regions and rows give the one-thread bits ---------------


def _encoder_tail(ln: bool) -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    """gelu(x + b) + r (a region) or layer_norm(x + r) (a row kernel), MiniLM 8x128 sized."""
    rng = np.random.default_rng(5)
    g = rlx.Graph("tail")
    width = 384 if ln else 1536
    x, r = g.input("x", (8, 128, width)), g.input("r", (8, 128, width))
    b = g.input("b", (width,))
    if ln:
        out = g.layer_norm(g.add(x, r), b, g.input("beta", (width,)), 1e-12)
    else:
        out = g.add(g.gelu(g.add(x, b)), r)
    g.set_outputs([out])
    feed = {
        k: rng.standard_normal(d).astype(np.float32)
        for k, d in (("x", (8, 128, width)), ("r", (8, 128, width)), ("b", (width,)))
    }
    if ln:
        feed["beta"] = rng.standard_normal(width).astype(np.float32)
    return g, feed


@needs_gcc
@pytest.mark.parametrize("ln", [False, True], ids=["gelu_region", "residual_layer_norm"])
def test_two_threads_give_the_one_thread_bits(ln: bool) -> None:
    from rlx.backends.reference import evaluate

    g, feed = _encoder_tail(ln)
    outs, notes = {}, {}
    for n in (1, 2):
        cg = Session("cpu").compile(g, options=CompileOptions(num_threads=n))
        outs[n] = cg.run(feed)[0]
        notes[n] = " ".join(x for k in cg.report().kernels for x in k.notes)
    if threads.resolve_threads(2) == 2:
        assert "OpenMP x2" in notes[2]
    assert "OpenMP" not in notes[1]
    np.testing.assert_array_equal(outs[1], outs[2])
    np.testing.assert_allclose(outs[2], evaluate(g, feed)[0], rtol=2e-5, atol=2e-5)


@needs_gcc
@given(
    rows=st.integers(1, 40),
    width=st.sampled_from([1, 7, 384, 4097]),
    threads_=st.integers(2, 5),
)
@settings(max_examples=25, deadline=None)
def test_team_chunks_cover_every_row_once(rows: int, width: int, threads_: int) -> None:
    """The team loop's chunking (codegen.loop.team_loop), called directly at any size and
    team size: every element computed once, as on one thread and as NumPy computes it."""
    from rlx.backends.cpu.codegen import elementwise as codegen
    from rlx.backends.cpu.engines import region as kernels_region

    g = rlx.Graph("team")
    a, b = g.input("in0", (rows, width)), g.input("in1", (width,))
    g.set_outputs([g.add(g.mul(a, 3.0), b)])
    rng = np.random.default_rng(rows * 31 + width)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    bias = rng.standard_normal(width).astype(np.float32)
    outs = []
    for t in (1, threads_):
        out = np.full_like(x, np.nan)
        fn, arrays = codegen.render_region(g, [x, bias], out)
        kernels_region.bind(kernels_region.load_function(fn), arrays, t)()
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[1], x * np.float32(3.0) + bias)


def test_info_names_the_wait_policy() -> None:
    from rlx.info import info  # the module, not rlx.info: tests/test_info_cli.py imports it

    text = str(info())
    line = next(ln for ln in text.splitlines() if "openmp wait" in ln)
    assert "GOMP_SPINCOUNT" in line or "OMP_WAIT_POLICY" in line


@needs_gcc
@pytest.mark.usefixtures("_restore_blas")
def test_blas_pinned_to_one_thread_when_rlx_sgemm_runs_the_matmuls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not _blas_threads():
        pytest.skip("threadpoolctl finds no BLAS library")
    monkeypatch.setenv("RLX_SGEMM", "native")
    g = rlx.Graph("own_gemm")
    x = g.input("x", (64, 96))
    w, b = g.param("w", (96, 48)), g.param("b", (48,))
    g.set_outputs([g.gelu(g.add(g.matmul(x, w), b))])
    rng = np.random.default_rng(3)
    params = {"w": rng.standard_normal((96, 48)).astype(np.float32), "b": np.ones(48, np.float32)}
    xv = rng.standard_normal((64, 96)).astype(np.float32)
    n = threads.resolve_threads(None)
    threads.ensure_blas_threads(n, force=True)
    cg = Session("cpu").compile(g, params=params, options=CompileOptions(num_threads=n))
    (got,) = cg.run({"x": xv})
    notes = " ".join(x for k in cg.report().kernels for x in k.notes)
    assert "rlx sgemm" in notes and not threads.calls_blas(cg.report().kernels)
    assert _blas_threads() == {1}
    from rlx.backends.reference import evaluate

    np.testing.assert_allclose(got, evaluate(g, {"x": xv}, params)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("record", "long"),
    [
        ({}, False),
        ({"libgomp_preloaded": False, "set_by_rlx": True, "GOMP_SPINCOUNT": "10000"}, False),
        ({"libgomp_preloaded": True, "set_by_rlx": True, "GOMP_SPINCOUNT": "10000"}, True),
        ({"libgomp_preloaded": True, "set_by_rlx": False, "OMP_WAIT_POLICY": "PASSIVE"}, False),
        ({"set_by_rlx": False, "OMP_WAIT_POLICY": "active"}, True),
        ({"set_by_rlx": False, "GOMP_SPINCOUNT": "300k"}, True),
        ({"set_by_rlx": False, "GOMP_SPINCOUNT": "infinite"}, True),
        ({"set_by_rlx": False, "GOMP_SPINCOUNT": "2000"}, False),
    ],
)
def test_openmp_spins_long(record: dict, long: bool) -> None:
    assert threads.openmp_spins_long(record) is long


@pytest.mark.usefixtures("_restore_blas")
def test_blas_one_thread_beside_a_long_spinning_libgomp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "openmp_spins_long", lambda policy=None: True)
    ex = type("Ex", (), {"kernel_entries": [_Entry(KernelKind.BLAS)], "prologue_entries": []})()
    assert threads.blas_threads_for(2, ex) == 1
    monkeypatch.setattr(threads, "openmp_spins_long", lambda policy=None: False)
    assert threads.blas_threads_for(2, ex) == 2
