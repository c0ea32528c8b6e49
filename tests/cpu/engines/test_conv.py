"""The native direct convolution and pooling (``engines/conv.py``, ``csrc/conv.c``)
against the NumPy reference interpreter and a plain loop: strides, dilations, uneven
padding, groups, bias, 1-D, windows over padding only, NaN in max pools; the report names
them native, and larger convolutions keep the BLAS path. Runs on the selected native
target (the suite also runs under RLX_ISA=avx2 / portable)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx.backends.cpu.kernels import KernelKind
from rlx.ir.mir import Graph
from rlx.options import CompileOptions
from rlx.runtime.session import Session


def _compile(g: Graph, params: dict, threads: int = 1):  # noqa: ANN202
    opts = CompileOptions(num_threads=threads, use_cache=False, verbose=False)
    return Session("cpu").compile(g, opts, params=params)


def _kinds(cg, op: str) -> list[KernelKind]:  # noqa: ANN001
    return [k.kind for k in cg.report().kernels if k.op == op]


def _loop_conv(x, w, b, stride, pads, dil, groups):  # noqa: ANN001, ANN202
    """A plain-loop 2-D convolution (the independent oracle)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), pads[0], pads[1]))
    oh = (xp.shape[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (xp.shape[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc in range(o):
        g0 = (oc // og) * cg
        for i in range(oh):
            for j in range(ow):
                r, s = i * stride[0], j * stride[1]
                win = xp[
                    :, g0 : g0 + cg, r : r + dil[0] * kh : dil[0], s : s + dil[1] * kw : dil[1]
                ]
                y[:, oc, i, j] = (win * w[oc]).sum(axis=(1, 2, 3)) + (0 if b is None else b[oc])
    return y


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 3),
    cg=st.integers(1, 3),
    og=st.integers(1, 6),
    groups=st.sampled_from([1, 2]),
    hw=st.tuples(st.integers(3, 9), st.integers(3, 9)),
    k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    dil=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pads=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
    bias=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_conv2d_matches_reference_and_loop(
    n, cg, og, groups, hw, k, stride, dil, pads, bias, threads
):
    c, o = cg * groups, og * groups
    span = [d * (kk - 1) + 1 for d, kk in zip(dil, k, strict=True)]
    padding = ((pads[0], pads[1]), (pads[2], pads[3]))
    if any(hw[i] + sum(padding[i]) < span[i] for i in range(2)):
        return  # no output position
    rng = np.random.default_rng(n * 7 + og)
    g = Graph("conv")
    x = g.input("x", (n, c, *hw))
    w = g.param("w", (o, cg, *k))
    b = g.param("b", (o,)) if bias else None
    g.set_outputs([g.conv(x, w, b, stride=stride, padding=padding, dilation=dil, groups=groups)])
    params = {"w": rng.standard_normal((o, cg, *k)).astype(np.float32)}
    if bias:
        params["b"] = rng.standard_normal(o).astype(np.float32)
    xv = rng.standard_normal((n, c, *hw)).astype(np.float32)
    cg_ = _compile(g, params, threads)
    assert _kinds(cg_, "conv") == [KernelKind.NATIVE]
    (got,) = cg_.run({"x": xv})
    (ref,) = g.evaluate({"x": xv}, params)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    want = _loop_conv(xv, params["w"], params.get("b"), stride, padding, dil, groups)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv1d_and_large_conv_paths():
    rng = np.random.default_rng(3)
    g = Graph("conv1d")
    x = g.input("x", (2, 4, 11))
    g.set_outputs([g.conv(x, g.param("w", (6, 4, 3)), stride=1, padding=((2, 1),), dilation=2)])
    params = {"w": rng.standard_normal((6, 4, 3)).astype(np.float32)}
    xv = rng.standard_normal((2, 4, 11)).astype(np.float32)
    cg = _compile(g, params)
    assert _kinds(cg, "conv") == [KernelKind.NATIVE]
    np.testing.assert_allclose(
        cg.run({"x": xv})[0], g.evaluate({"x": xv}, params)[0], rtol=1e-5, atol=1e-5
    )
    # more arithmetic per channel than the direct loop takes, too few output channels for
    # the sgemm path (test_conv_gemm.py) and for one NCHWc block (4 / 8 / 16 channels by
    # target, test_conv_nchwc.py): BLAS
    g = Graph("big")
    x = g.input("x", (1, 64, 48, 48))
    g.set_outputs([g.conv(x, g.param("w", (3, 64, 3, 3)), padding=1)])
    params = {"w": rng.standard_normal((3, 64, 3, 3)).astype(np.float32)}
    xv = rng.standard_normal((1, 64, 48, 48)).astype(np.float32)
    cg = _compile(g, params)
    assert _kinds(cg, "conv") == [KernelKind.BLAS]
    np.testing.assert_allclose(
        cg.run({"x": xv})[0], g.evaluate({"x": xv}, params)[0], rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("threads", [1, 2])
def test_team_sized_conv_and_pool(threads):
    """Sizes above the one-thread thresholds: the OpenMP team splits the work."""
    rng = np.random.default_rng(5)
    g = Graph("team")
    x = g.input("x", (4, 16, 16, 16))
    y = g.conv(x, g.param("w", (32, 16, 3, 3)), g.param("b", (32,)), padding=1)
    g.set_outputs([g.max_pool(y, 2), g.avg_pool(y, 3, 1, 1)])
    params = {"w": rng.standard_normal((32, 16, 3, 3)).astype(np.float32)}
    params["b"] = rng.standard_normal(32).astype(np.float32)
    xv = rng.standard_normal((4, 16, 16, 16)).astype(np.float32)
    cg = _compile(g, params, threads)
    assert _kinds(cg, "conv") == [KernelKind.NATIVE]
    assert _kinds(cg, "pool") == [KernelKind.NATIVE] * 2
    for got, ref in zip(cg.run({"x": xv}), g.evaluate({"x": xv}, params), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(
    fn=st.sampled_from(["max_pool", "avg_pool"]),
    nd=st.sampled_from([1, 2]),
    size=st.integers(2, 9),
    win=st.integers(1, 3),
    stride=st.integers(1, 3),
    pads=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    threads=st.sampled_from([1, 2]),
)
def test_pool_matches_reference(fn, nd, size, win, stride, pads, threads):
    if pads[0] >= win or pads[1] >= win or size + sum(pads) < win:
        return  # the Pool op refuses pads as large as the window, and empty outputs
    dims = (2, 3) + (size,) * nd
    g = Graph("pool")
    x = g.input("x", dims)
    g.set_outputs([getattr(g, fn)(x, win, stride, (pads,) * nd)])
    xv = np.random.default_rng(size).standard_normal(dims).astype(np.float32)
    xv.flat[::7] = np.nan if fn == "max_pool" else xv.flat[::7]
    cg = _compile(g, {}, threads)
    assert _kinds(cg, "pool") == [KernelKind.NATIVE]
    (got,) = cg.run({"x": xv})
    (ref,) = g.evaluate({"x": xv}, {})
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)  # NaN positions must agree too


@pytest.mark.parametrize("fn", ["max_pool", "avg_pool"])
def test_pool_window_over_padding_only(fn):
    """A window that covers only padding: -inf for max, NaN (0 / 0) for average, as the
    reference gives."""
    g = Graph("pad")
    x = g.input("x", (1, 1, 2, 2))
    g.set_outputs([getattr(g, fn)(x, 3, 3, ((2, 2), (2, 2)))])
    xv = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    cg = _compile(g, {})
    (got,) = cg.run({"x": xv})
    (ref,) = g.evaluate({"x": xv}, {})
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("fn", ["max_pool", "avg_pool"])
@pytest.mark.parametrize("hw", [(16, 16), (9, 7), (2, 5)])
@pytest.mark.parametrize("threads", [1, 2])
def test_pool_2x2_stride_2(fn, hw, threads):
    """The 2x2 stride-2 pool without padding (conv.c's one-pass loop; odd sizes drop the
    last row / column) against the reference, NaN included."""
    g = Graph("pool2")
    x = g.input("x", (3, 5, *hw))
    g.set_outputs([getattr(g, fn)(x, 2, 2, ((0, 0), (0, 0)))])
    xv = np.random.default_rng(sum(hw)).standard_normal((3, 5, *hw)).astype(np.float32)
    xv.flat[::5] = np.nan if fn == "max_pool" else xv.flat[::5]
    cg = _compile(g, {}, threads)
    assert _kinds(cg, "pool") == [KernelKind.NATIVE]
    (got,) = cg.run({"x": xv})
    (ref,) = g.evaluate({"x": xv}, {})
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
