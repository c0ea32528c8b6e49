"""The pass manager: default pass order, records, verification after each pass, errors
naming the pass, disabled passes, verbose output, frozen params, and the whole pipeline
on vs off (reference interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from rlx.errors import CompileError, ShapeError
from rlx.ir.mir import Graph
from rlx.ops.core import Constant, Param
from rlx.ops.elementwise import Unary, UnaryKind
from rlx.ops.fused import FusedMatMulBiasAct
from rlx.options import CompileOptions, VerifyMode
from rlx.passes.pipeline import PASS_NAMES, CompilePipeline, default_passes
from rlx.passes.precision import PrecisionPolicy
from rlx.passes.report import FusionPattern
from rlx.shape import Shape

from .graphs import (
    block_inputs,
    mlp,
    random_graph_values,
    random_graphs,
    random_inputs,
    random_params,
    transformer_block,
)
from .test_cleanup import same_numbers

EACH = CompileOptions(verify=VerifyMode.EACH_PASS, verbose=False)


def names(opts: CompileOptions) -> list[str]:
    return [p.name for p in default_passes(opts)]


def test_default_pass_order():
    cleanup = ["dce", "cse", "constant_folding", "simplify"]
    fusion = [
        "fuse_gelu",
        "fuse_layer_norm",
        "fuse_cross_entropy",
        "fuse_attention",
        "fuse_swiglu",
        "fuse_residual_norm",
        "fuse_quant_epilogue",
        "fuse_conv_act",
        "fuse_matmul_bias_act",
        "fuse_elementwise",
    ]
    assert names(EACH) == [*cleanup, "broadcast_legalization", *fusion, "nchwc_layout", "dce"]
    unblocked = [*cleanup, "broadcast_legalization", *fusion, "dce"]  # no native kernels
    assert names(EACH.replace(native=False)) == unblocked
    bf16 = EACH.replace(precision=PrecisionPolicy.AutoMixedBf16)
    assert names(bf16) == [
        *cleanup,
        "broadcast_legalization",
        *fusion,
        "auto_mixed_precision",
        "cast_elimination",
        "nchwc_layout",
        "dce",
    ]
    assert names(EACH.replace(optimize=False, fuse=False)) == ["broadcast_legalization", "dce"]
    assert names(EACH.replace(precision=PrecisionPolicy.AlwaysF32)) == names(EACH)
    blocks = names(bf16.replace(fuse_blocks=True))  # the opt-in block fusions
    i = fusion.index("fuse_matmul_bias_act") + 1
    with_blocks = [*fusion[:i], "fuse_attention_block", "fuse_transformer_layer", *fusion[i:]]
    assert blocks == [*cleanup, "broadcast_legalization", *with_blocks, *names(bf16)[-4:]]
    assert set(blocks) == set(PASS_NAMES)


def test_records_chain_and_report():
    g = transformer_block()
    res = CompilePipeline(EACH).run(g)
    assert [r.name for r in res.records] == names(EACH)
    for a, b in zip(res.records, res.records[1:]):
        assert a.nodes_after == b.nodes_before and a.seconds >= 0
    assert res.records[0].nodes_before == len(g) and res.records[-1].nodes_after == len(res.graph)
    assert res.fusion_report.count(FusionPattern.ATTENTION) == 1
    text = res.report()
    assert "fuse_attention" in text and "fusion report:" in text and "fused   attention" in text
    same_numbers(g, res.graph, block_inputs(g), random_params(g))
    again = CompilePipeline(EACH).run(g)
    assert again.fusion_report.count(FusionPattern.ATTENTION) == 1  # report reset per run


class _Breaks:
    name = "breaks"

    def __init__(self) -> None:
        self.notes: list[str] = []

    def run(self, graph: Graph) -> Graph:
        out = graph.copy()
        out.add_node(Unary(UnaryKind.EXP), [0], Shape((9, 9)))  # wrong recorded shape
        out.outputs = [len(out) - 1]
        return out


class _Raises:
    name = "raises"
    notes: list[str] = []

    def run(self, graph: Graph) -> Graph:
        raise ShapeError("%3 reshape: cannot view [2,3] as [5]")


class _Bug:
    name = "bug"
    notes: list[str] = []

    def run(self, graph: Graph) -> Graph:
        raise KeyError(7)


def test_failing_passes_are_named_and_leave_the_graph_alone():
    g = mlp()
    before = g.fingerprint()
    with pytest.raises(
        CompileError, match="pass 'breaks' produced an invalid graph: .*shape rule gives"
    ):
        CompilePipeline(EACH, passes=[_Breaks()]).run(g)
    with pytest.raises(
        CompileError, match=r"pass 'raises' failed: %3 reshape: cannot view \[2,3\] as \[5\]"
    ):
        CompilePipeline(EACH, passes=[_Raises()]).run(g)
    with pytest.raises(KeyError) as ei:
        CompilePipeline(EACH, passes=[_Bug()]).run(g)
    assert "raised inside rlx compile pass 'bug'" in ei.value.__notes__[0]
    # END verification catches it too, after the last pass
    with pytest.raises(CompileError, match="the compiled graph is invalid"):
        CompilePipeline(EACH.replace(verify=VerifyMode.END), passes=[_Breaks()]).run(g)
    assert g.fingerprint() == before


class _Later:
    name = "later"
    notes: list[str] = []

    def run(self, graph: Graph) -> Graph:
        return graph


def test_the_suite_verifies_after_every_pass(runner_rlx_verify):
    """tests/conftest.py sets RLX_VERIFY=each (unless the run set it): a default pipeline
    in a test fails at the pass that breaks an invariant, not after the last pass."""
    if runner_rlx_verify is not None and runner_rlx_verify.strip().lower() != "each":
        pytest.skip(f"this run set RLX_VERIFY={runner_rlx_verify!r}")
    assert CompileOptions().verify is VerifyMode.EACH_PASS
    with pytest.raises(CompileError, match="pass 'breaks' produced an invalid graph"):
        CompilePipeline(CompileOptions(verbose=False), passes=[_Breaks(), _Later()]).run(mlp())


def test_disabled_passes_and_bad_options():
    opts = EACH.replace(disabled_passes=("fuse_matmul_bias_act",))
    res = CompilePipeline(opts).run(mlp())
    assert "fuse_matmul_bias_act" not in [r.name for r in res.records]
    assert not [n for n in res.graph.nodes if isinstance(n.op, FusedMatMulBiasAct)]
    with pytest.raises(
        CompileError, match=r"disabled_passes names unknown passes \['fuse_everything'\]"
    ):
        CompilePipeline(EACH.replace(disabled_passes=("fuse_everything",)))
    with pytest.raises(CompileError, match="options must be a CompileOptions"):
        CompilePipeline({"fuse": True})
    with pytest.raises(CompileError, match="options.precision must be a PrecisionPolicy"):
        CompilePipeline(EACH.replace(precision="bf16"))
    with pytest.raises(CompileError, match="cannot compile a str"):
        CompilePipeline(EACH).run("graph")


def test_verbose_prints_records_and_fusion_report(capsys):
    CompilePipeline(EACH.replace(verbose=True)).run(mlp())
    err = capsys.readouterr().err
    assert "passes:" in err and "fuse_matmul_bias_act" in err
    assert "fusions: matmul_bias_act=3" in err


def test_freeze_params_folds_weights():
    g = Graph("frozen")
    x = g.input("x", (2, 4))
    w = g.param("w", (4, 4))
    scale = g.param("scale", (4,))
    g.set_outputs([g.matmul(x, g.mul(w, scale))])  # w * scale is param-only
    ps = random_params(g)
    res = CompilePipeline(EACH.replace(freeze_params=True), params=ps).run(g)
    assert not [n for n in res.graph.nodes if isinstance(n.op, Param)]
    assert len([n for n in res.graph.nodes if isinstance(n.op, Constant)]) == 1
    rec = {r.name: r for r in res.records}
    assert rec["constant_folding"].notes[:2] == ["froze 2 params as constants", "folded 1 nodes"]
    ins = random_inputs(g)
    np.testing.assert_allclose(res.graph.evaluate(ins)[0], g.evaluate(ins, ps)[0], rtol=1e-6)
    # not frozen without the flag
    res = CompilePipeline(EACH, params=ps).run(g)
    assert len([n for n in res.graph.nodes if isinstance(n.op, Param)]) == 2


@pytest.mark.parametrize("precision", [None, PrecisionPolicy.AutoMixedBf16])
def test_full_pipeline_on_models(precision):
    opts = EACH.replace(precision=precision)
    tol = 1e-5 if precision is None else 3e-2
    for g, ins in ((mlp(), None), (transformer_block(), None)):
        ins = block_inputs(g) if g.name == "block" else random_inputs(g)
        ps = random_params(g)
        res = CompilePipeline(opts).run(g)
        (want,), (got,) = g.evaluate(ins, ps), res.graph.evaluate(ins, ps)
        assert np.max(np.abs(got - want)) <= tol * max(1.0, float(np.max(np.abs(want))))


@given(random_graphs())
def test_full_pipeline_random_graphs(g):
    ins, ps = random_graph_values(g)
    res = CompilePipeline(EACH).run(g)
    same_numbers(g, res.graph, ins, ps)
    assert len(res.graph) <= len(g)  # cleanup and fusion never grow these graphs


def test_symbolic_batch_and_seq():
    from rlx.models.synthetic import encoder
    from rlx.models.synthetic import random_inputs as sized_inputs
    from rlx.shape import sym

    g = encoder(layers=1, hidden=16, heads=2, ffn=32, seq=sym("seq"), batch=sym("batch"))
    res = CompilePipeline(EACH).run(g)
    assert (
        res.fusion_report.summary()
        == "fusions: attention=1, residual_norm=2, matmul_bias_act=6; near misses: 0"
    )
    ps = random_params(g)
    for b, s in ((1, 3), (3, 5)):
        ins = sized_inputs(g, {"seq": s, "batch": b})
        same_numbers(g, res.graph, ins, ps)


def test_graph_module_is_lowered_first():
    from rlx.ir.module import GraphModule

    g = mlp()
    res = CompilePipeline(EACH).run(GraphModule.from_graph(g))
    assert res.fusion_report.count(FusionPattern.MATMUL_BIAS_ACT) == 3
    same_numbers(g, res.graph, random_inputs(g), random_params(g))


@pytest.mark.parametrize("precision", [None, PrecisionPolicy.AutoMixed])
def test_synthetic_encoder_and_decoder(precision):
    from rlx.models.synthetic import decoder, encoder

    tol = 1e-5 if precision is None else 5e-3
    for g in (
        encoder(layers=2, hidden=16, heads=2, ffn=32, seq=5, batch=2),
        decoder(layers=2, hidden=16, heads=4, ffn=32, seq=5, batch=1, kv_heads=2),
    ):
        res = CompilePipeline(EACH.replace(precision=precision)).run(g)
        assert res.fusion_report.count(FusionPattern.ATTENTION) == 2
        ins, ps = random_inputs(g), random_params(g)
        (want,), (got,) = g.evaluate(ins, ps), res.graph.evaluate(ins, ps)
        assert np.max(np.abs(got - want)) <= tol * float(np.max(np.abs(want)))


def test_rlx_verbose_env(monkeypatch, capsys):
    monkeypatch.setenv("RLX_VERBOSE", "1")
    CompilePipeline(CompileOptions(verify=VerifyMode.EACH_PASS)).run(mlp())
    assert "fusion report:" in capsys.readouterr().err
    monkeypatch.setenv("RLX_VERBOSE", "0")
    CompilePipeline(CompileOptions(verify=VerifyMode.EACH_PASS)).run(mlp())
    assert capsys.readouterr().err == ""
