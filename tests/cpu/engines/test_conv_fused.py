"""Convolutions with a fused residual and activation (``fuse_conv_act`` -> ``Conv.act``,
``Conv.has_residual``) compiled end to end, against ``torch.nn.functional.conv2d`` in
float64 followed by the same residual add and relu / relu6 / clip: on each path of the
Conv kernel (the direct conv and Winograd on NCHWc blocks, the pointwise 1x1 kernel, the packed sgemm with the residual in its epilogue, its transposed form for
small planes, the depthwise kernel,
the direct stride-1 and strided loops, the im2col + NumPy fallback), every native target
this CPU runs (RLX_ISA forced), batch 1 and 3, odd sizes, one and two threads."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.engines import conv_gemm, conv_nchwc
from rlx.ir.mir import Graph, NodeId
from rlx.options import CompileOptions
from rlx.runtime.session import Session
from tests.cpu.engines.conv_oracle import conv2d_f64

TARGETS = [t.value for t in native.runnable_targets()] if native.available() else []
pytestmark = pytest.mark.skipif(not TARGETS, reason="gcc is not installed")

# path -> (c, o, hw, k, stride, pad, groups) and the kernel note that proves the path
PATHS = {
    "nchwc": ((16, 24, (9, 11), 3, 1, 1, 1), "NCHWc"),
    "nchwc_s2": ((20, 17, (11, 8), 3, 2, 1, 1), "NCHWc"),
    "winograd": ((16, 20, (11, 12), 3, 1, 1, 1), "Winograd"),
    "pointwise": ((32, 7, (9, 11), 1, 1, 0, 1), "pointwise"),
    "gemm": ((16, 24, (9, 11), 3, 1, 1, 1), "sgemm"),
    "gemm1x1s2": ((24, 16, (11, 7), 1, 2, 0, 1), "sgemm"),
    "gemm_blocks": ((8, 256, (23, 41), 3, 1, 1, 1), "sgemm"),  # 2 column blocks
    "gemm_t": ((16, 40, (5, 7), 3, 1, 1, 1), "transposed"),
    "gemm_t_s2": ((16, 40, (9, 8), 3, 2, 1, 1), "transposed"),
    "depthwise": ((12, 12, (9, 10), 3, 1, 1, 12), "depthwise"),
    "direct": ((3, 4, (10, 9), 3, 1, 1, 1), "stride 1"),
    "direct_s2": ((3, 4, (11, 9), 3, 2, 1, 1), "native direct conv ("),
    "numpy": ((16, 4, (33, 31), 3, 1, 1, 1), None),
}
# act -> (lo, hi) of the graph's clip; None: relu
ACTS = {"relu": None, "relu6": (0.0, 6.0), "clip": (-0.5, 1.5), "none": ()}


def _graph(path: str, act: str, residual: bool, n: int) -> tuple[Graph, dict, dict]:
    (c, o, hw, k, s, p, groups), _ = PATHS[path]
    rng = np.random.default_rng(len(path) + 3 * n)
    g = Graph("fused")
    x = g.input("x", (n, c, *hw))
    y: NodeId = g.conv(x, g.param("w", (o, c // groups, k, k)), g.param("b", (o,)), s, p, 1, groups)
    oh, ow = ((d + 2 * p - k) // s + 1 for d in hw)
    if residual:
        y = g.add(y, g.input("r", (n, o, oh, ow)))
    bounds = ACTS[act]
    if bounds is None:
        y = g.relu(y)
    elif bounds:
        y = g.maximum(y, g.constant(np.float32(bounds[0])))
        y = g.minimum(y, g.constant(np.float32(bounds[1])))
    g.set_outputs([y])
    params = {
        "w": rng.standard_normal((o, c // groups, k, k)).astype(np.float32),
        "b": rng.standard_normal(o).astype(np.float32),
    }
    feeds = {"x": (2 * rng.standard_normal((n, c, *hw))).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((n, o, oh, ow)).astype(np.float32)
    return g, params, feeds


def _want(path: str, act: str, params: dict, feeds: dict) -> np.ndarray:
    (_, _, _, _, s, p, groups), _ = PATHS[path]
    y = conv2d_f64(feeds["x"], params["w"], params["b"], (s, s), ((p, p), (p, p)), (1, 1), groups)
    if "r" in feeds:
        y = y + feeds["r"]
    bounds = ACTS[act]
    return np.maximum(y, 0) if bounds is None else (np.clip(y, *bounds) if bounds else y)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(
    ("act", "residual"),
    [(a, r) for a in ACTS for r in (False, True) if r or a != "none"],  # something fused
)
def test_fused_conv_matches_torch(monkeypatch, target, path, act, residual) -> None:
    monkeypatch.setenv("RLX_ISA", target)
    monkeypatch.setattr(conv_gemm, "_GEMM_MIN_MACS", 0)  # small shapes take the sgemm
    monkeypatch.setattr(conv_nchwc, "ENABLED", path.startswith("nchwc") or path == "winograd")
    monkeypatch.setattr(conv_nchwc, "WINOGRAD", path == "winograd")
    monkeypatch.setattr(conv_nchwc, "POINTWISE", path == "pointwise")
    monkeypatch.setattr(conv_nchwc, "NARROW_MIN_PLANE", 0)  # small planes on every target
    for n, threads in ((1, 1), (3, 2)):
        g, params, feeds = _graph(path, act, residual, n)
        opts = CompileOptions(num_threads=threads, use_cache=False, verbose=False)
        cg = Session("cpu").compile(g, opts, params=params)
        kernels = cg.report().kernels
        assert [k.op for k in kernels if k.kind.value != "view"] == ["conv"], kernels
        note = PATHS[path][1]
        if note is not None:
            assert note in str(cg.report())
        (got,) = cg.run(feeds)
        want = _want(path, act, params, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
