"""Native low-precision kernels (rlx/backends/cpu/engines/lowp_lib.py, lowp_gemm.py): casts
bit-for-bit against ml_dtypes / NumPy at every SIMD level, the bf16 GEMM against float64
within the f32-accumulation bound, every matmul path (vdpbf16ps, native widening +
sgemm, the NumPy fallback) through Session against the reference interpreter, weight
repacking after set_param, and the fallback when the library cannot be built."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx.backends.cpu import native
from rlx.backends.cpu.engines import lowp_gemm as klg
from rlx.backends.cpu.engines import lowp_lib as kl
from rlx.backends.cpu.kernels import KernelCtx, KernelKind
from rlx.dtype import DType
from rlx.errors import CompileError, InputError
from rlx.ir.mir import Graph
from rlx.ops.elementwise import UnaryKind
from rlx.ops.fused import FusedMatMulBiasAct
from rlx.options import CompileOptions
from rlx.passes.precision import PrecisionPolicy
from rlx.runtime.session import Session

needs_gcc = pytest.mark.skipif(not native.available(), reason="needs gcc")

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
OPTS = CompileOptions(use_cache=False, verbose=False)
# the RLX_ISA target's: AVX512 with avx512_bf16, or aarch64's i8mm (BFDOT)
HAS_DPBF16 = native.target_spec(native.selected_target()).bf16 or (
    native.selected_target() is native.Target.I8MM
)
LEVELS = list(kl.lowp_lib().levels) if native.available() else []
PATHS = [kl.GemmPath.CONVERT] + [kl.GemmPath.DPBF16] * HAS_DPBF16


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16 if x.itemsize == 2 else np.uint32)


def _special_f32() -> np.ndarray:
    """Bit patterns at every rounding / range boundary of bf16 and f16, NaN payloads."""
    pats = [
        0, 0x80000000, 1, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000, 0xFF800000,
        0x7F800001, 0x7FC00000, 0x7FA00000, 0xFFC00001, 0x7F801FFF, 0x7F802000,
        0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x477FEFFF, 0x477FF000, 0x47800000,
        0x387FC000, 0x38800000, 0x33000000, 0x33000001, 0x337FFFFF, 0x32FFFFFF, 0x3F801000,
        0x3F803000, 0x3F800FFF, 0x3F802000, 0xC77FF000,
    ]  # fmt: skip
    rng = np.random.default_rng(1)
    rand = rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32)
    # around every f16 exponent: halfway cases, subnormal halves
    e = np.arange(0x33000000, 0x47800000, 0x00800000, dtype=np.uint32)
    near = (
        e[:, None] + np.array([0, 0xFFF, 0x1000, 0x1001, 0x2FFF, 0x3000, 0x7FFFFF], np.uint32)
    ).ravel()
    return np.concatenate([np.array(pats, np.uint32), near, near | 0x80000000, rand]).view(
        np.float32
    )


@pytest.mark.parametrize("level", LEVELS, ids=lambda lv: lv.name)
@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
@needs_gcc
def test_casts_are_bit_exact_at_every_level(level: kl.SimdLevel, dt: np.dtype) -> None:
    lib = kl.lowp_lib()
    x = _special_f32()
    with kl.lowp_override(simd=level):
        down = np.empty(x.shape, dt)
        lib.cast(x, down, threads=2)
        every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dt)
        up = np.empty(every.shape, np.float32)
        lib.cast(every, up, threads=2)
    with np.errstate(all="ignore"):
        want = x.astype(dt)
    np.testing.assert_array_equal(_bits(down), _bits(want))
    np.testing.assert_array_equal(_bits(up), _bits(every.astype(np.float32)))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 200),
    level=st.sampled_from(LEVELS),
    dt=st.sampled_from([BF16, F16]),
    seed=st.integers(0, 2**16),
)
@needs_gcc
def test_casts_ragged_lengths(n: int, level: kl.SimdLevel, dt: np.dtype, seed: int) -> None:
    lib = kl.lowp_lib()
    x = (np.random.default_rng(seed).standard_normal(n) * 1e3).astype(np.float32)
    out = np.empty(n, dt)
    back = np.empty(n, np.float32)
    with kl.lowp_override(simd=level):
        lib.cast(x, out, 1)
        lib.cast(out, back, 1)
    np.testing.assert_array_equal(_bits(out), _bits(x.astype(dt)))
    np.testing.assert_array_equal(_bits(back), _bits(out.astype(np.float32)))


CAST_PAIRS = [
    (DType.F32, DType.BF16),
    (DType.BF16, DType.F32),
    (DType.F32, DType.F16),
    (DType.F16, DType.F32),
    (DType.BF16, DType.F16),
    (DType.F16, DType.BF16),
]


@pytest.mark.parametrize(("src", "dst"), CAST_PAIRS, ids=lambda d: d.value)
@needs_gcc
def test_cast_kernel_matches_reference_bitwise(src: DType, dst: DType) -> None:
    g = Graph("cast")
    x = g.input("x", (300, 700), src)
    g.set_outputs([g.cast(x, dst)])
    bits = np.random.default_rng(2).integers(0, 2**32, (300, 700), dtype=np.uint64)
    v = bits.astype(np.uint32).view(np.float32)
    v = v if src is DType.F32 else np.ascontiguousarray(bits.astype(np.uint16)).view(src.np)
    cg = Session("cpu").compile(g, OPTS)
    got = cg.run({"x": v})[0]
    want = g.evaluate({"x": v}, {})[0]
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert [e.kind.value for e in cg.report().kernels if e.op == "cast"] == ["native"]


def _bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a| @ |b| * K * 2^-24: the worst-case f32 accumulation error (plus output ulp)."""
    k = a.shape[-1]
    return (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) * (k + 1) * 2.0**-24


