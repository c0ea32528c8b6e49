"""Native row kernels (codegen/rows.py + engines/rows.py) vs the reference interpreter.

Softmax / log-softmax / layer norm / RMS norm / residual norms go through Session.compile
(fusion off, so each node is the op under test) and are compared with ``evaluate``.
Tolerances: f64 rtol 1e-12; f32 rtol 1e-5 (libmvec expf and lane-wise f32 sums vs
NumPy's pairwise sums); f16 / bf16 one ulp of the type (both sides round once from f32).
The matmul epilogue is also checked directly, in ulps, against the Unary reference.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.codegen.elementwise import C_TYPES, UNARY_C, CModule
from rlx.backends.cpu.codegen.rows import RowKind, RowSpec, render_rows
from rlx.backends.cpu.engines import region as kernels_region
from rlx.backends.cpu.engines.rows import row_kernel
from rlx.backends.cpu.kernels import KernelCtx, KernelKind, ScratchPool, load_kernels
from rlx.dtype import DType
from rlx.ir.mir import Node
from rlx.ops.base import RefCtx
from rlx.ops.elementwise import Unary, UnaryKind
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

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
TOL = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 2e-6),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1e-2, 1e-2),
}
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), F16, BF16]

Build = Callable[..., int]


def opts(native_on: bool = True, threads: int = 1) -> CompileOptions:
    return CompileOptions(
        optimize=False, fuse=False, use_cache=False, native=native_on, num_threads=threads
    )


def run_op(
    build: Build,
    arrays: list[np.ndarray],
    options: CompileOptions | None = None,
) -> tuple[np.ndarray, np.ndarray, list]:
    """Compile ``build(g, *inputs)`` over ``arrays``; returns (compiled output, reference
    output, the report's records of the op under test)."""
    g = rlx.Graph("rows")
    ins = [
        g.input(f"in{i}", a.shape, dtype=DType.from_numpy(a.dtype)) for i, a in enumerate(arrays)
    ]
    g.set_outputs([build(g, *ins)])
    feeds = {f"in{i}": a for i, a in enumerate(arrays)}
    cg = Session("cpu").compile(g, options or opts())
    got = cg.run(feeds)[0]
    want = g.evaluate(feeds)[0]
    recs = [k for k in cg.report().kernels if k.node == g.outputs[0]]
    return got, want, recs


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    rtol, atol = TOL[got.dtype.name]
    np.testing.assert_allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True
    )


OPS: dict[str, tuple[int, int, Build]] = {
    # name: (row inputs, column inputs, builder(g, *ins, eps))
    "softmax": (1, 0, lambda g, x, eps: g.softmax(x)),
    "log_softmax": (1, 0, lambda g, x, eps: g.log_softmax(x)),
    "layer_norm": (1, 1, lambda g, x, ga, eps: g.layer_norm(x, ga, eps=eps)),
    "layer_norm_beta": (1, 2, lambda g, x, ga, b, eps: g.layer_norm(x, ga, b, eps=eps)),
    "rms_norm": (1, 1, lambda g, x, ga, eps: g.rms_norm(x, ga, eps=eps)),
    "rms_norm_beta": (1, 2, lambda g, x, ga, b, eps: g.rms_norm(x, ga, b, eps=eps)),
    "residual_ln": (
        2,
        1,
        lambda g, x, r, ga, eps: g.fused_residual_layer_norm(x, r, ga, eps=eps),
    ),
    "residual_ln_beta": (
        2,
        2,
        lambda g, x, r, ga, b, eps: g.fused_residual_layer_norm(x, r, ga, b, eps=eps),
    ),
    "residual_rms": (2, 1, lambda g, x, r, ga, eps: g.fused_residual_rms_norm(x, r, ga, eps=eps)),
    "residual_rms_beta": (
        2,
        2,
        lambda g, x, r, ga, b, eps: g.fused_residual_rms_norm(x, r, ga, b, eps=eps),
    ),
}


