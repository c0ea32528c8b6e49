"""Weight-only quantization: ``rlx.quantize(..., weights_only=True, scheme=...)``.

Oracles: ``gguf.quants`` (legacy GGUF packing byte for byte, every GGUF decode), per-block
rounding bounds written here in NumPy, and NumPy f32 forward passes of the MLP and the
MiniLM-sized encoder (written here, not rlx's). The output errors are checked against
what the scheme's bits explain (docs/weight_only.md): a weight with block step ``D`` has
rounding error RMS ``D / sqrt(12)``, so ``e_w = sqrt(sum D^2 / 12 / sum w^2)``; a chain
of ``L`` quantized matmuls is within ``2 sqrt(L) max e_w``."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erf

import rlx
from rlx.errors import QuantizationError
from rlx.formats import schemes as S
from rlx.models import synthetic as syn
from rlx.quant.pack import pack

gguf = pytest.importorskip("gguf")
LEGACY = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def step(scheme: S.QuantScheme, w: np.ndarray) -> np.ndarray:
    """Per-element quantization step D of ``w [N, K]`` (rows = outputs) in ``scheme``."""
    if isinstance(scheme, (S.Fp8E4m3, S.Fp8E5m2)):
        mant, fmax = (3, 448.0) if isinstance(scheme, S.Fp8E4m3) else (2, 57344.0)
        s = np.abs(w).max() / fmax
        e = np.floor(np.log2(np.maximum(np.abs(w) / s, 2.0**-6)))
        return 2.0 ** (e - mant) * s
    bs = scheme.block_size
    b = w.reshape(w.shape[0], -1, bs)
    amax = np.abs(b).max(-1)
    rng = np.maximum(b.max(-1), 0) - np.minimum(b.min(-1), 0)
    d = {
        S.Int8Block: lambda: amax / 127,
        S.Int4Block: lambda: rng / 15,
        S.GgufQ8_0: lambda: amax / 127,
        S.GgufQ4_0: lambda: amax / 8,
        S.GgufQ5_0: lambda: amax / 16,
        S.GgufQ4_1: lambda: (b.max(-1) - b.min(-1)) / 15,
        S.GgufQ5_1: lambda: (b.max(-1) - b.min(-1)) / 31,
        S.GgufQ8K: lambda: amax / 127,
    }
    if type(scheme) in d:
        dd = d[type(scheme)]()
    elif isinstance(scheme, S.GgufQ6K):  # per 16: absmax / 31, scale rounded up to 1/127
        b16 = w.reshape(w.shape[0], -1, 16)
        s16 = np.abs(b16).max(-1) / 31
        sup = s16.reshape(w.shape[0], -1, 16).max(-1, keepdims=True) / 127
        return np.repeat((s16.reshape(sup.shape[0], -1, 16) + sup).reshape(w.shape[0], -1), 16, 1)
    else:  # Q4_K / Q5_K: per 32: (range + one 1/63 step of the mins) / levels, rounded up
        levels = 15 if isinstance(scheme, S.GgufQ4K) else 31
        b32 = w.reshape(w.shape[0], -1, 32)
        mn = np.minimum(b32.min(-1), 0)
        dmin = (-mn).reshape(w.shape[0], -1, 8).max(-1, keepdims=True) / 63
        rng32 = (np.maximum(b32.max(-1), 0) - mn).reshape(dmin.shape[0], -1, 8) + dmin
        s32 = (rng32 / levels).reshape(w.shape[0], -1)
        sup = s32.reshape(w.shape[0], -1, 8).max(-1, keepdims=True) / 63
        return np.repeat((s32.reshape(sup.shape[0], -1, 8) + sup).reshape(w.shape[0], -1), 32, 1)
    return np.repeat(dd, bs, axis=1)


def e_w(scheme: S.QuantScheme, w: np.ndarray) -> float:
    """Relative RMS error the scheme's bits explain for ``w``: sqrt(sum D^2/12 / sum w^2)."""
    d = step(scheme, w).astype(np.float64)
    return math.sqrt(float((d**2).sum() / 12 / (w.astype(np.float64) ** 2).sum()))


def decode(scheme: S.QuantScheme, arrays: tuple[np.ndarray, ...], k: int) -> np.ndarray:
    """The f32 weight the packed arrays stand for, decoded without rlx."""
    if scheme.is_gguf and type(scheme).gguf_name != "Q8_K":
        qt = getattr(gguf.GGMLQuantizationType, type(scheme).gguf_name)
        return gguf.quants.dequantize(arrays[0], qt).astype(np.float32)
    if isinstance(scheme, S.GgufQ8K):
        b = arrays[0].reshape(-1, 292)
        d = b[:, 0:4].copy().view("<f4")
        return (d * b[:, 4:260].view(np.int8).astype(np.float32)).reshape(arrays[0].shape[0], k)
    wq, sc, zp = arrays
    if isinstance(scheme, (S.Fp8E4m3, S.Fp8E5m2)):
        return (wq.astype(np.float32) - zp[0]) * sc[0]
    if isinstance(scheme, S.Int4Block):
        q = np.empty((wq.shape[0], k), np.int64)
        q[:, 0::2], q[:, 1::2] = wq & 15, wq >> 4
    else:
        q = wq.astype(np.int64)
    bs = scheme.block_size
    return ((q - np.repeat(zp, bs, 1)) * np.repeat(sc, bs, 1)).astype(np.float32)


