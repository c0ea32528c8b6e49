"""The fft helpers built from primitive ops (rlx/ops/compose/fft.py): fftfreq / rfftfreq
against numpy.fft, stft against a NumPy loop of torch.stft's definition, psd_real against
scipy.signal.periodogram / welch, fft_conv1d against scipy.signal.fftconvolve and
numpy.convolve; each through the reference interpreter and the compiled CPU graph."""

import warnings

import numpy as np
import pytest
import scipy.signal as ss
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx import DType, Shape
from rlx.errors import ShapeError
from rlx.ops.fft import Fft

RNG = np.random.default_rng(7)
SESSION = rlx.Session("cpu")


def _both(build, **arrays):
    """Build over f32 inputs named like ``arrays``; (reference result, compiled result)."""
    g = rlx.Graph("h")
    ids = {k: g.input(k, v.shape, DType.from_numpy(v.dtype)) for k, v in arrays.items()}
    g.set_outputs([build(g, **ids)])
    g.verify()
    (ref,) = g.evaluate(arrays)
    (got,) = SESSION.compile(g).run(arrays)
    return g, ref, got


def _close(got, want, rtol=2e-5):
    scale = max(float(np.max(np.abs(want))), 1e-30)
    np.testing.assert_allclose(got, want, rtol=0, atol=rtol * scale)


# ---- fftfreq -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 8, 33])
@pytest.mark.parametrize("d", [1.0, 0.1, 3])
def test_fftfreq_and_rfftfreq_match_numpy(n, d):
    g = rlx.Graph("f")
    g.set_outputs([g.fftfreq(n, d), g.rfftfreq(n, d), g.fftfreq(n, d, dtype="f64")])
    f, rf, f64 = g.evaluate({})
    np.testing.assert_allclose(f, np.fft.fftfreq(n, d).astype(np.float32))
    np.testing.assert_allclose(rf, np.fft.rfftfreq(n, d).astype(np.float32))
    assert f64.dtype == np.float64
    np.testing.assert_array_equal(f64, np.fft.fftfreq(n, d))
    (cf, crf, _) = SESSION.compile(g).run({})
    np.testing.assert_array_equal(cf, f)
    np.testing.assert_array_equal(crf, rf)


@pytest.mark.parametrize(
    ("n", "d", "match"),
    [(rlx.sym("n"), 1.0, "static int"), (0, 1.0, ">= 1"), (4, 0.0, "> 0"), (True, 1.0, "static")],
)
def test_fftfreq_rejects_a_symbolic_or_bad_size(n, d, match):
    g = rlx.Graph("f")
    with pytest.raises(ShapeError, match=match):
        g.fftfreq(n, d)
    assert len(g.nodes) == 0  # nothing half-built


# ---- stft ----------------------------------------------------------------------------


def _stft_loop(x, n_fft, hop, win, window, center, mode, normalized, onesided):
    """torch.stft's definition, one frame at a time."""
    w = np.ones(win) if window is None else np.asarray(window, np.float64)
    wp = np.zeros(n_fft)
    left = (n_fft - win) // 2
    wp[left : left + win] = w
    x = x.astype(np.float64)
    if center:
        p = n_fft // 2
        np_mode = {"reflect": "reflect", "constant": "constant", "replicate": "edge"}
        np_mode["circular"] = "wrap"
        x = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(p, p)], mode=np_mode[mode])
    count = 1 + (x.shape[-1] - n_fft) // hop
    cols = []
    for f in range(count):
        seg = x[..., f * hop : f * hop + n_fft] * wp
        spec = np.fft.rfft(seg) if onesided else np.fft.fft(seg)
        cols.append(spec / np.sqrt(n_fft) if normalized else spec)
    return np.stack(cols, axis=-1)