def make_inputs(
    name: str, dims: tuple[int, ...], dtype: np.dtype, scale: float, seed: int
) -> list[np.ndarray]:
    nrow, ncol, _ = OPS[name]
    rng = np.random.default_rng(seed)
    rows = [(rng.standard_normal(dims) * scale).astype(dtype) for _ in range(nrow)]
    cols = [(rng.standard_normal(dims[-1]) + 0.5).astype(dtype) for _ in range(ncol)]
    return rows + cols


@settings(max_examples=60)
@given(
    name=st.sampled_from(sorted(OPS)),
    lead=st.lists(st.integers(1, 5), min_size=0, max_size=2),
    n=st.sampled_from([1, 2, 3, 7, 16, 33, 130, 385]),
    dtype=st.sampled_from(DTYPES),
    eps=st.sampled_from([1e-12, 1e-6, 1e-5, 1e-3, 0.5]),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_row_ops_match_reference(
    name: str, lead: list[int], n: int, dtype: np.dtype, eps: float, scale: float, seed: int
) -> None:
    dims = (*lead, n)
    arrays = make_inputs(name, dims, dtype, scale, seed)
    build = OPS[name][2]
    got, want, recs = run_op(lambda g, *ins: build(g, *ins, eps), arrays)
    assert recs[0].kind is KernelKind.NATIVE, recs[0].notes
    assert_close(got, want)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(OPS))