@pytest.mark.skipif(not HAS_DPBF16, reason="CPU without bf16 dot products")
@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 70),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**16),
)
@needs_gcc
def test_bf16_gemm_within_f32_accumulation_bound(m: int, k: int, n: int, seed: int) -> None:
    lib = kl.lowp_lib()
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    packed = np.empty(lib.packed_size(k, n), np.uint16)
    lib.pack_b(b, packed, 2)
    out = np.empty((m, n), np.float32)
    lib.gemm(a, packed, out, 2)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(out - ref) <= _bound(a, b))
    out16 = np.empty((m, n), BF16)
    lib.gemm(a, packed, out16, 1)
    np.testing.assert_array_equal(_bits(out16), _bits(out.astype(BF16)))


@pytest.mark.skipif(not HAS_DPBF16, reason="CPU without bf16 dot products")
@needs_gcc
def test_bf16_gemm_strided_rows_and_large_k() -> None:
    lib = kl.lowp_lib()
    rng = np.random.default_rng(3)
    big = rng.standard_normal((330, 1100)).astype(BF16)
    a = big[3:320, 5:1030]  # row stride 1100, M = 317 (two row blocks), K = 1025 (odd, 5 K blocks)
    b = rng.standard_normal((1025, 97)).astype(BF16)
    packed = np.empty(lib.packed_size(1025, 97), np.uint16)
    lib.pack_b(b, packed, 2)
    out = np.zeros((317, 120), np.float32)[:, :97]
    lib.gemm(a, packed, out, 2)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(out - ref) <= _bound(a, b))


@needs_gcc
def test_library_checks_its_arguments() -> None:
    lib = kl.lowp_lib()
    with pytest.raises(InputError, match="no native conversion"):
        lib.cast(np.zeros(4, np.float64), np.zeros(4, BF16))
    with pytest.raises(InputError, match="equal size"):
        lib.cast(np.zeros(4, np.float32), np.zeros(5, BF16))
    with pytest.raises(InputError, match="contiguous rows"):
        lib.pack_b(np.zeros((4, 6), BF16)[:, ::2], np.zeros(lib.packed_size(4, 3), np.uint16))
    with pytest.raises(InputError, match="packed"):
        lib.gemm(np.zeros((2, 4), BF16), np.zeros(3, np.uint16), np.zeros((2, 3), np.float32))