PACKABLE = [
    S.Int8Block(32),
    S.Int4Block(32),
    S.Fp8E4m3(),
    S.Fp8E5m2(),
    S.GgufQ8_0(),
    S.GgufQ4_0(),
    S.GgufQ4_1(),
    S.GgufQ5_0(),
    S.GgufQ5_1(),
    S.GgufQ4K(),
    S.GgufQ5K(),
    S.GgufQ6K(),
    S.GgufQ8K(),
]


@pytest.mark.parametrize("name", LEGACY)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), spread=st.floats(1e-3, 1e3), rows=st.integers(1, 4))
def test_legacy_packing_is_gguf_bytes(name, seed, spread, rows):
    w = (np.random.default_rng(seed).standard_normal((rows, 64)) * spread).astype(np.float32)
    ours = pack(S.GGUF_SCHEMES[name](), w)[0]
    theirs = gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, name))
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("scheme", PACKABLE, ids=str)
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), spread=st.floats(1e-2, 1e2))
def test_packing_round_trip_within_half_a_step(scheme, seed, spread):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((3, 512)) * spread).astype(np.float32)
    w[0, :7] = 0.0  # zero runs and a lone outlier
    w[1, 5] *= 20
    arrays = pack(scheme, w)
    got = decode(scheme, arrays, 512)
    # half a step, plus the f16 rounding of a legacy block's d (2**-11 relative, times the
    # largest |q|) and of its min, plus the f32 arithmetic of the decode
    qmax = {"Q8_0": 127, "Q4_0": 8, "Q5_0": 16, "Q4_1": 15, "Q5_1": 31}
    name = getattr(type(scheme), "gguf_name", "")
    # Q4_0 / Q5_0 map the block's signed extreme to -8 (-16): the far end of the other
    # sign clips at +7 (+15), up to one whole step (llama.cpp's method, same bytes)
    half = 1.0 if name in ("Q4_0", "Q5_0") else 0.5
    bound = step(scheme, w) * (half + 2.0**-11 * qmax.get(name, 0)) + 1e-6 * np.abs(w)
    if name in ("Q4_1", "Q5_1"):
        bound += 2.0**-11 * np.repeat(np.abs(w.reshape(3, -1, 32)).max(-1), 32, 1)
    err = np.abs(got - w)
    assert (err <= bound).all(), f"max err/step {float((err / bound).max()):.3f}"


# ---- models: NumPy f32 forward passes ----------------------------------------------


def gelu(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1 + erf(x / np.sqrt(np.float32(2))))).astype(np.float32)


def mlp_graph() -> rlx.Graph:
    g = rlx.Graph("mlp")
    x = g.input("x", (4, 256))
    h = g.gelu(g.linear(x, g.param("fc1.weight", (256, 512)), g.param("fc1.bias", (512,))))
    g.set_outputs([g.linear(h, g.param("fc2.weight", (512, 128)), g.param("fc2.bias", (128,)))])
    return g


def mlp_numpy(p: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h = gelu(x @ p["fc1.weight"] + p["fc1.bias"])
    return h @ p["fc2.weight"] + p["fc2.bias"]


def layer_norm(x, gamma, beta, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + np.float32(eps)) * gamma + beta


def encoder_numpy(p, x, layers=6, heads=12):
    b, s, h = x.shape
    hd = h // heads
    for i in range(layers):

        def lin(t: np.ndarray, n: str, i: int = i) -> np.ndarray:
            return t @ p[f"layer{i}.{n}.weight"] + p[f"layer{i}.{n}.bias"]

        q, k, v = (
            lin(x, f"attn.{n}").reshape(b, s, heads, hd).transpose(0, 2, 1, 3) for n in "qkv"
        )
        sc = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(hd))
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        ctx = (sc / sc.sum(-1, keepdims=True)) @ v
        a = lin(ctx.transpose(0, 2, 1, 3).reshape(b, s, h), "attn.o")
        x = layer_norm(x + a, p[f"layer{i}.ln1.gamma"], p[f"layer{i}.ln1.beta"])
        f = lin(gelu(lin(x, "ffn.up")), "ffn.down")
        x = layer_norm(x + f, p[f"layer{i}.ln2.gamma"], p[f"layer{i}.ln2.beta"])
    return x


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def check_model(g, forward, depth, scheme, seq_inputs=2):
    params = syn.random_params(g, seed=1)
    data = [syn.random_inputs(g, seed=i) for i in range(seq_inputs)]
    r = rlx.quantize(g, data, params=params, weights_only=True, scheme=scheme, rank_layers=False)
    # every layer the scheme can hold is packed: its f32 weight param left the graph
    assert r.report.quantized and set(r.report.quantized).isdisjoint(r.graph.param_names)
    assert any(n.op.mnemonic == "dequant_matmul" for n in r.graph.nodes)
    deq = dict(params)
    errs = []
    for name in r.report.quantized:
        w = params[name]
        arrays = pack(scheme, w.T, name)  # the packer is deterministic: the same bytes
        deq[name] = decode(scheme, arrays, w.shape[0]).T
        errs.append(e_w(scheme, w.T))
    for batch in data:
        (got,) = r.compiled.run(batch)
        x = next(iter(batch.values()))
        # the compiled graph computes the network of the decoded weights (f32 kernels)
        assert rel(got, forward(deq, x)) < 1e-4
        # and its error against the f32 network is what the bits explain
        err = rel(got, forward(params, x))
        assert err <= 2 * math.sqrt(depth) * max(errs), (err, max(errs))
    assert r.report.worst.relative <= 2 * math.sqrt(depth) * max(errs)
    return r


