"""The native int8 GEMM: exact int32 results vs NumPy int64 matmul on every ISA path
this CPU has, and the build cache (content key, atomic write, errors)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx import config
from rlx.backends.cpu import native
from rlx.backends.cpu.native import Isa
from rlx.errors import CompileError, InputError

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

ISAS = native.supported_isas()


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-native"))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 70),
    n=st.integers(1, 70),
    zp=st.integers(-128, 127),
    seed=st.integers(0, 2**16),
)
def test_exact_int32_vs_numpy(isa, m, k, n, zp, seed):
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = lib.pack(w)
    c = np.empty((m, n), np.int32)
    lib.gemm(a, packed, n, a_zero_point=zp, out_i32=c, num_threads=2)
    want = (a.astype(np.int64) - zp) @ w.astype(np.int64)
    np.testing.assert_array_equal(c, want)
    np.testing.assert_array_equal(packed[1], w.astype(np.int64).sum(axis=0))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
def test_extreme_values_and_f32_epilogue(isa):
    lib = native.qgemm_lib(isa)
    m, k, n = 13, 300, 45  # ragged in every dim
    a = np.full((m, k), -128, np.int8)
    w = np.full((k, n), -128, np.int8)
    w[:, 1] = 127
    scale = np.linspace(0.5, 2.0, n).astype(np.float32)
    bias = np.arange(n, dtype=np.float32)
    c = np.empty((m, n), np.int32)
    y = np.empty((m, n), np.float32)
    lib.gemm(
        a,
        lib.pack(w),
        n,
        a_zero_point=127,
        out_i32=c,
        out_f32=y,
        scale=scale,
        bias=bias,
        num_threads=1,
    )
    acc = (a.astype(np.int64) - 127) @ w.astype(np.int64)
    np.testing.assert_array_equal(c, acc)
    np.testing.assert_array_equal(y, acc.astype(np.float32) * scale + bias)


def test_detect_isa_from_flags():
    assert native.detect_isa(frozenset({"avx512f", "avx512bw", "avx512_vnni"})) is Isa.VNNI512
    assert native.detect_isa(frozenset({"avx2", "fma"})) is Isa.AVX2
    assert native.detect_isa(frozenset({"sse4_2"})) is Isa.PLAIN
    assert native.supported_isas(frozenset({"avx2"})) == [Isa.PLAIN, Isa.AVX2]
    # aarch64 HWCAP names: SMULL + SADALP everywhere, SDOT with asimddp, SMMLA with i8mm
    assert native.detect_isa(frozenset({"asimd"})) is Isa.NEON
    assert native.detect_isa(frozenset({"asimd", "asimddp", "i8mm", "bf16"})) is Isa.SMMLA
    assert native.supported_isas(frozenset({"asimd", "asimddp"})) == [Isa.PLAIN, Isa.NEON, Isa.SDOT]


def test_build_is_cached_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    src = "int rlx_answer(void) { return 42; }\n"
    p1 = native.build(src, Isa.PLAIN, "answer")
    mtime = p1.stat().st_mtime_ns
    assert native.build(src, Isa.PLAIN, "answer") == p1 and p1.stat().st_mtime_ns == mtime
    p2 = native.build(src + "\n", Isa.PLAIN, "answer")
    assert p2 != p1
    assert native.load(p1).rlx_answer() == 42
    assert not [f for f in (tmp_path / "native").iterdir() if f.is_dir()]  # no temp left


def test_failed_build_shows_command_and_gcc_message(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    with pytest.raises(CompileError) as ei:
        native.build("int broken( { return 1; }\n", Isa.PLAIN, "broken")
    msg = str(ei.value)
    assert "-O3 -march=" in msg and "-march=native" not in msg and "error" in msg


def test_missing_gcc_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(native, "gcc_path", lambda: None)
    with pytest.raises(CompileError, match="need gcc"):
        native.gcc_version()
    assert not native.available()
    assert not native.openmp_supported()


@pytest.mark.skipif(not native.available(), reason="needs gcc")
def test_gcc_facts_are_probed_once_and_kept_in_the_cache(tmp_path, monkeypatch):
    """The gcc version and OpenMP probe (two gcc runs) are stored in the native cache, so
    a later process reads them instead of running gcc; a damaged file is probed again."""
    import subprocess

    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    native._gcc_facts.cache_clear()
    try:
        # the compiler RLX_CC names (the emulated aarch64 run cross-compiles)
        real = subprocess.run([config.cc(), "--version"], capture_output=True, text=True)
        first = native.gcc_version()
        assert first == real.stdout.splitlines()[0]
        (probe,) = (tmp_path / "native").glob("gcc-probe-*.json")
        native._gcc_facts.cache_clear()  # as a new process

        def no_gcc(*a, **k):
            raise AssertionError("gcc was run although its facts are cached")

        monkeypatch.setattr(native.subprocess, "run", no_gcc)
        assert native.gcc_version() == first
        native._gcc_facts.cache_clear()
        monkeypatch.undo()
        monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
        probe.write_text("{not json")
        assert native.gcc_version() == first  # probed again
        assert '"version"' in probe.read_text()
    finally:
        native._gcc_facts.cache_clear()


def test_gemm_checks_its_arguments():
    lib = native.qgemm_lib()
    w = np.ones((8, 4), np.int8)
    packed = lib.pack(w)
    with pytest.raises(InputError, match="C-contiguous int8"):
        lib.gemm(np.ones((3, 8), np.float32), packed, 4, out_i32=np.empty((3, 4), np.int32))
    with pytest.raises(InputError, match="out_i32 must be"):
        lib.gemm(np.ones((3, 8), np.int8), packed, 4, out_i32=np.empty((3, 5), np.int32))
    with pytest.raises(InputError, match="not a \\[8, 5\\] weight"):
        lib.gemm(np.ones((3, 8), np.int8), packed, 5, out_i32=np.empty((3, 5), np.int32))
    with pytest.raises(InputError, match="needs scale"):
        lib.gemm(np.ones((3, 8), np.int8), packed, 4, out_f32=np.empty((3, 4), np.float32))
    c = np.empty((3, 4), np.int32)
    lib.gemm(np.ones((3, 8), np.int8), packed, 4, out_i32=c)
    np.testing.assert_array_equal(c, np.full((3, 4), 8))


def test_empty_contraction():
    lib = native.qgemm_lib()
    c = np.full((2, 3), 7, np.int32)
    lib.gemm(np.zeros((2, 0), np.int8), lib.pack(np.zeros((0, 3), np.int8)), 3, out_i32=c)
    np.testing.assert_array_equal(c, 0)


@settings(max_examples=30, deadline=None)
@given(
    x=st.lists(
        st.floats(-300, 300, width=32) | st.sampled_from([0.5, -1.5, 2.5, np.nan, np.inf]),
        min_size=1,
        max_size=100,
    ),
    scale=st.floats(0.0078125, 4.0, width=32),
    zp=st.integers(-128, 255),
)
def test_native_quantize_matches_reference(x, scale, zp):
    from rlx.ops.quant import quantize_array

    lib = native.qgemm_lib()
    xa = np.asarray(x, np.float32)
    signed = zp <= 127
    out = np.empty(xa.shape, np.int8 if signed else np.uint8)
    lib.quantize(xa, scale, zp, out)
    lo, hi = (-128, 127) if signed else (0, 255)
    np.testing.assert_array_equal(out, quantize_array(xa, [scale], [zp], None, lo, hi))


def test_concurrent_builds_share_one_library(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    src = "int rlx_seven(void) { return 7; }\n"
    with ThreadPoolExecutor(4) as ex:
        paths = set(ex.map(lambda _: native.build(src, Isa.PLAIN, "seven"), range(4)))
    (path,) = paths
    assert native.load(path).rlx_seven() == 7
    names = {p.name for p in (tmp_path / "native").iterdir()}
    names = {n for n in names if not n.startswith("gcc-probe-")}  # the gcc facts
    assert names == {"seven.lock", path.name, path.name + ".sha256"}


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
def test_threaded_path_exact(isa):
    # above the 32M multiply-add threshold, so OpenMP really splits the tiles
    lib = native.qgemm_lib(isa)
    rng = np.random.default_rng(5)
    m, k, n = 257, 260, 515
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    c = np.empty((m, n), np.int32)
    lib.gemm(a, lib.pack(w), n, a_zero_point=-7, out_i32=c, num_threads=2)
    np.testing.assert_array_equal(c, (a.astype(np.int64) + 7) @ w.astype(np.int64))
