"""The bf16 GEMM's AMX tiles and its fused bias + activation write-out
(rlx/backends/cpu/native/csrc/lowp_gemm.c through kernels.lowp_lib): shapes whose K is a
multiple of 32 (AMX rows, when the CPU has amx_bf16, plus the vdpbf16ps tail rows) against
float64 within the f32-accumulation bound; the epilogue against NumPy rounding of the same
product; FusedMatMulBiasAct through Session bit for bit against the reference interpreter
on inputs whose f32 sums are exact."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx.backends.cpu import native
from rlx.backends.cpu.engines import lowp_gemm as klg
from rlx.backends.cpu.engines import lowp_lib as kl
from rlx.dtype import DType
from rlx.errors import InputError
from rlx.ir.mir import Graph
from rlx.ops.elementwise import UnaryKind
from rlx.ops.fused import FusedMatMulBiasAct
from rlx.options import CompileOptions
from rlx.passes.precision import PrecisionPolicy
from rlx.runtime.session import Session

BF16 = np.dtype(ml_dtypes.bfloat16)
HAS_DPBF16 = native.available() and native.target_spec(native.selected_target()).bf16
needs_dpbf16 = pytest.mark.skipif(not HAS_DPBF16, reason="CPU or target without avx512_bf16")
OPTS = CompileOptions(use_cache=False, verbose=False)


def _bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a| @ |b| * (K + 1) * 2^-24: the worst-case f32 accumulation error."""
    return (
        (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) * (a.shape[1] + 1) * 2.0**-24
    )


def _packed(lib: kl.LowpLib, b: np.ndarray) -> np.ndarray:
    out = np.empty(lib.packed_size(*b.shape), np.uint16)
    lib.pack_b(b, out, 2)
    return out


@needs_dpbf16
@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 80),
    k32=st.integers(1, 5),
    n=st.integers(1, 70),
    threads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_gemm_with_k_multiple_of_32_within_bound(
    m: int, k32: int, n: int, threads: int, seed: int
) -> None:
    lib = kl.lowp_lib()
    rng = np.random.default_rng(seed)
    k = 32 * k32
    big = rng.standard_normal((m + 1, k + 7)).astype(BF16)
    a = big[1:, 3 : 3 + k]  # strided rows
    b = rng.standard_normal((k, n)).astype(BF16)
    packed = _packed(lib, b)
    out = np.full((m, n + 5), np.nan, np.float32)[:, :n]
    lib.gemm(a, packed, out, threads)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(out - ref) <= _bound(a, b))
    out16 = np.empty((m, n), BF16)
    lib.gemm(a, packed, out16, 1)
    np.testing.assert_array_equal(out16.view(np.uint16), out.astype(BF16).view(np.uint16))


@needs_dpbf16
def test_amx_result_does_not_depend_on_threads() -> None:
    lib = kl.lowp_lib()
    rng = np.random.default_rng(5)
    a = rng.standard_normal((301, 256)).astype(BF16)
    b = rng.standard_normal((256, 100)).astype(BF16)
    packed = _packed(lib, b)
    outs = []
    for threads in (1, 2, 3):
        out = np.empty((301, 100), np.float32)
        lib.gemm(a, packed, out, threads)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


@needs_dpbf16
@pytest.mark.parametrize("k", [64, 40])  # AMX rows + tail / vdpbf16ps only
@pytest.mark.parametrize("act", [None, UnaryKind.GELU])
@pytest.mark.parametrize("with_bias", [True, False])
def test_gemm_epilogue_rounds_like_numpy(k: int, act: UnaryKind | None, with_bias: bool) -> None:
    lib = kl.lowp_lib()
    rng = np.random.default_rng(k)
    m, n = 53, 70
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((k, n)).astype(BF16)
    bias = (rng.standard_normal(n) * 4).astype(np.float32)
    bias[:3] = [np.inf, -np.inf, np.nan]
    packed = _packed(lib, b)
    prod = np.empty((m, n), np.float32)
    lib.gemm(a, packed, prod, 1)
    want = prod.astype(BF16)
    if with_bias:
        want = (want.astype(np.float32) + bias).astype(BF16)
    table = klg.activation_table(act, BF16) if act is not None else None
    if table is not None:
        want = table[want.view(np.uint16)].view(BF16)
    for threads in (1, 2):
        got = np.empty((m, n), BF16)
        lib.gemm(a, packed, got, threads, bias if with_bias else None, table)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@needs_dpbf16
def test_gemm_epilogue_checks_its_arguments() -> None:
    lib = kl.lowp_lib()
    a = np.zeros((4, 32), BF16)
    packed = _packed(lib, np.zeros((32, 8), BF16))
    with pytest.raises(InputError, match="bf16 out"):
        lib.gemm(a, packed, np.empty((4, 8), np.float32), bias=np.zeros(8, np.float32))
    with pytest.raises(InputError, match=r"bias f32 \[8\]"):
        lib.gemm(a, packed, np.empty((4, 8), BF16), bias=np.zeros(7, np.float32))
    with pytest.raises(InputError, match="act_table uint16"):
        lib.gemm(a, packed, np.empty((4, 8), BF16), act_table=np.zeros(10, np.uint16))