def _matmul_graph(dt: DType, shape_a, shape_b, weight: str, wv: np.ndarray) -> Graph:
    g = Graph("mm")
    x = g.input("x", shape_a, dt)
    w = g.constant(wv) if weight == "constant" else g.param("w", shape_b, dt)
    g.set_outputs([g.matmul(x, w)])
    return g


SHAPES = [
    ((5, 33), (33, 40)),
    ((2, 3, 7, 16), (16, 9)),
    ((2, 3, 4, 8), (3, 8, 35)),
    ((1, 1), (1, 1)),
]


@pytest.mark.parametrize("path", PATHS + [kl.GemmPath.NUMPY], ids=lambda p: p.name)
@pytest.mark.parametrize("weight", ["constant", "param"])
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@needs_gcc
def test_bf16_matmul_paths_match_reference(path: kl.GemmPath, weight: str, shapes) -> None:
    sa, sb = shapes
    rng = np.random.default_rng(4)
    xv = rng.standard_normal(sa).astype(BF16)
    wv = rng.standard_normal(sb).astype(BF16)
    g = _matmul_graph(DType.BF16, sa, sb, weight, wv)
    ps = {"w": wv} if weight == "param" else {}
    with kl.lowp_override(gemm=path, native=path is not kl.GemmPath.NUMPY):
        cg = Session("cpu").compile(g, OPTS, params=ps)
    got = cg.run({"x": xv})[0].astype(np.float64)
    want = g.evaluate({"x": xv}, ps)[0].astype(np.float64)
    # the products are summed in f32 in another order than the reference, then both round
    # once to bf16: at most one bf16 ulp (plus the f32 accumulation bound) apart
    err = np.abs(got - want)
    assert np.all(err <= np.abs(want) * 2.0**-7 + 2 * _bound(xv, wv))
    (entry,) = [e for e in cg.report().kernels if e.op == "matmul"]
    if path is kl.GemmPath.NUMPY:
        assert entry.kind.value != "native"
    else:
        assert entry.kind.value == "native" and path.value in " ".join(entry.notes)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
@needs_gcc
def test_param_weight_is_repacked_after_set_param(path: kl.GemmPath) -> None:
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((24, 40)).astype(BF16)
    w2 = rng.standard_normal((24, 40)).astype(BF16)
    xv = rng.standard_normal((6, 24)).astype(BF16)
    g = _matmul_graph(DType.BF16, (6, 24), (24, 40), "param", w1)
    with kl.lowp_override(gemm=path):
        cg = Session("cpu").compile(g, OPTS, params={"w": w1})
    first = cg.run({"x": xv})[0].astype(np.float64)
    cg.set_param("w", w2)
    second = cg.run({"x": xv})[0].astype(np.float64)
    for got, w in ((first, w1), (second, w2)):
        want = g.evaluate({"x": xv}, {"w": w})[0].astype(np.float64)
        assert np.all(np.abs(got - want) <= np.abs(want) * 2.0**-7 + 2 * _bound(xv, w))


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
@pytest.mark.parametrize("weight", ["constant", "input"])
@needs_gcc
def test_dot_general_with_transposed_operands(path: kl.GemmPath, weight: str) -> None:
    rng = np.random.default_rng(6)
    av = rng.standard_normal((3, 20, 5)).astype(BF16)  # [batch, k, m]: lhs contracts axis 1
    bv = rng.standard_normal((3, 7, 20)).astype(BF16)  # [batch, n, k]
    g = Graph("dg")
    a = g.input("a", av.shape, DType.BF16)
    b = g.constant(bv) if weight == "constant" else g.input("b", bv.shape, DType.BF16)
    g.set_outputs([g.dot_general(a, b, contract=((1,), (2,)), batch=((0,), (0,)))])
    ins = {"a": av} if weight == "constant" else {"a": av, "b": bv}
    with kl.lowp_override(gemm=path):
        cg = Session("cpu").compile(g, OPTS)
    got = cg.run(ins)[0].astype(np.float64)
    want = g.evaluate(ins, {})[0].astype(np.float64)
    ref64 = np.einsum("bkm,bnk->bmn", av.astype(np.float64), bv.astype(np.float64))
    bound = np.einsum("bkm,bnk->bmn", np.abs(av.astype(np.float64)), np.abs(bv.astype(np.float64)))
    assert np.all(np.abs(got - want) <= np.abs(want) * 2.0**-7 + bound * 21 * 2.0**-23)
    assert np.all(np.abs(got - ref64) <= np.abs(ref64) * 2.0**-8 + bound * 21 * 2.0**-24)
    assert [e.kind.value for e in cg.report().kernels if e.op == "dot_general"] == ["native"]


