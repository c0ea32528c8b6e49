"""rlx's packed sgemm (native/csrc/sgemm.c, native/sgemm.py, engines/sgemm.py).

Oracles: NumPy float64 matmul (tolerance ``2 K eps32 (|a| @ |b|)``, the bound of an f32
dot product of K terms in any order), NumPy/SciPy formulas for the epilogues in float64,
ml_dtypes for the bf16 rounding, and the reference interpreter (``Graph.evaluate``) for
compiled graphs. Every runnable build target (AVX-512, AVX2, portable C here) is tested
through the library loader; the compiled-graph tests run under each RLX_ISA.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import erf

from rlx.backends.cpu import native
from rlx.backends.cpu.engines import sgemm as ks
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.sgemm import SgemmKernel, blocking, cache_sizes, sgemm_lib
from rlx.dtype import DType
from rlx.errors import InputError
from rlx.ir.mir import Graph
from rlx.options import CompileOptions
from rlx.runtime.session import Session

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

TARGETS = cpu.runnable_targets()
EPS = float(np.finfo(np.float32).eps)
ISA = {
    cpu.Target.AVX512: SgemmKernel.AVX512,
    cpu.Target.AVX2: SgemmKernel.AVX2,
    cpu.Target.PORTABLE: SgemmKernel.C,
    cpu.Target.NEON: SgemmKernel.NEON,
    cpu.Target.DOTPROD: SgemmKernel.NEON,
    cpu.Target.I8MM: SgemmKernel.NEON,
}


def _bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    k = a.shape[-1]
    return 2 * max(k, 1) * EPS * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture(params=TARGETS, ids=lambda t: t.value)
def lib(request):
    return sgemm_lib(request.param)


def test_each_target_builds_its_micro_kernel() -> None:
    for t in TARGETS:
        got = sgemm_lib(t)
        assert got.isa == ISA[t] and got.label == f"rlx sgemm ({ISA[t]})"
        assert got.mr * got.nr >= 48


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.value)
@given(
    m=st.integers(0, 40),
    n=st.integers(0, 70),
    k=st.integers(0, 90),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_gemm_matches_float64(target, m, n, k, threads, seed) -> None:
    lib = sgemm_lib(target)
    rng = np.random.default_rng(seed)
    a, b = _rand(rng, m, k), _rand(rng, k, n)
    out = np.full((m, n), np.nan, np.float32)
    lib.gemm(a, lib.pack_b(b), out, threads=threads)
    want = a.astype(np.float64) @ b
    assert np.all(np.abs(out - want) <= _bound(a, b) + 1e-30)


def test_blocking_edges_and_large_k(lib) -> None:
    """Shapes crossing several KC / MC blocks and ragged tiles, 1 and 2 threads."""
    rng = np.random.default_rng(1)
    mc = lib.a_bytes // (4 * lib.kc)  # rows of an A block at the largest K block
    for m, n, k in [(mc + 3, 2 * lib.nr + 5, 2 * lib.kc + 7), (2, 3 * lib.nr, 700), (1, 1, 1)]:
        a, b = _rand(rng, m, k), _rand(rng, k, n)
        for threads in (1, 2):
            out = np.empty((m, n), np.float32)
            lib.gemm(a, lib.pack_b(b), out, threads=threads)
            assert np.all(np.abs(out - a.astype(np.float64) @ b) <= _bound(a, b))


def test_every_row_and_column_tail_of_the_tile(lib) -> None:
    """M = 1 .. 2 MR + 1 (every short-row kernel, on each side of a full panel) x N with
    each tail past 2 whole NR panels (NR = 12 on aarch64 leaves 4 / 8 columns of the
    powers of two)."""
    rng = np.random.default_rng(7)
    k = 37
    a = _rand(rng, 2 * lib.mr + 1, k)
    for n in range(2 * lib.nr, 3 * lib.nr):
        b = _rand(rng, k, n)
        packed = lib.pack_b(b)
        for m in range(1, a.shape[0] + 1):
            out = np.full((m, n), np.nan, np.float32)
            lib.gemm(a[:m], packed, out)
            assert np.all(np.abs(out - a[:m].astype(np.float64) @ b) <= _bound(a[:m], b))


def test_strided_operands(lib) -> None:
    rng = np.random.default_rng(2)
    big_a = _rand(rng, 30, 50)
    a = big_a[::2, 1::2]  # [15, 25], neither stride unit
    bt = _rand(rng, 37, 25)
    b = bt.T  # [25, 37], column-major
    res_big = _rand(rng, 15, 80)
    out_big = np.zeros((15, 80), np.float32)
    out = out_big[:, 3:40]
    lib.gemm(a, lib.pack_b(b), out, residual=res_big[:, :37], threads=2)
    want = a.astype(np.float64) @ b + res_big[:, :37]
    assert np.all(np.abs(out - want) <= _bound(a, b) + 4 * EPS * np.abs(want))
    assert np.all(out_big[:, :3] == 0) and np.all(out_big[:, 40:] == 0)


def _act64(act: str | None, y: np.ndarray) -> np.ndarray:
    if act is None:
        return y
    if act == "relu":
        return np.maximum(y, 0)
    if act == "gelu":
        return 0.5 * y * (1 + erf(y / np.sqrt(2.0)))
    if act == "gelu_tanh":
        return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
    if act == "tanh":
        return np.tanh(y)
    return y / (1 + np.exp(-y))


@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu", "tanh"])
def test_epilogues_match_numpy_formulas(lib, act) -> None:
    rng = np.random.default_rng(3)
    m, n, k = 23, 45, 31
    a, b = _rand(rng, m, k), _rand(rng, k, n)
    bias, res = _rand(rng, n), _rand(rng, m, n)
    scale = 0.375
    for threads in (1, 2):
        out = np.empty((m, n), np.float32)
        lib.gemm(
            a, lib.pack_b(b), out, bias=bias, act=act, residual=res, scale=scale, threads=threads
        )
        pre = scale * (a.astype(np.float64) @ b) + bias
        want = _act64(act, pre) + res
        # |act'| <= 1.13 for these activations; f32 rounding of each epilogue step
        tol = 1.2 * scale * _bound(a, b) + 16 * EPS * (np.abs(pre) + np.abs(want) + np.abs(res))
        assert np.all(np.abs(out - want) <= tol), act


@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu", "tanh"])
def test_nan_rows_stay_nan_through_every_epilogue(lib, act) -> None:
    """A NaN in a row of A makes that output row NaN after any activation, as NumPy's
    formulas give (np.maximum propagates NaN: relu once returned 0 for it)."""
    rng = np.random.default_rng(5)
    a, b = _rand(rng, 9, 20), _rand(rng, 20, 37)
    a[4, 3] = np.nan
    out = np.empty((9, 37), np.float32)
    lib.gemm(a, lib.pack_b(b), out, bias=_rand(rng, 37), act=act, threads=1)
    want_nan = np.isnan(_act64(act, a.astype(np.float64) @ b))
    assert want_nan[4].all() and np.array_equal(np.isnan(out), want_nan), act


def test_bf16_output_rounds_once_like_ml_dtypes(lib) -> None:
    rng = np.random.default_rng(4)
    m, n = 19, 70
    for k in (60, 3 * lib.kc + 1):
        a, b = _rand(rng, m, k), _rand(rng, k, n)
        bias = _rand(rng, n)
        p = lib.pack_b(b)
        bf = np.empty((m, n), ml_dtypes.bfloat16)
        lib.gemm(a, p, bf, bias=bias, act="gelu", threads=2)
        want = _act64("gelu", a.astype(np.float64) @ b + bias)
        tol = 2.0**-8 * np.abs(want) + 1.2 * _bound(a, b) + 1e-30
        assert np.all(np.abs(bf.astype(np.float64) - want) <= tol)
        if k <= lib.kc:  # one K block either way: the same f32 values, rounded by ml_dtypes
            f32 = np.empty((m, n), np.float32)
            lib.gemm(a, p, f32, bias=bias, act="gelu")
            assert np.array_equal(
                bf.view(np.uint16), f32.astype(ml_dtypes.bfloat16).view(np.uint16)
            )


@pytest.mark.parametrize("transposed", [False, True])
def test_batched_matches_float64(lib, transposed) -> None:
    rng = np.random.default_rng(5)
    for nb, m, n, k in [(6, 17, 33, 8), (1, 40, 5, 64), (3, 1, 1, 1), (4, 9, 7, 0)]:
        a = _rand(rng, nb, m, k)
        b = _rand(rng, nb, n, k).transpose(0, 2, 1) if transposed else _rand(rng, nb, k, n)
        for threads in (1, 2):
            out = np.full((nb, m, n), np.nan, np.float32)
            lib.batched(a, b, out, scale=0.5, threads=threads)
            want = 0.5 * (a.astype(np.float64) @ b)
            assert np.all(np.abs(out - want) <= 0.5 * _bound(a, b) + 1e-30)


def test_bad_arguments_are_input_errors(lib) -> None:
    a = np.zeros((3, 4), np.float32)
    p = lib.pack_b(np.zeros((4, 5), np.float32))
    with pytest.raises(InputError, match="packed"):
        lib.gemm(a, p, np.zeros((3, 50), np.float32))
    with pytest.raises(InputError, match="bias"):
        lib.gemm(a, p, np.zeros((3, 5), np.float32), bias=np.zeros(4, np.float32))
    with pytest.raises(InputError, match="act"):
        lib.gemm(a, p, np.zeros((3, 5), np.float32), act="softplus")
    with pytest.raises(InputError, match="f32"):
        lib.gemm(a.astype(np.float64), p, np.zeros((3, 5), np.float32))


def test_blocking_follows_cache_sizes(tmp_path) -> None:
    kc, a_bytes, nc = blocking(14, 32, (48 << 10, 2 << 20, 32 << 20))
    assert kc * 32 * 4 <= (2 << 20) // 16 and a_bytes == 1 << 20 and nc % 32 == 0
    # the aarch64 8 x 12 kernel on a Neoverse N1's caches: the B micro-panel in half of L1d
    kc, a_bytes, nc = blocking(8, 12, (64 << 10, 1 << 20, 32 << 20), l1_panel=True)
    assert kc == 680 and kc * 12 * 4 <= 32 << 10 and a_bytes == 1 << 19 and nc % 12 == 0
    d = tmp_path / "index0"
    d.mkdir()
    (d / "type").write_text("Data\n")
    (d / "level").write_text("1\n")
    (d / "size").write_text("64K\n")
    assert cache_sizes(tmp_path) == (64 << 10, 1 << 20, 8 << 20)
    assert cache_sizes(tmp_path / "missing") == (32 << 10, 1 << 20, 8 << 20)


# ---- compiled graphs -------------------------------------------------------------------

OPTS = CompileOptions(use_cache=False, verbose=False, num_threads=2)


@pytest.fixture(params=[t.value for t in TARGETS])
def isa(request, monkeypatch):
    monkeypatch.setenv("RLX_ISA", request.param)
    monkeypatch.setenv("RLX_SGEMM", "native")
    return ISA[cpu.Target(request.param)]


def _entry(cg, op: str):
    (e,) = [e for e in cg.report().kernels if e.op == op]
    return e


@pytest.mark.parametrize("act", [None, "gelu", "silu", "tanh"])
def test_fused_matmul_on_param_weight_is_repacked(isa, act) -> None:
    rng = np.random.default_rng(6)
    g = Graph("mlp")
    x = g.input("x", (2, 9, 24), DType.F32)
    w = g.param("w", (24, 40), DType.F32)
    bias = g.param("b", (40,), DType.F32)
    y = g.add(g.matmul(x, w), bias)
    if act is not None:
        y = getattr(g, act)(y)
    g.set_outputs([y])
    xv, w1, w2, bv = _rand(rng, 2, 9, 24), _rand(rng, 24, 40), _rand(rng, 24, 40), _rand(rng, 40)
    cg = Session("cpu").compile(g, OPTS, params={"w": w1, "b": bv})
    e = _entry(cg, "fused_matmul_bias_act")
    assert e.kind.value == "native" and f"rlx sgemm ({isa})" in " ".join(e.notes)
    assert "once per param change" in " ".join(e.notes)
    for wv in (w1, w2):
        cg.set_param("w", wv)
        got = cg.run({"x": xv})[0]
        want = g.evaluate({"x": xv}, {"w": wv, "b": bv})[0]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_matmul_constant_and_batched_dot_general(isa) -> None:
    rng = np.random.default_rng(7)
    wv = _rand(rng, 16, 12)
    g = Graph("att")
    q = g.input("q", (2, 3, 10, 16), DType.F32)
    k = g.input("k", (2, 3, 10, 16), DType.F32)
    s = g.dot_general(q, k, contract=((3,), (3,)), batch=((0, 1), (0, 1)))  # q . k^T
    p = g.matmul(s, k)  # p . v with both operands batched
    g.set_outputs([g.matmul(q, g.constant(wv)), s, p])
    feeds = {"q": _rand(rng, 2, 3, 10, 16), "k": _rand(rng, 2, 3, 10, 16)}
    cg = Session("cpu").compile(g, OPTS)
    for got, want in zip(cg.run(feeds), g.evaluate(feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    notes = [" ".join(e.notes) for e in cg.report().kernels if e.op in ("matmul", "dot_general")]
    assert any("weight packed at compile time" in n for n in notes)
    assert sum(f"rlx sgemm ({isa}) batched" in n for n in notes) == 2


def test_native_off_or_blas_forced_keeps_blas(monkeypatch) -> None:
    g = Graph("mm")
    x = g.input("x", (5, 8), DType.F32)
    g.set_outputs([g.matmul(x, g.param("w", (8, 6), DType.F32))])
    ps = {"w": np.ones((8, 6), np.float32)}
    monkeypatch.setenv("RLX_SGEMM", "native")
    off = Session("cpu").compile(g, CompileOptions(use_cache=False, native=False), params=ps)
    assert _entry(off, "matmul").kind.value == "blas"
    monkeypatch.setenv("RLX_SGEMM", "blas")
    forced = Session("cpu").compile(g, CompileOptions(use_cache=False), params=ps)
    assert _entry(forced, "matmul").kind.value == "blas"
    np.testing.assert_array_equal(forced.run({"x": np.ones((5, 8), np.float32)})[0], 8.0)


# ---- the recorded choice ---------------------------------------------------------------


# choice_dir: tests/cpu/engines/conftest.py


def _calls() -> tuple[list[str], object]:
    seen: list[str] = []

    def make():
        return (lambda: seen.append("n")), (lambda: seen.append("b"))

    return seen, make


def test_choice_is_measured_once_and_recorded(choice_dir) -> None:
    seen, make = _calls()
    use, why = ks.choose("k1", make, 1)
    assert why.startswith("measured") and "n" in seen and "b" in seen
    data = json.loads(ks.choice_path().read_text())
    assert data["choices"]["k1"] == ("native" if use else "blas")
    seen.clear()
    ks.forget_choices()  # a new process: read back from the file, nothing run
    assert ks.choose("k1", make, 1) == (use, "recorded choice") and not seen


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"version": 99, "choices": {}}',
        '{"version": 2, "choices": 3}',
        '{"version": 1, "choices": {"k2": "blas"}}',
    ],
)
def test_corrupt_choice_file_is_ignored(choice_dir, text) -> None:
    ks.choice_path().write_text(text)
    seen, make = _calls()
    _, why = ks.choose("k2", make, 1)
    assert why.startswith("measured") and seen
    data = json.loads(ks.choice_path().read_text())  # rewritten valid
    assert data["version"] == ks._VERSION and set(data["choices"]) == {"k2"}


def test_invalid_entries_are_dropped(choice_dir) -> None:
    data = {"version": ks._VERSION, "choices": {"k3": "gpu", "k4": "blas"}}
    ks.choice_path().write_text(json.dumps(data))
    seen, make = _calls()
    assert ks.choose("k4", make, 1) == (False, "recorded choice") and not seen
    assert ks.choose("k3", make, 1)[1].startswith("measured")


class _AllBlas(dict):
    """A recorded-choice table in which BLAS won every shape class."""

    def get(self, key, default=None):
        return "blas"


@pytest.fixture
def blas_recorded(choice_dir, monkeypatch):
    monkeypatch.setattr(ks, "_read", lambda: _AllBlas())
    ks.forget_choices()
    yield
    ks.forget_choices()


def test_batch_invariant_choice_is_native_without_measuring(choice_dir, monkeypatch) -> None:
    seen, make = _calls()
    assert ks.choose("k5", make, 1, invariant=True) == (
        True,
        "batch-invariant: native for every shape",
    )
    assert not seen and not ks.choice_path().exists()
    monkeypatch.setenv("RLX_SGEMM", "blas")  # the user's explicit choice still wins
    assert ks.choose("k5", make, 1, invariant=True) == (False, "RLX_SGEMM=blas")


@pytest.mark.parametrize("bias", [False, True])
def test_batch_invariant_rows_keep_their_bits_at_every_batch_size(blas_recorded, bias) -> None:
    # at one thread the recorded choice (here: BLAS for every shape class) would pick BLAS,
    # whose kernels round apart from rlx's (and apart from each other at M = 1):
    # batch_invariant keeps every shape on one kernel, so a row's bits never depend on M
    rng = np.random.default_rng(11)
    g = Graph("lin")
    x = g.input("x", ("m", 96), DType.F32)
    w = g.param("w", (96, 200), DType.F32)
    y = g.matmul(x, w)
    if bias:
        y = g.add(y, g.param("b", (200,), DType.F32))
    g.set_outputs([y])
    ps = {"w": _rand(rng, 96, 200), "b": _rand(rng, 200)}
    ps = ps if bias else {"w": ps["w"]}
    opts = CompileOptions(use_cache=False, num_threads=1, batch_invariant=True)
    cg = Session("cpu").compile(g, opts, params=ps)
    xv = _rand(rng, 40, 96)
    full = cg.run({"x": xv})[0]
    want = xv.astype(np.float64) @ ps["w"].astype(np.float64)
    if bias:
        want += ps["b"]
    assert np.all(np.abs(full - want) <= _bound(xv, ps["w"]) + 1e-6)
    for m in (1, 2, 3, 7, 8, 16, 33):
        np.testing.assert_array_equal(cg.run({"x": xv[:m]})[0], full[:m], err_msg=f"m={m}")
    e = _entry(cg, "fused_matmul_bias_act" if bias else "matmul")
    assert e.kind.value == "native" and "batch-invariant" in " ".join(e.notes)
    off = Session("cpu").compile(g, opts.replace(batch_invariant=False), params=ps)
    off_notes = " ".join(_entry(off, e.op).notes)  # the recorded choice, without the option
    # (or native unmeasured: the compile's first plan, m = 1, is a small product)
    assert (
        "rlx sgemm" not in off_notes
        or "blas (not rlx sgemm" in off_notes
        or "small product" in off_notes
    )
