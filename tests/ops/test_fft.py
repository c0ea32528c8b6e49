import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx import DType, Shape
from rlx.errors import ShapeError
from rlx.ops.fft import Fft, FftKind, FftNorm

RNG = np.random.default_rng(0)
NP = {
    FftKind.FFT: np.fft.fft,
    FftKind.IFFT: np.fft.ifft,
    FftKind.RFFT: np.fft.rfft,
    FftKind.IRFFT: np.fft.irfft,
}
BUILD = {FftKind.FFT: "fft", FftKind.IFFT: "ifft", FftKind.RFFT: "rfft", FftKind.IRFFT: "irfft"}


def _value(kind, shape):
    if kind is FftKind.RFFT:
        return RNG.standard_normal(shape).astype(np.float32)
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex64)


def _run(kind, x, n=None, axis=-1, norm=FftNorm.BACKWARD):
    g = rlx.Graph("fft")
    xi = g.input("x", x.shape, DType.from_numpy(x.dtype))
    y = getattr(g, BUILD[kind])(xi, n=n, axis=axis, norm=norm)
    g.set_outputs([y])
    (got,) = g.evaluate({"x": x})
    return g, y, got


@pytest.mark.parametrize("kind", list(FftKind))
@pytest.mark.parametrize("norm", list(FftNorm))
@pytest.mark.parametrize(
    ("shape", "n", "axis"), [((3, 8), None, -1), ((6, 4), 5, 0), ((2, 7, 3), 4, 1), ((10,), 13, 0)]
)
def test_fft_matches_numpy(kind, norm, shape, n, axis):
    x = _value(kind, shape)
    g, y, got = _run(kind, x, n, axis, norm)
    want = NP[kind](x, n=n, axis=axis, norm=norm.value)
    assert g.shape(y).dims == want.shape
    assert got.dtype == (np.float32 if kind is FftKind.IRFFT else np.complex64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@given(
    st.integers(1, 9),
    st.integers(1, 3),
    st.sampled_from(list(FftKind)),
    st.sampled_from(list(FftNorm)),
    st.integers(0, 2**31 - 1),
)
def test_fft_property_random_length_and_axis(length, other, kind, norm, seed):
    rng = np.random.default_rng(seed)
    axis = int(rng.integers(0, 2))
    shape = (length, other) if axis == 0 else (other, length)
    x = rng.standard_normal(shape)
    if kind is not FftKind.RFFT:
        x = x + 1j * rng.standard_normal(shape)
    x = x.astype(np.float32 if kind is FftKind.RFFT else np.complex64)
    n = None if kind is not FftKind.IRFFT or length >= 2 else 3
    _, _, got = _run(kind, x, n, axis, norm)
    np.testing.assert_allclose(
        got, NP[kind](x, n=n, axis=axis, norm=norm.value), rtol=1e-5, atol=1e-5
    )


def test_fft_hand_computed():
    _, _, impulse = _run(FftKind.FFT, np.array([1, 0, 0, 0], np.complex64))
    np.testing.assert_allclose(impulse, [1, 1, 1, 1])
    _, _, ones = _run(FftKind.FFT, np.ones(4, np.complex64), norm=FftNorm.ORTHO)
    np.testing.assert_allclose(ones, [2, 0, 0, 0])  # 4 / sqrt(4)
    _, _, fwd = _run(FftKind.RFFT, np.ones(4, np.float32), norm=FftNorm.FORWARD)
    np.testing.assert_allclose(fwd, [1, 0, 0])  # 4 / 4, n//2 + 1 = 3 bins
    _, _, back = _run(FftKind.IFFT, np.array([4, 0, 0, 0], np.complex64))
    np.testing.assert_allclose(back, [1, 1, 1, 1])


@pytest.mark.parametrize("n", [6, 7])
def test_rfft_irfft_roundtrip_even_and_odd(n):
    x = RNG.standard_normal((3, n)).astype(np.float32)
    g = rlx.Graph("rt")
    xi = g.input("x", x.shape)
    spec = g.rfft(xi)
    back = g.irfft(spec, n=n)
    g.set_outputs([spec, back])
    assert g.shape(spec) == Shape((3, n // 2 + 1), DType.C64)
    assert g.shape(back) == Shape((3, n), DType.F32)
    _, got = g.evaluate({"x": x})
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-5)


def test_irfft_default_length_is_2m_minus_2():
    x = _value(FftKind.IRFFT, (2, 5))
    g, y, got = _run(FftKind.IRFFT, x)
    assert g.shape(y) == Shape((2, 8), DType.F32)
    np.testing.assert_allclose(got, np.fft.irfft(x), rtol=1e-5, atol=1e-5)


def test_builders_cast_inputs_and_normalise_axis():
    g = rlx.Graph("cast")
    x = g.input("x", (4, 6), DType.F64)
    y = g.rfft(x, axis=-2)
    z = g.fft(x, norm="ortho")
    g.set_outputs([y, z])
    assert g.nodes[g.nodes[y].inputs[0]].dtype is DType.F32
    assert g.nodes[g.nodes[z].inputs[0]].dtype is DType.C64
    assert g.nodes[y].op == Fft(FftKind.RFFT, FftNorm.BACKWARD, None, 0)
    assert g.shape(y) == Shape((3, 6), DType.C64)
    xv = RNG.standard_normal((4, 6))
    got_y, got_z = g.evaluate({"x": xv})
    np.testing.assert_allclose(
        got_y, np.fft.rfft(xv.astype(np.float32), axis=0), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(got_z, np.fft.fft(xv, norm="ortho"), rtol=1e-5, atol=1e-5)


def test_fft_symbolic_dims():
    g = rlx.Graph("sym")
    b, t = g.sym("batch"), g.sym("time")
    x = g.input("x", (b, t), DType.C64)
    y = g.fft(x)  # length follows the symbol
    assert g.shape(y) == Shape((b, t), DType.C64)
    r = g.input("r", (b, t))
    z = g.rfft(r, n=8)
    assert g.shape(z) == Shape((b, 5), DType.C64)
    g.set_outputs([y, z])
    xv = _value(FftKind.FFT, (2, 6))
    rv = RNG.standard_normal((2, 6)).astype(np.float32)
    got_y, got_z = g.evaluate({"x": xv, "r": rv})
    np.testing.assert_allclose(got_y, np.fft.fft(xv), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_z, np.fft.rfft(rv, n=8), rtol=1e-5, atol=1e-5)
    with pytest.raises(
        ShapeError,
        match=r"rfft of symbolic length time \(axis 1 of f32\[batch,time\]\) needs an explicit n",
    ):
        g.rfft(r)
    with pytest.raises(ShapeError, match="irfft of c64\\[batch,time\\] along axis 1 needs n"):
        g.irfft(x)


def test_fft_errors_name_expected_and_given():
    g = rlx.Graph("bad")
    c = g.input("c", (4, 8), DType.C64)
    i = g.input("i", (4, 8), DType.I32)
    with pytest.raises(ShapeError, match=r"rfft needs a f32 input, got c64\[4,8\]"):
        g.apply(Fft(FftKind.RFFT), [c])
    with pytest.raises(
        ShapeError, match=r"rfft: needs a float or complex input, got %1 i32\[4,8\]"
    ) as ei:
        g.rfft(i)
    assert "test_fft.py" in str(ei.value)
    with pytest.raises(
        ShapeError, match=r"rfft: needs a float or complex input, got %0 c64\[4,8\]"
    ):
        g.rfft(c)
    with pytest.raises(ShapeError, match=r"axis 2 is out of range for %0 c64\[4,8\]"):
        g.fft(c, axis=2)
    with pytest.raises(ShapeError, match="axis -3 is out of range for c64\\[4,8\\]"):
        g.apply(Fft(FftKind.FFT, axis=-3), [c])
    with pytest.raises(ShapeError, match="n must be None or an int >= 1, got 0"):
        g.fft(c, n=0)
    with pytest.raises(
        ShapeError, match=r"norm must be one of \['backward', 'ortho', 'forward'\], got 'unitary'"
    ):
        g.fft(c, norm="unitary")
    one = g.input("one", (3, 1), DType.C64)
    with pytest.raises(ShapeError, match="needs a static m >= 2, got m=1"):
        g.irfft(one)
    s = g.input("s", (), DType.C64)
    with pytest.raises(ShapeError, match=r"fft: input %3 is a scalar c64\[\]"):
        g.fft(s)
    assert len(g) == 4


def test_fft_op_prints_and_hashes():
    op = Fft(FftKind.IRFFT, FftNorm.ORTHO, 16, 1)
    assert str(op) == "irfft[n=16, norm=ortho, axis=1]"
    assert str(Fft(FftKind.FFT)) == "fft[norm=backward, axis=-1]"
    assert (
        op == Fft(FftKind.IRFFT, FftNorm.ORTHO, 16, 1)
        and len({op, Fft(FftKind.IRFFT, FftNorm.ORTHO, 16, 1)}) == 1
    )