@needs_gcc
def test_f16_matmul_uses_native_widening() -> None:
    rng = np.random.default_rng(7)
    xv = rng.standard_normal((9, 50)).astype(F16)
    wv = rng.standard_normal((50, 33)).astype(F16)
    g = _matmul_graph(DType.F16, (9, 50), (50, 33), "constant", wv)
    cg = Session("cpu").compile(g, OPTS)
    got = cg.run({"x": xv})[0].astype(np.float64)
    want = g.evaluate({"x": xv}, {})[0].astype(np.float64)
    assert np.all(np.abs(got - want) <= np.abs(want) * 2.0**-10 + 2 * _bound(xv, wv))
    (entry,) = [e for e in cg.report().kernels if e.op == "matmul"]
    assert entry.kind.value == "native" and kl.GemmPath.CONVERT.value in " ".join(entry.notes)


def test_empty_contraction_gives_zeros() -> None:
    g = _matmul_graph(DType.BF16, (4, 0), (0, 5), "constant", np.zeros((0, 5), BF16))
    out = Session("cpu").compile(g, OPTS).run({"x": np.zeros((4, 0), BF16)})[0]
    np.testing.assert_array_equal(out.astype(np.float32), np.zeros((4, 5), np.float32))


@needs_gcc
def test_without_avx512_bf16_the_convert_path_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    flags = native.cpu_flags() - {"avx512_bf16", "bf16"}  # x86-64's, aarch64's
    monkeypatch.setattr(native, "cpu_flags", lambda: flags)
    lib = kl.lowp_lib()
    assert kl.gemm_path(BF16, lib) is kl.GemmPath.CONVERT
    with (
        kl.lowp_override(gemm=kl.GemmPath.DPBF16),
        pytest.raises(CompileError, match="avx512_bf16"),
    ):
        kl.gemm_path(BF16, lib)
    with pytest.raises(CompileError, match="avx512_bf16"):
        lib.gemm(
            np.zeros((1, 2), BF16),
            np.zeros(lib.packed_size(2, 1), np.uint16),
            np.zeros((1, 1), np.float32),
        )


def test_failed_build_falls_back_to_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kw: object) -> None:
        raise CompileError("native build of 'lowp' failed (test)")

    kl.lowp_lib.cache_clear()
    monkeypatch.setattr(native, "build", fail)
    try:
        rng = np.random.default_rng(8)
        xv = rng.standard_normal((4, 16)).astype(np.float32)
        wv = rng.standard_normal((16, 8)).astype(BF16)
        g = Graph("fb")
        x = g.cast(g.input("x", (4, 16)), DType.BF16)
        g.set_outputs([g.cast(g.matmul(x, g.constant(wv)), DType.F32)])
        cg = Session("cpu").compile(g, OPTS)
        np.testing.assert_array_equal(cg.run({"x": xv})[0], g.evaluate({"x": xv}, {})[0])
        kinds = {e.op: e for e in cg.report().kernels}
        assert all(e.kind.value != "native" for e in kinds.values())
        assert "unavailable" in " ".join(kinds["matmul"].notes)
    finally:
        kl.lowp_lib.cache_clear()


