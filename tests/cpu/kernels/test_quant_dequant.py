"""The native DequantMatMul kernel (csrc/dqgemm.c) on packed bytes, for every build target
this CPU runs (RLX_ISA avx512 / avx2 / portable), against NumPy f64 matmuls of weights
decoded independently: by ``gguf.quants`` for the GGUF schemes, by hand (in this file)
for Q8_K, Int8Block, Int4Block and FP8. M = 1 (GEMV) and M > 1 (tiled), K at block
multiples, N odd, 1 and 2 threads; compiled graphs (native on / off, param weights
changed by set_param); wrong byte counts name the tensor."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import rlx
from rlx import config
from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.dqgemm import dqgemm_lib, uses_q8
from rlx.errors import QuantizationError, ShapeError
from rlx.formats import schemes as S
from rlx.options import CompileOptions
from tests.quant.gguf_blocks import set_f16_scales

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

SCHEMES = [
    S.Int8Block(32),
    S.Int8BlockAsym(48),
    S.Int4Block(32),
    S.Int4Block(8),
    S.Fp8E4m3(),
    S.Fp8E5m2(),
    *(c() for c in S.GGUF_SCHEMES.values()),
]


def make_weight(scheme: S.QuantScheme, n: int, k: int, rng: np.random.Generator):
    """(weight inputs, f32 [n, k] they stand for), decoded without rlx's decoders."""
    if scheme.is_gguf:
        cls = type(scheme)
        b = rng.integers(0, 256, (n * k // cls.qk, cls.block_bytes), dtype=np.uint8)
        name = cls.gguf_name
        set_f16_scales(b, name, rng)
        if name == "Q8_K":  # f32 d, i8 qs[256], i16 bsums: y = d * q (gguf 0.19 cannot decode it)
            d = rng.uniform(0.001, 0.05, len(b)).astype("<f4")
            b[:, 0:4] = d.view(np.uint8).reshape(-1, 4)
            w = d[:, None].astype(np.float32) * b[:, 4:260].view(np.int8).astype(np.float32)
        else:
            w = gguf.quants.dequantize(b, getattr(gguf.GGMLQuantizationType, name)).reshape(-1)
        packed = b.reshape(n, -1)
        return (packed,), np.asarray(w, np.float32).reshape(n, k)
    if isinstance(scheme, (S.Fp8E4m3, S.Fp8E5m2)):
        dt = ml_dtypes.float8_e4m3fn if isinstance(scheme, S.Fp8E4m3) else ml_dtypes.float8_e5m2
        wq = rng.uniform(-4, 4, (n, k)).astype(dt)
        return (wq, np.array([0.25], np.float32), np.array([1], np.int32)), (
            wq.astype(np.float32) - 1
        ) * np.float32(0.25)
    bs = scheme.block_size
    sc = rng.uniform(0.01, 0.1, (n, k // bs)).astype(np.float32)
    if isinstance(scheme, S.Int4Block):
        vals = rng.integers(0, 16, (n, k))
        zp = rng.integers(6, 10, (n, k // bs)).astype(np.int32)
        packed = (vals[:, 0::2] | (vals[:, 1::2] << 4)).astype(np.uint8)
        w = (vals - np.repeat(zp, bs, axis=1)) * np.repeat(sc, bs, axis=1)
        return (packed, sc, zp), w.astype(np.float32)
    wq = rng.integers(-128, 128, (n, k)).astype(np.int8)
    zp = rng.integers(-4, 5, (n, k // bs)).astype(np.int32)
    if isinstance(scheme, S.Int8Block):
        zp[:] = 0
    w = (wq.astype(np.int64) - np.repeat(zp, bs, axis=1)) * np.repeat(sc, bs, axis=1)
    return (wq, sc, zp), w.astype(np.float32)


def k_for(scheme: S.QuantScheme) -> int:
    """Three blocks' worth of K (an odd block count: exercises every remainder loop)."""
    return 3 * (scheme.block_size or 32)


def check_close(got: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """f32 accumulation over K terms: |error| <= K * 2**-23 * (|x| @ |w|.T) elementwise."""
    want = x.astype(np.float64) @ w.astype(np.float64).T
    bound = x.shape[-1] * 2.0**-23 * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T)
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= bound + 1e-30).all(), (
        f"max error {err.max():.3g}, bound there {bound.flat[err.argmax()]:.3g}"
    )


def q8_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The int8-activation path's error bound (docs/weight_only.md), from x and the decoded
    w only: each x rounded to a step dx = max|x over its 32-block| / 127 errs by at most
    dx / 2 (times 1 + 2^-20 for the f32 rounding of x / dx), plus f32 rounding of the
    scaled block sums, bounded with the block's largest |w| times 8 (a K-quant's scale and
    offset terms can each exceed |w| by its range)."""
    m, k = x.shape
    x64, w64 = np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64))
    dx = np.repeat(x64.reshape(m, k // 32, 32).max(-1) / 127, 32, axis=1)
    wmax = np.repeat(w64.reshape(w.shape[0], k // 32, 32).max(-1), 32, axis=1)
    return 0.5 * (1 + 2.0**-20) * dx @ w64.T + 8 * k * 2.0**-24 * (x64 + dx) @ wmax.T


def check_q8(got: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """|got - x @ w.T (f64)| <= q8_bound elementwise."""
    want = x.astype(np.float64) @ w.astype(np.float64).T
    err = np.abs(got.astype(np.float64) - want)
    bound = q8_bound(x, w)
    assert (err <= bound).all(), f"max error / bound {(err / bound).max():.3g}"


@pytest.mark.parametrize("target", cpu.runnable_targets(), ids=lambda t: t.value)
@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
def test_gemm_vs_numpy_f64_every_target(target, scheme):
    lib = dqgemm_lib(target)
    rng = np.random.default_rng(hash(str(scheme)) % 2**32)
    n, k = 37, k_for(scheme)
    ws, w = make_weight(scheme, n, k, rng)
    np.testing.assert_array_equal(lib.decode(scheme, ws, n, k), w)  # bit-exact decode
    for m, threads in ((1, 1), (2, 2), (3, 1), (5, 2), (13, 1), (13, 2)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        out = np.full((m, n), np.nan, np.float32)
        lib.gemm(scheme, x, ws, out, num_threads=threads)
        check_close(out, x, w)


def test_gemm_larger_k_and_panels():
    lib = dqgemm_lib()
    rng = np.random.default_rng(5)
    for scheme in (S.GgufQ4K(), S.GgufQ8_0(), S.GgufQ6K(), S.Int4Block(32)):
        n, k = 67, 1024  # several decode chunks along K, several NB panels plus a tail
        ws, w = make_weight(scheme, n, k, rng)
        for m in (1, 4, 19):
            x = rng.standard_normal((m, k)).astype(np.float32)
            out = np.empty((m, n), np.float32)
            lib.gemm(scheme, x, ws, out, num_threads=2)
            check_close(out, x, w)


def test_wrong_byte_count_names_the_tensor():
    lib = dqgemm_lib()
    x = np.zeros((1, 256), np.float32)
    out = np.zeros((1, 3), np.float32)
    with pytest.raises(
        QuantizationError, match=r"'blk\.3\.attn_q\.weight'.*\[3, 144\].*\(429 bytes\)"
    ):
        lib.gemm(
            S.GgufQ4K(), x, (np.zeros((3, 143), np.uint8),), out, names=("blk.3.attn_q.weight",)
        )
    with pytest.raises(QuantizationError, match=r"'w_scale'.*float32 \[3, 8\]"):
        lib.gemm(
            S.Int8Block(32),
            x,
            (np.zeros((3, 256), np.int8), np.ones((3, 7), np.float32), np.zeros((3, 8), np.int32)),
            out,
            names=("w_q", "w_scale", "w_zp"),
        )
    assert (out == 0).all()  # bad input changes nothing


def test_stream_read_sums():
    a = np.arange(1000, dtype=np.float32)
    assert dqgemm_lib().stream_read(a, 2) == pytest.approx(float(a.sum()))


DTYPES = {"uint8": "u8", "int8": "i8", "float32": "f32", "int32": "i32"}


def _graph(scheme: S.QuantScheme, ws, k: int, lead=(2, 3)) -> rlx.Graph:
    g = rlx.Graph("dq")
    x = g.input("x", (*lead, k))
    names = ("w_packed",) if scheme.is_gguf else ("w_q", "w_scale", "w_zp")
    ps = [g.param(nm, a.shape, DTYPES[a.dtype.name]) for nm, a in zip(names, ws, strict=True)]
    g.set_outputs([g.dequant_matmul(x, scheme, *ps)])
    return g


@pytest.mark.parametrize("scheme", [S.GgufQ4K(), S.GgufQ5_0(), S.Int4Block(32)], ids=str)
@pytest.mark.parametrize("native_on", [True, False])
def test_compiled_graph_native_and_fallback(scheme, native_on):
    rng = np.random.default_rng(11)
    n, k = 9, 512
    ws, w = make_weight(scheme, n, k, rng)
    names = ("w_packed",) if scheme.is_gguf else ("w_q", "w_scale", "w_zp")
    for lead in ((1,), (2, 3)):
        g = _graph(scheme, ws, k, lead)
        c = rlx.Session("cpu").compile(
            g, CompileOptions(use_cache=False, native=native_on), params=dict(zip(names, ws))
        )
        kern = [kk for kk in c.report().kernels if kk.op == "dequant_matmul"][0]
        assert (kern.kind.value == "native") is native_on
        assert any(("native " + str(scheme)) in t if native_on else "BLAS" in t for t in kern.notes)
        x = rng.standard_normal((*lead, k)).astype(np.float32)
        (y,) = c.run({"x": x})
        # the default RLX_DQ_ACT=f32: exact f32 activations (int8 ones are opt-in)
        q8 = native_on and uses_q8(scheme, int(np.prod(lead)), config.dq_act())
        assert q8 == any("int8-activation" in t for t in kern.notes)
        check = check_q8 if q8 else check_close
        check(y.reshape(-1, n), x.reshape(-1, k), w)
        ws2, w2 = make_weight(scheme, n, k, rng)  # a new param is read at the next run
        for nm, a in zip(names, ws2):
            c.set_param(nm, a)
        (y2,) = c.run({"x": x})
        check(y2.reshape(-1, n), x.reshape(-1, k), w2)


def test_non_f32_and_strided_x():
    rng = np.random.default_rng(2)
    scheme = S.GgufQ8_0()
    n, k = 5, 64
    ws, w = make_weight(scheme, n, k, rng)
    g = rlx.Graph("dq16")
    x = g.input("x", (4, k), "f16")
    g.set_outputs([g.dequant_matmul(x, scheme, g.constant(ws[0]))])
    xv = rng.standard_normal((4, k)).astype(np.float16)
    (y,) = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False)).run({"x": xv})
    check_close(y, xv.astype(np.float32), w)


def test_rlx_isa_selects_the_kernel_target(monkeypatch):
    for t in cpu.runnable_targets():
        monkeypatch.setenv("RLX_ISA", t.value)
        lib = dqgemm_lib()
        assert lib.target is t
        assert lib.lanes == {"portable": 4, "avx2": 8, "avx512": 16}[t.value]


def test_graph_shape_error_for_wrong_bytes():
    g = rlx.Graph("bad")
    x = g.input("x", (1, 64))
    with pytest.raises(ShapeError, match=r"Q8_0|GgufQ8_0"):
        g.dequant_matmul(x, S.GgufQ8_0(), g.param("w", (3, 67), "u8"))
