"""The seed's ops rlx lacked: SelectiveScan, DenseSolve / BatchedDenseSolve, GroupedMatMul,
LoraMatMul, QConv2d, Sample and CustomFn. Each against an oracle written here (Python
loops, SciPy), on the reference interpreter and the compiled CPU path (whose kernels,
in ``kernels.seed``, must not be the reference kernel), plus shape and run-time errors.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.backends.cpu.kernels import KernelKind
from rlx.errors import InputError, ShapeError
from rlx.ir.serialize import dumps, loads
from rlx.ops.custom import CustomFn
from rlx.ops.linalg import BatchedDenseSolve, DenseSolve, GroupedMatMul, LoraMatMul
from rlx.ops.qconv import QConv2d
from rlx.ops.recurrent import SelectiveScan
from rlx.ops.sample import Sample
from rlx.options import CompileOptions
from rlx.runtime.session import Session

RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)
FAST = settings(max_examples=25, deadline=None)


def build(inputs: dict[str, np.ndarray], fn, name: str = "t") -> rlx.Graph:
    g = rlx.Graph(name)
    ids = [g.input(k, v.shape, rlx.DType.from_numpy(v.dtype)) for k, v in inputs.items()]
    g.set_outputs([fn(g, *ids)])
    g.verify()
    return g


def both(g: rlx.Graph, feed: dict[str, np.ndarray], op: str, runs: int = 2):
    """(reference result, compiled result); the compiled op's kernel is not the
    reference one, and a second run (reused scratch) gives the same values."""
    (want,) = g.evaluate(feed)
    cg = Session("cpu").compile(g, RAW)
    outs = [cg.run(feed)[0] for _ in range(runs)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    kinds = {k.kind for k in cg.report().kernels if k.op == op}
    assert kinds and KernelKind.REFERENCE not in kinds, kinds
    return want, outs[0]


# ---- SelectiveScan -----------------------------------------------------------------------


def scan_oracle(x, delta, a, b, c, d=None, z=None, bias=None, softplus=False):
    """Scalar Python loops over batch, channel, time and state."""
    bs, s, h = x.shape
    n = a.shape[1]
    y = np.zeros((bs, s, h))
    for bi in range(bs):
        for ch in range(h):
            state = [0.0] * n
            for t in range(s):
                dt = float(delta[bi, t, ch]) + (float(bias[ch]) if bias is not None else 0.0)
                if softplus:
                    dt = math.log1p(math.exp(dt))
                acc = 0.0
                for k in range(n):
                    state[k] = math.exp(dt * float(a[ch, k])) * state[k] + dt * float(
                        b[bi, t, k]
                    ) * float(x[bi, t, ch])
                    acc += float(c[bi, t, k]) * state[k]
                if d is not None:
                    acc += float(d[ch]) * float(x[bi, t, ch])
                if z is not None:
                    zz = float(z[bi, t, ch])
                    acc *= zz / (1.0 + math.exp(-zz))
                y[bi, t, ch] = acc
    return y


def scan_inputs(rng, bs, s, h, n, dtype=np.float32):
    return {
        "x": rng.standard_normal((bs, s, h)).astype(dtype),
        "delta": rng.uniform(0.01, 0.5, (bs, s, h)).astype(dtype),
        "a": -rng.uniform(0.1, 2.0, (h, n)).astype(dtype),
        "b": rng.standard_normal((bs, s, n)).astype(dtype),
        "c": rng.standard_normal((bs, s, n)).astype(dtype),
    }


@FAST
@given(
    dims=st.tuples(st.integers(1, 2), st.integers(1, 6), st.integers(1, 4), st.integers(1, 5)),
    opts=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
    seed=st.integers(0, 2**16),
)
def test_selective_scan_matches_a_loop(dims, opts, seed):
    bs, s, h, n = dims
    has_d, has_z, has_bias, softplus = opts
    rng = np.random.default_rng(seed)
    feed = scan_inputs(rng, bs, s, h, n)
    if has_d:
        feed["d"] = rng.standard_normal(h).astype(np.float32)
    if has_z:
        feed["z"] = rng.standard_normal((bs, s, h)).astype(np.float32)
    if has_bias:
        feed["bias"] = rng.uniform(-0.5, 0.5, h).astype(np.float32)

    def fn(g, x, delta, a, b, c, *rest):
        it = iter(rest)
        d = next(it) if has_d else None
        z = next(it) if has_z else None
        bias = next(it) if has_bias else None
        return g.selective_scan(
            x, delta, a, b, c, d=d, z=z, delta_bias=bias, delta_softplus=softplus
        )

    g = build(feed, fn)
    (node,) = g.find(SelectiveScan)
    assert node.op.state_size == n and node.op.num_inputs() == 5 + has_d + has_z + has_bias
    want = scan_oracle(
        *(feed[k] for k in "x delta a b c".split()),
        d=feed.get("d"),
        z=feed.get("z"),
        bias=feed.get("bias"),
        softplus=softplus,
    )
    ref, got = both(g, feed, "selective_scan")
    np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, ml_dtypes.bfloat16])
def test_selective_scan_dtypes(dtype):
    rng = np.random.default_rng(1)
    feed = scan_inputs(rng, 2, 5, 3, 4, dtype)
    g = build(feed, lambda g, *ids: g.selective_scan(*ids))
    want = scan_oracle(*(feed[k].astype(np.float64) for k in "x delta a b c".split()))
    ref, got = both(g, feed, "selective_scan")
    assert ref.dtype == np.dtype(dtype) and got.dtype == np.dtype(dtype)
    tol = 1e-12 if dtype is np.float64 else 3e-2
    for r in (ref, got):
        np.testing.assert_allclose(r.astype(np.float64), want, rtol=tol, atol=tol)


def test_selective_scan_shape_errors():
    g = rlx.Graph("g")
    x, delta = g.input("x", (2, 5, 3)), g.input("delta", (2, 5, 3))
    a, b, c = g.input("a", (3, 4)), g.input("b", (2, 5, 4)), g.input("c", (2, 5, 4))
    with pytest.raises(ShapeError, match=r"selective_scan: b must be \[B, S, N\] = \[2,5,4\]"):
        g.selective_scan(x, delta, a, g.input("b2", (2, 5, 3)), c)
    with pytest.raises(ShapeError, match=r"a must be \[H, N\] = \[3, 4\], got f32\[4,4\]"):
        g.apply(SelectiveScan(4), [x, delta, g.input("a2", (4, 4)), b, c])
    with pytest.raises(ShapeError, match=r"d must be \[H\] = \[3\]"):
        g.selective_scan(x, delta, a, b, c, d=g.input("d", (4,)))
    with pytest.raises(ShapeError, match="delta f64"):
        g.selective_scan(x, g.input("dd", (2, 5, 3), "f64"), a, b, c)


# ---- DenseSolve / BatchedDenseSolve -----------------------------------------------------


@FAST
@given(n=st.integers(1, 6), k=st.sampled_from([None, 1, 3]), seed=st.integers(0, 2**16))
def test_dense_solve_matches_scipy(n, k, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((n, n)) + n * np.eye(n)).astype(np.float64)
    b = rng.standard_normal((n,) if k is None else (n, k))
    g = build({"a": a, "b": b}, lambda g, a, b: g.dense_solve(a, b))
    assert g.find(DenseSolve)
    want = scipy.linalg.solve(a, b)
    ref, got = both(g, {"a": a, "b": b}, "dense_solve")
    np.testing.assert_allclose(ref, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a @ got, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dense_solve_narrow_dtypes(dtype):
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((4, 4)) + 4 * np.eye(4)).astype(dtype)
    b = rng.standard_normal((4, 2)).astype(dtype)
    g = build({"a": a, "b": b}, lambda g, a, b: g.dense_solve(a, b))
    want = scipy.linalg.solve(a.astype(np.float64), b.astype(np.float64))
    tol = 1e-5 if dtype is np.float32 else 2e-3
    for r in both(g, {"a": a, "b": b}, "dense_solve"):
        assert r.dtype == dtype
        np.testing.assert_allclose(r.astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("batch", [(3,), (2, 2)])
@pytest.mark.parametrize("k", [None, 2])
def test_batched_dense_solve_matches_a_scipy_loop(batch, k):
    rng = np.random.default_rng(3)
    n = 4
    a = rng.standard_normal((*batch, n, n)) + n * np.eye(n)
    b = rng.standard_normal((*batch, n) if k is None else (*batch, n, k))
    g = build({"a": a, "b": b}, lambda g, a, b: g.dense_solve(a, b))
    assert g.find(BatchedDenseSolve)
    want = np.empty_like(b)
    for idx in np.ndindex(*batch):
        want[idx] = scipy.linalg.solve(a[idx], b[idx])
    for r in both(g, {"a": a, "b": b}, "batched_dense_solve"):
        np.testing.assert_allclose(r, want, rtol=1e-10, atol=1e-12)


def test_singular_matrix_is_an_input_error_on_both_paths():
    """An exactly singular A has no solution: an InputError naming the node (LAPACK
    reports a zero pivot), not inf/NaN, on the reference and the compiled path."""
    a = np.array([[1.0, 2.0], [2.0, 4.0]])
    b = np.array([1.0, 1.0])
    g = build({"a": a, "b": b}, lambda g, a, b: g.dense_solve(a, b))
    with pytest.raises(InputError, match=r"dense_solve\b.*: A is singular"):
        g.evaluate({"a": a, "b": b})
    cg = Session("cpu").compile(g, RAW)
    with pytest.raises(InputError, match=r"dense_solve\b.*: A is singular"):
        cg.run({"a": a, "b": b})
    ok = np.array([[2.0, 0.0], [0.0, 4.0]])
    np.testing.assert_allclose(cg.run({"a": ok, "b": b})[0], [0.5, 0.25])  # still usable

    ab = np.stack([np.eye(2), a, np.eye(2)])
    bb = np.ones((3, 2))
    g = build({"a": ab, "b": bb}, lambda g, a, b: g.dense_solve(a, b))
    with pytest.raises(InputError, match=r"batched_dense_solve\b.*: A\[1\] is singular"):
        g.evaluate({"a": ab, "b": bb})
    with pytest.raises(InputError, match=r"batched_dense_solve\b.*: A\[1\] is singular"):
        Session("cpu").compile(g, RAW).run({"a": ab, "b": bb})


def test_dense_solve_shape_errors():
    g = rlx.Graph("g")
    with pytest.raises(ShapeError, match=r"dense_solve: A must be square \[N, N\], got f32\[2,3\]"):
        g.dense_solve(g.input("a", (2, 3)), g.input("b", (2,)))
    with pytest.raises(ShapeError, match=r"b must be \[N\] or \[N, K\] with N = 3"):
        g.dense_solve(g.input("a2", (3, 3)), g.input("b2", (2,)))
    with pytest.raises(ShapeError, match="A must be a float tensor"):
        g.dense_solve(g.input("a3", (2, 2), "i32"), g.input("b3", (2,), "i32"))
    with pytest.raises(ShapeError, match=r"batched_dense_solve: b must be \[\*batch, N\]"):
        g.dense_solve(g.input("a4", (2, 3, 3)), g.input("b4", (3, 3)))


# ---- GroupedMatMul / LoraMatMul ----------------------------------------------------------


@FAST
@given(
    m=st.integers(0, 9),
    e=st.integers(1, 4),
    dtype=st.sampled_from(["float32", "float64", "bfloat16"]),
    seed=st.integers(0, 2**16),
)
def test_grouped_matmul_matches_a_token_loop(m, e, dtype, seed):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, 5)).astype(dt)
    w = rng.standard_normal((e, 5, 3)).astype(dt)
    idx = rng.integers(0, e, m).astype(np.int32)
    feed = {"x": x, "w": w, "idx": idx}
    g = build(feed, lambda g, x, w, i: g.grouped_matmul(x, w, i))
    assert g.find(GroupedMatMul)
    want = np.zeros((m, 3))
    for i in range(m):
        for n in range(3):
            want[i, n] = sum(float(x[i, k]) * float(w[idx[i], k, n]) for k in range(5))
    tol = 2e-2 if dtype == "bfloat16" else 1e-5
    for r in both(g, feed, "grouped_matmul"):
        assert r.dtype == dt and r.shape == (m, 3)
        np.testing.assert_allclose(r.astype(np.float64), want, rtol=tol, atol=tol)


def test_grouped_matmul_bad_expert_id_is_an_input_error():
    feed = {
        "x": np.ones((3, 2), np.float32),
        "w": np.ones((2, 2, 2), np.float32),
        "idx": np.array([0, 2, 1], np.int64),
    }
    g = build(feed, lambda g, x, w, i: g.grouped_matmul(x, w, i))
    with pytest.raises(InputError, match=r"expert_idx holds 2, outside \[0, 2\)"):
        g.evaluate(feed)
    with pytest.raises(InputError, match=r"expert_idx holds 2, outside \[0, 2\)"):
        Session("cpu").compile(g, RAW).run(feed)
    with pytest.raises(ShapeError, match=r"expert_idx must be an integer \[M\] = \[3\]"):
        g.grouped_matmul(g.input("x2", (3, 2)), g.input("w2", (2, 2, 2)), g.input("i2", (3,)))
    with pytest.raises(ShapeError, match="contracted dims differ"):
        g.grouped_matmul(
            g.input("x3", (3, 4)), g.input("w3", (2, 2, 2)), g.input("i3", (3,), "i32")
        )


@pytest.mark.parametrize("xdims", [(4, 6), (2, 3, 6)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lora_matmul_matches_numpy(xdims, dtype):
    rng = np.random.default_rng(4)
    feed = {
        "x": rng.standard_normal(xdims).astype(dtype),
        "w": rng.standard_normal((6, 5)).astype(dtype),
        "a": rng.standard_normal((6, 2)).astype(dtype),
        "b": rng.standard_normal((2, 5)).astype(dtype),
    }
    g = build(feed, lambda g, x, w, a, b: g.lora_matmul(x, w, a, b, scale=0.25))
    (node,) = g.find(LoraMatMul)
    assert node.op.scale == 0.25
    f = {k: v.astype(np.float64) for k, v in feed.items()}
    want = f["x"] @ f["w"] + 0.25 * (f["x"] @ f["a"] @ f["b"])
    tol = 1e-5 if dtype is np.float32 else 1e-12
    for r in both(g, feed, "lora_matmul"):
        np.testing.assert_allclose(r, want, rtol=tol, atol=tol)


def test_lora_matmul_shape_errors():
    g = rlx.Graph("g")
    x, w = g.input("x", (4, 6)), g.input("w", (6, 5))
    with pytest.raises(ShapeError, match=r"lora_matmul: b must be \[R, N\] = \[2, 5\]"):
        g.lora_matmul(x, w, g.input("a", (6, 2)), g.input("b", (3, 5)))
    with pytest.raises(ShapeError, match=r"a must be \[K, R\] with K = 6"):
        g.lora_matmul(x, w, g.input("a2", (5, 2)), g.input("b2", (2, 5)))


# ---- QConv2d -----------------------------------------------------------------------------


def qconv_oracle(x, w, x_zp, x_scale, w_scales, bias, stride, pad, dil, groups):
    """Integer loops straight from the definition (padding reads the zero point)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ho = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    wo = (wd + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    og = o // groups
    ws = np.broadcast_to(np.float32(x_scale) * np.asarray(w_scales, np.float32), (o,))
    y = np.zeros((n, o, ho, wo), np.float32)
    for b in range(n):
        for oc in range(o):
            grp = oc // og
            for i in range(ho):
                for j in range(wo):
                    acc = 0
                    for ci in range(cg):
                        for u in range(kh):
                            for v in range(kw):
                                r, s = i * stride + u * dil - pad, j * stride + v * dil - pad
                                if 0 <= r < h and 0 <= s < wd:
                                    xv = int(x[b, grp * cg + ci, r, s]) - x_zp
                                else:
                                    xv = 0
                                acc += xv * int(w[oc, ci, u, v])
                    val = np.float32(acc) * ws[oc]
                    y[b, oc, i, j] = val + (np.float32(bias[oc]) if bias is not None else 0)
    return y


@FAST
@given(
    geom=st.sampled_from([(1, 0, 1, 1), (2, 1, 1, 1), (1, 1, 2, 1), (1, 0, 1, 2), (2, 2, 1, 2)]),
    unsigned=st.booleans(),
    per_channel=st.booleans(),
    has_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_qconv2d_matches_an_integer_loop(geom, unsigned, per_channel, has_bias, seed):
    stride, pad, dil, groups = geom
    rng = np.random.default_rng(seed)
    c, o = 2 * groups, 2 * groups
    if unsigned:
        x, x_zp = rng.integers(0, 256, (2, c, 6, 5)).astype(np.uint8), 128
    else:
        x, x_zp = rng.integers(-128, 128, (2, c, 6, 5)).astype(np.int8), -3
    w = rng.integers(-128, 128, (o, c // groups, 3, 2)).astype(np.int8)
    ws = tuple(rng.uniform(0.01, 0.1, o)) if per_channel else (0.05,)
    bias = rng.standard_normal(o).astype(np.float32) if has_bias else None
    feed = {"x": x, "w": w} | ({"bias": bias} if has_bias else {})

    def fn(g, xq, wq, *b):
        return g.qconv2d(
            xq,
            wq,
            0.02,
            ws,
            x_zp,
            bias=b[0] if b else None,
            stride=stride,
            padding=pad,
            dilation=dil,
            groups=groups,
        )

    g = build(feed, fn)
    assert g.find(QConv2d)
    want = qconv_oracle(x, w, x_zp, 0.02, ws, bias, stride, pad, dil, groups)
    for r in both(g, feed, "qconv2d"):
        assert r.dtype == np.float32
        np.testing.assert_allclose(r, want, rtol=1e-6, atol=1e-5)


def test_qconv2d_padding_survives_scratch_shared_with_another_conv():
    """Two qconv2d nodes whose padded inputs have one shape (4x4 padded by 1, 6x6 by 0)
    share scratch: the padded one's zero border must still be zero on the next run."""
    rng = np.random.default_rng(6)
    xa = rng.integers(-128, 128, (1, 2, 4, 4)).astype(np.int8)
    xb = rng.integers(-128, 128, (1, 2, 6, 6)).astype(np.int8)
    w = rng.integers(-128, 128, (2, 2, 3, 3)).astype(np.int8)
    g = rlx.Graph("two")
    a, b, wq = (
        g.input("a", (1, 2, 4, 4), "i8"),
        g.input("b", (1, 2, 6, 6), "i8"),
        g.input("w", (2, 2, 3, 3), "i8"),
    )
    ya = g.qconv2d(a, wq, 0.1, 0.02, 5, padding=1)
    yb = g.qconv2d(b, wq, 0.1, 0.02, 5, padding=0)
    g.set_outputs([ya, yb])
    cg = Session("cpu").compile(g, RAW)
    want = qconv_oracle(xa, w, 5, 0.1, (0.02,), None, 1, 1, 1, 1)
    for _ in range(3):
        got = cg.run({"a": xa, "b": xb, "w": w})[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_qconv2d_shape_errors():
    g = rlx.Graph("g")
    x, w = g.input("x", (1, 2, 4, 4), "i8"), g.input("w", (3, 2, 2, 2), "i8")
    with pytest.raises(ShapeError, match=r"qconv2d: w_q must be i8 \[O, C/g, kH, kW\]"):
        g.qconv2d(x, g.input("wf", (3, 2, 2, 2)), 0.1, 0.1)
    with pytest.raises(ShapeError, match="w_scales needs 1 or O=3"):
        g.qconv2d(x, w, 0.1, (0.1, 0.2))
    with pytest.raises(ShapeError, match="x_zero_point 200 outside"):
        g.qconv2d(x, w, 0.1, 0.1, x_zero_point=200)
    with pytest.raises(ShapeError, match=r"qconv2d: groups=2 must divide"):
        g.qconv2d(x, w, 0.1, 0.1, groups=2)


# ---- Sample ------------------------------------------------------------------------------

M32 = 0xFFFFFFFF


def philox_oracle(ctr, key):
    """Philox4x32-10 with Python ints (Random123's constants)."""
    c, k = list(ctr), list(key)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & M32, (k[1] + 0xBB67AE85) & M32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & M32, (p0 >> 32) ^ c[3] ^ k[1], p0 & M32]
    return c


def test_philox_known_answers():
    """Random123's published known-answer vectors for philox4x32_10."""
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((M32,) * 4, (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    from rlx.ops.sample import philox4x32

    for ctr, key, want in cases:
        assert tuple(philox_oracle(ctr, key)) == want
        assert tuple(int(w) for w in philox4x32([np.uint64(c) for c in ctr], key)) == want


def sample_oracle(logits, temperature, top_k, top_p, seed, offset):
    """The documented contract, one row at a time with Python lists."""
    rows = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    out = []
    for r, row in enumerate(rows):
        vals = [float(v) for v in row]
        if temperature == 0:
            out.append(vals.index(max(vals)))
            continue
        ctr = (r & M32, r >> 32, offset & M32, (offset >> 32) & M32)
        u = (philox_oracle(ctr, (seed & M32, seed >> 32))[0] >> 8) / 2.0**24
        z = [v / temperature for v in vals]
        if 0 < top_k < len(z):
            kth = sorted(z, reverse=True)[top_k - 1]
            z = [v if v >= kth else -math.inf for v in z]
        mx = max(z)
        e = [math.exp(v - mx) for v in z]
        p = [v / math.fsum(e) for v in e]
        if top_p < 1:
            order = sorted(range(len(p)), key=lambda i: (-p[i], i))
            keep, cum = set(), 0.0
            for i in order:
                keep.add(i)
                cum += p[i]
                if cum >= top_p:
                    break
            p = [v if i in keep else 0.0 for i, v in enumerate(p)]
        cum, tot = [], 0.0
        for v in p:
            tot += v
            cum.append(tot)
        thr = u * cum[-1]
        out.append(next(i for i, cv in enumerate(cum) if cv > thr))
    return np.array(out, np.int64).reshape(logits.shape[:-1])


def sample_graph(shape, dtype="f32", offset=False, **kw):
    g = rlx.Graph("s")
    x = g.input("logits", shape, dtype)
    off = g.input("step", (), "i64") if offset else None
    g.set_outputs([g.sample(x, offset=off, **kw)])
    return g


@FAST
@given(
    rows=st.integers(1, 6),
    vocab=st.integers(1, 12),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    top_k=st.sampled_from([0, 1, 3, 20]),
    top_p=st.sampled_from([1.0, 0.9, 0.5, 0.1]),
    seed=st.sampled_from([0, 7, 2**40 + 3, 2**64 - 1]),
    offset=st.integers(0, 2**40),
    data=st.integers(0, 2**16),
)
def test_sample_follows_the_documented_contract(
    rows, vocab, temperature, top_k, top_p, seed, offset, data
):
    rng = np.random.default_rng(data)
    logits = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    g = sample_graph(
        (rows, vocab), offset=True, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed
    )
    (node,) = g.find(Sample)
    assert node.shape.dtype is rlx.DType.I64
    feed = {"logits": logits, "step": np.array(offset, np.int64)}
    want = sample_oracle(logits, temperature, top_k, top_p, seed, offset)
    ref, got = both(g, feed, "sample")
    np.testing.assert_array_equal(ref, want)
    np.testing.assert_array_equal(got, want)


def test_sample_distribution_and_filters():
    """Over many identical rows the draws follow softmax(logits / T) (a chi-square bound),
    top-k never draws outside the k largest, top-p outside the nucleus."""
    vocab, rows = 6, 20000
    logits = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))
    batch = np.tile(logits, (rows, 1)).astype(np.float32)
    cg = Session("cpu").compile(sample_graph((rows, vocab), seed=11), RAW)
    counts = np.bincount(cg.run({"logits": batch})[0], minlength=vocab)
    p = np.exp(logits) / np.exp(logits).sum()
    chi2 = float(((counts - rows * p) ** 2 / (rows * p)).sum())
    assert chi2 < 20.5, (counts, chi2)  # 5 dof: p < 0.001
    cg = Session("cpu").compile(sample_graph((rows, vocab), seed=11, top_k=2), RAW)
    assert set(np.unique(cg.run({"logits": batch})[0])) == {0, 1}
    cg = Session("cpu").compile(sample_graph((rows, vocab), seed=11, top_p=0.7), RAW)
    assert set(np.unique(cg.run({"logits": batch})[0])) == {0, 1, 2}  # 0.4+0.25 < 0.7


def test_sample_is_deterministic_and_the_offset_varies_it():
    logits = np.zeros((64, 50), np.float32)
    g = sample_graph((64, 50), offset=True, seed=5)
    cg = Session("cpu").compile(g, RAW)
    a = cg.run({"logits": logits, "step": np.array(0)})[0]
    b = cg.run({"logits": logits, "step": np.array(0)})[0]
    c = cg.run({"logits": logits, "step": np.array(1)})[0]
    np.testing.assert_array_equal(a, b)
    assert (a != c).sum() > 40
    np.testing.assert_array_equal(a, g.evaluate({"logits": logits, "step": np.array(0)})[0])


def test_sample_masked_and_bad_rows():
    logits = np.array([[-np.inf, 0.0, -np.inf], [3.0, -np.inf, -np.inf]], np.float32)
    g = sample_graph((2, 3), seed=3)
    for r in both(g, {"logits": logits}, "sample"):
        np.testing.assert_array_equal(r, [1, 0])
    cg = Session("cpu").compile(g, RAW)
    plus_inf = np.array([[0.0, np.inf, 1.0], [0.0, 0.0, 0.0]])
    for bad, msg in (
        (np.full((2, 3), -np.inf), "all -inf"),
        (np.full((2, 3), np.nan), "NaN"),
        (plus_inf, r"NaN or \+inf"),
    ):
        with pytest.raises(InputError, match=msg):
            g.evaluate({"logits": bad.astype(np.float32)})
        with pytest.raises(InputError, match=msg):
            cg.run({"logits": bad.astype(np.float32)})


def test_sample_shape_and_attribute_errors():
    g = rlx.Graph("g")
    x = g.input("x", (2, 5))
    with pytest.raises(ShapeError, match=r"sample: top_p must be in \(0, 1\], got 0"):
        g.sample(x, top_p=0.0)
    with pytest.raises(ShapeError, match="temperature must be >= 0"):
        g.sample(x, temperature=-1.0)
    with pytest.raises(ShapeError, match="offset must be a one-element integer tensor"):
        g.sample(x, offset=g.input("o", (2,), "i64"))
    with pytest.raises(ShapeError, match="logits must be float"):
        g.sample(g.input("xi", (2, 5), "i32"))


# ---- CustomFn ----------------------------------------------------------------------------


def _softplus_fn(g):
    x = g.input("x", (2, 3))
    y = g.input("y", (3,))
    return x, y


def test_custom_fn_runs_its_body_and_carries_its_rules():
    g = rlx.Graph("g")
    x, y = _softplus_fn(g)

    def fwd(s, a, b):
        return s.add(s.exp(a), b)

    def vjp(s, a, b, primal, d):
        return [s.mul(d, s.exp(a)), s.sum(d, axes=0)]

    def jvp(s, a, b, ta, tb, primal):
        return s.add(s.mul(ta, s.exp(a)), tb)

    out = g.custom_fn([x, y], fwd, vjp=vjp, jvp=jvp)
    g.set_outputs([out])
    g.verify()
    (node,) = g.find(CustomFn)
    assert node.op.n_inputs == 2 and len(node.op.subgraphs()) == 3
    assert "custom_fn[n_inputs=2, vjp=True, jvp=True]" in g.inspect()
    rng = np.random.default_rng(5)
    feed = {
        "x": rng.standard_normal((2, 3)).astype(np.float32),
        "y": rng.standard_normal(3).astype(np.float32),
    }
    want = np.exp(feed["x"].astype(np.float64)) + feed["y"]
    for r in both(g, feed, "custom_fn"):
        np.testing.assert_allclose(r, want, rtol=1e-6)
    g2, _ = loads(dumps(g))
    assert g2 == g and g2.fingerprint() == g.fingerprint()
    np.testing.assert_allclose(g2.evaluate(feed)[0], want, rtol=1e-6)


def test_custom_fn_bodies_are_part_of_identity():
    def graph(rule):
        g = rlx.Graph("g")
        x = g.input("x", (3,))
        g.set_outputs([g.custom_fn([x], lambda s, a: s.exp(a), vjp=rule)])
        return g

    a = graph(lambda s, x, p, d: [s.mul(d, p)])
    b = graph(lambda s, x, p, d: [s.mul(d, s.exp(x))])
    assert a != b and a.fingerprint() != b.fingerprint()
    assert graph(None) != a


def test_custom_fn_checks_its_bodies():
    g = rlx.Graph("g")
    x = g.input("x", (3,))
    with pytest.raises(ShapeError, match="custom_fn: fwd_body must return exactly one output"):
        g.custom_fn([x], lambda s, a: [s.exp(a), s.neg(a)])
    with pytest.raises(ShapeError, match=r"vjp_body must return \[f32\[3\]\], returns \[\]"):
        g.custom_fn([x], lambda s, a: s.exp(a), vjp=lambda s, a, p, d: [])
    bad = rlx.Graph("vjp")
    bad.set_outputs([bad.input("in0", (3,))])
    with pytest.raises(
        ShapeError, match=r"vjp_body must read Inputs named \['primal_output', 'd_output'\]"
    ):
        g.custom_fn([x], lambda s, a: s.exp(a), vjp=bad)
    jvp = rlx.Graph("jvp")
    jvp.set_outputs([jvp.input("tangent_0", (4,))])
    with pytest.raises(
        ShapeError, match=r"jvp_body input 'tangent_0' is f32\[4\], expected f32\[3\]"
    ):
        g.custom_fn([x], lambda s, a: s.exp(a), jvp=jvp)
    fwd = rlx.Graph("fwd")
    fwd.set_outputs([fwd.exp(fwd.input("in1", (3,)))])
    with pytest.raises(ShapeError, match=r"input 'in1' \(%0\) is not one of in0..in0"):
        g.custom_fn([x], fwd)


# ---- no allocation per run ---------------------------------------------------------------


def _big_cases():
    rng = np.random.default_rng(9)
    f = np.float32
    a = rng.standard_normal((96, 96)) + 96 * np.eye(96)
    return [
        (
            lambda g, *i: g.selective_scan(*i),
            {
                "x": rng.standard_normal((2, 64, 64)).astype(f),
                "delta": rng.uniform(0, 0.1, (2, 64, 64)).astype(f),
                "a": -rng.uniform(0, 1, (64, 16)).astype(f),
                "b": rng.standard_normal((2, 64, 16)).astype(f),
                "c": rng.standard_normal((2, 64, 16)).astype(f),
            },
        ),
        (
            lambda g, a, b: g.dense_solve(a, b),
            {"a": np.stack([a] * 8).astype(f), "b": rng.standard_normal((8, 96, 4)).astype(f)},
        ),
        (
            lambda g, x, w, i: g.grouped_matmul(x, w, i),
            {
                "x": rng.standard_normal((256, 64)).astype(f),
                "w": rng.standard_normal((16, 64, 64)).astype(f),
                "i": rng.integers(0, 16, 256).astype(np.int32),
            },
        ),
        (
            lambda g, x, w, a, b: g.lora_matmul(x, w, a, b, 0.5),
            {
                "x": rng.standard_normal((256, 128)).astype(f),
                "w": rng.standard_normal((128, 128)).astype(f),
                "a": rng.standard_normal((128, 8)).astype(f),
                "b": rng.standard_normal((8, 128)).astype(f),
            },
        ),
        (
            lambda g, x, w: g.qconv2d(x, w, 0.1, 0.02, 3, padding=1),
            {
                "x": rng.integers(-128, 128, (2, 16, 16, 16)).astype(np.int8),
                "w": rng.integers(-128, 128, (32, 16, 3, 3)).astype(np.int8),
            },
        ),
        (
            lambda g, x: g.sample(x, 0.8, 40, 0.9, 3),
            {"x": rng.standard_normal((8, 16000)).astype(f)},
        ),
        (
            lambda g, x: g.custom_fn([x], lambda s, a: s.mul(s.tanh(a), a)),
            {"x": rng.standard_normal((256, 256)).astype(f)},
        ),
    ]


def test_seed_kernels_allocate_nothing_data_sized_per_run():
    """tracemalloc sees NumPy's allocations: over one run, the peak beyond the returned
    output copy stays below 256 KiB (NumPy's fixed ufunc buffers, LAPACK's pivots), far
    below any of these ops' data (0.5-2 MiB)."""
    import tracemalloc

    for fn, feed in _big_cases():
        g = build(feed, fn)
        cg = Session("cpu").compile(g, RAW)
        out = cg.run(feed)[0]
        tracemalloc.start()
        try:
            cg.run(feed)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        extra = peak - out.nbytes
        assert extra < 256 * 1024, f"{g.nodes[-1].op.mnemonic}: {extra / 1024:.0f} KiB per run"