@needs_gcc
def test_amp_mlp_runs_bf16_matmuls_natively() -> None:
    g = Graph("mlp")
    x = g.input("x", (8, 64))
    h = g.gelu(g.matmul(x, g.param("w0", (64, 96))))
    g.set_outputs([g.matmul(h, g.param("w1", (96, 40)))])
    rng = np.random.default_rng(9)
    ps = {"w0": rng.standard_normal((64, 96)).astype(np.float32) / 8,
          "w1": rng.standard_normal((96, 40)).astype(np.float32) / 10}  # fmt: skip
    xv = rng.standard_normal((8, 64)).astype(np.float32)
    ref = g.evaluate({"x": xv}, ps)[0]
    for freeze in (False, True):
        opts = OPTS.replace(
            precision=PrecisionPolicy.AutoMixedBf16, freeze_params=freeze, fuse=False
        )
        cg = Session("cpu").compile(g, opts, params=ps)
        out = cg.run({"x": xv})[0]
        assert np.max(np.abs(out - ref)) / np.max(np.abs(ref)) < 3e-2
        mm = [e for e in cg.report().kernels if e.op == "matmul"]
        assert len(mm) == 2 and all(e.kind.value == "native" and e.dtype == "bf16" for e in mm)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
@pytest.mark.parametrize("act", [None, UnaryKind.GELU, UnaryKind.SILU])
@pytest.mark.parametrize("bias", ["constant", "input", None])
@needs_gcc
def test_fused_matmul_helper_rounds_like_the_reference(path, act, bias) -> None:
    rng = np.random.default_rng(10)
    xv = rng.standard_normal((12, 40)).astype(BF16)
    wv = (rng.standard_normal((40, 36)) / 6).astype(BF16)
    bv = rng.standard_normal(36).astype(BF16)
    g = Graph("fused")
    x = g.input("x", xv.shape, DType.BF16)
    operands = [x, g.constant(wv)]
    if bias == "constant":
        operands.append(g.constant(bv))
    elif bias == "input":
        operands.append(g.input("b", bv.shape, DType.BF16))
    g.set_outputs([g.apply(FusedMatMulBiasAct(act, bias is not None), operands)])
    ins = {"x": xv, "b": bv} if bias == "input" else {"x": xv}
    cg = Session("cpu").compile(g, OPTS.replace(optimize=False, fuse=False))
    cg.run(ins)  # fills the arena's input slots
    ex = cg._executor_any()
    (node,) = [n for n in cg.graph.nodes if isinstance(n.op, FusedMatMulBiasAct)]
    out = ex.views[node.id]
    ctx = KernelCtx(node, cg.graph, ex.bindings, {}, ins, ex.pool, KernelKind.BLAS)
    with kl.lowp_override(gemm=path):
        fn = klg.lowp_fused_matmul(node, [ex.views[i] for i in node.inputs], out, ctx)
    assert fn is not None and ctx.kind is KernelKind.NATIVE
    out[...] = 0
    fn()
    want = g.evaluate(ins, {})[0].astype(np.float64)
    got = out.astype(np.float64)
    # the products' f32 sums differ in order; each rounding step may then differ by 1 ulp
    assert np.all(np.abs(got - want) <= np.abs(want) * 2.0**-6 + 4 * _bound(xv, wv) + 2.0**-8)
    assert np.mean(got == want) > 0.9