STFT_CASES = [
    # shape, n_fft, hop, win, window?, center, pad_mode, normalized, onesided
    ((40,), 16, 4, None, True, True, "reflect", False, True),
    ((2, 50), 16, 5, 12, True, True, "reflect", False, True),
    ((3, 33), 8, None, None, False, True, "constant", True, True),
    ((2, 30), 8, 3, 5, True, False, "reflect", False, False),
    ((1, 2, 21), 10, 4, None, True, True, "replicate", False, True),
    ((25,), 9, 2, 9, True, True, "circular", True, False),
]


@pytest.mark.parametrize("case", STFT_CASES)
def test_stft_matches_the_torch_definition(case):
    shape, n_fft, hop, win, has_w, center, mode, normalized, onesided = case
    x = RNG.standard_normal(shape).astype(np.float32)
    wlen = n_fft if win is None else win
    window = np.hanning(wlen + 2)[1:-1].astype(np.float32) if has_w else None

    def build(g, x):
        return g.stft(x, n_fft, hop, win, window, center, mode, normalized, onesided)

    g, ref, got = _both(build, x=x)
    hop_ = n_fft // 4 if hop is None else hop
    want = _stft_loop(x, n_fft, hop_, wlen, window, center, mode, normalized, onesided)
    assert ref.shape == want.shape and ref.dtype == np.complex64
    _close(ref, want)
    _close(got, want)
    # built from primitive ops: the only transform is one Fft node
    assert sum(isinstance(n.op, Fft) for n in g.nodes) == 1


def test_stft_window_node_and_real_output():
    x = RNG.standard_normal((2, 24)).astype(np.float32)
    w = np.hamming(8).astype(np.float32)

    def build(g, x, w):
        return g.stft(x, 8, 2, window=w, return_complex=False)

    _, ref, got = _both(build, x=x, w=w)
    want = _stft_loop(x, 8, 2, 8, w, True, "reflect", False, True)
    assert ref.shape == (*want.shape, 2) and ref.dtype == np.float32
    _close(ref, np.stack([want.real, want.imag], axis=-1))
    _close(got, np.stack([want.real, want.imag], axis=-1))


def test_stft_errors_name_the_problem():
    g = rlx.Graph("s")
    t = g.sym("t", max=100)
    xs = g.input("xs", Shape((t,), DType.F32))
    x = g.input("x", Shape((6,), DType.F32))
    x4 = g.input("x4", Shape((4,), DType.F32))
    xi = g.input("xi", Shape((20,), DType.I32))
    before = len(g.nodes)
    with pytest.raises(ShapeError, match="symbolic length t.*must be static"):
        g.stft(xs, 8)
    with pytest.raises(ShapeError, match="reflect padding of 4 needs a signal longer"):
        g.stft(x4, 8)
    with pytest.raises(ShapeError, match="fewer than one frame"):
        g.stft(x, 8, center=False)
    with pytest.raises(ShapeError, match="real float"):
        g.stft(xi, 8)
    with pytest.raises(ShapeError, match="pad_mode"):
        g.stft(x, 4, pad_mode="mirror")
    with pytest.raises(ShapeError, match="win_length"):
        g.stft(x, 4, win_length=5)
    with pytest.raises(ShapeError, match=r"window must be .*shape \(4,\)"):
        g.stft(x, 4, window=np.ones(3))
    assert len(g.nodes) == before  # a rejected call adds nothing


def test_complex_constants_survive_simplification():
    """x * (1+2j) is not x * 1: the simplifier compared only the real part of a complex
    constant (and warned), so the compiled graph dropped the multiply (a wrong answer in
    stft's real/imaginary split before the split avoided such constants)."""
    xv = np.array([1, 2j, 3 - 1j], np.complex64)
    c = np.asarray(1 + 2j, np.complex64)
    for k in (c, np.asarray(2j, np.complex64)):
        _, ref, got = _both(lambda g, x, k=k: g.mul(x, g.constant(k)), x=xv)
        np.testing.assert_allclose(ref, xv * k)
        np.testing.assert_allclose(got, xv * k)


