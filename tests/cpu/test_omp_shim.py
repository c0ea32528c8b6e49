"""rlx's own OpenMP runtime (``csrc/rlx_omp.c``, issue 37): with a clang that has no libomp
(clang-14 here: no omp.h), ``#pragma omp`` is compiled by clang's front end
(``-Xclang -fopenmp``) and run on rlx's pool. Every construct the kernels use (parallel
with num_threads / if / reduction, for with static / static-chunked / dynamic schedules
and collapse, single, barrier, atomic write, nested regions) is checked in a fresh
process against what the OpenMP spec and libgomp's static partition say (NumPy's
``array_split``; the reduction against the same sums in thread order in Python floats);
then the kernel libraries (sgemm, the int8 GEMM, attention, the GGUF dequant GEMM, conv,
layer norm) built by clang for the pool at 2 threads give the bits of clang's build
without threads, and (the integer and dequant GEMMs, conv) of the gcc + libgomp build."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rlx import config
from rlx.backends.cpu.native import omp_shim
from rlx.backends.cpu.native.omp_shim import ThreadRuntime


def _clang() -> str | None:
    """A clang that builds for this machine: RLX_CC when it names one (a cross ``clang
    --target=aarch64-linux-gnu`` wrapper under qemu-user), else clang-14 / clang on PATH
    (under qemu-user the host's clang builds x86-64 code: not one)."""
    cc = os.environ.get("RLX_CC", "")
    for c in ([cc] if "clang" in Path(cc).name else []) + ["clang-14", "clang"]:
        path = shutil.which(c)
        if path is None:
            continue
        r = subprocess.run([path, "-dumpmachine"], capture_output=True, text=True, check=False)
        if r.stdout.startswith(platform.machine().replace("arm64", "aarch64")):
            return path
    return None


CLANG = _clang()
GCC = shutil.which("gcc")
needs_clang = pytest.mark.skipif(CLANG is None, reason="needs clang")

# the constructs, each in a function the driver calls through ctypes
CONSTRUCTS = r"""
#include <omp.h>
#include <stdint.h>
int team(int n, int *size) {
#pragma omp parallel num_threads(n)
    size[omp_get_thread_num()] = omp_get_num_threads();
    return omp_get_max_threads();
}
void owners(int n, int nth, int *stat, int *chunk3, int *dyn, int *coll) {
#pragma omp parallel num_threads(nth)
    {
#pragma omp for schedule(static)
        for (int i = 0; i < n; i++) stat[i] = omp_get_thread_num();
#pragma omp for schedule(static, 3)
        for (int i = 0; i < n; i++) chunk3[i] = omp_get_thread_num();
#pragma omp for schedule(dynamic, 2)
        for (int i = 0; i < n; i++) dyn[i] += 1;
#pragma omp for collapse(2) schedule(static)
        for (int i = 0; i < 7; i++)
            for (int j = 0; j < n; j++) coll[i * n + j] += 1;
    }
}
/* 40 dynamic loops and 40 singles in one region, half of them nowait (more than the
   pool's ring of 16 in flight) */
void rings(int n, int nth, int *hits, int *singles) {
#pragma omp parallel num_threads(nth)
    for (int k = 0; k < 40; k++) {
        if (k % 2) {
#pragma omp for schedule(dynamic, 1) nowait
            for (int i = 0; i < n; i++) hits[k * n + i] += 1;
#pragma omp single nowait
            singles[k] += 1;
        } else {
#pragma omp for schedule(dynamic, 3)
            for (int i = 0; i < n; i++) hits[k * n + i] += 1;
#pragma omp single
            singles[k] += 1;
        }
    }
}
double dsum(const double *x, int n, int nth, int *bits) {
    double s = 0.0;
    int any = 0;
#pragma omp parallel for num_threads(nth) schedule(static) reduction(+ : s) reduction(| : any)
    for (int i = 0; i < n; i++) {
        s += x[i];
        any |= bits[i];
    }
    bits[0] = any;
    return s;
}
int single_barrier(int nth, int *seen, int *atomic_out) {
    int count = 0, w = 0;
#pragma omp parallel num_threads(nth)
    {
#pragma omp single
        count++;
#pragma omp barrier
        seen[omp_get_thread_num()] = count;
#pragma omp atomic write
        w = omp_get_thread_num() + 1;
    }
    *atomic_out = w;
    return count;
}
int if_clause(int nth, int cond) {
    int got = -1;
#pragma omp parallel num_threads(nth) if (cond)
    {
#pragma omp single
        got = omp_get_num_threads();
    }
    return got;
}
void nested(int nth, int *inner) {
#pragma omp parallel num_threads(nth)
    {
        int t = omp_get_thread_num();
#pragma omp parallel num_threads(3)
        inner[t] = omp_get_num_threads() * 10 + omp_get_thread_num();
    }
}
void set_threads(int n) { omp_set_num_threads(n); }
"""

DRIVER = textwrap.dedent(
    """
    import ctypes, json, sys
    import numpy as np
    from rlx.backends.cpu import native
    from rlx.backends.cpu.native.omp_shim import ThreadRuntime

    src = open(sys.argv[1]).read()
    assert native.thread_runtime() is ThreadRuntime.POOL, native.thread_runtime()
    lib = native.load(native.build(src, native.selected_target(), name="omp_constructs"))
    P = np.ctypeslib.ndpointer
    i32 = ctypes.c_int
    out = {}
    size = np.zeros(8, np.int32)
    lib.team.argtypes = [i32, P(np.int32)]
    out["max"] = lib.team(4, size)
    out["team"] = size.tolist()
    n = 23
    stat, ch3, dyn = (np.full(n, -1, np.int32) for _ in range(3))
    dyn[:] = 0
    coll = np.zeros(7 * n, np.int32)
    lib.owners.argtypes = [i32, i32] + [P(np.int32)] * 4
    lib.owners(n, 4, stat, ch3, dyn, coll)
    out.update(stat=stat.tolist(), chunk3=ch3.tolist(), dyn=dyn.tolist(), coll=coll.tolist())
    hits = np.zeros(40 * n, np.int32)
    singles = np.zeros(40, np.int32)
    lib.rings.argtypes = [i32, i32, P(np.int32), P(np.int32)]
    lib.rings(n, 3, hits, singles)
    out.update(hits=hits.tolist(), singles=singles.tolist())
    x = np.random.default_rng(0).standard_normal(1001)
    bits = np.zeros(1001, np.int32)
    bits[777] = 4
    lib.dsum.argtypes = [P(np.float64), i32, i32, P(np.int32)]
    lib.dsum.restype = ctypes.c_double
    out["dsum"] = [lib.dsum(x, 1001, 3, bits), int(bits[0])]
    seen = np.zeros(8, np.int32)
    w = np.zeros(1, np.int32)
    lib.single_barrier.argtypes = [i32, P(np.int32), P(np.int32)]
    out["single"] = [lib.single_barrier(4, seen, w), seen.tolist(), int(w[0])]
    out["if"] = [lib.if_clause(3, 1), lib.if_clause(3, 0)]
    inner = np.full(8, -1, np.int32)
    lib.nested.argtypes = [i32, P(np.int32)]
    lib.nested(2, inner)
    out["nested"] = inner.tolist()
    lib.set_threads(3)
    out["max_after_set"] = lib.team(0, size)  # num_threads(0) is not given: the ICV rules
    print(json.dumps(out))
    """
)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLX_", "OMP_"))}
    return {**env, "RLX_CACHE_DIR": str(cache), **extra}


def _run(script: str, env: dict[str, str], *args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip().splitlines()[-1]


def _static_owner(n: int, nth: int) -> list[int]:
    """libgomp's / libomp's schedule(static): contiguous blocks, the first n % nth one longer."""
    return [t for t, blk in enumerate(np.array_split(np.arange(n), nth)) for _ in blk]


@needs_clang
def test_every_construct_on_the_pool(tmp_path: Path) -> None:
    src = tmp_path / "constructs.c"
    src.write_text(CONSTRUCTS)
    env = _env(tmp_path, RLX_CC=str(CLANG), RLX_OPENMP="shim", OMP_NUM_THREADS="5")
    got = json.loads(_run(DRIVER, env, str(src)))
    assert got["max"] == 5  # OMP_NUM_THREADS is the nthreads ICV, as in libgomp
    assert got["team"] == [4, 4, 4, 4, 0, 0, 0, 0]
    n = 23
    assert got["stat"] == _static_owner(n, 4)
    assert got["chunk3"] == [(i // 3) % 4 for i in range(n)]
    assert got["dyn"] == [1] * n and got["coll"] == [1] * (7 * n)
    assert got["hits"] == [1] * (40 * n) and got["singles"] == [1] * 40
    x = np.random.default_rng(0).standard_normal(1001)
    want = 0.0
    for blk in np.array_split(x, 3):  # each thread's block in order, combined in thread order
        part = 0.0
        for v in blk:
            part += float(v)
        want += part
    assert got["dsum"] == [want, 4]
    count, seen, w = got["single"]
    assert count == 1 and seen == [1, 1, 1, 1, 0, 0, 0, 0] and 1 <= w <= 4
    assert got["if"] == [3, 1]
    assert got["nested"][:2] == [10, 10] and got["nested"][2:] == [-1] * 6  # inner: a team of 1
    assert got["max_after_set"] == 3


def test_flags_and_runtime_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags each runtime builds with, and RLX_OPENMP's choice among them."""
    from rlx.backends.cpu import native

    spec = native.target_spec(native.selected_target())
    pool = omp_shim.build_flags(spec, None, ThreadRuntime.POOL)
    assert "-fopenmp" not in omp_shim.build_flags(spec, None, ThreadRuntime.NONE)
    assert pool[pool.index("-Xclang") + 1] == "-fopenmp" and "-Iomp_shim" in pool
    for rt in ThreadRuntime:
        assert omp_shim.runtime_of_flags(omp_shim.build_flags(spec, None, rt)) is rt
    monkeypatch.setenv("RLX_OPENMP", "off")
    assert native.thread_runtime() is ThreadRuntime.NONE
    assert "none (RLX_OPENMP=off)" in native.thread_runtime_description()
    monkeypatch.setenv("RLX_OPENMP", "auto")
    if GCC is not None and native.openmp_supported():
        assert native.thread_runtime() is ThreadRuntime.OPENMP
    assert config.openmp() == "auto"


@pytest.mark.skipif(GCC is None, reason="needs gcc")
def test_forcing_the_pool_with_gcc_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx.backends.cpu import native
    from rlx.errors import CompileError

    monkeypatch.setenv("RLX_CC", str(GCC))
    monkeypatch.setenv("RLX_OPENMP", "shim")
    with pytest.raises(CompileError, match="RLX_OPENMP=shim: the compiler .*gcc"):
        native.thread_runtime()


KERNELS = textwrap.dedent(
    """
    import hashlib, json, sys
    import numpy as np
    import rlx
    from rlx.backends.cpu import native
    from rlx.backends.cpu.native.dqgemm import dqgemm_lib
    from rlx.backends.cpu.native.sgemm import sgemm_lib
    from rlx.formats import schemes as S
    from rlx.ir.mir import Graph
    from rlx.models import encoder, random_params
    from rlx.options import CompileOptions
    from rlx.runtime.session import Session
    from tests.cpu.kernels.test_quant_dequant import make_weight

    rng = np.random.default_rng(7)
    out, ref = {}, {}
    def keep(name, got, want):
        out[name] = hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()
        ref[name] = float(np.max(np.abs(got.astype(np.float64) - want)) / (np.max(np.abs(want)) + 1e-30))

    opts = CompileOptions(use_cache=False, verbose=False, num_threads=2)
    # sgemm, attention, layer norm and the regions: a small encoder
    g = encoder(layers=1, hidden=64, heads=4, ffn=128, seq=rlx.sym("seq"), batch=rlx.sym("batch"),
                fused_attention=True)
    ps = random_params(g, 3)
    cg = Session("cpu").compile(g, opts, params=ps)
    x = rng.standard_normal((2, 33, 64)).astype(np.float32)
    keep("encoder", cg.run({"x": x})[0], g.evaluate({"x": x}, ps)[0])
    # sgemm alone (packed, 2 threads)
    sg = sgemm_lib()
    a = rng.standard_normal((97, 300)).astype(np.float32)
    b = rng.standard_normal((300, 130)).astype(np.float32)
    c = np.zeros((97, 130), np.float32)
    sg.gemm(a, sg.pack_b(b), c, threads=2)
    keep("sgemm", c, a.astype(np.float64) @ b)
    # the int8 GEMM
    q = native.qgemm_lib()
    ai = rng.integers(-128, 128, (37, 160)).astype(np.int8)
    wi = rng.integers(-128, 128, (160, 70)).astype(np.int8)
    acc = np.zeros((37, 70), np.int32)
    q.gemm(ai, q.pack(wi), 70, out_i32=acc, num_threads=2)
    keep("qgemm", acc, ai.astype(np.float64) @ wi)
    # the GGUF dequant GEMM (Q4_K)
    ws, w = make_weight(S.GgufQ4K(), 48, 512, rng)
    xq = rng.standard_normal((5, 512)).astype(np.float32)
    yq = np.zeros((5, 48), np.float32)
    # the portable target: clang cannot build the AVX2 / AVX-512 one (a non-constant
    # _mm_insert_epi16 lane in dqgemm_q8_group.c, which gcc unrolls)
    dqgemm_lib(native.Target.PORTABLE).gemm(S.GgufQ4K(), xq, ws, yq, num_threads=2)
    keep("dqgemm", yq, xq.astype(np.float64) @ w.T)
    # conv (NCHW, threads 2)
    g = Graph("conv")
    xi = g.input("x", (2, 8, 19, 19))
    g.set_outputs([g.conv(xi, g.param("w", (16, 8, 3, 3)), padding=1)])
    pc = {"w": rng.standard_normal((16, 8, 3, 3)).astype(np.float32)}
    xc = rng.standard_normal((2, 8, 19, 19)).astype(np.float32)
    cc = Session("cpu").compile(g, opts, params=pc)
    keep("conv", cc.run({"x": xc})[0], g.evaluate({"x": xc}, pc)[0])
    print(json.dumps({"runtime": native.thread_runtime().value, "hash": out, "err": ref}))
    """
)


@pytest.mark.slow
@needs_clang
@pytest.mark.skipif(GCC is None, reason="needs gcc")
def test_kernel_libraries_on_the_pool(tmp_path: Path) -> None:
    """The same kernels at 2 threads, built by clang for rlx's pool, give the bits clang's
    build without threads gives (RLX_OPENMP=off: each kernel is deterministic at any
    thread count); the integer GEMM, the dequant GEMM and conv also give the gcc + libgomp
    build's bits (sgemm and the encoder differ there in the last bits by compiler:
    clang's build without threads differs from gcc's alike); all agree with NumPy's f64
    results within f32 rounding."""
    runs = {}
    for name, extra in {
        "gomp": {"RLX_CC": str(GCC)},
        "pool": {"RLX_CC": str(CLANG)},
        "off": {"RLX_CC": str(CLANG), "RLX_OPENMP": "off"},
    }.items():
        (tmp_path / name).mkdir()
        runs[name] = json.loads(_run(KERNELS, _env(tmp_path / name, **extra)))
    assert [runs[n]["runtime"] for n in ("gomp", "pool", "off")] == ["openmp", "rlx pool", "none"]
    assert runs["pool"]["hash"] == runs["off"]["hash"]
    for k in ("qgemm", "dqgemm", "conv"):
        assert runs["pool"]["hash"][k] == runs["gomp"]["hash"][k], k
    for run in runs.values():
        assert run["err"]["qgemm"] == 0.0
        assert max(run["err"].values()) < 1e-4, run["err"]