def test_fused_matmul_helper_declines_f32() -> None:
    g = Graph("f32")
    x = g.input("x", (2, 3))
    g.set_outputs(
        [g.apply(FusedMatMulBiasAct(None, False), [x, g.constant(np.ones((3, 4), np.float32))])]
    )
    cg = Session("cpu").compile(g, OPTS.replace(optimize=False, fuse=False))
    ex = cg._executor_any()
    node = cg.graph.nodes[cg.graph.outputs[0]]
    ctx = KernelCtx(node, cg.graph, ex.bindings, {}, {}, ex.pool, KernelKind.BLAS)
    assert (
        klg.lowp_fused_matmul(node, [ex.views[i] for i in node.inputs], ex.views[node.id], ctx)
        is None
    )


@pytest.mark.parametrize("threads", [1, 2])
@needs_gcc
def test_compile_options_native_and_threads(threads: int) -> None:
    rng = np.random.default_rng(11)
    xv = rng.standard_normal((70, 300)).astype(np.float32)
    wv = rng.standard_normal((300, 50)).astype(BF16)
    g = Graph("opts")
    x = g.cast(g.input("x", xv.shape), DType.BF16)
    g.set_outputs([g.cast(g.matmul(x, g.constant(wv)), DType.F32)])
    want = g.evaluate({"x": xv}, {})[0]
    for use_native in (True, False):
        cg = Session("cpu").compile(g, OPTS.replace(native=use_native, num_threads=threads))
        got = cg.run({"x": xv})[0]
        bound = _bound(xv.astype(BF16), wv)
        assert np.all(np.abs(got - want) <= np.abs(want) * 2.0**-7 + 2 * bound)
        kinds = {e.kind.value for e in cg.report().kernels if e.op in ("cast", "matmul")}
        assert kinds == {"native"} if use_native else "native" not in kinds


@pytest.mark.parametrize(
    "act", [UnaryKind.GELU, UnaryKind.SILU, UnaryKind.GELU_TANH, UnaryKind.RELU]
)
@pytest.mark.parametrize("dt", [DType.BF16, DType.F16], ids=lambda d: d.value)
def test_activation_table_equals_the_interpreter(act: UnaryKind, dt: DType) -> None:
    codes = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    g = Graph("act")
    g.set_outputs([g.unary(act, g.input("x", (2**16,), dt))])
    want = g.evaluate({"x": codes.view(dt.np)}, {})[0]
    table = klg.activation_table(act, dt.np)
    np.testing.assert_array_equal(table[codes], _bits(want))


@needs_gcc
def test_lookup_applies_a_table_in_place() -> None:
    lib = kl.lowp_lib()
    x = (np.random.default_rng(12).standard_normal(100_003) * 4).astype(BF16)
    table = klg.activation_table(UnaryKind.SILU, BF16)
    want = table[x.view(np.uint16)]
    out = np.empty_like(x)
    lib.lookup(x, table, out, threads=2)
    np.testing.assert_array_equal(out.view(np.uint16), want)
    lib.lookup(x, table, x, threads=1)
    np.testing.assert_array_equal(x.view(np.uint16), want)
    with pytest.raises(InputError, match="table"):
        lib.lookup(x, table[:10], out)
    with pytest.raises(InputError, match="bf16/f16"):
        lib.lookup(x.astype(np.float32), table, out)


@needs_gcc
@pytest.mark.skipif(not HAS_DPBF16, reason="CPU without bf16 dot products")
def test_bf16_gemm_is_deterministic_across_thread_counts() -> None:
    lib = kl.lowp_lib()
    rng = np.random.default_rng(13)
    a = rng.standard_normal((300, 700)).astype(BF16)
    b = rng.standard_normal((700, 130)).astype(BF16)
    packed = np.empty(lib.packed_size(700, 130), np.uint16)
    lib.pack_b(b, packed, 2)
    outs = []
    for threads in (1, 2, 3):
        out = np.empty((300, 130), np.float32)
        lib.gemm(a, packed, out, threads)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
