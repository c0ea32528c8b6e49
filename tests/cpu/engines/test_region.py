"""Native elementwise regions (codegen/elementwise.py + engines/region.py) vs the reference
interpreter.

Per-kind tests render many one-op bodies into one C module (one gcc run) and compare each
function's output with ``evaluate`` of the body. Tolerances: f64 rtol 1e-12; f32 rtol
2e-6 (libm vs NumPy's SIMD transcendental functions differ by an ulp or two); f16 2e-3
and bf16 1e-2 (one ulp of the type: both sides round once from f32); integers and bool
exact. Random DAG tests go through Session.compile and the executor.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.codegen import elementwise as codegen
from rlx.backends.cpu.codegen.elementwise import BINARY_C, COMPARE_C, UNARY_C, CFunction, CModule
from rlx.backends.cpu.dispatch import ORDER, KernelKind, load_kernels
from rlx.backends.cpu.engines import region as kernels_region
from rlx.backends.cpu.kernels.fused import native_region_kernel, region_kernel
from rlx.backends.reference import evaluate
from rlx.dtype import DType
from rlx.ops.elementwise import BinaryKind, Compare, CompareKind, UnaryKind
from rlx.ops.fused import ElementwiseRegion
from rlx.options import CompileOptions
from rlx.runtime.session import Session

# the SIMD expf of libmvec: x86-64 AVX-512, AVX2, SSE; aarch64 AdvSIMD (4 and 2 lanes)
SIMD_EXPF = (
    b"_ZGVeN16v_expf",
    b"_ZGVdN8v_expf",
    b"_ZGVbN4v_expf",
    b"_ZGVnN4v_expf",
    b"_ZGVnN2v_expf",
)

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)
TOL = {
    "float64": (1e-12, 1e-12),
    "float32": (2e-6, 1e-6),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1e-2, 1e-2),
}
SPECIAL = [0.0, -0.0, 0.5, 1.5, 2.5, -2.5, -1.0, 1.0, np.inf, -np.inf, np.nan, 3.75, -7.25]
INT_OK = [UnaryKind.RELU, UnaryKind.NEG, UnaryKind.ABS, UnaryKind.SQUARE, UnaryKind.SIGN]

Case = tuple[rlx.Graph, list[np.ndarray]]


def body(dtypes: list[DType], dims: list[tuple[int, ...]], fn: Callable[..., int]) -> rlx.Graph:
    g = rlx.Graph("body")
    ids = [g.input(f"in{k}", d, t) for k, (t, d) in enumerate(zip(dtypes, dims, strict=True))]
    g.set_outputs([fn(g, *ids)])
    return g


def run_cases(cases: list[Case]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Render every case into one module, build it once, run each function; returns
    (native, reference) pairs."""
    funcs: list[CFunction] = []
    bound: list[tuple[list[np.ndarray], np.ndarray]] = []
    for i, (g, ins) in enumerate(cases):
        ref = evaluate(g, {f"in{k}": a for k, a in enumerate(ins)})[0]
        out = np.full(ref.shape, 7, ref.dtype)
        fn, arrays = codegen.render_region(g, ins, out, name=f"k{i}")
        funcs.append(fn)
        bound.append((arrays, ref))
    module = CModule(tuple(funcs), vector_math=kernels_region.vector_math_available())
    lib = native.load(native.build(module.source, native.Isa.PLAIN, "region_test"))
    pairs = []
    for fn, (arrays, ref) in zip(funcs, bound, strict=True):
        cfn = getattr(lib, fn.name)
        cfn.argtypes = [ctypes.c_void_p] * fn.num_pointers + [ctypes.c_long]
        cfn(*[a.ctypes.data for a in arrays], 1)
        pairs.append((arrays[-1], ref))
    return pairs


def check(pairs: list[tuple[np.ndarray, np.ndarray]], names: list[str]) -> None:
    for (got, ref), name in zip(pairs, names, strict=True):
        assert got.dtype == ref.dtype, name
        if ref.dtype.name in TOL:
            rtol, atol = TOL[ref.dtype.name]
            np.testing.assert_allclose(
                got.astype(np.float64), ref.astype(np.float64), rtol, atol, err_msg=name
            )
        else:
            np.testing.assert_array_equal(got, ref, err_msg=name)


