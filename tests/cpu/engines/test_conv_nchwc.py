"""The direct convolution on NCHWc channel blocks (``engines/conv_nchwc.py``,
``csrc/conv_nchwc.c``) against ``torch.nn.functional.conv2d`` in float64 (the independent
oracle; NumPy's where torch is not installed, ``conv_oracle.py``), on every native target
this CPU runs (RLX_ISA forced: avx512 with blocks of 16, avx2 of 8, portable and the aarch64
targets of 4; a stem's few input channels unblocked): strides 1 / 2 / 3, uneven padding, dilation, channel counts
that are not a multiple of the block, odd and one-row planes, 1-D convs, bias or none,
1 and 2 threads, new parameters after compile, the direct kernel and Winograd F(2x2, 3x3)
(``csrc/conv_winograd.c``) for the 3x3 stride-1 cases, the 1x1 kernel on NCHW
(``csrc/conv_pointwise.c``), the depthwise kernel on NCHWc blocks (``csrc/conv_dw_nchwc.c``); the epilogue (bias + residual, then relu /
relu6 / clip, NaN kept) through the engine's factory."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.dispatch import KernelCtx
from rlx.backends.cpu.engines import conv as conv_engine
from rlx.backends.cpu.engines import conv_nchwc
from rlx.backends.cpu.kernels import KernelKind
from rlx.ir.mir import Graph
from rlx.options import CompileOptions
from rlx.runtime.session import Session
from tests.cpu.engines.conv_oracle import conv2d_f64

TARGETS = [t.value for t in native.runnable_targets()] if native.available() else []
pytestmark = pytest.mark.skipif(not TARGETS, reason="gcc is not installed")


#: target -> (block CB, register tile TMAX): aarch64 NEON holds 8 positions x 2 blocks of 4
BLOCK_TILE = {
    "avx512": (16, 12),
    "avx2": (8, 6),
    "portable": (4, 6),
    "neon": (4, 8),
    "dotprod": (4, 8),
    "i8mm": (4, 8),
}


@pytest.mark.parametrize("target", TARGETS)
def test_block_and_tile_of_each_target(monkeypatch, target) -> None:
    monkeypatch.setenv("RLX_ISA", target)
    lib = conv_nchwc.nchwc_lib()
    assert (lib.rlx_nchwc_block(), lib.rlx_nchwc_tile()) == BLOCK_TILE[target]


@pytest.fixture(autouse=True)
def _every_shape(monkeypatch) -> None:
    """The kernels on every shape here: the measured size rules (stems only with 25+ taps
    on AVX-512, no small planes on AVX2 / portable) off, test_selection_rules checks them."""
    monkeypatch.setattr(conv_nchwc, "STEM_MIN_TAPS", 0)
    monkeypatch.setattr(conv_nchwc, "STEM_WIDE_ONLY", False)
    monkeypatch.setattr(conv_nchwc, "NARROW_MIN_PLANE", 0)
    monkeypatch.setattr(conv_nchwc, "DEPTHWISE_WIDE_ONLY", False)
    monkeypatch.setattr(conv_nchwc, "DEPTHWISE_MAX_PLANE", 1 << 20)


def _torch_conv(x, w, b, stride, padding, dil):  # noqa: ANN001, ANN202
    return conv2d_f64(x, w, b, stride, padding, dil)


def _tol(w: np.ndarray) -> float:
    """f32 bound: products summed over the window's taps, inputs ~N(0, 1)."""
    return 2e-6 * float(np.sqrt(w[0].size)) * 8


# (n, c, o, hw, k, stride, padding, dilation, bias)
CASES = [
    (1, 16, 32, (12, 12), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), True),  # whole blocks
    (2, 20, 24, (11, 13), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), False),  # partial blocks
    (1, 17, 40, (15, 9), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), True),  # stride 2, odd
    (2, 16, 17, (10, 9), (3, 3), (2, 1), ((1, 0), (2, 1)), (1, 1), True),  # uneven pads
    (1, 24, 16, (12, 12), (3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2), False),  # dilated
    (1, 16, 48, (13, 30), (5, 5), (3, 3), ((2, 2), (2, 2)), (1, 1), True),  # 5x5 stride 3
    (3, 32, 16, (1, 29), (1, 3), (1, 1), ((0, 0), (1, 1)), (1, 1), True),  # one row
    (1, 16, 16, (7, 7), (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), True),  # no padding
    (2, 3, 20, (23, 21), (7, 7), (2, 2), ((3, 3), (3, 3)), (1, 1), True),  # a stem: NCHW input
    (1, 5, 16, (9, 8), (3, 3), (2, 1), ((1, 1), (1, 1)), (1, 1), False),  # 5 input channels
]


