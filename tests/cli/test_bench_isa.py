"""``rlx bench --isa / --amx`` and the AMX switch: the (target, AMX) configurations asked
for on CPUs described by their /proc/cpuinfo flags, the JSON schema of a run (notes,
peaks, rows; each row's peak is the one of its path on its target, measured in the same
process), one target run in a child process under its RLX_ISA, a target this CPU lacks
as a one-line error naming the missing feature, and RLX_AMX=0 passed through to the
kernels (the int8 and bf16 GEMMs built without AMX, still exact against NumPy). No
timings are asserted."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from rlx import config
from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.cpu import Target
from rlx.cli import bench
from rlx.errors import ConfigError
from tests.cli.conftest import here, run

# /proc/cpuinfo flags of three kinds of CPU (x86-64-v3 / v4 sets as gcc defines them)
V3 = frozenset(
    "cx16 lahf_lm popcnt pni sse4_1 sse4_2 ssse3 avx avx2 bmi1 bmi2 f16c fma abm movbe "
    "xsave".split()
)
ZEN4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
ZEN4 |= {"avx512_vnni", "avx512_bf16"}
SPR = ZEN4 | {"amx_tile", "amx_int8", "amx_bf16"}

RUN_KEYS = {
    "kind", "isa", "amx", "precision", "threads", "shape", "batch", "gflop", "median_ms",
    "min_ms", "per_second", "gflops", "peak", "peak_gops", "peak_pct",
}  # fmt: skip
PEAK_KEYS = {"kind", "isa", "amx", "threads", "path", "gops", "measured", "how"}


def pairs(cs: list[bench.Config]) -> list[tuple[str, bool]]:
    return [(c.target.value, c.amx) for c in cs]


def test_configs_per_cpu() -> None:
    assert pairs(bench.configs("all", "both", V3)) == [("avx2", False), ("portable", False)]
    assert pairs(bench.configs("all", "both", ZEN4)) == [
        ("avx512", False),
        ("avx2", False),
        ("portable", False),
    ]
    # AMX rows only where the CPU has it, and only the AVX512 target takes tiles
    assert pairs(bench.configs("all", "both", SPR)) == [
        ("avx512", True),
        ("avx512", False),
        ("avx2", False),
        ("portable", False),
    ]
    assert pairs(bench.configs("avx512", "on", SPR)) == [("avx512", True)]
    assert pairs(bench.configs("avx512", "off", SPR)) == [("avx512", False)]
    assert pairs(bench.configs("avx512", "on", ZEN4)) == [("avx512", False)]
    assert pairs(bench.configs("avx2", "both", SPR)) == [("avx2", False)]
    # each child runs under the environment of its configuration
    on, off = bench.configs("avx512", "both", SPR)
    assert on.env == {"RLX_ISA": "avx512", "RLX_AMX": "1"}
    assert off.env == {"RLX_ISA": "avx512", "RLX_AMX": "0"}


def test_an_isa_the_cpu_lacks_names_the_feature(monkeypatch) -> None:
    with pytest.raises(ConfigError, match=r"--isa avx512: .*missing avx512bw, avx512cd"):
        bench.configs("avx512", "both", V3)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: V3)
    r = run(["bench", "no-such-model", "--isa", "avx512"])
    assert r.code == 1
    last = r.err.strip().splitlines()[-1]
    assert last.startswith("rlx: error: --isa avx512") and "avx512f" in last, last
    assert "usable: portable, avx2" in last and "Traceback" not in r.err


def test_amx_switch(monkeypatch) -> None:
    monkeypatch.delenv("RLX_AMX", raising=False)
    assert config.amx() and cpu.amx_prelude() == ""
    monkeypatch.setattr(cpu, "cpu_flags", lambda: SPR)
    assert cpu.has_amx() and cpu.amx_enabled()
    monkeypatch.setenv("RLX_AMX", "0")
    assert not config.amx() and not cpu.amx_enabled()
    assert cpu.amx_prelude().startswith("#define RLX_NO_AMX 1")
    assert not bench.current_config().amx
    monkeypatch.setenv("RLX_AMX", "sometimes")
    with pytest.raises(ConfigError, match="RLX_AMX='sometimes' is not a boolean"):
        config.amx()
    monkeypatch.setattr(cpu, "cpu_flags", lambda: ZEN4)
    monkeypatch.setenv("RLX_AMX", "1")
    assert not cpu.amx_enabled()  # nothing to switch on


@pytest.mark.skipif(not native.available(), reason="gcc is not installed")
def test_kernels_built_without_amx_stay_exact(monkeypatch, tmp_path_factory) -> None:
    """RLX_AMX=0: the int8 GEMM and the bf16 GEMM come from a source with the AMX paths
    compiled out (has_amx False whatever the CPU), and their results still equal NumPy."""
    from rlx.backends.cpu.engines.lowp_lib import lowp_lib

    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rlx-native"))
    monkeypatch.setenv("RLX_AMX", "0")
    rng = np.random.default_rng(0)
    m, k, n = 33, 128, 40  # K a multiple of 64: the shape AMX would take
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    q = native.qgemm_lib()
    assert not q.has_amx
    out = np.empty((m, n), np.int32)
    q.gemm(a, q.pack(w), n, a_zero_point=3, out_i32=out)
    np.testing.assert_array_equal(out, (a.astype(np.int64) - 3) @ w.astype(np.int64))
    lib = lowp_lib()
    assert not lib.has_amx
    if lib.has_dpbf16 and "avx512_bf16" in cpu.cpu_flags():
        bf = ml_dtypes.bfloat16
        x = rng.standard_normal((m, k)).astype(bf)
        b = rng.standard_normal((k, n)).astype(bf)
        packed = np.empty(lib.packed_size(k, n), np.uint16)
        lib.pack_b(b, packed)
        y = np.empty((m, n), np.float32)
        lib.gemm(x, packed, y)
        ref = x.astype(np.float64) @ b.astype(np.float64)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)


def _expected_peak(precision: str, target: Target) -> str | None:
    """The path each precision multiplies on, from the target's CPU features."""
    spec = cpu.target_spec(target)
    if precision == "f32" or (precision == "bf16" and not spec.bf16):
        return "f32 FMA"
    if precision == "bf16":
        return "bf16 vdpbf16ps"
    if spec.vnni:
        return "int8 vpdpbusd"
    # the AVX2 int8 GEMM: rlx.quantize's default there is 7-bit weights (vpmaddubsw)
    return None if target is Target.PORTABLE else "int8 vpmaddubsw"


