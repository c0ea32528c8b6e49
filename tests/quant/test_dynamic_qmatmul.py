"""dynamic_qmatmul and the qmatmul epilogue: the op's reference against a NumPy
re-implementation of the published method written here (per-row max-abs / 127 for s8, ONNX
DynamicQuantizeLinear for u8, round half to even in f32, int64 accumulation), shape errors,
compiled graphs on every build target this CPU runs (RLX_ISA) against the same oracle, the
epilogue fusion (no elementwise kernel left after the integer matmul), and graph files
written before the epilogue attributes existed."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from scipy.special import erf

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.native import cpu
from rlx.errors import ShapeError
from rlx.ir import serialize
from rlx.ops.elementwise import UnaryKind
from rlx.ops.quant import ActQuant, DynamicQBatchMatMul, DynamicQMatMul, QMatMul
from rlx.options import CompileOptions

F = np.float32
RNG = np.random.default_rng(0)
M, K, N = 10, 37, 13
W = RNG.integers(-128, 128, (K, N), dtype=np.int8)
WS = RNG.uniform(1e-3, 1e-2, N).astype(F)
B = RNG.standard_normal(N).astype(F)
TARGETS = [t.value for t in cpu.runnable_targets()] if native.available() else []


def method(x: np.ndarray, unsigned: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The oracle: per-row quantization (q int64, scale f32, zp), row by row."""
    qs, scales, zps = [], [], []
    for row in x.reshape(-1, x.shape[-1]).astype(F):
        if unsigned:
            lo, hi = min(F(0), row.min()), max(F(0), row.max())
            scale = F(F(hi - lo) / F(255))
        else:
            scale = F(np.abs(row).max() / F(127))
        if not (np.isfinite(row).all() and np.isfinite(scale)):
            qs.append(np.zeros(row.shape, np.int64))
            scales.append(F(np.nan))
            zps.append(0)
            continue
        scale = F(1) if scale == 0 else scale
        zp = int(np.clip(np.rint(F(-lo) / scale), 0, 255)) if unsigned else 0
        q = np.clip(
            np.rint(row / scale).astype(np.int64) + zp, *((0, 255) if unsigned else (-128, 127))
        )
        qs.append(q)
        scales.append(scale)
        zps.append(zp)
    return np.array(qs), np.array(scales, F), np.array(zps, np.int64)


def act64(y: np.ndarray, act: UnaryKind | None) -> np.ndarray:
    y = y.astype(np.float64)
    return {
        None: lambda: y,
        UnaryKind.RELU: lambda: np.maximum(y, 0),
        UnaryKind.GELU: lambda: 0.5 * y * (1 + erf(y / np.sqrt(2))),
        UnaryKind.GELU_TANH: lambda: 0.5 * y * (1 + np.tanh(0.7978845608 * (y + 0.044715 * y**3))),
        UnaryKind.SILU: lambda: y / (1 + np.exp(-y)),
    }[act]()


def oracle(x, unsigned, act=None, bias=None, res=None) -> np.ndarray:
    q, s, z = method(x, unsigned)
    acc = (q - z[:, None]) @ W.astype(np.int64)
    y = acc.astype(F) * (s[:, None] * WS)
    if bias is not None:
        y = y + bias
    y = act64(y, act)
    if res is not None:
        y = y + res.reshape(y.shape)
    return y.reshape(*x.shape[:-1], N)


def dyn_graph(mode: str, act=None, bias=False, res=False, fused=True) -> rlx.Graph:
    g = rlx.Graph("dyn")
    x = g.input("x", (2, 5, K))
    w = g.constant(W)
    b = g.param("b", (N,)) if bias else None
    r = g.input("r", (2, 5, N)) if res else None
    if fused:
        y = g.dynamic_qmatmul(x, w, WS, bias=b, act=act, residual=r, mode=mode)
    else:  # the unfused chain the fusion pass folds
        y = g.dynamic_qmatmul(x, w, WS, mode=mode)
        y = g.add(y, b) if b is not None else y
        y = g.apply(rlx.ops.OPS["unary"](act), [y]) if act is not None else y
        y = g.add(y, r) if r is not None else y
    g.set_outputs([y])
    return g


X = (RNG.standard_normal((2, 5, K)) * 3).astype(F)
R = RNG.standard_normal((2, 5, N)).astype(F)


