"""The seed's GraphModule tests and README quickstart, in the seed's own spellings (issue 35
section 3): ``Graph.define`` (the seed's ``Graph::define``), ``Graph.hir`` (``Graph::hir``)
and ``g.module()`` over ``GraphModule.define`` / ``GraphModule.hir`` /
``GraphModule.from_graph``. Each test names the seed test it ports (the ``#[test]``s of
``rlx-ir/src/graph_module.rs``, and the quickstart of ``rlx-ir/README.md``). Numbers come
from the reference interpreter and are checked against NumPy; the GGUF Q4_K weights are
decoded by ``gguf.quants``, not by rlx.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlx.dtype import DType
from rlx.ir.hir import FusionPolicy, HirModule
from rlx.ir.mir import Graph
from rlx.ir.module import GraphModule, GraphStage
from rlx.ops.linalg import MatMul
from rlx.ops.quant import DequantMatMul, GgufQ4K
from tests.quant.gguf_blocks import set_f16_scales

RNG = np.random.default_rng(35)


def _f32(*dims: int) -> np.ndarray:
    return RNG.standard_normal(dims).astype(np.float32)


def _run(module: GraphModule, inputs: dict, params: dict) -> list[np.ndarray]:
    """The module's outputs from the reference interpreter (lowered first if at HIR)."""
    return module.into_graph().evaluate(inputs, params)


# Seed test: graph_module.rs `define_lowers_to_mir_graph`
def test_define_lowers_to_mir_graph():
    def build(m: HirModule) -> int:
        x = m.input("x", (2, 8))
        w = m.param("w", (8, 8))
        return m.linear(x, w, None, None, (2, 8))

    module = GraphModule.define("m", build)
    assert module.stage is GraphStage.HIR
    module = module.lower()
    assert module.stage is GraphStage.MIR
    assert len(module) >= 3
    xv, wv = _f32(2, 8), _f32(8, 8)
    (got,) = _run(module, {"x": xv}, {"w": wv})
    np.testing.assert_allclose(got, xv @ wv, rtol=1e-5, atol=1e-6)
    # the seed's Graph::define spelling builds the same module
    same = Graph.define("m", build).lower()
    assert same.stage is GraphStage.MIR
    assert same.into_graph().fingerprint() == module.into_graph().fingerprint()


# Seed test: graph_module.rs `mir_module_deref_builds_graph`
def test_mir_module_deref_builds_graph():
    module = GraphModule.mir("raw")
    x = module.input("x", (4,))
    module.set_outputs([x])
    assert len(module) == 1
    xv = _f32(4)
    (got,) = _run(module, {"x": xv}, {})
    np.testing.assert_array_equal(got, xv)


# Seed test: graph_module.rs `hir_module_block_builders_via_graph_module`
def test_hir_module_block_builders_via_graph_module():
    gguf = pytest.importorskip("gguf")
    # rlx's DequantMatMul takes the GGUF Q4_K bytes as stored ([out, in/256 * 144] u8);
    # the seed's [128, 128] f32 weight shape names no packed layout, so K = 256 here.
    n, k = 128, 256
    module = Graph.hir("layer")
    x = module.input("x", (2, k))
    w = module.param("w", (n, k // 256 * 144), DType.U8)
    y = module.dequant_matmul(x, w, None, None, GgufQ4K(), (2, n))
    module.set_outputs([y])
    assert module.stage is GraphStage.HIR

    module = module.lower()
    assert module.stage is GraphStage.MIR
    assert len(module) >= 3
    assert module.as_graph().find(DequantMatMul)

    blocks = RNG.integers(0, 256, (n * k // 256, 144), dtype=np.uint8)
    set_f16_scales(blocks, "Q4_K", RNG)
    dense = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_K).reshape(n, k)
    xv = _f32(2, k)
    (got,) = _run(module, {"x": xv}, {"w": blocks.reshape(n, -1)})
    want = xv.astype(np.float64) @ np.asarray(dense, np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# Seed test: graph_module.rs `graph_hir_entry_matches_define`
def test_graph_hir_entry_matches_define():
    via_graph = Graph.hir("m")

    def build(m: HirModule) -> int:
        x = m.input("x", (4,))
        return m.rms_norm(x, x, x, 1e-5, (4,))

    via_define = Graph.define("m", build)
    assert via_graph.stage is GraphStage.HIR
    assert via_define.stage is GraphStage.HIR
    assert isinstance(via_graph, GraphModule) and isinstance(via_define, GraphModule)
    assert via_graph.name == via_define.name == "m"
    # the same as the GraphModule spellings
    assert GraphModule.hir("m").stage is via_graph.stage
    assert (
        via_define.into_graph().fingerprint()
        == GraphModule.define("m", build).into_graph().fingerprint()
    )
    # rms_norm(x, gamma=x, beta=x) = x / sqrt(mean(x^2) + eps) * x + x
    xv = _f32(4)
    (got,) = _run(via_define, {"x": xv}, {})
    x64 = xv.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 * x64) + 1e-5) * x64 + x64
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# Seed README: the Quickstart (`Graph::define("layer", ...)`, then `g.module()`)
def test_readme_quickstart():
    # Fusion-first (recommended)
    module = Graph.define(
        "layer",
        lambda m: m.linear(m.input("x", (2, 128)), m.param("w", (128, 128)), None, None, (2, 128)),
    )
    assert module.stage is GraphStage.HIR and module.name == "layer"
    xv, wv = _f32(2, 128), _f32(128, 128)
    (got,) = _run(module, {"x": xv}, {"w": wv})
    np.testing.assert_allclose(got, xv.astype(np.float64) @ wv, rtol=1e-4, atol=1e-4)

    # Primitive MIR (legacy)
    g = Graph("hello")
    x = g.input("x", (1, 4))
    w = g.param("w", (4, 2))
    y = g.matmul(x, w)  # rlx infers the [1, 2] f32 shape the seed spells out
    g.set_outputs([y])
    module = g.module()
    assert isinstance(module, GraphModule) and module.stage is GraphStage.MIR
    assert module.name == "hello" and module.as_graph() is g  # wraps g, as from_graph does
    assert [n.id for n in module.find(MatMul)] == [y]
    xv, wv = _f32(1, 4), _f32(4, 2)
    (got,) = _run(module, {"x": xv}, {"w": wv})
    np.testing.assert_allclose(got, xv.astype(np.float64) @ wv, rtol=1e-5, atol=1e-6)


def test_seed_spellings_pass_the_fusion_policy_through():
    """Not a seed test: the optional policy reaches GraphModule.define / .hir."""
    policy = FusionPolicy.FUSABLE
    assert Graph.hir("m").fusion_policy is FusionPolicy.DIRECT
    assert Graph.hir("m", policy).fusion_policy is policy
    module = Graph.define("m", lambda m: m.input("x", (4,)), policy)
    assert module.fusion_policy is policy