def test_output_may_alias_the_row_input(name: str, dtype: np.dtype) -> None:
    """The planner may give the output the input's slot: each pass reads an element
    before it writes it, so the kernel is correct in place."""
    arrays = make_inputs(name, (6, 45), dtype, 1.0, 8)
    g = rlx.Graph("alias")
    ins = [
        g.input(f"in{i}", a.shape, dtype=DType.from_numpy(a.dtype)) for i, a in enumerate(arrays)
    ]
    g.set_outputs([OPS[name][2](g, *ins, 1e-5)])
    want = g.evaluate({f"in{i}": a for i, a in enumerate(arrays)})[0]
    node = g.nodes[g.outputs[0]]
    views = [a.copy() for a in arrays]
    ctx = KernelCtx(node, g, {}, {}, {}, ScratchPool(), num_threads=1)
    fn = load_kernels()[type(node.op)](node, views, views[0], ctx)
    assert fn is not None and ctx.kind is KernelKind.NATIVE
    fn()
    assert_close(views[0], want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_large_values_are_stable(name: str, dtype: np.dtype) -> None:
    big = {"float16": 6e4, "bfloat16": 1e38, "float32": 1e38, "float64": 1e300}[dtype.name]
    x = np.array([[big, big / 2, -big, 0.0], [1.0, 1.0, 1.0, 1.0], [-big, -big, -big, -big]])
    got, want, recs = run_op(lambda g, a: OPS[name][2](g, a, 0.0), [x.astype(dtype)])
    assert recs[0].kind is KernelKind.NATIVE
    # softmax of finite inputs is finite (log-softmax may overflow to -inf in f16)
    finite = got.astype(np.float64)[:2] if name == "softmax" else got.astype(np.float64)[1]
    assert np.all(np.isfinite(finite))
    assert_close(got, want)


def test_softmax_special_values_follow_reference() -> None:
    inf, nan = np.inf, np.nan
    x = np.array(
        [[inf, 1.0, 2.0], [-inf, -inf, -inf], [nan, 1.0, 2.0], [-inf, 0.0, 1.0]], np.float32
    )
    for name in ("softmax", "log_softmax"):
        with np.errstate(all="ignore"):
            got, want, _ = run_op(lambda g, a, n=name: OPS[n][2](g, a, 0.0), [x])
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_two_threads_give_the_single_thread_bits() -> None:
    x = np.random.default_rng(1).standard_normal((512, 2048)).astype(np.float32)
    g1, _, r1 = run_op(lambda g, a: g.softmax(a), [x], opts(threads=1))
    g2, want, r2 = run_op(lambda g, a: g.softmax(a), [x], opts(threads=2))
    assert "OpenMP x2" in r2[0].notes[-1] and "OpenMP" not in r1[0].notes[-1]
    np.testing.assert_array_equal(g1, g2)
    assert_close(g2, want)


@pytest.mark.parametrize("name", ["softmax", "layer_norm_beta", "residual_rms_beta"])
def test_native_off_takes_the_numpy_kernel(name: str) -> None:
    arrays = make_inputs(name, (3, 9), np.dtype(np.float32), 1.0, 0)
    got, want, recs = run_op(
        lambda g, *ins: OPS[name][2](g, *ins, 1e-5), arrays, opts(native_on=False)
    )
    assert recs[0].kind is KernelKind.NUMPY
    assert any("CompileOptions.native" in s for s in recs[0].notes)
    assert_close(got, want)


def test_softmax_over_another_axis_falls_back() -> None:
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    got, want, recs = run_op(lambda g, a: g.softmax(a, axis=0), [x])
    assert recs[0].kind is KernelKind.NUMPY
    assert "not the last" in recs[0].notes[-1]
    assert_close(got, want)


def test_broadcast_residual_falls_back() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    r = rng.standard_normal((8,)).astype(np.float32)
    ga = rng.standard_normal((8,)).astype(np.float32)
    got, want, recs = run_op(lambda g, a, b, c: g.fused_residual_layer_norm(a, b, c), [x, r, ga])
    assert recs[0].kind is KernelKind.NUMPY
    assert_close(got, want)


# ---- matmul epilogue -------------------------------------------------------------------

FLOAT_ACTS = [k for k in UnaryKind if k is not UnaryKind.NOT and k in UNARY_C]


def ulps(got: np.ndarray, want: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """Distance in units in the last place of ``want`` (of ``scale`` when given: the
    magnitude of a cancelling formula's terms); NaN against NaN: 0."""
    both_nan = np.isnan(got) & np.isnan(want)
    ref = np.abs(want) if scale is None else np.maximum(np.abs(want), np.abs(scale))
    with np.errstate(all="ignore"):
        d = np.abs(got.astype(np.float64) - want.astype(np.float64)) / np.spacing(ref).astype(
            np.float64
        )
    d[both_nan | (got == want)] = 0
    return d


def epilogue_ctx(y: np.ndarray) -> KernelCtx:
    g = rlx.Graph("epi")
    node = Node(0, Unary(UnaryKind.RELU), (), None)  # type: ignore[arg-type]
    return KernelCtx(node, g, {}, {}, {}, ScratchPool(), num_threads=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("act", FLOAT_ACTS, ids=lambda k: k.value)
def test_epilogue_matches_unary_reference_in_ulps(act: UnaryKind, dtype: type) -> None:
    rng = np.random.default_rng(4)
    y0 = (rng.standard_normal((5, 67)) * 4).astype(dtype)
    y0[0, :8] = [0.0, -0.0, 1e-30, -1e-30, 60.0, -60.0, 9.5, -9.5]
    bias = rng.standard_normal(67).astype(dtype)
    y = y0.copy()
    spec = RowSpec(RowKind.BIAS_ACT, C_TYPES[DType.from_numpy(np.dtype(dtype))], beta=True, act=act)
    row_kernel(spec, [y], [bias], 0.0, epilogue_ctx(y))()
    with np.errstate(all="ignore"):
        s = y0 + bias
        want = Unary(act).reference([s], RefCtx(s.shape, s.dtype, {}, {}, {})).astype(dtype)
    limit = 4 if act in (UnaryKind.GELU, UnaryKind.ERF) else 8
    # gelu's 0.5 * x * (1 + erf(x / sqrt 2)) cancels for x << 0 (in the reference too):
    # its error is measured against the magnitude of x
    gelus = (UnaryKind.GELU, UnaryKind.GELU_TANH)
    assert np.max(ulps(y, want, s if act in gelus else None)) <= limit


@pytest.mark.parametrize("act", [None, UnaryKind.GELU, UnaryKind.RELU, UnaryKind.SILU])
@pytest.mark.parametrize("has_bias", [True, False])
def test_fused_matmul_epilogue_through_session(act: UnaryKind | None, has_bias: bool) -> None:
    rng = np.random.default_rng(5)
    arrays = [
        rng.standard_normal((6, 32)).astype(np.float32),
        rng.standard_normal((32, 40)).astype(np.float32) / 4,
    ]
    if has_bias:
        arrays.append(rng.standard_normal(40).astype(np.float32))

    def build(g: rlx.Graph, x: int, w: int, b: int | None = None) -> int:
        return g.fused_matmul_bias_act(x, w, b, act)

    got, want, recs = run_op(build, arrays)
    plain = act is None and not has_bias
    assert recs[0].kind is (KernelKind.BLAS if plain else KernelKind.NATIVE)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    off, _, recs_off = run_op(build, arrays, opts(native_on=False))
    assert recs_off[0].kind is KernelKind.BLAS
    np.testing.assert_allclose(off, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=30)
@given(
    m=st.integers(1, 9),
    k=st.integers(1, 40),
    n=st.integers(1, 70),
    act=st.sampled_from([None, *FLOAT_ACTS]),
    dtype=st.sampled_from([np.dtype(np.float32), np.dtype(np.float64)]),
    seed=st.integers(0, 2**16),
)
def test_fused_matmul_epilogue_shapes(
    m: int, k: int, n: int, act: UnaryKind | None, dtype: np.dtype, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    arrays = [
        rng.standard_normal((m, k)).astype(dtype),
        (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype),
        rng.standard_normal(n).astype(dtype),
    ]
    with np.errstate(all="ignore"):
        got, want, recs = run_op(lambda g, x, w, b: g.fused_matmul_bias_act(x, w, b, act), arrays)
    assert recs[0].kind is KernelKind.NATIVE, recs[0].notes
    rtol, atol = (1e-12, 1e-12) if dtype == np.float64 else (2e-5, 2e-5)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("dims", [(1, 1, 1), (2, 3, 8, 6), (7, 64, 96)], ids=str)
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64), F16], ids=str)
def test_fused_swiglu(dims: tuple[int, ...], dtype: np.dtype) -> None:
    *lead, k, n = dims
    rng = np.random.default_rng(9)
    arrays = [
        rng.standard_normal((*lead, k)).astype(dtype),
        (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype),
        (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype),
    ]

    def build(g: rlx.Graph, x: int, wg: int, wu: int) -> int:
        return g.fused_swiglu(x, wg, wu)

    got, want, recs = run_op(build, arrays)
    lowp_dt = dtype == F16
    assert recs[0].kind is (KernelKind.BLAS if lowp_dt else KernelKind.NATIVE), recs[0].notes
    assert_close(got, want)
    off, _, recs_off = run_op(build, arrays, opts(native_on=False))
    assert recs_off[0].kind is KernelKind.BLAS
    assert_close(off, want)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
def test_fused_matmul_low_precision(dtype: np.dtype) -> None:
    rng = np.random.default_rng(6)
    arrays = [
        rng.standard_normal((4, 16)).astype(dtype),
        (rng.standard_normal((16, 24)) / 4).astype(dtype),
        rng.standard_normal(24).astype(dtype),
    ]
    got, want, recs = run_op(
        lambda g, x, w, b: g.fused_matmul_bias_act(x, w, b, UnaryKind.GELU), arrays
    )
    assert recs[0].kind is KernelKind.NATIVE
    assert_close(got, want)


def test_row_function_text_depends_only_on_the_variant() -> None:
    f32 = C_TYPES[DType.F32]
    a = render_rows(RowSpec(RowKind.LAYER_NORM, f32, residual=True, beta=True))
    b = render_rows(RowSpec(RowKind.LAYER_NORM, f32, residual=True, beta=True))
    c = render_rows(RowSpec(RowKind.LAYER_NORM, f32, residual=False, beta=True))
    assert a == b and a.source != c.source
    assert a.num_pointers == 7 and c.num_pointers == 6
    assert render_rows(RowSpec(RowKind.SOFTMAX, f32)).calls == 1


# ---- attention's softmax ---------------------------------------------------------------

ATTN_MASKS = {
    "none": (rlx.ops.nn.MaskKind.none(), False),
    "causal": (rlx.ops.nn.MaskKind.causal(), False),
    "window": (rlx.ops.nn.MaskKind.sliding_window(2), False),
    "custom": (rlx.ops.nn.MaskKind.custom(), True),
}


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64), BF16], ids=str)
@pytest.mark.parametrize("mask", sorted(ATTN_MASKS))
def test_attention_native_softmax(mask: str, dtype: np.dtype) -> None:
    kind, custom = ATTN_MASKS[mask]
    rng = np.random.default_rng(7)
    h, d, hkv, sq, skv = 4, 8, 2, 3, 5
    arrays = [
        rng.standard_normal((2, sq, h * d)).astype(dtype),
        rng.standard_normal((2, skv, hkv * d)).astype(dtype),
        rng.standard_normal((2, skv, hkv * d)).astype(dtype),
    ]
    if custom:  # query 1 sees no key at all: its output is 0 (the 'safe' row softmax)
        m = rng.standard_normal((1, 1, sq, skv))
        m[..., 1, :] = -np.inf
        arrays.append(m.astype(dtype))

    def build(g: rlx.Graph, q: int, k: int, v: int, m: int | None = None) -> int:
        return g.attention(q, k, v, h, d, mask=kind, mask_input=m, num_kv_heads=hkv)

    got, want, recs = run_op(build, arrays)
    # f32 / bf16 take the fused native attention kernel (tests/cpu/kernels/test_nn.py),
    # f64 the BLAS kernel with the native softmax
    native_note = "native: softmax" if dtype == np.float64 else "native attention"
    assert any(s.startswith(native_note) for s in recs[0].notes), recs[0].notes
    off, _, recs_off = run_op(build, arrays, opts(native_on=False))
    assert not any(s.startswith("native: softmax") for s in recs_off[0].notes)
    if custom:
        assert (got[:, 1] == 0).all() and (off[:, 1] == 0).all()
    for x in (got, off):
        assert_close(x, want)