@pytest.mark.parametrize("unsigned", [False, True], ids=["s8", "u8"])
def test_reference_is_the_published_method(unsigned):
    x = X.copy()
    x[0, 1] = 0.0
    x[1, 2, 3] = np.nan
    g = dyn_graph("u8" if unsigned else "s8", UnaryKind.GELU, bias=True, res=True)
    got = g.evaluate({"x": x, "r": R}, {"b": B})[0]
    want = oracle(x, unsigned, UnaryKind.GELU, B, R)
    assert np.isnan(got[1, 2]).all() and np.isnan(want[1, 2]).all()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_shape_errors_name_what_is_wrong():
    g = rlx.Graph("bad")
    x = g.input("x", (3, K))
    w = g.constant(W)
    cases = [
        (lambda: g.dynamic_qmatmul(g.input("xi", (3, K), "i8"), w, WS), "x must be float"),
        (lambda: g.dynamic_qmatmul(x, g.constant(W.astype(np.int16)), WS), "w_q must be i8"),
        (lambda: g.dynamic_qmatmul(g.input("x2", (3, K + 1)), w, WS), "contraction dims"),
        (lambda: g.dynamic_qmatmul(x, w, WS[:3]), "w_scales needs 1 or N=13"),
        (lambda: g.dynamic_qmatmul(x, w, WS, act=UnaryKind.TANH), "act must be None or one of"),
        (lambda: g.dynamic_qmatmul(x, w, WS, bias=g.input("b", (N + 1,))), "bias must be"),
        (lambda: g.dynamic_qmatmul(x, w, WS, residual=g.input("r", (1, N))), "residual must"),
        (lambda: g.qmatmul(g.input("q", (3, K), "i8"), w, 0.1, WS, x_zero_point=200), "x_zero"),
    ]
    for build, msg in cases:
        with pytest.raises(ShapeError, match=msg):
            build()
    with pytest.raises(ValueError):
        DynamicQMatMul(tuple(WS), mode="s4")


@pytest.mark.skipif(not TARGETS, reason="gcc is not installed")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("unsigned", [False, True], ids=["s8", "u8"])
@pytest.mark.parametrize("act", [None, UnaryKind.RELU, UnaryKind.GELU, UnaryKind.SILU])
def test_compiled_on_every_target(monkeypatch, tmp_path, target, unsigned, act):
    monkeypatch.setenv("RLX_ISA", target)
    g = dyn_graph("u8" if unsigned else "s8", act, bias=True, res=True)
    c = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False), params={"b": B})
    got = c.run({"x": X, "r": R})[0]
    np.testing.assert_allclose(got, oracle(X, unsigned, act, B, R), rtol=2e-6, atol=2e-6)
    (k,) = [k for k in c.report().kernels if k.op == "dynamic_qmatmul"]
    assert k.kind.value == "native"
    want_isa = {
        "portable": "PLAIN",
        "avx2": "AVX2",
        "avx512": "VNNI512",
        "neon": "NEON",
        "dotprod": "SDOT",
        "i8mm": "SMMLA",
    }[target]
    if target == "avx512" and not cpu.target_spec(cpu.Target.AVX512).vnni:
        want_isa = "AVX2"
    assert native.qgemm_lib().isa.name == want_isa


def test_native_off_takes_the_exact_f64_path():
    g = dyn_graph("s8", None, bias=True, res=True)
    c = rlx.Session("cpu").compile(
        g, CompileOptions(use_cache=False, native=False), params={"b": B}
    )
    got = c.run({"x": X, "r": R})[0]
    np.testing.assert_allclose(got, oracle(X, False, None, B, R), rtol=1e-6, atol=1e-6)
    (k,) = [k for k in c.report().kernels if k.op == "dynamic_qmatmul"]
    assert any("native=False" in note for note in k.notes)


@pytest.mark.parametrize("act", [UnaryKind.GELU, UnaryKind.GELU_TANH, UnaryKind.RELU, None])
def test_fusion_leaves_no_elementwise_kernel(act):
    g = dyn_graph("u8", act, bias=True, res=True, fused=False)
    c = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False), params={"b": B})
    ops = [k.op for k in c.report().kernels if k.view_of is None]
    assert ops == ["dynamic_qmatmul"], ops
    (node,) = c.graph.find(DynamicQMatMul)
    assert node.op.act is act and node.op.has_bias and node.op.has_residual
    got = c.run({"x": X, "r": R})[0]
    np.testing.assert_allclose(got, oracle(X, True, act, B, R), rtol=2e-6, atol=2e-6)


