"""The NCHWc layout pass (``nchwc_layout``, ``rlx/passes/layout.py``) and its ops
(``to_nchwc``, ``from_nchwc``, ``conv_nchwc``, ``rlx/ops/layout.py``): conv chains compiled
with the pass against ``torch.nn.functional.conv2d`` in float64 (``conv_oracle``) and the
NumPy reference interpreter on the graph as written; the ops' references against explicit
index loops. Odd channel counts (not multiples of the block), stride 2, padding,
depthwise, a residual, relu / relu6 / clip, batch 1 and 3, one and two threads, every
native target of this CPU (RLX_ISA forced)."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.engines.conv_nchwc import nchwc_block
from rlx.backends.reference import evaluate
from rlx.ir.mir import Graph, NodeId
from rlx.ops.layout import ConvNchwc, FromNchwc, Nchwc, ToNchwc
from rlx.ops.nn import Conv, ConvAct
from rlx.options import CompileOptions
from rlx.passes.layout import NchwcLayout
from rlx.runtime.session import Session
from tests.cpu.engines.conv_oracle import conv2d_f64

TARGETS = [t.value for t in native.runnable_targets()] if native.available() else []
needs_gcc = pytest.mark.skipif(not TARGETS, reason="gcc is not installed")

# each layer: (out channels, kernel, stride, pad, depthwise, act, residual of layer i or None)
# act: None relu, (lo, hi) a clip, () none
CHAIN = (
    (20, 3, 1, 1, False, None, None),  # Winograd on planes of 100+ outputs
    (24, 3, 2, 1, False, (0.0, 6.0), None),  # stride 2, relu6
    (24, 3, 1, 1, True, (0.0, 6.0), None),  # depthwise
    (24, 1, 1, 0, False, (), 1),  # pointwise, the residual of layer 1
    (40, 1, 1, 0, False, None, None),
    (40, 3, 2, 1, True, (-0.5, 1.5), None),  # depthwise stride 2, a clip
    (17, 1, 1, 0, False, (), None),  # 17 output channels
)


def _chain(n: int, c: int, hw: tuple[int, int], seed: int) -> tuple[Graph, dict, dict, list]:
    """The graph of CHAIN after a 3x3 stem, its params and feeds, and the layer specs."""
    rng = np.random.default_rng(seed)
    g = Graph("chain")
    x = g.input("x", (n, c, *hw))
    feeds = {"x": rng.standard_normal((n, c, *hw)).astype(np.float32)}
    params: dict[str, np.ndarray] = {}
    outs: list[NodeId] = []
    specs = []
    y: NodeId = x
    for i, (o, k, s, p, dw, act, res) in enumerate(CHAIN):
        groups = c if dw else 1
        wshape = (o, c // groups, k, k)
        params[f"w{i}"] = (rng.standard_normal(wshape) / np.sqrt(c // groups * k * k)).astype(
            np.float32
        )
        params[f"b{i}"] = rng.standard_normal(o).astype(np.float32)
        y = g.conv(y, g.param(f"w{i}", wshape), g.param(f"b{i}", (o,)), s, p, 1, groups)
        if res is not None:
            y = g.add(y, outs[res])
        if act is None:
            y = g.relu(y)
        elif act:
            y = g.minimum(
                g.maximum(y, g.constant(np.float32(act[0]))), g.constant(np.float32(act[1]))
            )
        outs.append(y)
        specs.append((s, p, groups, res, act))
        c = o
    g.set_outputs([outs[-1], outs[3]])  # the chain's end and a tensor read in the middle
    return g, params, feeds, specs


def _torch_chain(params: dict, feeds: dict, specs: list) -> list[np.ndarray]:
    y = feeds["x"].astype(np.float64)
    outs = []
    for i, (s, p, groups, res, act) in enumerate(specs):
        y = conv2d_f64(
            y, params[f"w{i}"], params[f"b{i}"], (s, s), ((p, p), (p, p)), (1, 1), groups
        )
        if res is not None:
            y = y + outs[res]
        y = np.maximum(y, 0) if act is None else (np.clip(y, *act) if act else y)
        outs.append(y)
    return [outs[-1], outs[3]]


@needs_gcc
@pytest.mark.parametrize("target", TARGETS)
def test_conv_chain_on_blocks_matches_torch_and_the_reference(monkeypatch, target) -> None:
    monkeypatch.setenv("RLX_ISA", target)
    # (13, 11): the first conv runs Winograd on blocks; (9, 10), 3 channels: an RGB stem
    # (direct kernel); either reads its NCHW input
    for n, threads, hw, c in ((1, 1, (13, 11), 20), (3, 2, (9, 10), 3)):
        g, params, feeds, specs = _chain(n, c, hw, seed=n)
        opts = CompileOptions(num_threads=threads, use_cache=False, verbose=False)
        cg = Session("cpu").compile(g, opts, params=params)
        ops = [k.op for k in cg.report().kernels if k.kind.value != "view"]
        blocked = ops.count("conv_nchwc")
        assert blocked == 7, ops
        assert ("Winograd" in str(cg.report())) == (c == 20)
        # the chain's first conv reorders its own input; out of it: the two outputs
        assert ops.count("to_nchwc") == 0 and ops.count("from_nchwc") == 2, ops
        got = cg.run(feeds)
        want = _torch_chain(params, feeds, specs)
        ref = evaluate(g, feeds, params)
        for a, b, r in zip(got, want, ref, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)


@needs_gcc
def test_the_pass_can_be_disabled_and_leaves_lone_convs() -> None:
    g, params, feeds, _ = _chain(1, 20, (9, 9), seed=5)
    opts = CompileOptions(use_cache=False, disabled_passes=("nchwc_layout",))
    cg = Session("cpu").compile(g, opts, params=params)
    assert "conv_nchwc" not in [k.op for k in cg.report().kernels]
    lone = Graph("lone")
    x = lone.input("x", (1, 32, 8, 8))
    lone.set_outputs([lone.conv(x, lone.param("w", (32, 32, 1, 1)))])
    assert NchwcLayout(block=16).run(lone) is lone  # one conv: two reorders for nothing


def test_layout_ops_match_index_loops() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    g = Graph("reorder")
    xi = g.input("x", x.shape)
    b = g.apply(ToNchwc(Nchwc(4)), [xi])
    back = g.apply(FromNchwc(Nchwc(4), 5), [b])
    g.set_outputs([b, back])
    blocked, unblocked = evaluate(g, {"x": x}, {})
    want = np.zeros((2, 2, 3, 4, 4), np.float32)
    for n in range(2):
        for c in range(5):
            for h in range(3):
                for w in range(4):
                    want[n, c // 4, h, w, c % 4] = x[n, c, h, w]
    np.testing.assert_array_equal(blocked, want)
    np.testing.assert_array_equal(unblocked, x)


@pytest.mark.parametrize("native_kernels", [True, False])
def test_conv_nchwc_op_matches_torch(native_kernels) -> None:
    """The op on its own (native kernel, and the NumPy fallback) against conv2d in f64;
    its padding lanes hold act(residual lane)."""
    rng = np.random.default_rng(11)
    block = (nchwc_block() or 4) if native_kernels else 4  # the native kernel: its block
    x = rng.standard_normal((2, 6, 7, 5)).astype(np.float32)
    w = rng.standard_normal((7, 6, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(7).astype(np.float32)
    cb = -(-7 // block)
    res = rng.standard_normal((2, cb, 4, 3, block)).astype(np.float32)
    conv = Conv((2, 2), ((1, 1), (1, 1)), (1, 1), 1, True, ConvAct.CLIP, (-0.5, 2.0), True)
    g = Graph("one")
    xi, ri = g.input("x", x.shape), g.input("r", res.shape)
    xb = g.apply(ToNchwc(Nchwc(block)), [xi])
    y = g.apply(
        ConvNchwc(conv, Nchwc(block), 6), [xb, g.param("w", w.shape), g.param("b", (7,)), ri]
    )
    g.set_outputs([y])
    opts = CompileOptions(use_cache=False, native=native_kernels, disabled_passes=("nchwc_layout",))
    (got,) = Session("cpu").compile(g, opts, params={"w": w, "b": bias}).run({"x": x, "r": res})
    full = np.zeros((2, cb * block, 4, 3))
    full[:, :7] = conv2d_f64(x, w, bias, (2, 2), ((1, 1), (1, 1)))
    full += res.transpose(0, 1, 4, 2, 3).reshape(2, cb * block, 4, 3)
    want = np.clip(full, -0.5, 2.0).reshape(2, cb, block, 4, 3).transpose(0, 1, 3, 4, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    cg = Session("cpu").compile(g, opts, params={"w": w, "b": bias})
    note = str(cg.report())
    assert ("activations kept blocked" in note) == (native_kernels and TARGETS != []), note


@needs_gcc
@pytest.mark.parametrize("target", TARGETS)
def test_winograd_chain_on_blocks_matches_torch(monkeypatch, target) -> None:
    """Two 3x3 stride-1 convs on a 12x12 plane (Winograd on blocks; the second reads the
    first's blocks and adds the block input as its residual), then relu."""
    monkeypatch.setenv("RLX_ISA", target)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 20, 12, 12)).astype(np.float32)
    w1, w2 = (rng.standard_normal((20, 20, 3, 3)).astype(np.float32) / 13 for _ in range(2))
    b1, b2 = rng.standard_normal(20).astype(np.float32), rng.standard_normal(20).astype(np.float32)
    g = Graph("wino")
    xi = g.input("x", x.shape)
    y = g.relu(g.conv(xi, g.param("w1", w1.shape), g.param("b1", (20,)), 1, 1))
    y = g.relu(g.add(g.conv(y, g.param("w2", w2.shape), g.param("b2", (20,)), 1, 1), xi))
    g.set_outputs([y])
    params = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    cg = Session("cpu").compile(g, CompileOptions(num_threads=2, use_cache=False), params=params)
    rep = str(cg.report())
    assert rep.count("Winograd") == 2 and "activations kept blocked" in rep, rep
    (got,) = cg.run({"x": x})
    pads = ((1, 1), (1, 1))
    h = np.maximum(conv2d_f64(x, w1, b1, (1, 1), pads), 0)
    want = np.maximum(conv2d_f64(h, w2, b2, (1, 1), pads) + x, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_blocked_ops_survive_serialization() -> None:
    """A graph holding the layout ops (a Conv and the Nchwc layout as attributes) saves and
    loads with its attributes intact."""
    from rlx.ir.serialize import dumps, loads

    g = Graph("saved")
    lay = Nchwc(4)
    conv = Conv((1, 1), ((1, 1), (1, 1)), (1, 1), 1, True, ConvAct.CLIP, (0.0, 6.0))
    xb = g.apply(ToNchwc(lay), [g.input("x", (1, 5, 6, 5))])
    y = g.apply(ConvNchwc(conv, lay, 5), [xb, g.param("w", (6, 5, 3, 3)), g.param("b", (6,))])
    g.set_outputs([g.apply(FromNchwc(lay, 6), [y])])
    loaded, _ = loads(dumps(g))
    assert [n.op for n in loaded.nodes] == [n.op for n in g.nodes]
