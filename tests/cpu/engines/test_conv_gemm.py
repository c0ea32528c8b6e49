"""The convolutions on rlx's packed sgemm and the depthwise kernel (``engines/conv.py``,
``csrc/conv.c``: ``rlx_conv2d_gemm_f32``, ``rlx_conv2d_depthwise_f32``) against
``torch.nn.functional.conv2d`` in float64 (the independent oracle): 1x1 and 3x3 / 5x5 / 7x7
windows, small planes (``rlx_conv2d_gemm_t_f32``: the product transposed), strides, dilations, uneven padding, groups, depthwise with channel multipliers,
bias or none, several column blocks per image, blocks over the team or one at a time
with the sgemm's team, on every native target this CPU
runs (RLX_ISA forced: avx512, avx2, portable), plus the kernels' activation epilogues
(relu / relu6 / clip, called through the engine's factories on a conv node; the fused
graph nodes ``fuse_conv_act`` makes are test_conv_fused.py's)."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.engines import conv as conv_engine
from rlx.backends.cpu.engines import conv_gemm, conv_nchwc
from rlx.backends.cpu.kernels import KernelKind
from rlx.ir.mir import Graph
from rlx.options import CompileOptions
from rlx.runtime.session import Session
from tests.cpu.engines.conv_oracle import conv2d_f64

TARGETS = [t.value for t in native.runnable_targets()] if native.available() else []
pytestmark = pytest.mark.skipif(not TARGETS, reason="gcc is not installed")


@pytest.fixture(autouse=True)
def _gemm_path(monkeypatch) -> None:
    """The NCHWc direct and pointwise convs (test_conv_nchwc.py's) off: these convs go to
    the sgemm."""
    monkeypatch.setattr(conv_nchwc, "ENABLED", False)
    monkeypatch.setattr(conv_nchwc, "POINTWISE", False)


def _compile(g: Graph, params: dict, threads: int = 1):  # noqa: ANN202
    opts = CompileOptions(num_threads=threads, use_cache=False, verbose=False)
    return Session("cpu").compile(g, opts, params=params)


def _torch_conv(x, w, b, stride, padding, dil, groups):  # noqa: ANN001, ANN202
    return conv2d_f64(x, w, b, stride, padding, dil, groups)


def _tol(w: np.ndarray) -> float:
    """f32 bound: products summed over the window's taps, inputs ~N(0, 1)."""
    return 2e-6 * float(np.sqrt(w[0].size)) * 8


# (n, c, o, hw, k, stride, padding, dilation, groups, bias)
GEMM_CASES = [
    (1, 16, 32, (9, 11), (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1, True),  # 1x1
    (2, 24, 16, (8, 8), (1, 1), (2, 2), ((0, 0), (0, 0)), (1, 1), 1, False),  # 1x1 stride 2
    (1, 8, 40, (13, 12), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, True),  # 3x3
    (3, 8, 16, (10, 9), (3, 3), (2, 1), ((1, 0), (2, 1)), (1, 1), 1, False),  # uneven pads
    (2, 6, 24, (12, 12), (3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2), 1, True),  # dilated
    (1, 3, 16, (15, 15), (7, 7), (2, 2), ((3, 3), (3, 3)), (1, 1), 1, False),  # a stem
    (2, 16, 32, (7, 9), (3, 3), (1, 2), ((1, 1), (0, 2)), (1, 1), 2, True),  # groups
    (4, 8, 64, (37, 5), (5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1), 1, True),  # wide rows
    (1, 4, 16, (41, 43), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, True),  # column blocks
    (1, 8, 16, (9, 70), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 1, True),  # whole s2 panels
    # small planes (L <= O): the transposed product, the weight packed once as B
    (2, 16, 48, (5, 7), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, True),
    (3, 24, 40, (9, 8), (3, 3), (2, 2), ((1, 0), (1, 2)), (1, 1), 1, False),
    (2, 32, 64, (7, 7), (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1, True),  # x is im2col
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", GEMM_CASES, ids=[f"gemm{i}" for i in range(len(GEMM_CASES))])
@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_conv_matches_torch(monkeypatch, target, case, threads) -> None:
    monkeypatch.setenv("RLX_ISA", target)
    # small shapes here: lower the size from which the sgemm path runs (not the kernel)
    monkeypatch.setattr(conv_gemm, "_GEMM_MIN_MACS", 0)
    n, c, o, hw, k, stride, padding, dil, groups, bias = case
    rng = np.random.default_rng(sum(hw) + o)
    g = Graph("conv")
    x = g.input("x", (n, c, *hw))
    w = g.param("w", (o, c // groups, *k))
    b = g.param("b", (o,)) if bias else None
    g.set_outputs([g.conv(x, w, b, stride=stride, padding=padding, dilation=dil, groups=groups)])
    params = {"w": rng.standard_normal((o, c // groups, *k)).astype(np.float32)}
    if bias:
        params["b"] = rng.standard_normal(o).astype(np.float32)
    xv = rng.standard_normal((n, c, *hw)).astype(np.float32)
    cg = _compile(g, params, threads)
    rep = [kk for kk in cg.report().kernels if kk.op == "conv"]
    assert [kk.kind for kk in rep] == [KernelKind.NATIVE]
    assert "sgemm" in str(cg.report())
    (got,) = cg.run({"x": xv})
    want = _torch_conv(xv, params["w"], params.get("b"), stride, padding, dil, groups)
    tol = _tol(params["w"])
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # new params reach the packed weight (the bias column included)
    params2 = {k_: v * 0.5 for k_, v in params.items()}
    cg.set_params(params2)
    (got2,) = cg.run({"x": xv})
    want2 = _torch_conv(xv, params2["w"], params2.get("b"), stride, padding, dil, groups)
    np.testing.assert_allclose(got2, want2, rtol=tol, atol=tol)


# (n, c, mult, hw, k, stride, padding, dilation, bias)
DW_CASES = [
    (1, 8, 1, (14, 14), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), True),
    (2, 5, 1, (15, 16), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), False),
    (1, 4, 2, (9, 11), (5, 5), (1, 2), ((2, 1), (0, 2)), (1, 1), True),
    (3, 6, 1, (12, 12), (3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2), True),
    (1, 3, 1, (10, 10), (3, 3), (3, 3), ((0, 0), (0, 0)), (1, 1), False),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", DW_CASES, ids=[f"dw{i}" for i in range(len(DW_CASES))])
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_conv_matches_torch(monkeypatch, target, case, threads) -> None:
    monkeypatch.setenv("RLX_ISA", target)
    n, c, mult, hw, k, stride, padding, dil, bias = case
    o = c * mult
    rng = np.random.default_rng(sum(hw) + c)
    g = Graph("dw")
    x = g.input("x", (n, c, *hw))
    w = g.param("w", (o, 1, *k))
    b = g.param("b", (o,)) if bias else None
    g.set_outputs([g.conv(x, w, b, stride=stride, padding=padding, dilation=dil, groups=c)])
    params = {"w": rng.standard_normal((o, 1, *k)).astype(np.float32)}
    if bias:
        params["b"] = rng.standard_normal(o).astype(np.float32)
    xv = rng.standard_normal((n, c, *hw)).astype(np.float32)
    cg = _compile(g, params, threads)
    assert "depthwise" in str(cg.report())
    (got,) = cg.run({"x": xv})
    want = _torch_conv(xv, params["w"], params.get("b"), stride, padding, dil, c)
    tol = _tol(params["w"])
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_batch_one_image_per_thread(monkeypatch) -> None:
    """A batch of small images: its column blocks go over the team (one sgemm thread
    each)."""
    monkeypatch.setattr(conv_gemm, "_GEMM_MIN_MACS", 0)
    rng = np.random.default_rng(0)
    g = Graph("batch")
    x = g.input("x", (5, 8, 6, 6))
    g.set_outputs([g.conv(x, g.param("w", (16, 8, 3, 3)), g.param("b", (16,)), padding=1)])
    params = {"w": rng.standard_normal((16, 8, 3, 3)).astype(np.float32)}
    params["b"] = rng.standard_normal(16).astype(np.float32)
    xv = rng.standard_normal((5, 8, 6, 6)).astype(np.float32)
    (got,) = _compile(g, params, 2).run({"x": xv})
    want = _torch_conv(xv, params["w"], params["b"], (1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("act", list(conv_engine.ConvAct))
@pytest.mark.parametrize("kind", ["gemm", "depthwise"])
def test_activation_epilogues(monkeypatch, target, act, kind) -> None:
    """act(conv + bias) from the kernels' epilogues against torch (relu, relu6 = clip to
    [0, 6], clip to [lo, hi]); NaN stays NaN."""
    monkeypatch.setenv("RLX_ISA", target)
    monkeypatch.setattr(conv_gemm, "_GEMM_MIN_MACS", 0)
    from rlx.backends.cpu.dispatch import KernelCtx

    n, c, hw = 2, 8, (9, 10)
    o, groups = (16, 1) if kind == "gemm" else (8, 8)
    rng = np.random.default_rng(7)
    g = Graph("act")
    xi = g.input("x", (n, c, *hw))
    y = g.conv(xi, g.input("w", (o, c // groups, 3, 3)), g.input("b", (o,)), padding=1,
               groups=groups)  # fmt: skip
    g.set_outputs([y])
    node = g.nodes[y]
    x = rng.standard_normal((n, c, *hw)).astype(np.float32) * 3
    x[0, 0, 4, 4] = np.nan
    w = rng.standard_normal((o, c // groups, 3, 3)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    out = np.empty((n, o, *hw), np.float32)
    ctx = KernelCtx(node=node, graph=g, bindings={}, params={}, inputs={}, pool=None)  # type: ignore[arg-type]
    ctx.num_threads = 2
    geo = conv_engine.Geometry(n, c, *hw, o, 3, 3, *hw, 1, 1, 1, 1, 1, 1, groups)
    lo, hi = (-0.5, 1.5) if act is conv_engine.ConvAct.CLIP else (0.0, 0.0)
    lib = conv_engine.conv_lib()
    make = conv_gemm.gemm if kind == "gemm" else conv_engine._depthwise
    if kind == "gemm":
        run = make(lib, node, geo, x, w, b, out, ctx, act, lo, hi)
    else:
        run = make(lib, geo, x, w, b, out, ctx, act, lo, hi)
    assert run is not None
    run()
    ref = _torch_conv(x, w, b, (1, 1), ((1, 1), (1, 1)), (1, 1), groups)
    ref = {
        conv_engine.ConvAct.NONE: ref,
        conv_engine.ConvAct.RELU: np.maximum(ref, 0),
        conv_engine.ConvAct.RELU6: np.clip(ref, 0, 6),
        conv_engine.ConvAct.CLIP: np.clip(ref, lo, hi),
    }[act]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)  # NaN positions agree too


def test_numpy_oracle_agrees_with_torch() -> None:
    """The NumPy reference conv (the emulated aarch64 run has no torch) against torch's,
    on strides, uneven padding, dilation and groups."""
    torch = pytest.importorskip("torch")  # installed in the x86 venv: runs there
    from tests.cpu.engines.conv_oracle import numpy_conv2d

    rng = np.random.default_rng(11)
    for stride, pads, dil, groups in [
        ((1, 1), ((1, 1), (1, 1)), (1, 1), 1),
        ((2, 3), ((2, 0), (1, 2)), (1, 2), 2),
        ((1, 2), ((0, 1), (3, 3)), (2, 1), 6),
    ]:
        x = rng.standard_normal((2, 6, 11, 13))
        w = rng.standard_normal((12, 6 // groups, 3, 2))
        b = rng.standard_normal(12)
        (pt, pb), (pl, pr) = pads
        xt = torch.nn.functional.pad(torch.from_numpy(x), (pl, pr, pt, pb))
        want = torch.nn.functional.conv2d(
            xt, torch.from_numpy(w), torch.from_numpy(b), stride=stride, dilation=dil, groups=groups
        ).numpy()
        got = numpy_conv2d(x, w, b, stride, pads, dil, groups)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