def float_values(dt: DType, n: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = np.concatenate([SPECIAL, rng.normal(0, 3, n - len(SPECIAL))])
    return v.astype(dt.np)


def int_values(dt: DType, seed: int = 0) -> np.ndarray:
    info = np.iinfo(dt.np)
    rng = np.random.default_rng(seed)
    edge = [0, 1, -1, 2, -2, 7, -7, info.min, info.max] if info.min < 0 else [0, 1, 2, 7, info.max]
    return np.concatenate([edge, rng.integers(max(info.min, -50), 50, 55)]).astype(dt.np)


def test_tables_cover_every_kind() -> None:
    assert set(UNARY_C) == set(UnaryKind)
    assert set(BINARY_C) == set(BinaryKind)
    assert set(COMPARE_C) == set(CompareKind)


def test_native_region_kernel_is_tried_before_the_numpy_one() -> None:
    load_kernels()
    assert ORDER[ElementwiseRegion] == (native_region_kernel, region_kernel)


@pytest.mark.parametrize("dt", [DType.F32, DType.F64, DType.F16, DType.BF16])
def test_every_unary_float(dt: DType) -> None:
    kinds = [k for k in UnaryKind if k is not UnaryKind.NOT]
    x = float_values(dt)
    cases = [(body([dt], [x.shape], lambda g, a, k=k: g.unary(k, a)), [x]) for k in kinds]
    check(run_cases(cases), [f"{k.value} {dt}" for k in kinds])


@pytest.mark.parametrize("dt", [DType.I8, DType.I32, DType.I64, DType.U8])
def test_every_integer_unary(dt: DType) -> None:
    x = int_values(dt)
    kinds = [k for k in INT_OK if not (k is UnaryKind.NEG and dt is DType.U8)]
    cases = [(body([dt], [x.shape], lambda g, a, k=k: g.unary(k, a)), [x]) for k in kinds]
    check(run_cases(cases), [f"{k.value} {dt}" for k in kinds])


def test_not_and_logic() -> None:
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])
    cases = [
        (body([DType.BOOL], [(4,)], lambda g, x: g.logical_not(x)), [a]),
        (
            body([DType.BOOL] * 2, [(4,)] * 2, lambda g, x, y: g.binary(BinaryKind.AND, x, y)),
            [a, b],
        ),
        (body([DType.BOOL] * 2, [(4,)] * 2, lambda g, x, y: g.binary(BinaryKind.OR, x, y)), [a, b]),
    ]
    check(run_cases(cases), ["not", "and", "or"])


ARITH = [k for k in BinaryKind if k not in (BinaryKind.AND, BinaryKind.OR)]


@pytest.mark.parametrize("dt", [DType.F32, DType.F64, DType.BF16])
def test_every_binary_float(dt: DType) -> None:
    a = float_values(dt, seed=1)
    b = np.roll(float_values(dt, seed=2), 3)
    cases = [
        (body([dt] * 2, [a.shape] * 2, lambda g, x, y, k=k: g.binary(k, x, y)), [a, b])
        for k in ARITH
    ]
    check(run_cases(cases), [f"{k.value} {dt}" for k in ARITH])


@pytest.mark.parametrize("dt", [DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U32])
def test_every_binary_integer(dt: DType) -> None:
    a = int_values(dt, seed=3)
    b = np.roll(int_values(dt, seed=4), 5)
    info = np.iinfo(dt.np)
    pw = np.clip(b, -3 if info.min < 0 else 0, 5).astype(dt.np)
    # the reference's integer div takes abs(), which wraps at the type's minimum: keep
    # the minimum out of div's operands (C's truncating division is the definition)
    no_min = [np.where(v == info.min, info.min + 1, v).astype(dt.np) for v in (a, b)]
    operands = {BinaryKind.POW: [a, pw], BinaryKind.DIV: no_min}
    cases = [
        (
            body([dt] * 2, [a.shape] * 2, lambda g, x, y, k=k: g.binary(k, x, y)),
            operands.get(k, [a, b]),
        )
        for k in ARITH
    ]
    check(run_cases(cases), [f"{k.value} {dt}" for k in ARITH])