@pytest.mark.parametrize("scheme", PACKABLE, ids=str)
def test_mlp_error_within_what_the_bits_explain(scheme):
    check_model(mlp_graph(), mlp_numpy, 2, scheme)


@pytest.mark.slow
@pytest.mark.parametrize(
    "scheme", [S.Int8Block(32), S.Int4Block(32), S.Fp8E4m3(), S.GgufQ8_0(), S.GgufQ5_0()], ids=str
)
def test_minilm_sized_encoder_error_within_what_the_bits_explain(scheme):
    g = syn.encoder(layers=6, hidden=384, heads=12, ffn=1536, seq=16)
    r = check_model(g, encoder_numpy, 4 * 6, scheme, seq_inputs=1)
    assert len(r.report.quantized) == 36  # q, k, v, o, up, down of 6 layers


def test_k_not_a_block_multiple_is_kept_float_with_reason():
    g = syn.encoder(layers=1, hidden=64, heads=4, ffn=256, seq=4)
    params = syn.random_params(g)
    data = [syn.random_inputs(g)]
    r = rlx.quantize(
        g, data, params=params, weights_only=True, scheme=S.GgufQ4K(), rank_layers=True
    )
    assert r.report.quantized == ["layer0.ffn.down.weight"]  # K = 256; the others have K = 64
    why = r.report.kept_float["layer0.attn.q.weight"]
    assert "K=64 is not a multiple of the GgufQ4K block size 256" in why
    assert [le.layer for le in r.report.layers] == ["layer0.ffn.down.weight"]
    assert "weights_only GgufQ4K" in str(r.report)


def test_errors_name_the_problem():
    g = mlp_graph()
    params = syn.random_params(g)
    data = [syn.random_inputs(g)]
    with pytest.raises(QuantizationError, match="needs scheme= a QuantScheme"):
        rlx.quantize(g, data, params=params, weights_only=True)
    with pytest.raises(QuantizationError, match="scheme= applies to weights_only=True"):
        rlx.quantize(g, data, params=params, scheme=S.Int8Block(32))
    with pytest.raises(QuantizationError, match="accuracy_budget is not supported"):
        rlx.quantize(
            g, data, params=params, weights_only=True, scheme=S.Int8Block(32), accuracy_budget=0.1
        )
    bad = dict(params)
    bad["fc2.weight"] = params["fc2.weight"].copy()
    bad["fc2.weight"][3, 4] = np.nan
    with pytest.raises(QuantizationError, match="'fc2.weight'.*NaN"):
        rlx.quantize(g, data, params=bad, weights_only=True, scheme=S.Int4Block(32))
    with pytest.raises(QuantizationError, match="no matmul that GgufQ2K can hold.*no packer"):
        rlx.quantize(g, data, params=params, weights_only=True, scheme=S.GgufQ2K())
    with pytest.raises(QuantizationError, match="exclude names unknown layers"):
        rlx.quantize(
            g, data, params=params, weights_only=True, scheme=S.Int8Block(32), exclude=["nope"]
        )


def test_exclude_and_no_eval_data():
    g = mlp_graph()
    params = syn.random_params(g)
    r = rlx.quantize(
        g, [], params=params, weights_only=True, scheme=S.Int8Block(32), exclude=["fc1.weight"]
    )
    assert r.report.quantized == ["fc2.weight"]
    assert r.report.kept_float == {"fc1.weight": "excluded by the caller"}
    assert r.report.eval_batches == 0
    x = syn.random_inputs(g)["x"]
    (got,) = r.compiled.run({"x": x})
    assert rel(got, mlp_numpy(params, x)) < 2 * math.sqrt(1) * e_w(
        S.Int8Block(32), params["fc2.weight"].T
    )


def test_fp8_pack_is_round_to_nearest():
    w = np.array([[0.0, 1.0, -448.0, 3.3, 1e-3, 17.0, -0.07, 100.0]], np.float32)
    q, sc, zp = pack(S.Fp8E4m3(), w)
    assert sc[0] == np.float32(448.0 / 448.0) and zp[0] == 0
    np.testing.assert_array_equal(q, w.astype(ml_dtypes.float8_e4m3fn))