def test_fusion_stops_at_a_shared_intermediate():
    g = rlx.Graph("shared")
    x = g.input("x", (4, K))
    y = g.dynamic_qmatmul(x, g.constant(W), WS)
    h = g.add(y, g.param("b", (N,)))
    g.set_outputs([g.gelu(h), h])  # h is an output: the gelu cannot swallow it
    c = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False), params={"b": B})
    ops = sorted(k.op for k in c.report().kernels if k.view_of is None)
    assert "dynamic_qmatmul" in ops and len(ops) == 2
    xv = X[0, :4]
    got_gelu, got_h = c.run({"x": xv})
    want_h = oracle(xv, False, None, B)
    np.testing.assert_allclose(got_h, want_h, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_gelu, act64(want_h, UnaryKind.GELU), rtol=2e-6, atol=2e-6)


def test_static_qmatmul_epilogue_is_exact_before_the_activation():
    g = rlx.Graph("static")
    xq = g.input("xq", (6, K), "u8")
    y = g.qmatmul(xq, g.constant(W), 0.02, WS, x_zero_point=131, bias=g.param("b", (N,)))
    g.set_outputs([g.add(g.relu(y), g.input("r", (6, N)))])
    c = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False), params={"b": B})
    assert [k.op for k in c.report().kernels if k.view_of is None] == ["qmatmul"]
    xv = RNG.integers(0, 256, (6, K), dtype=np.uint8)
    r = RNG.standard_normal((6, N)).astype(F)
    acc = (xv.astype(np.int64) - 131) @ W.astype(np.int64)
    want = np.maximum(acc.astype(F) * (F(0.02) * WS) + B, 0) + r
    np.testing.assert_array_equal(c.run({"xq": xv, "r": r})[0], want)


def _rewrite_header(data: bytes, edit) -> bytes:
    """Re-encode a graph file with its JSON header changed by ``edit`` (an older writer)."""
    pre = serialize._PRELUDE
    magic, version, hl, bl = pre.unpack_from(data)
    header = json.loads(data[pre.size : pre.size + hl])
    blobs = data[pre.size + hl : pre.size + hl + bl]
    edit(header)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-(pre.size + len(text)) % serialize.ALIGN)
    body = pre.pack(magic, version, len(text), bl) + text + blobs
    return body + hashlib.sha256(body).digest()


def test_files_written_before_the_epilogue_attributes_load():
    g = rlx.Graph("old")
    xq = g.input("xq", (3, K), "i8")
    g.set_outputs([g.qmatmul(xq, g.constant(W), 0.05, WS, bias=g.param("b", (N,)))])

    def drop_new(header: dict) -> None:
        for node in header["graph"]["nodes"]:
            if node["op"] == "qmatmul":
                del node["attrs"]["act"], node["attrs"]["has_residual"]

    old = _rewrite_header(serialize.dumps(g, {"b": B}), drop_new)
    g2, params = serialize.loads(old)
    (node,) = g2.find(QMatMul)
    assert node.op.act is None and not node.op.has_residual and node.op.has_bias
    xv = RNG.integers(-128, 128, (3, K), dtype=np.int8)
    np.testing.assert_array_equal(
        g2.evaluate({"xq": xv}, params)[0], g.evaluate({"xq": xv}, {"b": B})[0]
    )


def test_new_attributes_round_trip():
    g = dyn_graph("u8", UnaryKind.SILU, bias=True, res=True)
    g2, _ = serialize.loads(serialize.dumps(g, {"b": B}))
    (node,) = g2.find(DynamicQMatMul)
    assert node.op.mode is ActQuant.U8 and node.op.act is UnaryKind.SILU
    assert node.op.has_residual and node.op.w_scales == tuple(float(s) for s in WS)


def batch_oracle(a, b, transpose_b, alpha, unsigned):
    """Per batch: rows of a by the method, columns of b (rows of b^T) s8, int64 product."""
    bt = b if transpose_b else np.swapaxes(b, -1, -2)
    m, n = a.shape[-2], bt.shape[-2]
    a3, b3 = a.reshape(-1, m, a.shape[-1]), bt.reshape(-1, n, a.shape[-1])
    out = []
    for ai, bi in zip(a3, b3, strict=True):
        qa, sa, za = method(ai, unsigned)
        qb, sb, _ = method(bi, False)
        acc = (qa - za[:, None]) @ qb.T
        out.append(acc.astype(F) * (sa[:, None] * (sb * F(alpha))[None, :]))
    return np.array(out).reshape(*a.shape[:-1], n)