@pytest.mark.parametrize("dt", [DType.F32, DType.I32, DType.F16])
def test_every_compare_and_where(dt: DType) -> None:
    a = float_values(dt, seed=5) if dt.is_float else int_values(dt, seed=5)
    b = np.roll(a, 7)
    cases: list[Case] = [
        (body([dt] * 2, [a.shape] * 2, lambda g, x, y, k=k: g.apply(Compare(k), [x, y])), [a, b])
        for k in CompareKind
    ]
    cases.append((body([dt] * 2, [a.shape] * 2, lambda g, x, y: g.where(g.lt(x, y), x, y)), [a, b]))
    check(run_cases(cases), [k.value for k in CompareKind] + ["where"])


CASTS = [
    (DType.F32, DType.I32),
    (DType.F32, DType.I64),
    (DType.F32, DType.I8),
    (DType.F32, DType.F64),
    (DType.F64, DType.F32),
    (DType.F32, DType.BOOL),
    (DType.BOOL, DType.F32),
    (DType.I32, DType.F32),
    (DType.I64, DType.F64),
    (DType.I64, DType.I8),
    (DType.I32, DType.BOOL),
    (DType.F32, DType.F16),
    (DType.F32, DType.BF16),
    (DType.F64, DType.F16),
    (DType.BF16, DType.F32),
    (DType.F16, DType.I32),
    (DType.BF16, DType.F16),
    (DType.F32, DType.U8),
]


def test_casts() -> None:
    cases: list[Case] = []
    for src, dst in CASTS:
        if src is DType.BOOL:
            x = np.array([True, False, True, True])
        elif src.is_float:
            x = (np.random.default_rng(6).uniform(0 if dst is DType.U8 else -100, 100, 40)).astype(
                src.np
            )
            x[:4] = [0.0, 1.0, 0.5, 99.5] if dst is DType.U8 else [0.0, -0.0, -1.5, 2.5]
        else:
            x = int_values(src, seed=7)
        cases.append((body([src], [x.shape], lambda g, a, dst=dst: g.cast(a, dst)), [x]))
    check(run_cases(cases), [f"{s}->{d}" for s, d in CASTS])


