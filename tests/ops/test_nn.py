import dataclasses
import math

import numpy as np
import pytest
import scipy.signal
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx import DType, Shape
from rlx.errors import ShapeError
from rlx.ops.nn import Attention, Conv, MaskKind, MaskType, Pool, PoolKind, Rope

RNG = np.random.default_rng(0)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ---- MaskKind ---------------------------------------------------------------------


def test_mask_kind_is_frozen_hashable_printable():
    kinds = [MaskKind.none(), MaskKind.causal(), MaskKind.sliding_window(4), MaskKind.custom()]
    assert [k.type for k in kinds] == list(MaskType)
    assert [str(k) for k in kinds] == ["none", "causal", "sliding_window(4)", "custom"]
    assert MaskKind.sliding_window(4) == MaskKind(MaskType.SLIDING_WINDOW, 4)
    assert len(set(kinds + [MaskKind.causal()])) == 4
    assert MaskKind() == MaskKind.none() and MaskKind.sliding_window(4).window == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        MaskKind.causal().window = 3  # type: ignore[misc]
    with pytest.raises(ShapeError, match="sliding window size must be an int >= 1, got 0"):
        MaskKind.sliding_window(0)
    with pytest.raises(ShapeError, match="a causal mask has no window, got window=2"):
        MaskKind(MaskType.CAUSAL, 2)


def test_mask_allowed_is_aligned_to_the_end():
    T, F = True, False
    assert MaskKind.none().allowed(2, 4) is None and MaskKind.custom().allowed(2, 4) is None
    np.testing.assert_array_equal(MaskKind.causal().allowed(2, 4), [[T, T, T, F], [T, T, T, T]])
    np.testing.assert_array_equal(MaskKind.causal().allowed(1, 3), [[T, T, T]])  # decode step
    np.testing.assert_array_equal(
        MaskKind.sliding_window(2).allowed(2, 4), [[F, T, T, F], [F, F, T, T]]
    )
    np.testing.assert_array_equal(MaskKind.causal().allowed(3, 2), [[F, F], [T, F], [T, T]])


# ---- attention --------------------------------------------------------------------


def _attention_loop(q, k, v, h, d, hkv, mask, custom=None, scale=None):
    """Naive per-head, per-query reference in float64 (dead rows give NaN, as softmax)."""
    b, sq, _ = q.shape
    skv = k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros((b, sq, h * d))
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hkv)
            for i in range(sq):
                qi = q[bi, i, hi * d : (hi + 1) * d].astype(np.float64)
                scores = []
                for j in range(skv):
                    kj = k[bi, j, kv * d : (kv + 1) * d].astype(np.float64)
                    s = float(qi @ kj) * scale
                    if custom is not None:
                        s += float(np.broadcast_to(custom, (b, h, sq, skv))[bi, hi, i, j])
                    last = i + skv - sq
                    if mask.type in (MaskType.CAUSAL, MaskType.SLIDING_WINDOW) and j > last:
                        s = -math.inf
                    if mask.type is MaskType.SLIDING_WINDOW and j <= last - mask.window:
                        s = -math.inf
                    scores.append(s)
                if max(scores) == -math.inf:
                    out[bi, i, hi * d : (hi + 1) * d] = math.nan
                    continue
                m = max(scores)
                w = [math.exp(s - m) for s in scores]
                tot = sum(w)
                for j in range(skv):
                    vj = v[bi, j, kv * d : (kv + 1) * d].astype(np.float64)
                    out[bi, i, hi * d : (hi + 1) * d] += w[j] / tot * vj
    return out


def _attention_graph(b, sq, skv, h, d, hkv, mask, mask_shape=None, dtype=DType.F32, scale=None):
    g = rlx.Graph("attn")
    q = g.input("q", (b, sq, h * d), dtype)
    k = g.input("k", (b, skv, hkv * d), dtype)
    v = g.input("v", (b, skv, hkv * d), dtype)
    m = None if mask_shape is None else g.input("m", mask_shape, dtype)
    y = g.attention(q, k, v, h, d, mask=mask, mask_input=m, num_kv_heads=hkv, scale=scale)
    g.set_outputs([y])
    return g, y


MASKS = [MaskKind.none(), MaskKind.causal(), MaskKind.sliding_window(2), MaskKind.custom()]