def _exact_inputs(rng: np.random.Generator, m: int, k: int, n: int) -> tuple[np.ndarray, ...]:
    """small integers (x) and quarters (w): every f32 partial sum is exact, so the
    product does not depend on the order of accumulation"""
    xv = rng.integers(-3, 4, (m, k)).astype(BF16)
    wv = (rng.integers(-3, 4, (k, n)) / 4).astype(BF16)
    bv = (rng.standard_normal(n) * 3).astype(BF16)
    return xv, wv, bv


@needs_dpbf16
@pytest.mark.parametrize("act", [None, UnaryKind.GELU])
@pytest.mark.parametrize("bias", ["constant", "input", "param"])
def test_fused_matmul_through_session_is_bit_exact(act: UnaryKind | None, bias: str) -> None:
    rng = np.random.default_rng(21)
    xv, wv, bv = _exact_inputs(rng, 53, 96, 70)
    g = Graph("fused_amx")
    x = g.input("x", xv.shape, DType.BF16)
    b = {
        "constant": lambda: g.constant(bv),
        "input": lambda: g.input("b", bv.shape, DType.BF16),
        "param": lambda: g.param("b", bv.shape, DType.BF16),
    }[bias]()
    g.set_outputs([g.apply(FusedMatMulBiasAct(act, True), [x, g.constant(wv), b])])
    ins = {"x": xv, "b": bv} if bias == "input" else {"x": xv}
    ps = {"b": bv} if bias == "param" else {}
    want = g.evaluate(ins, ps)[0]
    for threads in (1, 2):
        opts = OPTS.replace(optimize=False, fuse=False, num_threads=threads)
        cg = Session("cpu").compile(g, opts, params=ps)
        for _ in range(2):  # the second run reuses the widened bias
            got = cg.run(ins)[0]
            np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
        (entry,) = [e for e in cg.report().kernels if e.op == "fused_matmul_bias_act"]
        assert entry.kind.value == "native"
    if bias == "param":
        bv2 = (bv.astype(np.float32) - 1).astype(BF16)
        cg.set_param("b", bv2)
        want2 = g.evaluate(ins, {"b": bv2})[0]
        np.testing.assert_array_equal(cg.run(ins)[0].view(np.uint16), want2.view(np.uint16))


@needs_dpbf16
def test_amp_mlp_with_gelu_matches_reference_on_exact_inputs() -> None:
    rng = np.random.default_rng(4)
    xv = rng.integers(-2, 3, (48, 64)).astype(np.float32)
    w1 = (rng.integers(-2, 3, (64, 96)) / 8).astype(np.float32)
    b1 = (rng.standard_normal(96)).astype(BF16).astype(np.float32)
    g = Graph("mlp")
    x = g.input("x", xv.shape)
    h = g.gelu(g.add(g.matmul(x, g.constant(w1)), g.constant(b1)))
    g.set_outputs([h])
    cg = Session("cpu").compile(g, OPTS.replace(precision=PrecisionPolicy.AutoMixedBf16))
    got = cg.run({"x": xv})[0]
    ref = g.evaluate({"x": xv}, {})[0]
    assert np.max(np.abs(got - ref)) <= 2.0**-7 * np.max(np.abs(ref)) + 2.0**-8
    assert any(e.op == "fused_matmul_bias_act" and e.dtype == "bf16" for e in cg.report().kernels)


@needs_dpbf16
@pytest.mark.parametrize("k", [64, 40])
def test_report_names_the_bf16_instructions_that_ran(k):
    """The kernel note and the report's native summary say AMX or vdpbf16ps, as run."""
    g = Graph("amx_note")
    x = g.input("x", (32, k))
    w = g.param("w", (k, 48))
    g.set_outputs([g.matmul(x, w)])
    opts = CompileOptions(precision=PrecisionPolicy.AutoMixedBf16, use_cache=False)
    c = Session("cpu").compile(g, opts, params={"w": np.ones((k, 48), np.float32)})
    c.run({"x": np.ones((32, k), np.float32)})
    text = str(c.report())
    lib = kl.lowp_lib()
    if lib.has_amx and k % 32 == 0:
        want = "AMX tiles"
    elif lib.has_amx:
        want = f"vdpbf16ps: K={k} is not a multiple of 32 for AMX"
    else:
        want = "(vdpbf16ps)"
    (summary,) = [line for line in text.splitlines() if "bfloat16 GEMM:" in line]
    assert want in summary  # the native summary line
    assert sum(want in line for line in text.splitlines()) >= 2  # and the kernel's note
