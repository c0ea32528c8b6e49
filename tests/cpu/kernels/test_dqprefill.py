"""The prefill GEMM on GGUF-packed weights (csrc/dqgemm_prefill.c, native/dqprefill.py) for
every GGUF scheme x every build target this CPU runs x the plain and the row-interleaved
layouts (R = 4 / 8, the interleaved bytes built here with NumPy from csrc/dq_layout.h's
description) x M in {17, 64, 129}, against NumPy f64 products of weights decoded by
``gguf.quants`` (test_quant_dequant.make_weight): within the f32 accumulation bound
(test_quant_dequant.check_close: |err| <= K 2^-23 (|x| @ |w|^T)). N = 37 leaves tail rows
after the interleaved groups and after the kernel's weight-row blocks; K spans two K
blocks of the kernel with a short one. Edge cases: N = 1, K = one block, non-finite
inputs. The int8-activation path (act="q8"): every scheme but Q8_K x target x layout x M,
within the int8 rounding bound against the exact product and within f32 rounding of a
NumPy model of the same per-32 quantization (check_q8_prefill). End to end: the greedy text of a tiny llama GGUF (tests/models/llm/tiny_llama.py)
with a prompt of 40 tokens is transformers' and the one of the old tiled path."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu, prebuilt
from rlx.backends.cpu.native.dqprefill import (
    INTERLEAVES,
    PREFILL_SCHEMES,
    Q8_PREFILL_SCHEMES,
    SOURCES,
    dqprefill_lib,
    runs_prefill,
)
from rlx.errors import InputError, QuantizationError
from rlx.formats import schemes as S
from tests.cpu.kernels.test_quant_dequant import check_close, make_weight, q8_bound

pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

SCHEMES = [cls() for cls in PREFILL_SCHEMES]
TARGETS = cpu.runnable_targets()


def interleave(packed: np.ndarray, rows: int, bb: int) -> np.ndarray:
    """The u8 [N, row_bytes] weight with its first N - N % rows rows interleaved by ``rows``
    at block granularity: in each group, block b of the group's rows one after another,
    then block b + 1; the tail rows unchanged."""
    if rows == 1:
        return packed.copy()
    n, rb = packed.shape
    nb = rb // bb
    full = n - n % rows
    out = packed.copy()
    g = packed[:full].reshape(full // rows, rows, nb, bb).transpose(0, 2, 1, 3)
    out[:full] = np.ascontiguousarray(g).reshape(full, rb)
    return out


def _k(scheme: S.QuantScheme) -> int:
    # two K blocks of the kernel (512 weights) with a short second one
    return 544 if scheme.block_size == 32 else 768


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.value)
@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
def test_f32_prefill_matches_f64_every_layout(target, scheme) -> None:
    lib = dqprefill_lib(target)
    rng = np.random.default_rng(abs(hash((str(scheme), target.value))) % 2**32)
    n, k = 37, _k(scheme)
    (packed,), w = make_weight(scheme, n, k, rng)
    bb = type(scheme).block_bytes  # type: ignore[attr-defined]
    for rows in INTERLEAVES:
        wr = interleave(packed, rows, bb)
        assert np.array_equal(lib.decode(scheme, wr, n, k, rows=rows), w), rows
        for m in (17, 64, 129):
            x = rng.standard_normal((m, k)).astype(np.float32)
            out = np.full((m, n), np.nan, np.float32)
            lib.gemm(scheme, x, wr, out, rows=rows, num_threads=1 + m % 2)
            check_close(out, x, w)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.value)
def test_edge_shapes(target) -> None:
    lib = dqprefill_lib(target)
    rng = np.random.default_rng(7)
    for scheme in (S.GgufQ4_0(), S.GgufQ6K()):
        qk = scheme.block_size
        for n, k in ((1, qk), (8, qk), (45, 3 * qk), (3, 1024 + qk)):
            (packed,), w = make_weight(scheme, n, k, rng)
            for m in (17, 33):
                x = rng.standard_normal((m, k)).astype(np.float32)
                out = np.full((m, n), np.nan, np.float32)
                lib.gemm(scheme, x, packed, out, num_threads=2)
                check_close(out, x, w)


def test_non_finite_input_stays_in_its_row() -> None:
    lib = dqprefill_lib()
    rng = np.random.default_rng(3)
    (packed,), w = make_weight(S.GgufQ8_0(), 20, 64, rng)
    x = rng.standard_normal((40, 64)).astype(np.float32)
    x[5, 3] = np.inf
    x[33, 0] = np.nan
    out = np.empty((40, 20), np.float32)
    lib.gemm(S.GgufQ8_0(), x, packed, out, num_threads=2)
    bad = ~np.isfinite(out).all(axis=1)
    assert bad[5] and bad[33] and bad.sum() == 2
    keep = np.isfinite(x).all(axis=1)
    check_close(out[keep], x[keep], w)


def test_bad_arguments_are_named() -> None:
    lib = dqprefill_lib()
    rng = np.random.default_rng(4)
    (packed,), _ = make_weight(S.GgufQ4_0(), 8, 64, rng)
    x = np.zeros((20, 64), np.float32)
    out = np.zeros((20, 8), np.float32)
    with pytest.raises(QuantizationError, match="'w_q'"):
        lib.gemm(S.GgufQ4_0(), x, packed[:, :-1], out)
    with pytest.raises(InputError, match="rows must be one of"):
        lib.gemm(S.GgufQ4_0(), x, packed, out, rows=3)
    with pytest.raises(InputError, match="no prefill kernel"):
        lib.gemm(S.Int8Block(32), x, packed, out)
    with pytest.raises(InputError, match="x must be C-contiguous f32"):
        lib.gemm(S.GgufQ4_0(), x.astype(np.float64), packed, out)


def test_which_products_take_it_and_prebuilt_entry() -> None:
    assert [runs_prefill(S.GgufQ4K(), m) for m in (1, 16, 17, 512)] == [False, False, True, True]
    assert not runs_prefill(S.Int8Block(32), 64)
    base = cpu.runnable_targets()[0]  # portable on x86-64, neon on aarch64
    libs = {lib.name: lib for lib in prebuilt.fixed_libraries(base, False)}
    assert libs["dqprefill"].source == native.csrc_source(*SOURCES)


def test_tiny_llama_greedy_unchanged_by_the_prefill_kernel(tmp_path, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import rlx.models.llm as llm
    from rlx.backends.cpu.kernels import quant
    from rlx.backends.cpu.native.dqprefill import DqPrefillLib
    from tests.models.llm.tiny_llama import hf_model, hf_weights, write_gguf

    monkeypatch.setenv("RLX_DQ_ACT", "f32")
    used = write_gguf(tmp_path / "tiny.gguf", hf_weights(seed=3), arch="llama")
    ids = [int(t) for t in np.random.default_rng(5).integers(1, 96, 40)]
    bound = []
    orig = DqPrefillLib.bind

    def counting(self, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        bound.append(a[1].shape[0])
        return orig(self, *a, **kw)

    monkeypatch.setattr(DqPrefillLib, "bind", counting)

    def greedy() -> list[int]:
        m = llm.load(tmp_path / "tiny.gguf", max_context=96, num_threads=2)
        tok = int(m.prefill(ids).argmax())
        out = [tok]
        for _ in range(8):
            tok = int(m.step(tok).argmax())
            out.append(tok)
        return out

    got = greedy()
    assert bound and min(bound) >= 17  # the Q8_0 weights' prompt products took it
    ref = hf_model(used, "llama")
    seq = list(ids)
    with torch.no_grad():
        for _ in range(9):
            seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
    assert got == seq[len(ids) :]
    monkeypatch.setattr(quant, "PREFILL_KERNEL", False)
    assert greedy() == got


# ---- the int8-activation path (act="q8") -----------------------------------------------


def q8_model(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy model of the per-32 activation quantization (f32 steps as the kernel's:
    dx = max|x| / 127, id = 1 / dx, xq = rint(x * id)) and the f64 product of the
    quantized activations with the decoded weight: (xhat [M, K] f64, xhat @ w.T f64)."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    dx = np.abs(xb).max(-1) / np.float32(127)
    safe = np.where(dx != 0, dx, np.float32(1))
    idx = np.where(dx != 0, np.float32(1) / safe, np.float32(0)).astype(np.float32)
    xq = np.rint(xb * idx[..., None])
    xhat = (dx[..., None].astype(np.float64) * xq).reshape(m, k)
    return xhat, xhat @ w.astype(np.float64).T


def check_q8_prefill(got: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """Two checks. (1) Against the exact product: the int8 rounding bound
    (test_quant_dequant.q8_bound). Derivation: x_j = dx xq_j + e_j with |e_j| <= dx / 2
    (rint of x / dx; times 1 + 2^-20 for the f32 rounding of x * id), so the activation
    rounding alone errs by at most sum_j |w_j| dx_j / 2; the rest is f32 rounding of the
    per-group terms (s dx) T and (mm dx) sum(xq) and of their sum over K / 16 groups, each
    term at most 8 max|w| of its block times |x_j| + dx_j summed: 8 K 2^-24 (|x| + dx) @
    wmax. (2) Against the NumPy model of the same quantization (q8_model): only the f32
    rounding term remains."""
    m, k = x.shape
    want = x.astype(np.float64) @ w.astype(np.float64).T
    err = np.abs(got.astype(np.float64) - want)
    bound = q8_bound(x, w)
    assert (err <= bound).all(), f"vs exact: max error / bound {(err / bound).max():.3g}"
    xhat, model = q8_model(x, w)
    x64 = np.abs(x.astype(np.float64))
    dx = np.repeat(x64.reshape(m, k // 32, 32).max(-1) / 127, 32, axis=1)
    wmax = np.repeat(
        np.abs(w.astype(np.float64)).reshape(w.shape[0], k // 32, 32).max(-1), 32, axis=1
    )
    tol = 8 * k * 2.0**-24 * (x64 + dx) @ wmax.T
    merr = np.abs(got.astype(np.float64) - model)
    assert (merr <= tol).all(), f"vs model: max error / bound {(merr / tol).max():.3g}"


Q8_SCHEMES = [cls() for cls in Q8_PREFILL_SCHEMES]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.value)
@pytest.mark.parametrize("scheme", Q8_SCHEMES, ids=str)
def test_q8_prefill_matches_model_and_bound_every_layout(target, scheme) -> None:
    lib = dqprefill_lib(target)
    rng = np.random.default_rng(abs(hash((str(scheme), target.value, "q8"))) % 2**32)
    n, k = 37, _k(scheme)
    (packed,), w = make_weight(scheme, n, k, rng)
    bb = type(scheme).block_bytes  # type: ignore[attr-defined]
    for rows in INTERLEAVES:
        wr = interleave(packed, rows, bb)
        for m in (17, 64, 129):
            x = rng.standard_normal((m, k)).astype(np.float32)
            x[1, :32] = 0.0  # an all-zero 32-block (dx = 0)
            out = np.full((m, n), np.nan, np.float32)
            lib.gemm(scheme, x, wr, out, rows=rows, num_threads=1 + m % 2, act="q8")
            check_q8_prefill(out, x, w)


def test_q8_prefill_non_finite_and_bad_act() -> None:
    lib = dqprefill_lib()
    rng = np.random.default_rng(8)
    (packed,), w = make_weight(S.GgufQ4K(), 9, 512, rng)
    x = rng.standard_normal((20, 512)).astype(np.float32)
    x[4, 300] = np.inf
    out = np.empty((20, 9), np.float32)
    lib.gemm(S.GgufQ4K(), x, packed, out, act="q8")
    assert np.isnan(out[4]).all() and np.isfinite(np.delete(out, 4, axis=0)).all()
    with pytest.raises(InputError, match="act must be one of"):
        lib.gemm(S.GgufQ4K(), x, packed, out, act="bf16")
    (p8k,), _ = make_weight(S.GgufQ8K(), 9, 512, rng)
    with pytest.raises(InputError, match="no int8-activation prefill"):
        lib.gemm(S.GgufQ8K(), x, p8k, out, act="q8")