@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize(("h", "hkv"), [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize(("sq", "skv"), [(5, 5), (3, 6), (1, 4)])
def test_attention_matches_naive_loop(mask, h, hkv, sq, skv):
    b, d = 2, 3
    custom_shape = (b, 1, sq, skv) if mask.type is MaskType.CUSTOM else None
    g, y = _attention_graph(b, sq, skv, h, d, hkv, mask, custom_shape)
    assert g.shape(y) == Shape((b, sq, h * d))
    assert g.nodes[y].op.num_inputs() == (4 if custom_shape else 3)
    q, k, v = _rand(b, sq, h * d), _rand(b, skv, hkv * d), _rand(b, skv, hkv * d)
    feeds = {"q": q, "k": k, "v": v}
    custom = None
    if custom_shape:
        custom = np.where(RNG.random(custom_shape) < 0.3, -np.inf, _rand(*custom_shape))
        custom[..., 0] = 0.0  # every row keeps one key
        feeds["m"] = custom.astype(np.float32)
    (got,) = g.evaluate(feeds)
    want = _attention_loop(q, k, v, h, d, hkv, mask, custom)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mshape", [(4, 5), (1, 4, 5), (2, 1, 4, 5), (1, 2, 1, 5), (2, 2, 4, 5)])
def test_attention_custom_mask_broadcasts(mshape):
    b, sq, skv, h, d = 2, 4, 5, 2, 3
    g, _ = _attention_graph(b, sq, skv, h, d, h, MaskKind.custom(), mshape)
    q, k, v, m = _rand(b, sq, h * d), _rand(b, skv, h * d), _rand(b, skv, h * d), _rand(*mshape)
    (got,) = g.evaluate({"q": q, "k": k, "v": v, "m": m})
    np.testing.assert_allclose(
        got, _attention_loop(q, k, v, h, d, h, MaskKind.none(), m), rtol=1e-5, atol=1e-5
    )


def test_attention_row_that_sees_no_key_gives_zero():
    # a query that sees no key gives exactly 0, not the NaN of softmax over only -inf
    # (issue 29; tests/ops/test_attention_empty_rows.py covers every path). Causal with
    # more queries than keys: query 0 sees key j <= 0 + 2 - 3 = -1, i.e. none
    g, _ = _attention_graph(1, 3, 2, 1, 2, 1, MaskKind.causal())
    q, k, v = _rand(1, 3, 2), _rand(1, 2, 2), _rand(1, 2, 2)
    (got,) = g.evaluate({"q": q, "k": k, "v": v})
    assert (got[0, 0] == 0).all() and np.isfinite(got).all()
    np.testing.assert_allclose(got[0, 1], v[0, 0], rtol=1e-6)  # sees only key 0
    # a custom mask row of only -inf gives 0 too
    g, _ = _attention_graph(1, 2, 3, 1, 2, 1, MaskKind.custom(), (2, 3))
    m = np.array([[-np.inf] * 3, [0.0, -np.inf, -np.inf]], np.float32)
    v3 = _rand(1, 3, 2)
    (got,) = g.evaluate({"q": q[:, :2], "k": _rand(1, 3, 2), "v": v3, "m": m})
    assert (got[0, 0] == 0).all()
    np.testing.assert_allclose(got[0, 1], v3[0, 0], rtol=1e-6)
    # NaN inputs are not hidden
    qn = q.copy()
    qn[0, 2, 0] = np.nan
    g, _ = _attention_graph(1, 3, 2, 1, 2, 1, MaskKind.causal())
    (got,) = g.evaluate({"q": qn, "k": k, "v": v})
    assert np.isnan(got[0, 2]).all() and not np.isnan(got[0, 1]).any()


def test_attention_scale_hand_computed():
    # one query, two keys, scale 0.5: weights softmax([0.5*1, 0.5*3]) over v rows
    g, y = _attention_graph(1, 1, 2, 1, 1, 1, MaskKind.none(), scale=0.5)
    assert g.nodes[y].op.effective_scale == 0.5
    (got,) = g.evaluate(
        {
            "q": np.array([[[1.0]]]),
            "k": np.array([[[1.0], [3.0]]]),
            "v": np.array([[[10.0], [20.0]]]),
        }
    )
    w = np.exp([0.5, 1.5]) / np.exp([0.5, 1.5]).sum()
    np.testing.assert_allclose(got[0, 0, 0], 10 * w[0] + 20 * w[1], rtol=1e-6)
    assert Attention(2, 16).effective_scale == 0.25


def test_attention_f16_computes_in_f32():
    b, s, h, d = 1, 6, 2, 4
    g, y = _attention_graph(b, s, s, h, d, h, MaskKind.causal(), dtype=DType.F16)
    assert g.shape(y).dtype is DType.F16
    q, k, v = (_rand(b, s, h * d).astype(np.float16) for _ in range(3))
    (got,) = g.evaluate({"q": q, "k": k, "v": v})
    assert got.dtype == np.float16
    want = _attention_loop(q, k, v, h, d, h, MaskKind.causal())
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


def test_attention_symbolic_batch_and_sequence():
    g = rlx.Graph("sym")
    b, s, t = g.sym("batch"), g.sym("seq"), g.sym("kv")
    q = g.input("q", (b, s, 8))
    k = g.input("k", (b, t, 4))
    y = g.attention(q, k, k, num_heads=2, head_dim=4, num_kv_heads=1, mask=MaskKind.causal())
    m = g.input("m", (1, 1, s, t))
    z = g.attention(q, k, k, 2, 4, mask_input=m, num_kv_heads=1)
    assert g.nodes[z].op.mask == MaskKind.custom()
    g.set_outputs([y, z])
    assert g.shape(y) == Shape((b, s, 8))
    qv, kv = _rand(3, 2, 8), _rand(3, 5, 4)
    mv = np.zeros((1, 1, 2, 5), np.float32)
    got_y, got_z = g.evaluate({"q": qv, "k": kv, "m": mv})
    np.testing.assert_allclose(
        got_y, _attention_loop(qv, kv, kv, 2, 4, 1, MaskKind.causal()), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        got_z, _attention_loop(qv, kv, kv, 2, 4, 1, MaskKind.none()), rtol=1e-5, atol=1e-5
    )


def test_attention_errors_name_expected_and_given():
    g = rlx.Graph("bad")
    q = g.input("q", (2, 5, 8))
    k = g.input("k", (2, 7, 4))
    with pytest.raises(ShapeError, match=r"q must be \[B,Sq,12\] \(H=3 x D=4\), got f32\[2,5,8\]"):
        g.attention(q, k, k, 3, 4, num_kv_heads=1)
    with pytest.raises(ShapeError, match="num_kv_heads must divide num_heads=2, got 3"):
        g.attention(q, k, k, 2, 4, num_kv_heads=3)
    with pytest.raises(
        ShapeError, match=r"k must be \[B,Skv,8\] \(Hkv=2 x D=4\), got f32\[2,7,4\]"
    ):
        g.attention(q, k, k, 2, 4)
    k2 = g.input("k2", (3, 7, 8))
    with pytest.raises(ShapeError, match=r"batch of k f32\[3,7,8\] differs from q f32\[2,5,8\]"):
        g.attention(q, k2, k2, 2, 4)
    v = g.input("v", (2, 6, 4))
    with pytest.raises(ShapeError, match="have different lengths"):
        g.attention(q, k, v, 2, 4, num_kv_heads=1)
    h = g.input("h", (2, 7, 4), DType.F16)
    with pytest.raises(ShapeError, match="equal dtypes"):
        g.attention(q, k, h, 2, 4, num_kv_heads=1)
    m = g.input("m", (5, 6))
    with pytest.raises(
        ShapeError, match=r"mask must broadcast to \[B,H,Sq,Skv\]=\[2,2,5,7\], got f32\[5,6\]"
    ):
        g.attention(q, k, k, 2, 4, mask_input=m, num_kv_heads=1)
    with pytest.raises(ShapeError, match="mask=custom needs mask_input"):
        g.attention(q, k, k, 2, 4, mask=MaskKind.custom(), num_kv_heads=1)
    m2 = g.input("m2", (5, 7))
    with pytest.raises(ShapeError, match="mask=causal takes no mask_input") as ei:
        g.attention(q, k, k, 2, 4, mask=MaskKind.causal(), mask_input=m2, num_kv_heads=1)
    assert "test_nn.py" in str(ei.value)
    with pytest.raises(ShapeError, match="expected 4 inputs, got 3"):
        g.apply(Attention(2, 4, MaskKind.custom(), 1), [q, k, k])
    assert len(g) == 7


def test_attention_op_attrs_print():
    op = Attention(4, 8, MaskKind.sliding_window(16), 2)
    assert (
        str(op)
        == "attention[num_heads=4, head_dim=8, mask=sliding_window(16), num_kv_heads=2, scale=None]"
    )
    assert op == Attention(4, 8, MaskKind.sliding_window(16), 2) and hash(op) == hash(
        Attention(4, 8, MaskKind.sliding_window(16), 2)
    )


# ---- rope -------------------------------------------------------------------------


def _rope_loop(x, cos, sin, d, n_rot, interleaved):
    b, s, hd = x.shape
    out = x.astype(np.float64).copy()
    for bi in range(b):
        for si in range(s):
            for h in range(hd // d):
                base = h * d
                for i in range(n_rot // 2):
                    if interleaved:
                        p0, p1 = base + 2 * i, base + 2 * i + 1
                    else:
                        p0, p1 = base + i, base + i + n_rot // 2
                    a, c = float(x[bi, si, p0]), float(x[bi, si, p1])
                    out[bi, si, p0] = a * cos[si, i] - c * sin[si, i]
                    out[bi, si, p1] = c * cos[si, i] + a * sin[si, i]
    return out


def _rope_graph(b, s, h, d, n_rot, interleaved, dtype=DType.F32):
    g = rlx.Graph("rope")
    x = g.input("x", (b, s, h * d), dtype)
    c = g.input("cos", (s, n_rot // 2), dtype)
    sn = g.input("sin", (s, n_rot // 2), dtype)
    y = g.rope(x, c, sn, head_dim=d, n_rot=n_rot, interleaved=interleaved)
    g.set_outputs([y])
    return g, y


def _angles(s, n_rot):
    inv = 10000.0 ** (-np.arange(0, n_rot, 2) / n_rot)
    ang = np.arange(s)[:, None] * inv[None]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("n_rot", [8, 4, 2])
def test_rope_matches_loop(interleaved, n_rot):
    b, s, h, d = 2, 5, 3, 8
    g, y = _rope_graph(b, s, h, d, n_rot, interleaved)
    assert g.shape(y) == Shape((b, s, h * d))
    x = _rand(b, s, h * d)
    cos, sin = _angles(s, n_rot)
    (got,) = g.evaluate({"x": x, "cos": cos, "sin": sin})
    np.testing.assert_allclose(
        got, _rope_loop(x, cos, sin, d, n_rot, interleaved), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(
        got.reshape(b, s, h, d)[..., n_rot:], x.reshape(b, s, h, d)[..., n_rot:]
    )


def test_rope_hand_computed_rotation():
    g, _ = _rope_graph(1, 1, 1, 2, 2, False)
    t = 0.3
    (got,) = g.evaluate(
        {
            "x": np.array([[[1.0, 0.0]]]),
            "cos": np.array([[math.cos(t)]]),
            "sin": np.array([[math.sin(t)]]),
        }
    )
    np.testing.assert_allclose(got[0, 0], [math.cos(t), math.sin(t)], rtol=1e-6)


@given(st.integers(1, 4), st.sampled_from([2, 4, 6]), st.integers(0, 2**31 - 1))
def test_rope_layouts_agree_up_to_permutation_and_preserve_norm(s, n_rot, seed):
    rng = np.random.default_rng(seed)
    d, h = 6, 2
    x = rng.standard_normal((1, s, h * d)).astype(np.float32)
    ang = rng.uniform(-3, 3, (s, n_rot // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    feeds = {"cos": cos, "sin": sin}
    neox, _ = _rope_graph(1, s, h, d, n_rot, False)
    gptj, _ = _rope_graph(1, s, h, d, n_rot, True)
    # interleaved on x == neox on x with each head's rotated dims de-interleaved
    perm = np.concatenate([np.arange(0, n_rot, 2), np.arange(1, n_rot, 2), np.arange(n_rot, d)])
    full = np.concatenate([perm + k * d for k in range(h)])
    (a,) = gptj.evaluate({"x": x, **feeds})
    (b,) = neox.evaluate({"x": x[..., full], **feeds})
    np.testing.assert_allclose(a[..., full], b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.linalg.norm(b.reshape(s, h, d), axis=-1),
        np.linalg.norm(x[..., full].reshape(s, h, d), axis=-1),
        rtol=1e-5,
    )


def test_rope_symbolic_sequence_and_errors():
    g = rlx.Graph("rope")
    s = g.sym("seq")
    x = g.input("x", (2, s, 8))
    c = g.input("cos", (s, 2))
    y = g.rope(x, c, c, head_dim=4)
    assert g.shape(y) == Shape((2, s, 8))
    with pytest.raises(ShapeError, match="n_rot must be even and in \\[2, head_dim=4\\], got 3"):
        g.rope(x, c, c, head_dim=4, n_rot=3)
    with pytest.raises(ShapeError, match="got 8"):
        g.rope(x, c, c, head_dim=4, n_rot=8)
    with pytest.raises(
        ShapeError, match=r"x's last dim must be a multiple of head_dim=3, got f32\[2,seq,8\]"
    ):
        g.rope(x, c, c, head_dim=3, n_rot=2)
    c2 = g.input("c2", (s, 1))
    with pytest.raises(ShapeError, match=r"cos must be \[S,n_rot/2\]=\[seq,2\], got f32\[seq,1\]"):
        g.rope(x, c2, c, head_dim=4)
    c16 = g.input("c16", (s, 2), DType.F16)
    with pytest.raises(ShapeError, match="sin f16\\[seq,2\\] must have x's dtype f32"):
        g.rope(x, c, c16, head_dim=4)
    assert str(Rope(64, 32, True)) == "rope[head_dim=64, n_rot=32, interleaved=True]"


# ---- conv -------------------------------------------------------------------------


def _conv_loop(x, w, b, stride, pads, dil, groups):
    nd = x.ndim - 2
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), *pads))
    n, c = x.shape[:2]
    o, k = w.shape[0], w.shape[2:]
    out_sp = [(xp.shape[2 + i] - dil[i] * (k[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    y = np.zeros((n, o, *out_sp))
    cg, og = c // groups, o // groups
    for ni in range(n):
        for oi in range(o):
            gi = oi // og
            for pos in np.ndindex(*out_sp):
                acc = 0.0 if b is None else float(b[oi])
                for ci in range(cg):
                    for kk in np.ndindex(*k):
                        idx = tuple(pos[i] * stride[i] + kk[i] * dil[i] for i in range(nd))
                        acc += xp[(ni, gi * cg + ci, *idx)] * w[(oi, ci, *kk)]
                y[(ni, oi, *pos)] = acc
    return y


def _conv_graph(xs, ws, bias, **kw):
    g = rlx.Graph("conv")
    x = g.input("x", xs)
    w = g.param("w", ws)
    b = g.param("b", (ws[0],)) if bias else None
    y = g.conv(x, w, b, **kw)
    g.set_outputs([y])
    return g, y


CONV_CASES = [
    # x shape, w shape, stride, padding, dilation, groups, bias
    ((2, 3, 9), (4, 3, 3), 1, 0, 1, 1, False),
    ((1, 4, 10), (6, 2, 3), 2, ((2, 1),), 1, 2, True),
    ((2, 2, 11), (2, 1, 2), 3, 1, 2, 2, True),
    ((1, 3, 7, 6), (2, 3, 3, 2), 1, 0, 1, 1, True),
    ((2, 4, 8, 7), (4, 2, 3, 3), (2, 1), ((1, 0), (2, 1)), (1, 2), 2, False),
    ((1, 6, 5, 5), (6, 1, 3, 3), 1, 1, 1, 6, True),  # depthwise
]


@pytest.mark.parametrize(("xs", "ws", "stride", "pad", "dil", "groups", "bias"), CONV_CASES)
def test_conv_matches_direct_loop(xs, ws, stride, pad, dil, groups, bias):
    g, y = _conv_graph(xs, ws, bias, stride=stride, padding=pad, dilation=dil, groups=groups)
    op = g.nodes[y].op
    x, w = _rand(*xs), _rand(*ws)
    b = _rand(ws[0]) if bias else None
    params = {"w": w} | ({"b": b} if bias else {})
    (got,) = g.evaluate({"x": x}, params)
    want = _conv_loop(x, w, b, op.stride, op.padding, op.dilation, groups)
    assert g.shape(y).dims == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_single_channel_matches_scipy():
    x1, w1 = _rand(1, 1, 20), _rand(1, 1, 5)
    g, _ = _conv_graph((1, 1, 20), (1, 1, 5), False)
    (got,) = g.evaluate({"x": x1}, {"w": w1})
    np.testing.assert_allclose(
        got[0, 0], scipy.signal.correlate(x1[0, 0], w1[0, 0], mode="valid"), rtol=1e-5, atol=1e-5
    )
    x2, w2 = _rand(1, 1, 9, 8), _rand(1, 1, 3, 4)
    g, _ = _conv_graph((1, 1, 9, 8), (1, 1, 3, 4), False, padding=((1, 1), (2, 1)))
    (got,) = g.evaluate({"x": x2}, {"w": w2})
    padded = np.pad(x2[0, 0], ((1, 1), (2, 1)))
    np.testing.assert_allclose(
        got[0, 0], scipy.signal.correlate2d(padded, w2[0, 0], mode="valid"), rtol=1e-5, atol=1e-5
    )


@given(
    st.integers(1, 2),
    st.integers(1, 3),
    st.integers(1, 2),
    st.integers(0, 2),
    st.integers(1, 2),
    st.sampled_from([1, 2]),
    st.integers(0, 2**31 - 1),
)
def test_conv1d_property(k, stride, pad_lo, pad_hi, dil, groups, seed):
    rng = np.random.default_rng(seed)
    c, o, length = 2 * groups, 2 * groups, 7
    x = rng.standard_normal((1, c, length)).astype(np.float32)
    w = rng.standard_normal((o, c // groups, k)).astype(np.float32)
    g, _ = _conv_graph(
        x.shape,
        w.shape,
        False,
        stride=stride,
        padding=((pad_lo, pad_hi),),
        dilation=dil,
        groups=groups,
    )
    (got,) = g.evaluate({"x": x}, {"w": w})
    np.testing.assert_allclose(
        got,
        _conv_loop(x, w, None, (stride,), ((pad_lo, pad_hi),), (dil,), groups),
        rtol=1e-4,
        atol=1e-4,
    )


def test_conv_against_torch():
    torch = pytest.importorskip("torch")
    x, w, b = _rand(2, 4, 9, 8), _rand(6, 2, 3, 2), _rand(6)
    g, _ = _conv_graph(
        x.shape, w.shape, True, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2
    )
    (got,) = g.evaluate({"x": x}, {"w": w, "b": b})
    want = torch.nn.functional.conv2d(
        torch.from_numpy(x),
        torch.from_numpy(w),
        torch.from_numpy(b),
        stride=(2, 1),
        padding=(1, 2),
        dilation=(1, 2),
        groups=2,
    )
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dt", [DType.F16, DType.BF16])
def test_conv_and_pool_low_precision_round_once(dt):
    x, w, b = (
        _rand(1, 3, 6, 6).astype(dt.np),
        _rand(2, 3, 3, 3).astype(dt.np),
        _rand(2).astype(dt.np),
    )
    g = rlx.Graph("lp")
    xi = g.input("x", x.shape, dt)
    y = g.conv(xi, g.param("w", w.shape, dt), g.param("b", (2,), dt), padding=1)
    p = g.avg_pool(y, 2)
    g.set_outputs([y, p])
    assert g.shape(y).dtype is dt and g.shape(p).dtype is dt
    got_y, got_p = g.evaluate({"x": x}, {"w": w, "b": b})
    f32 = [a.astype(np.float32) for a in (x, w, b)]
    want_y = _conv_loop(*f32, (1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    tol = 1e-2 if dt is DType.BF16 else 2e-3
    np.testing.assert_allclose(got_y.astype(np.float32), want_y, rtol=tol, atol=tol)
    want_p = _pool_loop(got_y.astype(np.float32), PoolKind.AVG, (2, 2), (2, 2), ((0, 0), (0, 0)))
    np.testing.assert_allclose(got_p.astype(np.float32), want_p, rtol=tol, atol=tol)


def test_conv_symbolic_batch_and_errors():
    g = rlx.Graph("conv")
    n = g.sym("n")
    x = g.input("x", (n, 4, 8))
    w = g.param("w", (6, 2, 3))
    y = g.conv(x, w, groups=2, padding=1)
    assert g.shape(y) == Shape((n, 6, 8))
    assert g.nodes[y].op == Conv((1,), ((1, 1),), (1,), 2, False)
    with pytest.raises(
        ShapeError, match=r"weight must be \[6,4,...\] \(C=4 / groups=1\), got f32\[6,2,3\]"
    ):
        g.conv(x, w)
    with pytest.raises(ShapeError, match="groups=3 must divide in-channels 4 and out-channels 6"):
        g.conv(x, w, groups=3)
    wbig = g.param("wbig", (2, 4, 11))
    with pytest.raises(
        ShapeError,
        match=r"spatial dim 0 of f32\[n,4,8\] is 8 \(\+0\+0 padding\), smaller than the window span 11",
    ):
        g.conv(x, wbig)
    bias = g.param("bias", (5,))
    with pytest.raises(ShapeError, match=r"bias must be f32\[6\], got f32\[5\]"):
        g.conv(x, w, bias, groups=2)
    with pytest.raises(
        ShapeError, match=r"stride needs 1 entries \(one per spatial dim\), got \(1, 2\)"
    ):
        g.conv(x, w, stride=(1, 2), groups=2)
    w3 = g.param("w3", (6, 2, 3, 3, 3))
    with pytest.raises(ShapeError, match="with 1 or 2 kernel dims"):
        g.conv(x, w3)
    s = g.sym("len")
    xs = g.input("xs", (1, 4, s))
    with pytest.raises(
        ShapeError, match=r"spatial dim 0 of f32\[1,4,len\] is symbolic \(len\): the output"
    ):
        g.conv(xs, w, groups=2)  # len - 2 is not a symbolic dim
    assert g.shape(g.conv(xs, w, groups=2, padding=((2, 0),))).dims == (1, 6, s)
    with pytest.raises(ShapeError, match="stride and dilation must be >= 1"):
        g.conv(x, w, stride=0, groups=2)
    with pytest.raises(ShapeError, match="expected 3 inputs, got 2"):
        g.apply(Conv((1,), ((0, 0),), (1,), 2, True), [x, w])


# ---- pool -------------------------------------------------------------------------


def _pool_loop(x, fn, window, stride, pads):
    nd = x.ndim - 2
    sp = x.shape[2:]
    out_sp = [(sp[i] + pads[i][0] + pads[i][1] - window[i]) // stride[i] + 1 for i in range(nd)]
    y = np.zeros((*x.shape[:2], *out_sp))
    for nc in np.ndindex(*x.shape[:2]):
        for pos in np.ndindex(*out_sp):
            vals = []
            for kk in np.ndindex(*window):
                idx = tuple(pos[i] * stride[i] + kk[i] - pads[i][0] for i in range(nd))
                if all(0 <= idx[i] < sp[i] for i in range(nd)):
                    vals.append(float(x[(*nc, *idx)]))
            y[(*nc, *pos)] = max(vals) if fn is PoolKind.MAX else sum(vals) / len(vals)
    return y


POOL_CASES = [
    ((2, 3, 10), 2, None, 0),
    ((1, 2, 9), 3, 2, ((1, 2),)),
    ((2, 2, 6, 7), (2, 3), (2, 1), ((1, 0), (1, 2))),
    ((1, 1, 5, 5), 3, 1, 1),
]


@pytest.mark.parametrize("fn", list(PoolKind))
@pytest.mark.parametrize(("xs", "window", "stride", "pad"), POOL_CASES)
def test_pool_matches_loop(fn, xs, window, stride, pad):
    g = rlx.Graph("pool")
    x = g.input("x", xs)
    build = g.max_pool if fn is PoolKind.MAX else g.avg_pool
    y = build(x, window, stride=stride, padding=pad)
    g.set_outputs([y])
    op = g.nodes[y].op
    xv = _rand(*xs)
    (got,) = g.evaluate({"x": xv})
    want = _pool_loop(xv, fn, op.window, op.stride, op.padding)
    assert g.shape(y).dims == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_pool_hand_computed_padding_excluded():
    g = rlx.Graph("pool")
    x = g.input("x", (1, 1, 3))
    a = g.avg_pool(x, 2, stride=1, padding=1)
    m = g.max_pool(x, 2, stride=1, padding=1)
    g.set_outputs([a, m])
    got_a, got_m = g.evaluate({"x": np.array([[[-1.0, -2.0, -3.0]]])})
    np.testing.assert_allclose(got_a[0, 0], [-1.0, -1.5, -2.5, -3.0])
    np.testing.assert_allclose(got_m[0, 0], [-1.0, -1.0, -2.0, -3.0])  # padding never wins


def test_max_pool_integers():
    g = rlx.Graph("pool")
    x = g.input("x", (1, 1, 4), DType.I32)
    y = g.max_pool(x, 2, stride=1, padding=1)
    g.set_outputs([y])
    (got,) = g.evaluate({"x": np.array([[[-5, -7, 3, -1]]], np.int32)})
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got[0, 0], [-5, -5, 3, 3, -1])


def test_pool_against_torch():
    torch = pytest.importorskip("torch")
    x = _rand(2, 3, 7, 8)
    g = rlx.Graph("pool")
    xi = g.input("x", x.shape)
    g.set_outputs([g.max_pool(xi, (3, 2), (2, 2), (1, 1)), g.avg_pool(xi, (3, 2), (2, 2), (1, 1))])
    got_m, got_a = g.evaluate({"x": x})
    t = torch.from_numpy(x)
    F = torch.nn.functional
    np.testing.assert_allclose(got_m, F.max_pool2d(t, (3, 2), (2, 2), (1, 1)).numpy(), rtol=1e-6)
    np.testing.assert_allclose(
        got_a, F.avg_pool2d(t, (3, 2), (2, 2), (1, 1), count_include_pad=False).numpy(), rtol=1e-5
    )


def test_pool_errors():
    g = rlx.Graph("pool")
    x = g.input("x", (1, 2, 6))
    with pytest.raises(
        ShapeError,
        match=r"padding must be \(lo, hi\) pairs >= 0 and smaller than the window \(2,\), got \(\(2, 2\),\)",
    ):
        g.max_pool(x, 2, padding=2)
    xi = g.input("xi", (1, 2, 6), DType.I32)
    with pytest.raises(ShapeError, match=r"x must be a float tensor, got i32\[1,2,6\]"):
        g.avg_pool(xi, 2)
    with pytest.raises(ShapeError, match="smaller than the window span 7"):
        g.max_pool(x, 7)
    with pytest.raises(
        ShapeError, match=r"2-D pool needs x of rank 4 \[N,C,\*sp\], got f32\[1,2,6\]"
    ):
        g.max_pool(x, (2, 2))
    x5 = g.input("x5", (1, 1, 2, 2, 2))
    with pytest.raises(ShapeError, match=r"must be \[N,C,L\] or \[N,C,H,W\]"):
        g.avg_pool(x5, 2)
    assert (
        str(Pool(PoolKind.MAX, (2,), (2,), ((0, 0),)))
        == "pool[fn=max, window=(2,), stride=(2,), padding=((0, 0),)]"
    )


def test_conv_and_pool_keep_symbolic_spatial_dims_when_the_output_is_a_monomial():
    """'same' padding at stride 1 keeps ``len``; a stride dividing ``2*len`` with
    non-overlapping windows gives ``len``; anything else asks for static dims."""
    g = rlx.Graph("g")
    n = g.sym("len")
    x = g.input("x", (2, 3, n * 2))
    w = g.param("w", (3, 1, 3))
    same = g.conv(x, w, groups=3, padding=((1, 1),))
    causal = g.conv(x, w, groups=3, padding=((2, 0),))
    half = g.max_pool(x, 2)  # window 2, stride 2
    strided = g.conv(x, g.param("w2", (5, 3, 2)), stride=2)
    assert g.shape(same).dims == (2, 3, n * 2) and g.shape(causal).dims == (2, 3, n * 2)
    assert g.shape(half).dims == (2, 3, n) and g.shape(strided).dims == (2, 5, n)
    with pytest.raises(ShapeError, match=r"output length \(2\*len \+ 0 \+ 0 - 3\) // 2 \+ 1"):
        g.avg_pool(x, 3, 2)
    g.set_outputs([same, causal, half, strided])
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((2, 3, 8)).astype(np.float32)
    wv = rng.standard_normal((3, 1, 3)).astype(np.float32)
    w2 = rng.standard_normal((5, 3, 2)).astype(np.float32)
    outs = g.evaluate({"x": xv}, {"w": wv, "w2": w2})
    fixed = rlx.Graph("f")
    xf = fixed.input("x", (2, 3, 8))
    wf = fixed.param("w", (3, 1, 3))
    fixed.set_outputs(
        [
            fixed.conv(xf, wf, groups=3, padding=((1, 1),)),
            fixed.conv(xf, wf, groups=3, padding=((2, 0),)),
            fixed.max_pool(xf, 2),
            fixed.conv(xf, fixed.param("w2", (5, 3, 2)), stride=2),
        ]
    )
    want = fixed.evaluate({"x": xv}, {"w": wv, "w2": w2})
    for got, ref in zip(outs, want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-6)
    assert outs[2].shape == (2, 3, 4)
