"""KernelCtx.num_threads / KernelCtx.native: CompileOptions reach the quantized kernels.
native=False runs QMatMul and Quantize on their NumPy paths with the same exact results;
the int8 GEMM gets the compile's thread count, not the process's BLAS setting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx import config
from rlx.backends.cpu import native, threads
from rlx.backends.cpu.executor import Executor
from rlx.backends.cpu.kernels import KernelCtx, KernelKind, ScratchPool
from rlx.backends.cpu.program import compile_program
from rlx.dtype import DType
from rlx.errors import CompileError
from rlx.ops.quant import QMatMul, Quantize
from rlx.options import CompileOptions

RNG = np.random.default_rng(0)
K, N = 48, 20
W_Q = RNG.integers(-128, 128, (K, N)).astype(np.int8)
BIAS = RNG.standard_normal(N).astype(np.float32)


def quantized_linear(dtype: DType = DType.I8, zp: int = 3) -> rlx.Graph:
    """f32 x -> quantize (per tensor) -> qmatmul with a constant int8 weight and a bias."""
    g = rlx.Graph("qlinear")
    x = g.input("x", (2, 7, K))
    xq = g.quantize(x, (0.03,), (zp,), dtype=dtype)
    w = g.constant(W_Q)
    b = g.param("b", (N,))
    y = g.qmatmul(xq, w, x_scale=0.03, w_scales=np.linspace(0.01, 0.05, N), x_zero_point=zp, bias=b)
    g.set_outputs([y, xq])
    return g


def compile_(g: rlx.Graph, **opts) -> rlx.runtime.compiled.CompiledGraph:
    return rlx.Session("cpu").compile(
        g, CompileOptions(use_cache=False, **opts), params={"b": BIAS}
    )


def kinds(c: rlx.runtime.compiled.CompiledGraph) -> dict[str, tuple[KernelKind, tuple[str, ...]]]:
    return {k.op: (k.kind, k.notes) for k in c.report().kernels if k.op in ("qmatmul", "quantize")}


@pytest.mark.parametrize(("dtype", "zp"), [(DType.I8, 3), (DType.U8, 131)])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), spread=st.floats(0.1, 8.0))
def test_native_off_gives_the_same_exact_result(dtype: DType, zp: int, seed: int, spread: float):
    g = quantized_linear(dtype, zp)
    x = (np.random.default_rng(seed).standard_normal((2, 7, K)) * spread).astype(np.float32)
    want = g.evaluate({"x": x}, {"b": BIAS})
    off = compile_(g, native=False).run({"x": x})
    for got, ref in zip(off, want, strict=True):
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(got, ref)
    if native.available():
        on = compile_(g).run({"x": x})
        for a, b in zip(on, off, strict=True):
            np.testing.assert_array_equal(a, b)


def test_native_off_takes_the_numpy_paths_and_says_so():
    g = quantized_linear()
    assert g.find(QMatMul) and g.find(Quantize)
    off = kinds(compile_(g, native=False))
    assert off["qmatmul"][0] is KernelKind.BLAS
    assert any("CompileOptions.native=False" in note for note in off["qmatmul"][1])
    assert off["quantize"][0] is KernelKind.NUMPY
    if native.available():
        on = kinds(compile_(g))
        assert on["qmatmul"] == (KernelKind.NATIVE, ())
        assert on["quantize"][0] is KernelKind.NATIVE


def test_native_off_never_builds_the_library(monkeypatch: pytest.MonkeyPatch):
    def must_not_build(isa=None):
        raise AssertionError("native=False must not build or load the int8 GEMM")

    monkeypatch.setattr(native, "qgemm_lib", must_not_build)
    g = quantized_linear()
    x = RNG.standard_normal((2, 7, K)).astype(np.float32)
    out = compile_(g, native=False).run({"x": x})
    np.testing.assert_array_equal(out[0], g.evaluate({"x": x}, {"b": BIAS})[0])


@pytest.mark.skipif(not native.available(), reason="gcc is not installed")
@pytest.mark.parametrize("num_threads", [1, 3])
def test_qgemm_gets_the_compile_thread_count(monkeypatch: pytest.MonkeyPatch, num_threads: int):
    """The kernel passes CompileOptions.num_threads, whatever the process's BLAS count
    (which another graph may have set since)."""
    monkeypatch.setattr(config, "available_cpus", lambda: 8)  # no clamp on a small machine
    seen: list[int] = []
    real = native.QGemmLib.bind

    def spy(self, *args, **kw):  # type: ignore[no-untyped-def]
        seen.append(kw["num_threads"])
        return real(self, *args, **kw)

    monkeypatch.setattr(native.QGemmLib, "bind", spy)
    g = quantized_linear()
    prog = compile_program(g, CompileOptions(use_cache=False, num_threads=num_threads), None)
    probe = prog.take_probe()
    assert probe is not None
    ex, live_params, _ = probe
    assert ex.num_threads == num_threads and ex.native
    ex.load_param("b", BIAS)
    monkeypatch.setattr(threads, "_current", 7)  # as if another graph had set BLAS to 7
    x = RNG.standard_normal((2, 7, K)).astype(np.float32)
    y = ex.run({"x": x})[0]
    assert seen == [num_threads]
    np.testing.assert_array_equal(y, g.evaluate({"x": x}, {"b": BIAS})[0])


def test_kernel_ctx_fields_and_defaults(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(config, "available_cpus", lambda: 8)  # no clamp on a small machine
    g = quantized_linear()
    node = g.nodes[g.outputs[0]]
    ctx = KernelCtx(node, g, {}, {}, {}, ScratchPool())
    assert ctx.native is True and ctx.num_threads == threads.resolve_threads(None) >= 1
    ctx = KernelCtx(node, g, {}, {}, {}, ScratchPool(), num_threads=5, native=False)
    assert (ctx.num_threads, ctx.native) == (5, False)
    prog = compile_program(g, CompileOptions(use_cache=False, num_threads=2, native=False), None)
    ex = Executor(prog.graph, prog.plan({}), {}, {}, num_threads=2, native=False)
    assert (ex.num_threads, ex.native) == (2, False)
    assert threads.resolve_threads(4) == 4
    with pytest.raises(CompileError, match="num_threads must be an int >= 1 or None"):
        threads.resolve_threads(0)