@pytest.mark.skipif(
    not kernels_region.vector_math_available(), reason="no libmvec with SIMD math here"
)
@pytest.mark.parametrize("act", [UnaryKind.SILU, UnaryKind.SIGMOID, UnaryKind.SOFTPLUS])
def test_epilogue_activations_call_vector_math(act: UnaryKind) -> None:
    """The branch-free sigmoid / softplus helpers let gcc vectorise the loop: the built
    library imports libmvec's SIMD variants (``_ZGV...``), not only scalar libm."""
    fn = render_rows(RowSpec(RowKind.BIAS_ACT, C_TYPES[DType.F32], beta=True, act=act))
    source = CModule((fn,), vector_math=True).source
    lib = native.build(source, native.Isa.PLAIN, "region")
    text = lib.read_bytes()  # libmvec's AVX-512, AVX2, SSE or AdvSIMD expf, by the target
    assert any(v in text for v in SIMD_EXPF)


EXTREME = [0.0, -0.0, 1e-30, -1e-30, 17.0, -17.0, 87.5, -87.5, 88.0, -88.0, 89.0, -89.0]
EXTREME += [104.0, -104.0, 709.0, -709.0, 746.0, -746.0, 1e4, -1e4, np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("act", [UnaryKind.SIGMOID, UnaryKind.SILU, UnaryKind.SOFTPLUS])
def test_epilogue_sigmoid_family_extreme_inputs(act: UnaryKind, dtype: type) -> None:
    """The shared branch-free helpers at the tails, +-inf and NaN: at most 4 ulps of the
    stable reference (silu: ulps of x times the smallest normal where its sigmoid is
    subnormal, in the reference too)."""
    x = np.array(EXTREME * 3, dtype).reshape(3, -1)
    y = x.copy()
    spec = RowSpec(RowKind.BIAS_ACT, C_TYPES[DType.from_numpy(np.dtype(dtype))], act=act)
    row_kernel(spec, [y], [], 0.0, epilogue_ctx(y))()
    with np.errstate(all="ignore"):
        want = Unary(act).reference([x], RefCtx(x.shape, x.dtype, {}, {}, {})).astype(dtype)
    assert np.array_equal(np.isnan(y), np.isnan(want))
    scale = x * np.finfo(dtype).tiny if act is UnaryKind.SILU else None
    assert np.max(ulps(y, want, scale)) <= 4