def _winograd_case(case: tuple) -> bool:
    """3x3, stride 1, undilated, whole input blocks on every target (Winograd's cases)."""
    _, c, _, _, k, stride, _, dil, _ = case
    return k == (3, 3) and stride == dil == (1, 1) and c >= 16


RUNS = [(case, w) for case in CASES for w in (False, True) if not w or _winograd_case(case)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("case", "wino"),
    RUNS,
    ids=[f"c{CASES.index(c)}-{'winograd' if w else 'direct'}" for c, w in RUNS],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_nchwc_conv_matches_torch(monkeypatch, target, case, wino, threads) -> None:
    monkeypatch.setenv("RLX_ISA", target)
    monkeypatch.setattr(conv_nchwc, "_PARALLEL_MIN_MACS", 0)  # a team even on small convs
    monkeypatch.setattr(conv_nchwc, "WINOGRAD", wino)
    monkeypatch.setattr(conv_nchwc, "WINOGRAD_MIN_PLANE", 0)  # small planes too
    n, c, o, hw, k, stride, padding, dil, bias = case
    rng = np.random.default_rng(sum(hw) + o + c)
    g = Graph("conv")
    x = g.input("x", (n, c, *hw))
    w = g.param("w", (o, c, *k))
    b = g.param("b", (o,)) if bias else None
    g.set_outputs([g.conv(x, w, b, stride=stride, padding=padding, dilation=dil)])
    params = {"w": rng.standard_normal((o, c, *k)).astype(np.float32)}
    if bias:
        params["b"] = rng.standard_normal(o).astype(np.float32)
    xv = rng.standard_normal((n, c, *hw)).astype(np.float32)
    opts = CompileOptions(num_threads=threads, use_cache=False, verbose=False)
    cg = Session("cpu").compile(g, opts, params=params)
    rep = [kk for kk in cg.report().kernels if kk.op == "conv"]
    assert [kk.kind for kk in rep] == [KernelKind.NATIVE]
    assert "NCHWc" in str(cg.report())
    assert wino == ("Winograd" in str(cg.report()))
    (got,) = cg.run({"x": xv})
    want = _torch_conv(xv, params["w"], params.get("b"), stride, padding, dil)
    tol = _tol(params["w"])
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # new params reach the re-laid-out weight
    params2 = {k_: v * -0.5 for k_, v in params.items()}
    cg.set_params(params2)
    (got2,) = cg.run({"x": xv})
    want2 = _torch_conv(xv, params2["w"], params2.get("b"), stride, padding, dil)
    np.testing.assert_allclose(got2, want2, rtol=tol, atol=tol)


def test_conv1d_and_where_the_path_does_not_apply(monkeypatch) -> None:
    """A 1-D conv runs on the blocks; a conv with fewer output channels than the smallest
    block (4), a 1x1 window or groups does not take the path."""
    rng = np.random.default_rng(3)
    g = Graph("conv1d")
    x = g.input("x", (2, 16, 37))
    g.set_outputs([g.conv(x, g.param("w", (20, 16, 5)), None, stride=(2,), padding=((2, 1),))])
    params = {"w": rng.standard_normal((20, 16, 5)).astype(np.float32)}
    xv = rng.standard_normal((2, 16, 37)).astype(np.float32)
    cg = Session("cpu").compile(g, CompileOptions(use_cache=False, verbose=False), params=params)
    assert "NCHWc" in str(cg.report())
    (got,) = cg.run({"x": xv})
    want = conv2d_f64(  # the 1-D conv as a 2-D one over a plane of one row
        xv[:, :, None], params["w"][:, :, None], None, (1, 2), ((0, 0), (2, 1))
    )[:, :, 0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for c, o, k, groups in ((8, 3, 3, 1), (32, 32, 1, 1), (32, 32, 3, 2)):
        g = Graph("skip")
        x = g.input("x", (1, c, 9, 9))
        g.set_outputs([g.conv(x, g.param("w", (o, c // groups, k, k)), None, groups=groups)])
        params = {"w": rng.standard_normal((o, c // groups, k, k)).astype(np.float32)}
        cg = Session("cpu").compile(g, CompileOptions(use_cache=False, verbose=False),
                                    params=params)  # fmt: skip
        assert "NCHWc" not in str(cg.report())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("act", list(conv_engine.ConvAct))
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("wino", [False, True], ids=["direct", "winograd"])
def test_epilogue(monkeypatch, target, act, residual, wino) -> None:
    """act(conv + bias + residual) from the kernel's epilogue against torch (relu, relu6 =
    clip to [0, 6], clip to [lo, hi]); NaN stays NaN (a Winograd tile spreads it over its
    2x2 outputs' neighbours, as the direct sum does over the window's)."""
    monkeypatch.setenv("RLX_ISA", target)
    monkeypatch.setattr(conv_nchwc, "WINOGRAD", wino)
    monkeypatch.setattr(conv_nchwc, "WINOGRAD_MIN_PLANE", 0)
    n, c, o, hw = 2, 18, 20, (9, 10)
    rng = np.random.default_rng(11)
    g = Graph("act")
    xi = g.input("x", (n, c, *hw))
    y = g.conv(xi, g.input("w", (o, c, 3, 3)), g.input("b", (o,)), padding=1)
    g.set_outputs([y])
    node = g.nodes[y]
    x = rng.standard_normal((n, c, *hw)).astype(np.float32) * 3
    x[0, 0, 4, 4] = np.nan
    w = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    res = rng.standard_normal((n, o, *hw)).astype(np.float32) * 4 if residual else None
    out = np.empty((n, o, *hw), np.float32)
    ctx = KernelCtx(node=node, graph=g, bindings={}, params={}, inputs={}, pool=None)  # type: ignore[arg-type]
    ctx.num_threads = 2
    geo = conv_engine.Geometry(n, c, *hw, o, 3, 3, *hw, 1, 1, 1, 1, 1, 1, 1)
    lo, hi = (-0.5, 1.5) if act is conv_engine.ConvAct.CLIP else (0.0, 0.0)
    run = conv_nchwc.nchwc(node, geo, x, w, b, out, ctx, act, lo, hi, res)
    assert run is not None
    assert wino == ("Winograd" in ctx.notes[-1])
    run()
    ref = _torch_conv(x, w, b, (1, 1), ((1, 1), (1, 1)), (1, 1))
    if res is not None:
        ref = ref + res
    ref = {
        conv_engine.ConvAct.NONE: ref,
        conv_engine.ConvAct.RELU: np.maximum(ref, 0),
        conv_engine.ConvAct.RELU6: np.clip(ref, 0, 6),
        conv_engine.ConvAct.CLIP: np.clip(ref, lo, hi),
    }[act]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)  # NaN positions agree too


# (n, c, o, hw, bias, threads): output channels not a multiple of the 4-channel tile,
# planes not a multiple of a chunk, a one-position plane
PW_CASES = [
    (1, 24, 7, (9, 11), True, 1),
    (2, 37, 13, (8, 8), False, 2),
    (3, 32, 5, (1, 1), True, 2),
    (1, 40, 64, (17, 23), True, 2),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", PW_CASES, ids=[f"pw{i}" for i in range(len(PW_CASES))])
@pytest.mark.parametrize("act", list(conv_engine.ConvAct))
def test_pointwise_matches_torch(monkeypatch, target, case, act) -> None:
    """The 1x1 kernel on NCHW (csrc/conv_pointwise.c) compiled end to end (act(conv + bias
    + residual) fused by ``fuse_conv_act``), against torch in float64; NaN stays NaN."""
    monkeypatch.setenv("RLX_ISA", target)
    monkeypatch.setattr(conv_nchwc, "_PARALLEL_MIN_MACS", 0)
    n, c, o, hw, bias, threads = case
    rng = np.random.default_rng(c + o)
    g = Graph("pw")
    x = g.input("x", (n, c, *hw))
    b = g.param("b", (o,)) if bias else None
    y = g.add(g.conv(x, g.param("w", (o, c, 1, 1)), b), g.input("r", (n, o, *hw)))
    lo, hi = {"relu": (0.0, np.inf), "relu6": (0.0, 6.0), "clip": (-0.5, 1.5)}.get(
        act.value, (-np.inf, np.inf)
    )
    if act is conv_engine.ConvAct.RELU:
        y = g.relu(y)
    elif act is not conv_engine.ConvAct.NONE:
        y = g.minimum(g.maximum(y, g.constant(np.float32(lo))), g.constant(np.float32(hi)))
    g.set_outputs([y])
    params = {"w": rng.standard_normal((o, c, 1, 1)).astype(np.float32)}
    if bias:
        params["b"] = rng.standard_normal(o).astype(np.float32)
    xv = rng.standard_normal((n, c, *hw)).astype(np.float32)
    xv[0, 1, 0, 0] = np.nan
    rv = rng.standard_normal((n, o, *hw)).astype(np.float32)
    opts = CompileOptions(num_threads=threads, use_cache=False, verbose=False)
    cg = Session("cpu").compile(g, opts, params=params)
    kernels = [k for k in cg.report().kernels if k.kind.value != "view"]
    assert [k.op for k in kernels] == ["conv"], kernels
    assert "pointwise" in str(cg.report())
    (got,) = cg.run({"x": xv, "r": rv})
    want = _torch_conv(xv, params["w"], params.get("b"), (1, 1), ((0, 0), (0, 0)), (1, 1))
    want = np.clip(want + rv, lo, hi)
    tol = _tol(params["w"])
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)  # NaN positions agree too


@pytest.mark.parametrize("target", TARGETS)
def test_selection_rules(monkeypatch, target) -> None:
    """The measured size rules: a 3x3 stem (3 input channels) and, on the narrow targets
    (AVX2, portable), a 7x7 output plane stay on the older paths; a 7x7 stem takes the direct
    kernel only on AVX-512; a 14x14 3x3 conv takes Winograd everywhere."""
    monkeypatch.setenv("RLX_ISA", target)
    monkeypatch.setattr(conv_nchwc, "STEM_MIN_TAPS", 25)
    monkeypatch.setattr(conv_nchwc, "STEM_WIDE_ONLY", True)
    monkeypatch.setattr(conv_nchwc, "NARROW_MIN_PLANE", 100)
    wide = target == "avx512"
    rng = np.random.default_rng(5)
    for c, o, hw, k, s, want in (
        (3, 32, 24, 3, 2, None),
        (3, 64, 30, 7, 2, "NCHWc" if wide else None),
        (32, 32, 7, 3, 1, "NCHWc" if wide else None),
        (32, 32, 14, 3, 1, "Winograd"),
    ):
        g = Graph("rule")
        x = g.input("x", (1, c, hw, hw))
        g.set_outputs([g.conv(x, g.param("w", (o, c, k, k)), None, stride=s, padding=k // 2)])
        params = {"w": rng.standard_normal((o, c, k, k)).astype(np.float32)}
        opts = CompileOptions(use_cache=False, verbose=False)
        cg = Session("cpu").compile(g, opts, params=params)
        text = str(cg.report())
        assert ("NCHWc" not in text) if want is None else (want in text), (c, hw, k, target)


# (n, c, hw, k, stride, padding, dilation, bias): channels not a multiple of a block,
# odd planes, strides 1 / 2, uneven padding, dilation
DW_CASES = [
    (1, 16, (7, 7), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), True),
    (2, 37, (14, 13), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), False),
    (1, 20, (9, 11), (5, 5), (1, 2), ((2, 1), (0, 2)), (1, 1), True),
    (3, 24, (12, 12), (3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2), True),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", DW_CASES, ids=[f"dw{i}" for i in range(len(DW_CASES))])
@pytest.mark.parametrize("act", list(conv_engine.ConvAct))
def test_depthwise_nchwc_matches_torch(monkeypatch, target, case, act) -> None:
    """The depthwise kernel on NCHWc blocks (csrc/conv_dw_nchwc.c) through the engine's
    factory: act(conv + bias + residual) against torch in float64; NaN stays NaN."""
    monkeypatch.setenv("RLX_ISA", target)
    n, c, hw, k, stride, padding, dil, bias = case
    rng = np.random.default_rng(c + sum(hw))
    (pt, pb), (pl, pr) = padding
    oh = (hw[0] + pt + pb - dil[0] * (k[0] - 1) - 1) // stride[0] + 1
    ow = (hw[1] + pl + pr - dil[1] * (k[1] - 1) - 1) // stride[1] + 1
    g = Graph("dw")
    xi = g.input("x", (n, c, *hw))
    y = g.conv(xi, g.input("w", (c, 1, *k)), g.input("b", (c,)) if bias else None,
               stride=stride, padding=padding, dilation=dil, groups=c)  # fmt: skip
    g.set_outputs([y])
    node = g.nodes[y]
    x = rng.standard_normal((n, c, *hw)).astype(np.float32) * 3
    x[0, 1, 2, 3] = np.nan
    w = rng.standard_normal((c, 1, *k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32) if bias else None
    res = rng.standard_normal((n, c, oh, ow)).astype(np.float32)
    out = np.empty((n, c, oh, ow), np.float32)
    ctx = KernelCtx(node=node, graph=g, bindings={}, params={}, inputs={}, pool=None)  # type: ignore[arg-type]
    ctx.num_threads = 2
    geo = conv_engine.Geometry(n, c, *hw, c, *k, oh, ow, *stride, pt, pl, *dil, c)
    lo, hi = {"relu": (0.0, np.inf), "relu6": (0.0, 6.0), "clip": (-0.5, 1.5)}.get(
        act.value, (-np.inf, np.inf)
    )
    kl, kh = (lo, hi) if act is conv_engine.ConvAct.CLIP else (0.0, 0.0)
    run = conv_nchwc.depthwise(node, geo, x, w, b, out, ctx, act, kl, kh, res)
    assert run is not None and "depthwise conv on NCHWc" in ctx.notes[-1]
    run()
    want = conv2d_f64(x, w, b, stride, ((pt, pb), (pl, pr)), dil, c)
    want = np.clip(want + res, lo, hi)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)  # NaN positions agree too