@pytest.mark.skipif(not TARGETS, reason="gcc is not installed")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("transpose_b", [True, False])
@pytest.mark.parametrize("unsigned", [False, True], ids=["s8", "u8"])
def test_batched_product_on_every_target(monkeypatch, target, transpose_b, unsigned):
    """Attention-shaped Q @ K^T (transpose_b) and P @ V (u8 rows of P >= 0)."""
    monkeypatch.setenv("RLX_ISA", target)
    a = RNG.standard_normal((2, 3, 17, 64)).astype(F)
    if unsigned:
        a = np.abs(a)
    a[0, 1, 4] = 0.0  # a zero row
    b = RNG.standard_normal((2, 3, 19, 64) if transpose_b else (2, 3, 64, 19)).astype(F)
    g = rlx.Graph("qbmm")
    ai, bi = g.input("a", a.shape), g.input("b", b.shape)
    mode = "u8" if unsigned else "s8"
    g.set_outputs([g.dynamic_qbatch_matmul(ai, bi, transpose_b, 0.125, a_mode=mode)])
    c = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False, num_threads=2))
    got = c.run({"a": a, "b": b})[0]
    want = batch_oracle(a, b, transpose_b, 0.125, unsigned)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    exact = 0.125 * (a @ (np.swapaxes(b, -1, -2) if transpose_b else b))
    assert np.abs(got - exact).max() < 0.02 * np.abs(exact).max()
    assert [k.kind.value for k in c.report().kernels] == ["native"]


def test_batched_product_shape_errors():
    g = rlx.Graph("bad")
    a = g.input("a", (2, 5, 8))
    with pytest.raises(ShapeError, match="leading dims differ"):
        g.dynamic_qbatch_matmul(a, g.input("b", (3, 8, 4)))
    with pytest.raises(ShapeError, match="contraction dims differ"):
        g.dynamic_qbatch_matmul(a, g.input("b2", (2, 4, 9)), transpose_b=True)
    with pytest.raises(ShapeError, match="alpha must be finite"):
        g.dynamic_qbatch_matmul(a, g.input("b3", (2, 8, 4)), alpha=0.0)
    with pytest.raises(ShapeError, match="a must be float"):
        g.dynamic_qbatch_matmul(g.input("i", (2, 5, 8), "i8"), g.input("b4", (2, 8, 4)))
    assert DynamicQBatchMatMul("u8").a_mode is ActQuant.U8


@pytest.mark.skipif(not TARGETS, reason="gcc is not installed")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("dtype", "zp"), [("i8", -3), ("u8", 140)])
def test_quantize_folds_into_the_static_qmatmul(monkeypatch, target, dtype, zp):
    """quantize(x) -> qmatmul becomes one qmatmul reading the float x (x_dtype); NaN goes
    to the zero point and +-inf saturate, as the quantize op says."""
    monkeypatch.setenv("RLX_ISA", target)
    g = rlx.Graph("static_q")
    x = g.input("x", (6, K))
    xq = g.quantize(x, 0.03, [zp], dtype=dtype)
    y = g.qmatmul(xq, g.constant(W), 0.03, WS, x_zero_point=zp, bias=g.param("b", (N,)))
    g.set_outputs([g.relu(y)])
    c = rlx.Session("cpu").compile(g, CompileOptions(use_cache=False), params={"b": B})
    assert [k.op for k in c.report().kernels if k.view_of is None] == ["qmatmul"]
    (node,) = c.graph.find(QMatMul)
    assert node.op.x_dtype is not None and node.op.act is UnaryKind.RELU
    xv = (RNG.standard_normal((6, K)) * 3).astype(F)
    xv[0, :3] = [np.nan, np.inf, -np.inf]
    xv[1, 5] = 1e30
    lo, hi = (-128, 127) if dtype == "i8" else (0, 255)
    t = np.rint(xv / F(0.03))
    q = np.clip(np.where(np.isnan(t), 0, np.clip(t, -(2.0**40), 2.0**40)) + zp, lo, hi)
    acc = (q.astype(np.int64) - zp) @ W.astype(np.int64)
    want = np.maximum(acc.astype(F) * (F(0.03) * WS) + B, 0)
    np.testing.assert_array_equal(c.run({"x": xv})[0], want)
