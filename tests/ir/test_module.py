"""GraphModule: stage tracking over HIR / MIR / LIR, transitions and stage errors."""

from __future__ import annotations

import numpy as np
import pytest

from rlx.dtype import DType
from rlx.errors import LowerError, StageError
from rlx.ir.hir import FusionPolicy, HirModule
from rlx.ir.mir import Graph
from rlx.ir.module import GraphModule, GraphStage
from rlx.ops.elementwise import Unary, UnaryKind
from rlx.ops.fused import FusedMatMulBiasAct
from rlx.ops.linalg import MatMul
from rlx.ops.nn import MaskKind
from rlx.ops.quant import DequantMatMul, GgufQ4K
from rlx.passes.pipeline import CompilePipeline


def _layer(m):
    x = m.input("x", (2, 8))
    w = m.param("w", (8, 8))
    return m.linear(x, w, None, None, (2, 8))


# ---- the seed's four tests ---------------------------------------------------------


def test_define_lowers_to_mir_graph():
    module = GraphModule.define("m", _layer)
    assert module.stage is GraphStage.HIR
    module = module.lower()
    assert module.stage is GraphStage.MIR
    assert len(module) >= 3


def test_mir_module_builds_graph():
    module = GraphModule.mir("raw")
    x = module.input("x", (4,))
    module.set_outputs([x])
    assert len(module) == 1
    assert module.as_graph().input_names == ["x"]


def test_hir_module_block_builders_via_graph_module():
    module = GraphModule.hir("layer")
    x = module.input("x", (2, 256))
    w = module.param("w", (128, 144), DType.U8)  # GGUF Q4_K: 144 bytes per 256 weights
    y = module.dequant_matmul(x, w, None, None, GgufQ4K(), (2, 128))
    module.set_outputs([y])
    assert module.stage is GraphStage.HIR
    module = module.lower()
    assert module.stage is GraphStage.MIR
    assert len(module) >= 3
    assert module.as_graph().find(DequantMatMul)


def test_graph_hir_entry_matches_define():
    via_hir = GraphModule.hir("m")

    def build(m):
        x = m.input("x", (4,))
        return m.rms_norm(x, x, x, 1e-5, (4,))

    via_define = GraphModule.define("m", build)
    assert via_hir.stage is GraphStage.HIR
    assert via_define.stage is GraphStage.HIR


# ---- transitions ---------------------------------------------------------------------


def test_stage_transitions_and_accessors():
    module = GraphModule.define("layer", _layer)
    assert module.name == "layer" and module.fusion_policy is FusionPolicy.DIRECT
    assert isinstance(module.as_hir(), HirModule) and module.as_graph() is None
    mir = module.lower()
    assert mir is not module and module.stage is GraphStage.HIR  # lower() makes a new module
    assert mir.as_hir() is None and isinstance(mir.as_graph(), Graph)
    assert mir.lower() is mir and mir.fusion_policy is None
    assert mir.into_graph() is mir.as_graph() and mir.into_mir() is mir.as_graph()
    g = module.into_graph()  # lowering straight from HIR
    assert g == mir.as_graph()
    assert repr(module) == "<GraphModule 'layer' stage=HIR nodes=3>"
    assert repr(mir).startswith("<GraphModule 'layer' stage=MIR")


def test_lir_stage_from_planner():
    from rlx.backends.cpu.planner import plan_module

    graph = GraphModule.define("layer", _layer).into_graph()
    lir = GraphModule.from_lir(plan_module(graph))
    assert lir.stage is GraphStage.LIR and lir.name == "layer" and len(lir) == len(graph)
    assert lir.as_graph() is graph and lir.into_graph() is graph and lir.lower() is lir
    assert lir.as_lir() is not None and lir.as_hir() is None
    text = lir.inspect()
    assert "graph layer(" in text and "fused_matmul_bias_act" in text
    with pytest.raises(StageError, match="LIR stage"):
        lir.input("y", (2,))
    with pytest.raises(StageError, match="set_outputs at LIR stage"):
        lir.set_outputs([0])


def test_from_graph_and_from_hir():
    g = Graph("g")
    x = g.input("x", (3,))
    g.set_outputs(g.exp(x))
    m = GraphModule.from_graph(g)
    assert m.stage is GraphStage.MIR and m.as_graph() is g
    np.testing.assert_allclose(m.into_graph().evaluate({"x": np.zeros(3, np.float32)})[0], 1.0)
    h = HirModule("h")
    assert GraphModule.from_hir(h).as_hir() is h
    with pytest.raises(StageError, match="from_graph needs a Graph"):
        GraphModule.from_graph(h)
    with pytest.raises(StageError, match="from_hir needs a HirModule"):
        GraphModule.from_hir(g)
    with pytest.raises(StageError, match="from_lir needs an LirModule"):
        GraphModule.from_lir(g)