def test_broadcasting_constants_and_dag() -> None:
    """A DAG reusing values, scalar and array constants, rank-changing broadcasts."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(3, 1, 5)).astype(np.float32)
    b = rng.normal(size=(4, 1)).astype(np.float32)
    s = np.array(2.0, np.float32)

    def fn(g: rlx.Graph, a: int, c: int, d: int) -> int:
        w = g.constant(np.arange(5, dtype=np.float32))
        h = g.add(g.mul(a, c), w)
        t = g.tanh(h)
        return g.where(g.gt(h, d), g.mul(t, h), g.sub(h, 0.5))

    cases = [(body([DType.F32] * 3, [x.shape, b.shape, ()], fn), [x, b, s])]
    pairs = run_cases(cases)
    assert pairs[0][0].shape == (3, 4, 5)
    check(pairs, ["dag"])


def test_in_place_output_and_threads() -> None:
    """Output aliasing its input (the planner's in-place slot): no restrict, still right;
    an OpenMP team gives the same bits as one thread."""
    x = np.random.default_rng(9).normal(size=(300, 700)).astype(np.float32)
    g = body([DType.F32], [x.shape], lambda g, a: g.add(g.gelu(a), a))
    ref = evaluate(g, {"in0": x})[0]
    buf = x.copy()
    fn, arrays = codegen.render_region(g, [buf], buf)
    assert "float* restrict" not in fn.source
    cfn = kernels_region.load_function(fn)
    kernels_region.bind(cfn, arrays)()
    np.testing.assert_allclose(buf, ref, 2e-6, 1e-6)
    out1 = np.empty_like(x)
    out2 = np.empty_like(x)
    fn, arrays = codegen.render_region(g, [x], out1)
    cfn = kernels_region.load_function(fn)
    cfn(*[a.ctypes.data for a in arrays], 1)
    cfn(*[a.ctypes.data for a in arrays[:-1]], out2.ctypes.data, 2)
    np.testing.assert_array_equal(out1, out2)


def region_graph(
    fn: Callable[..., int], shapes: list[tuple[int, ...]], name: str = "g"
) -> rlx.Graph:
    g = rlx.Graph(name)
    ins = [g.input(f"x{k}", s) for k, s in enumerate(shapes)]
    g.set_outputs([g.elementwise_region(ins, fn)])
    return g


def compiled_entry(g: rlx.Graph) -> tuple[object, object]:
    cg = Session("cpu").compile(g, RAW)
    (entry,) = [e for e in cg._executor_any().entries if e.op == "elementwise_region"]
    return cg, entry


def test_executor_uses_native_and_shares_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []
    real = native.build
    monkeypatch.setattr(native, "build", lambda *a, **k: built.append(real(*a, **k)) or built[-1])

    def fn(g: rlx.Graph, a: int, b: int) -> int:
        return g.silu(g.add(a, b))

    rng = np.random.default_rng(10)
    feed = {
        "x0": rng.normal(size=(6, 8)).astype(np.float32),
        "x1": rng.normal(size=8).astype(np.float32),
    }
    for name in ("first", "second"):
        g = region_graph(fn, [(6, 8), (8,)], name)
        cg, entry = compiled_entry(g)
        assert entry.kind is KernelKind.NATIVE  # type: ignore[attr-defined]
        np.testing.assert_allclose(cg.run(feed)[0], evaluate(g, feed)[0], 2e-6, 1e-6)
    # the region modules only: the first compile in a process also builds the native
    # schedule's own library (already built when other tests ran first)
    regions = [p for p in built if str(getattr(p, "name", p)).startswith("region-")]
    assert len(regions) >= 2 and len(set(regions)) == 1, built


def _simple() -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    g = region_graph(lambda g, a: g.mul(g.exp(a), 2.0), [(5, 3)])
    return g, {"x0": np.linspace(-2, 2, 15, dtype=np.float32).reshape(5, 3)}


def test_fallback_without_gcc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "available", lambda: False)
    g, feed = _simple()
    cg, entry = compiled_entry(g)
    assert entry.kind is KernelKind.NUMPY  # type: ignore[attr-defined]
    assert any("gcc is not on PATH" in n for n in entry.notes)  # type: ignore[attr-defined]
    np.testing.assert_allclose(cg.run(feed)[0], evaluate(g, feed)[0], 1e-6)


def test_fallback_when_the_build_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(UNARY_C, UnaryKind.EXP, lambda a, t: f"({a[0]} @@ not C)")
    g, feed = _simple()
    cg, entry = compiled_entry(g)
    assert entry.kind is KernelKind.NUMPY  # type: ignore[attr-defined]
    assert any("native build failed" in n for n in entry.notes)  # type: ignore[attr-defined]
    np.testing.assert_allclose(cg.run(feed)[0], evaluate(g, feed)[0], 1e-6)


def test_fallback_without_a_rendering() -> None:
    g = rlx.Graph("c")
    x = g.input("x0", (4,), DType.C64)
    g.set_outputs([g.elementwise_region([x], lambda sg, a: sg.exp(a))])
    cg, entry = compiled_entry(g)
    assert entry.kind is KernelKind.NUMPY  # type: ignore[attr-defined]
    assert any("no C rendering" in n and "c64" in n for n in entry.notes)  # type: ignore[attr-defined]
    feed = {"x0": np.array([1 + 1j, 0, -1j, 2], np.complex64)}
    np.testing.assert_allclose(cg.run(feed)[0], evaluate(g, feed)[0], 1e-6)


# ---- random DAGs through the executor ---------------------------------------------------

SAFE_UNARY = [
    UnaryKind.RELU, UnaryKind.GELU, UnaryKind.GELU_TANH, UnaryKind.SILU, UnaryKind.SIGMOID,
    UnaryKind.TANH, UnaryKind.NEG, UnaryKind.ABS, UnaryKind.SIN, UnaryKind.COS,
    UnaryKind.SOFTPLUS, UnaryKind.ERF, UnaryKind.SIGN,
]  # fmt: skip
SAFE_BINARY = [BinaryKind.ADD, BinaryKind.SUB, BinaryKind.MUL, BinaryKind.MAX, BinaryKind.MIN]
OUT_DIMS = (3, 4, 5)


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[tuple[int, ...]], list[tuple[str, int, int, int]], DType]:
    """Input shapes (each broadcasting to OUT_DIMS, scalars allowed) and a program:
    (op, a, b, k) steps over earlier values."""
    dt = draw(st.sampled_from([DType.F32, DType.F64]))
    n_in = draw(st.integers(1, 3))
    shapes = []
    for _ in range(n_in):
        rank = draw(st.integers(0, 3))
        dims = tuple(d if draw(st.booleans()) else 1 for d in OUT_DIMS[3 - rank :])
        shapes.append(dims)
    shapes[0] = OUT_DIMS if draw(st.booleans()) else shapes[0]
    steps = []
    for _ in range(draw(st.integers(1, 10))):
        op = draw(st.sampled_from(["unary", "binary", "where", "cast", "const"]))
        steps.append(
            (op, draw(st.integers(0, 99)), draw(st.integers(0, 99)), draw(st.integers(0, 99)))
        )
    return shapes, steps, dt


def build_dag(
    g: rlx.Graph, ins: list[int], steps: list[tuple[str, int, int, int]], dt: DType
) -> int:
    vals = list(ins)
    for op, a, b, k in steps:
        x, y = vals[a % len(vals)], vals[b % len(vals)]
        if op == "unary":
            vals.append(g.unary(SAFE_UNARY[k % len(SAFE_UNARY)], x))
        elif op == "binary":
            vals.append(g.binary(SAFE_BINARY[k % len(SAFE_BINARY)], x, y))
        elif op == "where":  # compares read region inputs only (no ulp-sized flips)
            c = g.apply(Compare(list(CompareKind)[k % 6]), [ins[a % len(ins)], ins[b % len(ins)]])
            vals.append(g.where(c, x, y))
        elif op == "cast":  # exact round trips of region inputs through i32 / the other float
            src = ins[a % len(ins)]
            mid = DType.I32 if k % 2 else (DType.F32 if dt is DType.F64 else DType.F64)
            vals.append(g.cast(g.cast(src, mid), dt))
        else:
            vals.append(g.mul(x, float(k % 7) - 3.0))
    return vals[-1]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_dags_match_reference(case: tuple) -> None:
    shapes, steps, dt = case
    g = rlx.Graph("dag")
    ins = [g.input(f"x{k}", s, dt) for k, s in enumerate(shapes)]
    g.set_outputs([g.elementwise_region(ins, lambda sg, *xs: build_dag(sg, list(xs), steps, dt))])
    cg, entry = compiled_entry(g)
    assert entry.kind is KernelKind.NATIVE, entry.notes  # type: ignore[attr-defined]
    rng = np.random.default_rng(len(steps))
    feed = {f"x{k}": np.round(rng.normal(0, 2, s), 1).astype(dt.np) for k, s in enumerate(shapes)}
    rtol, atol = TOL[dt.np.name]
    np.testing.assert_allclose(cg.run(feed)[0], evaluate(g, feed)[0], rtol * 5, atol * 5)


def test_native_off_takes_the_numpy_kernel() -> None:
    from rlx.backends.cpu.executor import Executor
    from rlx.backends.cpu.planner import plan_memory

    g, feed = _simple()
    ex = Executor(g, plan_memory(g), {}, {}, native=False)
    (entry,) = [e for e in ex.entries if e.op == "elementwise_region"]
    assert entry.kind is KernelKind.NUMPY
    assert any("CompileOptions.native" in n for n in entry.notes)
    np.testing.assert_allclose(ex.run(feed)[0], evaluate(g, feed)[0], 1e-6)


def test_threads_from_the_context() -> None:
    """A team of ``num_threads`` from PARALLEL_MIN_WORK on (one sigmoid call per element
    weighs 1 + CALL_WEIGHT), one thread below it or when num_threads is 1."""
    from rlx.backends.cpu.executor import Executor
    from rlx.backends.cpu.planner import plan_memory

    big = kernels_region.PARALLEL_MIN_WORK // (1 + kernels_region.CALL_WEIGHT)
    for n, threads, note in (
        (big, 2, "OpenMP x2"),
        (big // 2, 2, "one C loop"),
        (big, 1, "one C loop"),
    ):
        g = region_graph(lambda g, a: g.sigmoid(g.mul(a, a)), [(n,)])
        feed = {"x0": np.random.default_rng(11).normal(size=n).astype(np.float32)}
        ex = Executor(g, plan_memory(g), {}, {}, num_threads=threads)
        (entry,) = [e for e in ex.entries if e.op == "elementwise_region"]
        assert entry.kind is KernelKind.NATIVE and entry.notes[0].endswith(note)
        np.testing.assert_allclose(ex.run(feed)[0], evaluate(g, feed)[0], 2e-6, 1e-6)


def test_shapes_of_one_pattern_share_the_source() -> None:
    """Extents and strides are arguments: a new batch size renders the same C text (one
    library for every binding); a batch of 1 collapses to another pattern."""
    g = body([DType.F32] * 2, [("b", 8), (8,)], lambda g, a, c: g.add(a, c))
    b = np.zeros(8, np.float32)

    def source(batch: int) -> str:
        x = np.zeros((batch, 8), np.float32)
        return codegen.render_region(g, [x, b], np.empty_like(x))[0].source

    assert source(3) == source(17) == source(5000)
    assert source(1) != source(3)


def test_symbolic_batch_builds_per_binding() -> None:
    g = rlx.Graph("sym")
    g.sym("batch", max=64)
    x = g.input("x0", ("batch", 8))
    b = g.input("x1", (8,))
    g.set_outputs([g.elementwise_region([x, b], lambda sg, a, c: sg.gelu_tanh(sg.add(a, c)))])
    cg = Session("cpu").compile(g, RAW)
    rng = np.random.default_rng(12)
    for batch in (3, 17):
        feed = {
            "x0": rng.normal(size=(batch, 8)).astype(np.float32),
            "x1": rng.normal(size=8).astype(np.float32),
        }
        np.testing.assert_allclose(cg.run(feed)[0], evaluate(g, feed)[0], 2e-6, 1e-6)


def test_bf16_region_through_the_executor() -> None:
    g = rlx.Graph("lowp")
    x = g.input("x0", (4, 6), DType.BF16)
    r = g.input("x1", (4, 6), DType.BF16)
    g.set_outputs([g.elementwise_region([x, r], lambda sg, a, c: sg.add(sg.silu(a), c))])
    cg, entry = compiled_entry(g)
    assert entry.kind is KernelKind.NATIVE  # type: ignore[attr-defined]
    rng = np.random.default_rng(13)
    feed = {k: rng.normal(size=(4, 6)).astype(DType.BF16.np) for k in ("x0", "x1")}
    got, ref = cg.run(feed)[0], evaluate(g, feed)[0]
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), 1e-2, 1e-2)


def test_vector_math_declarations() -> None:
    fn, _ = codegen.render_region(
        body([DType.F32], [(8,)], lambda g, a: g.tanh(a)),
        [np.zeros(8, np.float32)],
        np.zeros(8, np.float32),
    )
    assert "tanhf(" in fn.source
    assert "RLX_SIMD float tanhf(float);" in CModule((fn,), vector_math=True).source
    assert "RLX_SIMD" not in CModule((fn,)).source


@pytest.mark.parametrize("n", [60, 61, 1004])
def test_f64_round_trip_through_f32_in_the_loop_tail(n: int) -> None:
    """Regression: gcc 12.2's SLP vectoriser turned the tail's (double)(float)x into a
    copy of x (the generated code disables SLP)."""
    x = np.round(np.random.default_rng(14).normal(0, 2, n), 1)
    g = body([DType.F64], [(n,)], lambda g, a: g.cast(g.cast(a, DType.F32), DType.F64))
    check(run_cases([(g, [x])]), ["f64->f32->f64"])


def test_staged_chains_of_math_calls() -> None:
    """Two or more math calls on one path split the loop into stages over blocks; values
    cross stages through block temporaries (the output here comes from stage 1 of 3)."""
    rng = np.random.default_rng(15)
    x = rng.normal(size=(3, 700)).astype(np.float32)
    b = rng.normal(size=700).astype(np.float32)

    def fn(g: rlx.Graph, a: int, c: int) -> int:
        h = g.tanh(g.add(a, c))
        k = g.exp(g.sin(h))
        return g.where(g.gt(a, c), g.mul(h, k), g.sub(h, c))

    g = body([DType.F32] * 2, [x.shape, b.shape], fn)
    fn_, _ = codegen.render_region(g, [x, b], np.empty_like(x))
    assert fn_.source.count("#pragma omp simd") == 3 and "[j - jb]" in fn_.source
    check(run_cases([(g, [x, b])]), ["staged"])


def test_wide_body_beyond_the_temporary_cap_stays_one_loop() -> None:
    n = codegen.MAX_TEMPS + 2
    x = np.random.default_rng(16).normal(size=(2, 40)).astype(np.float32)

    def fn(g: rlx.Graph, a: int) -> int:
        firsts = [g.tanh(g.mul(a, 0.01 * (k + 1))) for k in range(n)]
        acc = g.sin(firsts[0])
        for f in firsts[1:]:
            acc = g.add(acc, f)
        return g.mul(acc, g.exp(firsts[0]))

    g = body([DType.F32], [x.shape], fn)
    fn_, _ = codegen.render_region(g, [x], np.empty_like(x))
    assert "[j - jb]" not in fn_.source
    check(run_cases([(g, [x])]), ["wide"])


# ---- the sigmoid family: branch-free helpers ---------------------------------------------

SIGMOID_FAMILY = [UnaryKind.SIGMOID, UnaryKind.SILU, UnaryKind.SOFTPLUS]
EXTREME = [0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 17.0, -17.0, 87.5, -87.5, 88.0, -88.0]
EXTREME += [89.0, -89.0, 104.0, -104.0, 709.0, -709.0, 746.0, -746.0, 1e4, -1e4, 3e38, -3e38]
EXTREME += [np.inf, -np.inf, np.nan]


def ulps(got: np.ndarray, want: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """|got - want| in units in the last place of max(|want|, |scale|); equal values and
    NaN against NaN: 0."""
    with np.errstate(all="ignore"):
        ref = np.maximum(np.abs(want), np.abs(scale)).astype(want.dtype)
        d = np.abs(got.astype(np.float64) - want.astype(np.float64)) / np.spacing(ref)
    d[(np.isnan(got) & np.isnan(want)) | (got == want)] = 0
    return d


@pytest.mark.parametrize("dt", [DType.F32, DType.F64])
def test_sigmoid_family_extreme_inputs_in_ulps(dt: DType) -> None:
    """sigmoid / silu / softplus against the reference's stable formulas at 0, the tails
    (exp(-|x|) subnormal or 0 in f32 and f64), +-inf and NaN: at most 4 ulps (libmvec's
    bound). silu = x * sigmoid(x) scales an ulp of a subnormal sigmoid by |x|, in the
    reference too: its ulps there are those of x times the smallest normal number."""
    rng = np.random.default_rng(17)
    x = np.concatenate([EXTREME, rng.normal(0, 30, 300), rng.uniform(-800, 800, 200)])
    x = x.astype(dt.np)
    pairs = run_cases(
        [(body([dt], [x.shape], lambda g, a, k=k: g.unary(k, a)), [x]) for k in SIGMOID_FAMILY]
    )
    tiny = np.finfo(dt.np).tiny
    for k, (got, want) in zip(SIGMOID_FAMILY, pairs, strict=True):
        assert np.array_equal(np.isnan(got), np.isnan(want)), k
        scale = x * tiny if k is UnaryKind.SILU else np.zeros_like(x)
        assert np.max(ulps(got, want, scale)) <= 4, k
    sig, silu, softplus = (got for got, _ in pairs)
    assert np.all(sig[x == np.inf] == 1) and np.all(sig[x == -np.inf] == 0)
    assert np.all(softplus[x == np.inf] == np.inf) and np.all(softplus[x == -np.inf] == 0)
    assert np.isnan(silu[x == -np.inf]).all()  # -inf * 0, as in the reference


@pytest.mark.skipif(
    not kernels_region.vector_math_available(), reason="no libmvec with SIMD math here"
)
@pytest.mark.parametrize("kind", SIGMOID_FAMILY, ids=lambda k: k.value)
def test_sigmoid_family_regions_call_vector_math(kind: UnaryKind) -> None:
    """The prelude's sigmoid / softplus select on bits, not with a branch, so gcc
    vectorises a region's loop: the built library imports libmvec's SIMD expf."""
    x = np.zeros((4, 64), np.float32)
    g = body([DType.F32], [x.shape], lambda g, a: g.unary(kind, a))
    fn, _ = codegen.render_region(g, [x], np.empty_like(x))
    lib = native.build(CModule((fn,), vector_math=True).source, native.Isa.PLAIN, "region")
    text = lib.read_bytes()
    # libmvec's AVX-512, AVX2, SSE or AdvSIMD expf, by the target
    assert any(v in text for v in SIMD_EXPF)