# ---- psd -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "axis", "kw"),
    [
        ((64,), -1, {}),
        ((3, 63), -1, {"fs": 100.0}),
        ((2, 40), -1, {"scaling": "spectrum", "detrend": None}),
        ((31, 2), 0, {"nfft": 48, "fs": 8.0}),
        ((2, 32), 1, {"window": np.hanning(32)}),
    ],
)
def test_psd_real_matches_scipy_periodogram(shape, axis, kw):
    x = (RNG.standard_normal(shape) + 0.5).astype(np.float32)
    _, ref, got = _both(lambda g, x: g.psd_real(x, axis=axis, **kw), x=x)
    skw = dict(kw)
    if "window" not in skw:
        skw["window"] = "boxcar"
    if "detrend" in skw and skw["detrend"] is None:
        skw["detrend"] = False
    _, want = ss.periodogram(x.astype(np.float64), axis=axis, **skw)
    assert ref.shape == want.shape and ref.dtype == np.float32
    _close(ref, want, 1e-5)
    _close(got, want, 1e-5)


@pytest.mark.parametrize(
    ("n", "nperseg", "noverlap", "nfft"), [(64, 16, None, None), (50, 12, 4, 16), (33, 8, 0, None)]
)
def test_psd_real_segments_match_scipy_welch(n, nperseg, noverlap, nfft):
    x = RNG.standard_normal((2, n)).astype(np.float32)
    w = ss.get_window("hann", nperseg)

    def build(g, x):
        return g.psd_real(x, 2.0, w, nperseg, noverlap, nfft)

    _, ref, got = _both(build, x=x)
    _, want = ss.welch(x.astype(np.float64), 2.0, w, nperseg, noverlap, nfft)
    _close(ref, want, 1e-5)
    _close(got, want, 1e-5)


def test_psd_real_frequencies_pair_with_rfftfreq():
    g = rlx.Graph("p")
    g.set_outputs([g.rfftfreq(48, 1 / 8.0)])
    (f,) = g.evaluate({})
    want, _ = ss.periodogram(np.zeros(31), fs=8.0, nfft=48)
    np.testing.assert_allclose(f, want.astype(np.float32))


def test_psd_real_errors():
    g = rlx.Graph("p")
    t = g.sym("t")
    xs = g.input("xs", Shape((2, t), DType.F32))
    x = g.input("x", Shape((16,), DType.F32))
    with pytest.raises(ShapeError, match="symbolic length t along axis 1"):
        g.psd_real(xs)
    with pytest.raises(ShapeError, match="nperseg=20 exceeds"):
        g.psd_real(x, nperseg=20)
    with pytest.raises(ShapeError, match="noverlap"):
        g.psd_real(x, nperseg=8, noverlap=8)
    with pytest.raises(ShapeError, match="scaling"):
        g.psd_real(x, scaling="power")
    with pytest.raises(ShapeError, match="nfft=8 is shorter"):
        g.psd_real(x, nfft=8)
    with pytest.raises(ShapeError, match="fs"):
        g.psd_real(x, fs=-1.0)
    w = g.input("w", Shape((16,), DType.F32))
    with pytest.raises(ShapeError, match="window node must be a constant"):
        g.psd_real(x, window=w)
    # a constant window node is fine: its values set the scale
    win = np.hanning(16)
    g.set_outputs([g.psd_real(x, 4.0, window=g.constant(win.astype(np.float32)))])
    xv = RNG.standard_normal(16).astype(np.float32)
    (got,) = g.evaluate({"x": xv, "xs": np.zeros((2, 3), np.float32), "w": np.ones(16, np.float32)})
    _close(got, ss.periodogram(xv.astype(np.float64), 4.0, win)[1], 1e-5)