def test_fusion_policy_decides_the_lowering():
    direct = GraphModule.define("l", _layer).lower().as_graph()
    fusable = GraphModule.define("l", _layer, policy=FusionPolicy.FUSABLE).lower().as_graph()
    assert direct.find(FusedMatMulBiasAct) and not direct.find(MatMul)
    assert fusable.find(MatMul) and not fusable.find(FusedMatMulBiasAct)
    switched = GraphModule.define("l", _layer).with_fusion_policy(FusionPolicy.FUSABLE)
    assert switched.fusion_policy is FusionPolicy.FUSABLE
    assert switched.lower().as_graph() == fusable
    assert GraphModule.define("l", _layer).lower(FusionPolicy.FUSABLE).as_graph() == fusable


def test_hir_mir_escape_hatch():
    module = GraphModule.hir("hatch")
    x = module.input("x", (3,))
    module.set_outputs(module.hir_mir(Unary(UnaryKind.EXP), [x]))
    out = module.into_graph().evaluate({"x": np.zeros(3, np.float32)})[0]
    np.testing.assert_allclose(out, 1.0)


def test_define_with_several_outputs_and_named_blocks():
    def build(m):
        x = m.input("x", (2, 8))
        return m.named(
            "ffn", lambda h: h.shared_linear_pair(x, h.param("a", (8, 4)), h.param("b", (8, 4)))
        )

    module = GraphModule.define("pair", build)
    g = module.into_graph()
    assert len(g.outputs) == 2 and sorted(g.param_names) == ["ffn.a", "ffn.b"]


def test_inspect_per_stage():
    module = GraphModule.define("layer", _layer)
    assert module.inspect().startswith("hir layer(x: f32[2,8]) policy=direct {")
    assert str(module) == module.inspect()
    mir = module.lower()
    assert mir.inspect() == mir.as_graph().inspect()


# ---- stage errors --------------------------------------------------------------------


def test_hir_builders_at_mir_stage_raise_stage_error():
    mir = GraphModule.define("layer", _layer).lower()
    with pytest.raises(StageError, match=r"linear\(\) needs HIR stage but the module is at MIR"):
        mir.linear(0, 1)
    with pytest.raises(StageError, match="attention"):
        mir.attention(0, 0, 0, num_heads=1, head_dim=8, mask_kind=MaskKind.causal())
    with pytest.raises(StageError, match="hir_mir"):
        mir.hir_mir(Unary(UnaryKind.EXP), [0])
    with pytest.raises(StageError, match="with_fusion_policy needs HIR stage"):
        mir.with_fusion_policy(FusionPolicy.FUSABLE)
    with pytest.raises(AttributeError, match="no attribute 'frobnicate'"):
        mir.frobnicate  # noqa: B018
    # input / param work at MIR stage: they add MIR nodes
    p = mir.param("extra", (2,))
    assert mir.as_graph().param_names[-1] == "extra" and p == len(mir) - 1


def test_define_errors():
    with pytest.raises(StageError, match="returned None"):
        GraphModule.define("m", lambda m: None)
    with pytest.raises(StageError, match="holds a HirModule"):
        GraphModule("not a module")


def test_lower_raises_lower_error(monkeypatch: pytest.MonkeyPatch):
    from rlx.errors import ShapeError
    from rlx.ir import hir_lower
    from rlx.ir.hir_blocks import AttentionBlock

    def build(m):
        q = m.input("q", (1, "seq", 8))
        return m.attention(q, q, q, num_heads=2, head_dim=4, mask_kind=MaskKind.causal())

    def refuse(ctx, node, ins):
        raise ShapeError("attention: not today")

    module = GraphModule.define("sym", build, policy=FusionPolicy.FUSABLE)
    monkeypatch.setitem(hir_lower._LOWERINGS, AttentionBlock, refuse)
    with pytest.raises(LowerError, match="attention block %1 under FUSABLE: attention: not today"):
        module.lower()
    with pytest.raises(LowerError):
        module.into_graph()


def test_pipeline_accepts_a_hir_module():
    result = CompilePipeline(passes=[]).run(GraphModule.define("layer", _layer))
    assert result.graph.find(FusedMatMulBiasAct)