def test_bench_json_rows_and_peaks(tiny_bert) -> None:
    args = ["bench", str(tiny_bert), "--shapes", "1x8,2x16", "--precision", "f32,bf16,int8"]
    r = run([*args, *here(), "--repeat", "2", "--warmup", "0", "--json"])
    assert r.code == 0, r.err
    items = [json.loads(line) for line in r.out.splitlines()]
    notes = [x for x in items if x["kind"] == "note"]
    peaks = [x for x in items if x["kind"] == "peak"]
    rows = [x for x in items if x["kind"] == "run"]
    assert len(notes) + len(peaks) + len(rows) == len(items)
    assert notes == ([] if cpu.has_amx() else [{"kind": "note", "text": "no AMX on this CPU"}])
    target = bench.current_config().target
    assert [(x["precision"], x["shape"]) for x in rows] == [
        (p, s) for p in ("f32", "bf16", "int8") for s in ("1x8", "2x16")
    ]
    by_path = {p["path"]: p for p in peaks}
    assert len(by_path) == len(peaks)  # one thread count: one peak per path
    for x in rows:
        assert set(x) == RUN_KEYS
        assert x["isa"] == target.value and x["amx"] == bench.current_config().amx
        assert x["threads"] == 1 and 0 < x["min_ms"] <= x["median_ms"]
        assert x["gflops"] == pytest.approx(x["gflop"] / (x["median_ms"] / 1e3))
        assert x["peak"] == _expected_peak(x["precision"], target)
        if x["peak"] is None:
            assert x["peak_pct"] is None
            continue
        p = by_path[x["peak"]]
        assert x["peak_gops"] == p["gops"] > 0 and p["measured"]
        assert x["peak_pct"] == pytest.approx(100 * x["gflops"] / p["gops"])
    for p in peaks:
        assert set(p) == PEAK_KEYS and p["isa"] == target.value and p["threads"] == 1
    r = run([*args[:4], *here(), "--repeat", "1", "--warmup", "0"])  # the table
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert any(ln.startswith(f"{target.value} ") and "f32 FMA" in ln for ln in lines)
    assert "% peak" in r.out and "peaks (measured in the same process" in r.out


VECTOR = {Target.PORTABLE: "4-lane mul+add", Target.AVX2: "AVX2 FMA", Target.AVX512: "AVX-512 FMA"}


@pytest.mark.skipif(not native.available(), reason="gcc is not installed")
def test_another_target_runs_in_its_own_process(tiny_bert) -> None:
    """--isa T for a target T this process does not run: a child under RLX_ISA=T (the
    portable one, or the best when this process runs portable)."""
    here_t = bench.current_config().target
    others = [t for t in native.runnable_targets() if t is not here_t]
    if not others:
        pytest.skip(f"this CPU runs only the {here_t.value} target")
    other = others[0]
    args = ["bench", str(tiny_bert), "--shapes", "1x8", "--isa", other.value, "--amx", "off"]
    r = run([*args, "--repeat", "1", "--warmup", "0", "--json"])
    assert r.code == 0, r.err
    items = [json.loads(line) for line in r.out.splitlines()]
    rows = [x for x in items if x["kind"] == "run"]
    peaks = [x for x in items if x["kind"] == "peak"]
    assert [(x["isa"], x["precision"], x["peak"]) for x in rows] == [
        (other.value, "f32", "f32 FMA")
    ]
    # the child's probe ran that target's vectors, not this process's
    assert [p["isa"] for p in peaks] == [other.value] and VECTOR[other] in peaks[0]["how"]
    assert f"{other.value}, AMX off: own process" in r.err


def test_a_peak_that_cannot_be_measured_is_null(tiny_bert, monkeypatch) -> None:
    """No probe result (no gcc, a failed build): the peak's gops and the rows' peak_pct
    are JSON null (strict JSON: no NaN) and the table prints '-'."""
    import rlx.cli.peak as peak_mod

    def unknown(path, threads, *a):  # noqa: ANN001, ANN202
        return peak_mod.Peak(float("nan"), threads, False, "unknown (test)")

    monkeypatch.setattr(peak_mod, "path_peak", unknown)
    args = ["bench", str(tiny_bert), "--shapes", "1x8", *here(), "--repeat", "1", "--warmup", "0"]
    r = run([*args, "--json"])
    assert r.code == 0, r.err

    def no_nan(c: str) -> None:
        raise AssertionError(f"{c} in the JSON")

    items = [json.loads(line, parse_constant=no_nan) for line in r.out.splitlines()]
    (pk,) = [x for x in items if x["kind"] == "peak"]
    (row,) = [x for x in items if x["kind"] == "run"]
    assert pk["gops"] is None and pk["how"] == "unknown (test)" and not pk["measured"]
    assert row["peak"] == "f32 FMA" and row["peak_gops"] is None and row["peak_pct"] is None
    r = run(args)
    assert r.code == 0, r.err
    assert any(ln.split()[-1] == "-%" for ln in r.out.splitlines() if " f32 " in ln)