# ---- convolution ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["full", "same", "valid"])
@pytest.mark.parametrize(
    ("sa", "sb"), [((20,), (7,)), ((2, 9), (9,)), ((3, 5), (3, 12)), ((1,), (1,))]
)
def test_fft_conv1d_matches_scipy_fftconvolve(mode, sa, sb):
    a = RNG.standard_normal(sa).astype(np.float32)
    b = RNG.standard_normal(sb).astype(np.float32)
    _, ref, got = _both(lambda g, a, b: g.fft_conv1d(a, b, mode), a=a, b=b)
    lead = np.broadcast_shapes(sa[:-1], sb[:-1])
    a2 = np.broadcast_to(a, (*lead, sa[-1])).astype(np.float64)
    b2 = np.broadcast_to(b, (*lead, sb[-1])).astype(np.float64)
    want = ss.fftconvolve(a2, b2, mode=mode, axes=-1)
    assert ref.shape == want.shape
    _close(ref, want, 1e-5)
    _close(got, want, 1e-5)


@settings(max_examples=25, deadline=None)
@given(
    la=st.integers(1, 40),
    lb=st.integers(1, 40),
    mode=st.sampled_from(["full", "valid"]),
    seed=st.integers(0, 2**31),
)
def test_fft_conv1d_equals_numpy_convolve(la, lb, mode, seed):
    r = np.random.default_rng(seed)
    a = r.standard_normal(la).astype(np.float32)
    b = r.standard_normal(lb).astype(np.float32)
    g = rlx.Graph("c")
    ai, bi = g.input("a", a.shape), g.input("b", b.shape)
    g.set_outputs([g.fft_conv1d(ai, bi, mode)])
    (got,) = g.evaluate({"a": a, "b": b})
    want = np.convolve(a.astype(np.float64), b.astype(np.float64), mode=mode)
    # An output that cancels (a valid-mode dot product near 0) is only known to within
    # f32 rounding of the sum of |a_i b_j| terms behind it: scale the tolerance by that
    # bound, not by the output itself (seed 56881, la = lb = 18 missed by 2.3e-7 on 0.0017).
    bound = np.convolve(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64), mode=mode)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * float(bound.max()))


def test_fft_conv1d_errors():
    g = rlx.Graph("c")
    n = g.sym("n")
    a = g.input("a", Shape((4, n), DType.F32))
    b = g.input("b", Shape((5,), DType.F32))
    z = g.input("z", Shape((5,), DType.C64))
    with pytest.raises(ShapeError, match="a %0 .* symbolic length n"):
        g.fft_conv1d(a, b)
    with pytest.raises(ShapeError, match="mode"):
        g.fft_conv1d(b, b, "circular")
    with pytest.raises(ShapeError, match="b %2 must be a real float"):
        g.fft_conv1d(b, z)


def test_complex_to_real_cast_keeps_the_real_part_without_a_warning():
    """psd_real takes |X| through a c64 -> f32 cast: NumPy warned (ComplexWarning) on
    every run of the reference and of the compiled kernel."""
    z = np.array([1 + 2j, -3.5 - 1j, 0.25j], np.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, ref, got = _both(lambda g, z: g.cast(z, DType.F32), z=z)
    np.testing.assert_array_equal(ref, z.real)
    np.testing.assert_array_equal(got, z.real)


def test_symbolic_leading_dims_are_fine():
    """Only the transformed axis must be static: a symbolic batch runs at any binding."""
    g = rlx.Graph("s")
    b = g.sym("b", max=8)
    x = g.input("x", Shape((b, 40), DType.F32))
    k = g.input("k", Shape((5,), DType.F32))
    g.set_outputs([g.stft(x, 16, 4), g.psd_real(x, fs=2.0), g.fft_conv1d(x, k, "same")])
    cg = SESSION.compile(g)
    for n in (1, 3):
        xv = RNG.standard_normal((n, 40)).astype(np.float32)
        kv = RNG.standard_normal(5).astype(np.float32)
        s, p, c = cg.run({"x": xv, "k": kv})
        want_s = _stft_loop(xv, 16, 4, 16, None, True, "reflect", False, True)
        _close(s, want_s)
        _close(p, ss.periodogram(xv.astype(np.float64), 2.0)[1], 1e-5)
        _close(c, ss.fftconvolve(xv, kv[None], "same", axes=-1), 1e-5)
