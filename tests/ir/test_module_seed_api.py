"""GraphModule and Calibrator: the rest of the seed's vocabulary (issue 19).

GraphModule: ``from_mir``, ``block``, ``set_hir_outputs``, ``finish_hir``, ``into_hir``,
``into_lir``, ``as_mir``, the MIR graph's builders reachable from the module (the seed's
``Deref<Target = Graph>``: ``mm.matmul(...)``), and ``attention`` in the seed's positional
form. Calibrator: ``arena()`` / ``arena_mut()`` / ``graph()`` and ``step()`` over inputs
written into the arena, as the seed's calibrator test does. Values are checked against
NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlx.errors import QuantizationError, ShapeError, StageError
from rlx.ir.hir import HirModule
from rlx.ir.mir import Graph
from rlx.ir.module import GraphModule, GraphStage
from rlx.ops.linalg import MatMul
from rlx.ops.nn import MaskKind
from rlx.options import CompileOptions
from rlx.runtime.session import Session

RNG = np.random.default_rng(0)


def _f32(*dims: int) -> np.ndarray:
    return RNG.standard_normal(dims).astype(np.float32)


# ---- MIR builders through the module --------------------------------------------------


def test_mir_stage_builders_are_reachable_from_the_module():
    mm = GraphModule.mir("hello")
    x = mm.input("x", (1, 4))
    w = mm.param("w", (4, 2))
    y = mm.matmul(x, w)  # the seed's quickstart: g.matmul through the module
    z = mm.relu(mm.add(y, 1.0))
    mm.set_outputs([z])
    assert mm.stage is GraphStage.MIR and len(mm) == 6
    assert [n.id for n in mm.find(MatMul)] == [y]  # queries too
    assert mm.nodes is mm.as_graph().nodes and mm.outputs == [z]
    xv, wv = _f32(1, 4), _f32(4, 2)
    (got,) = mm.as_graph().evaluate({"x": xv}, {"w": wv})
    np.testing.assert_allclose(got, np.maximum(xv @ wv + 1.0, 0.0), rtol=1e-6)
    assert "matmul" in dir(mm) and "find" in dir(mm)  # discoverable


def test_graph_methods_are_stage_checked():
    hir = GraphModule.hir("h")
    hir.input("x", (4,))
    with pytest.raises(StageError, match=r"matmul\(\) needs MIR stage.*call lower\(\)"):
        hir.matmul(0, 0)
    with pytest.raises(StageError, match="needs MIR stage"):
        _ = hir.nodes
    assert "matmul" not in dir(hir)
    with pytest.raises(AttributeError, match="no attribute 'no_such_method'"):
        GraphModule.mir("m").no_such_method  # noqa: B018
    from rlx.backends.cpu.planner import plan_module

    g = GraphModule.define("layer", lambda m: m.rms_norm(m.input("x", (2, 8)), m.param("g", (8,))))
    lir = GraphModule.from_lir(plan_module(g.into_graph()))
    assert lir.find(MatMul) == [] and len(lir.nodes) == len(lir)  # queries work at LIR
    with pytest.raises(StageError, match=r"builder exp\(\) cannot add nodes at LIR stage"):
        lir.exp(0)
    assert "exp" not in dir(lir) and "find" in dir(lir)
    # the HIR block builders keep the seed's meaning: HIR stage only, even where Graph has
    # a builder of the same name
    with pytest.raises(StageError, match="needs HIR stage"):
        GraphModule.mir("m").rms_norm(0, 0)


# ---- the seed's HIR-side names --------------------------------------------------------


def test_from_mir_and_as_mir():
    g = Graph("g")
    g.set_outputs([g.exp(g.input("x", (3,)))])
    m = GraphModule.from_mir(g)
    assert m.stage is GraphStage.MIR and m.as_mir() is g and m.into_hir() is None
    assert m.into_lir() is None
    with pytest.raises(StageError, match="from_mir needs a MIR Graph, got HirModule"):
        GraphModule.from_mir(HirModule("h"))
    assert GraphModule.hir("h").as_mir() is None


def test_block_scopes_params_and_returns_the_build_result():
    def build(h: HirModule) -> int:
        x = h.input("x", (2, 4))

        def layer(h2: HirModule) -> int:
            return h2.linear(x, h2.param("w", (4, 4)))

        y = GraphModule.block(h, "layer0", layer)
        return GraphModule.block(h, "layer1", lambda h2: h2.linear(y, h2.param("w", (4, 4))))

    m = GraphModule.define("two", build)
    assert m.into_graph().param_names == ["layer0.w", "layer1.w"]
    xv, w0, w1 = _f32(2, 4), _f32(4, 4), _f32(4, 4)
    (got,) = m.into_graph().evaluate({"x": xv}, {"layer0.w": w0, "layer1.w": w1})
    np.testing.assert_allclose(got, xv @ w0 @ w1, rtol=1e-5)
    # a HIR-stage GraphModule works as the seed's &mut HirModule
    gm = GraphModule.hir("gm")
    gm.input("x", (4,))
    gm.finish_hir(GraphModule.block(gm, "s", lambda h: h.param("p", (4,))))
    assert gm.into_graph().param_names == ["s.p"]
    with pytest.raises(StageError, match="block\\(\\) needs HIR stage"):
        GraphModule.block(GraphModule.mir("m"), "s", lambda h: 0)
    with pytest.raises(StageError, match="got Graph"):
        GraphModule.block(Graph("g"), "s", lambda h: 0)


def test_set_hir_outputs_finish_hir_into_hir():
    m = GraphModule.hir("m")
    x = m.input("x", (3,))
    y = m.rms_norm(x, m.param("g", (3,)))
    m.set_hir_outputs([x, y])
    assert m.as_hir().outputs == [x, y]
    assert m.finish_hir(y) is m and m.as_hir().outputs == [y]
    hir = m.into_hir()
    assert isinstance(hir, HirModule) and hir.outputs == [y]
    xv, gv = _f32(3), _f32(3)
    (got,) = m.into_graph().evaluate({"x": xv}, {"g": gv})
    np.testing.assert_allclose(got, xv / np.sqrt(np.mean(xv * xv) + 1e-6) * gv, rtol=1e-5)
    mir = m.lower()
    for call in (lambda: mir.set_hir_outputs([0]), lambda: mir.finish_hir(0)):
        with pytest.raises(StageError, match="needs HIR stage but the module is at MIR"):
            call()
    with pytest.raises(ShapeError, match="output id 9"):
        GraphModule.hir("e").finish_hir(9)


def test_into_lir():
    from rlx.backends.cpu.planner import plan_module

    lir_value = plan_module(GraphModule.define("l", lambda m: m.input("x", (2,))).into_graph())
    lir = GraphModule.from_lir(lir_value)
    assert lir.into_lir() is lir_value and lir.as_mir() is lir_value.graph
    assert lir.into_hir() is None


def test_attention_accepts_the_seeds_positional_form():
    b, s, heads, hd = 1, 4, 2, 4
    q_, k_, v_ = _f32(b, s, heads * hd), _f32(b, s, heads * hd), _f32(b, s, heads * hd)

    def build(m: HirModule | GraphModule) -> int:
        q, k, v = (m.input(n, (b, s, heads * hd)) for n in "qkv")
        return m.attention(q, k, v, None, heads, hd, MaskKind.causal(), (b, s, heads * hd))

    gm = GraphModule.hir("att")
    gm.finish_hir(build(gm))  # through the module, as the seed calls it
    (got,) = gm.into_graph().evaluate({"q": q_, "k": k_, "v": v_})
    # NumPy oracle: causal softmax attention per head
    qh, kh, vh = (a.reshape(b, s, heads, hd).transpose(0, 2, 1, 3) for a in (q_, k_, v_))
    sc = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(hd)
    sc = np.where(np.tril(np.ones((s, s), bool)), sc, -np.inf)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ vh
    np.testing.assert_allclose(
        got, want.transpose(0, 2, 1, 3).reshape(b, s, heads * hd), rtol=1e-5, atol=1e-6
    )
    kw = GraphModule.define(
        "kw",
        lambda m: m.attention(
            *(m.input(n, (b, s, heads * hd)) for n in "qkv"), num_heads=heads, head_dim=hd
        ),
    )
    assert len(kw) == 4  # the keyword form still works
    with pytest.raises(ShapeError, match="num_heads and head_dim are required"):
        GraphModule.define("e", lambda m: m.attention(*(m.input(n, (1, 2, 4)) for n in "qkv")))


# ---- Calibrator: the seed's arena access ---------------------------------------------


def _relu_graph() -> tuple[Graph, int, int]:
    g = Graph("calib_demo")
    x = g.input("x", (4,))
    y = g.relu(x)
    g.set_outputs([x, y])  # tap on x and y, as the seed's test
    return g, x, y


def test_calibrator_steps_over_inputs_written_into_the_arena():
    """The seed's calibrator test: write each batch into the arena, step(), then max-abs
    and scales (an independent NumPy fold over the same batches is the oracle)."""
    from rlx.quant.calibrate import Calibrator

    g, x, y = _relu_graph()
    cal = Calibrator(Session("cpu").compile(g, CompileOptions(use_cache=False)), [x, y])
    assert cal.graph() is cal.compiled.program.source and cal.graph().outputs == [x, y]
    batches = [[-3.0, 1.0, -2.0, 0.5], [-7.0, 0.0, -7.0, -2.0], [10.0, 0.0, 0.0, 5.0]]
    for b in batches:
        arena = cal.arena_mut()
        off = arena.byte_offset(x)
        arena.buffer[off : off + 16] = np.array(b, np.float32).view(np.uint8)
        cal.step()
    xs = np.array(batches, np.float32)
    want = np.array([np.abs(xs).max(), np.maximum(xs, 0).max()], np.float32)
    np.testing.assert_array_equal(cal.max_abs(), want)
    np.testing.assert_allclose(cal.scales(), want / 127.0, rtol=1e-6)
    assert cal.batches == 3
    # read-only view: the values of the last step
    ro = cal.arena()
    np.testing.assert_array_equal(ro.view(y), np.maximum(xs[-1], 0))
    with pytest.raises(ValueError, match="read-only"):
        ro.view(x)[0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        ro.buffer[0] = 1
    # write() is the typed form of the same thing; step(inputs) still works and mixes in
    cal.arena_mut().write("x", np.array([0.0, -20.0, 0.0, 0.0], np.float32))
    cal.step()
    cal.step({"x": np.array([30.0, 0.0, 0.0, 0.0], np.float32)})
    np.testing.assert_array_equal(cal.max_abs(), np.array([30.0, 30.0], np.float32))


def test_calibrator_arena_rejects_unknown_nodes_and_bad_writes():
    from rlx.quant.calibrate import Calibrator

    g, x, y = _relu_graph()
    hidden = g.exp(x)  # neither a tap, an output nor an input of the compiled graph
    cal = Calibrator(Session("cpu").compile(g, CompileOptions(use_cache=False)), [x, y])
    with pytest.raises(QuantizationError, match=f"node %{hidden} .* not in the arena"):
        cal.arena().byte_offset(hidden)
    with pytest.raises(QuantizationError, match="no input named 'nope'.*'x'"):
        cal.arena().byte_offset("nope")
    with pytest.raises(QuantizationError, match=r"shape \(4,\).*given \(3,\)"):
        cal.arena_mut().write(x, np.zeros(3, np.float32))
    with pytest.raises(QuantizationError, match="read-only"):
        cal.arena().write(x, np.zeros(4, np.float32))
    assert cal.batches == 0
