"""The executor's prologue: param-derived nodes (rlx/backends/cpu/planner.py
``param_derived_nodes``) sit in the persistent region and run once per param change
(rlx/backends/cpu/executor.py), checked against the reference interpreter with params
changed between runs, under symbolic re-plans, with AMP bf16 against frozen params, and
by counting kernel calls (never by timing)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.executor import Executor
from rlx.backends.cpu.plancheck import check_plan
from rlx.backends.cpu.planner import param_derived_nodes, plan_memory
from rlx.ir.mir import Graph
from rlx.options import CompileOptions
from rlx.passes.precision import PrecisionPolicy
from rlx.runtime.compiled import CompiledGraph
from rlx.runtime.session import Session
from tests.cpu.call_counts import count_calls

OPTS = CompileOptions(use_cache=False, verbose=False)
needs_gcc = pytest.mark.skipif(not native.available(), reason="needs gcc")


def _overlaps(plan, a: int, b: int) -> bool:
    sa, sb = plan.slots[a], plan.slots[b]
    return sa.offset < sb.offset + sb.nbytes and sb.offset < sa.offset + sa.nbytes


def weight_graph() -> tuple[Graph, dict[str, int]]:
    """x @ (exp(w) * 2)^T + b, with the param-only w-chain also an output."""
    g = rlx.Graph("hoist")
    x = g.input("x", (4, 8))
    w = g.param("w", (3, 8))
    b = g.param("b", (3,))
    wt = g.transpose(g.mul(g.exp(w), 2.0))
    y = g.add(g.matmul(x, wt), b)
    g.set_outputs([y, wt])
    return g, {"x": x, "w": w, "b": b, "wt": wt, "y": y}


def test_param_derived_nodes_follow_every_input() -> None:
    g, ids = weight_graph()
    derived = param_derived_nodes(g)
    assert ids["wt"] in derived
    assert ids["y"] not in derived and ids["x"] not in derived
    assert ids["w"] not in derived  # params are persistent already, not prologue kernels
    for nid in derived:
        assert all(i in derived or g.nodes[i].op.mnemonic in ("param", "constant")
                   for i in g.nodes[nid].inputs)  # fmt: skip


def test_planner_keeps_prologue_nodes_out_of_the_working_region() -> None:
    g, ids = weight_graph()
    hoisted = param_derived_nodes(g)
    plan = plan_memory(g, persistent=hoisted)
    check_plan(g, plan)
    assert set(hoisted) <= set(plan.keep_alive)
    for nid in hoisted:
        s = plan.slots[nid]
        assert s.offset + s.nbytes <= plan.persistent_bytes and s.inplace_of is None
        for n in g.nodes:
            if n.id != nid and plan.slots[n.id].view_of != nid and plan.slots[nid].view_of != n.id:
                assert not _overlaps(plan, nid, n.id), (nid, n.id)
    # without the request nothing moves: no prologue
    ex = Executor(g, plan_memory(g), {}, {})
    assert ex.hoisted == frozenset() and ex.prologue == []


def test_set_param_between_runs_reaches_prologue_and_outputs() -> None:
    g, ids = weight_graph()
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((4, 8)).astype(np.float32)
    cg = Session("cpu").compile(g, OPTS.replace(fuse=False))
    ex = cg._executor_any()
    assert ids["wt"] in {cg.graph.nodes[e.node].id for e in ex.entries if e.prologue} or ex.prologue
    for step in range(3):
        ps = {
            "w": rng.standard_normal((3, 8)).astype(np.float32),
            "b": rng.standard_normal(3).astype(np.float32),
        }
        if step == 1:
            cg.set_param("w", ps["w"])  # one param changes, the other keeps its value
            ps["b"] = cg._params["b"]
        else:
            cg.set_params(ps)
        want = g.evaluate({"x": xv}, ps)
        for _ in range(2):
            got = cg.run({"x": xv})
            for a, b in zip(got, want, strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_prologue_runs_once_per_param_change() -> None:
    g, _ = weight_graph()
    rng = np.random.default_rng(1)
    ps = {"w": rng.standard_normal((3, 8)).astype(np.float32), "b": np.ones(3, np.float32)}
    cg = Session("cpu").compile(g, OPTS.replace(fuse=False), params=ps)
    ex = cg._executor_any()
    counts = count_calls(ex)
    assert len(ex.prologue) >= 2  # exp, mul (the transpose may be a kernel too)
    xv = np.ones((4, 8), np.float32)
    for _ in range(5):
        cg.run({"x": xv})
    assert counts == [1] * len(counts) and ex.prologue_runs == 1
    cg.set_param("b", np.zeros(3, np.float32))
    for _ in range(4):
        cg.run({"x": xv})
    assert counts == [2] * len(counts) and ex.prologue_runs == 2
    # report: every kernel listed, the prologue ones marked; a profile times them all
    cg.run({"x": xv}, profile=True)
    rep = cg.report()
    marked = {k.node for k in rep.kernels if k.prologue}
    assert marked == {e.node for e in ex.entries if e.prologue} and marked
    assert all(k.seconds is not None for k in rep.kernels if k.view_of is None)
    assert "(prologue)" in str(rep)
    assert len([k for k in rep.kernels if k.view_of is None]) == len(ex.prologue) + len(ex.schedule)


def test_symbolic_replans_each_get_a_prologue() -> None:
    g = rlx.Graph("sym")
    n = g.sym("n", max=32)
    x = g.input("x", (n, 6))
    w = g.param("w", (6, 5))
    y = g.matmul(g.tanh(x), g.mul(g.neg(w), w))
    g.set_outputs([y])
    rng = np.random.default_rng(2)
    cg = Session("cpu").compile(g, OPTS)
    for _ in range(2):
        wv = rng.standard_normal((6, 5)).astype(np.float32)
        cg.set_param("w", wv)
        for rows in (3, 7, 3, 11):
            xv = rng.standard_normal((rows, 6)).astype(np.float32)
            (got,) = cg.run({"x": xv})
            np.testing.assert_allclose(got, g.evaluate({"x": xv}, {"w": wv})[0], rtol=1e-5)
    ran = [ex for ex in cg._executors.values() if ex.bindings["n"] in (3, 7, 11)]
    assert len(ran) == 3
    for ex in ran:
        assert ex.prologue and ex.prologue_runs == 2 and not ex.stale


def test_constant_only_subexpression_runs_once_without_params() -> None:
    g = rlx.Graph("consts")
    x = g.input("x", (2, 3))
    c = g.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    g.set_outputs([g.add(x, g.exp(c))])
    cg = Session("cpu").compile(g, OPTS.replace(optimize=False, fuse=False))
    ex = cg._executor_any()
    counts = count_calls(ex)
    xv = np.ones((2, 3), np.float32)
    for _ in range(3):
        np.testing.assert_allclose(cg.run({"x": xv})[0], g.evaluate({"x": xv}, {})[0], rtol=1e-6)
    assert counts == [1] and ex.prologue_runs == 1


_UNARY = ("neg", "tanh", "abs", "exp")
_BINARY = ("add", "mul", "sub", "maximum")


@st.composite
def graphs(draw: st.DrawFn) -> tuple[Graph, list[str]]:
    """Random [3, 4] DAGs over one input and up to three params, with param-only
    subexpressions (a param-only node is always among the outputs)."""
    g = rlx.Graph("rand")
    nparams = draw(st.integers(1, 3))
    pool = [(g.input("x", (3, 4)), False)]
    names = []
    for i in range(nparams):
        names.append(f"p{i}")
        pool.append((g.param(f"p{i}", (3, 4)), True))
    for _ in range(draw(st.integers(2, 9))):
        kind = draw(st.sampled_from(("unary", "binary", "square")))
        a, pa = pool[draw(st.integers(0, len(pool) - 1))]
        if kind == "unary":
            fn = draw(st.sampled_from(_UNARY))
            src = g.tanh(a) if fn == "exp" else a  # keep exp's input bounded
            pool.append((getattr(g, fn)(src), pa))
        elif kind == "binary":
            b, pb = pool[draw(st.integers(0, len(pool) - 1))]
            pool.append((getattr(g, draw(st.sampled_from(_BINARY)))(a, b), pa and pb))
        else:  # a [3, 3] product brought back to [3, 4]
            b, pb = pool[draw(st.integers(0, len(pool) - 1))]
            sq = g.matmul(a, g.transpose(b))
            pool.append((g.matmul(sq, g.tanh(a)), pa and pb))
    outs = [pool[-1][0]]
    param_only = [nid for nid, p in pool[1 + nparams :] if p]
    if param_only:
        outs.append(param_only[draw(st.integers(0, len(param_only) - 1))])
    else:
        outs.append(g.mul(g.exp(g.tanh(pool[1][0])), 0.5))
    g.set_outputs(outs)
    return g, names


@settings(max_examples=40, deadline=None)
@given(graphs(), st.integers(0, 2**31 - 1), st.booleans())
def test_random_graphs_match_reference_as_params_change(
    built: tuple[Graph, list[str]], seed: int, fuse: bool
) -> None:
    g, names = built
    rng = np.random.default_rng(seed)
    cg = Session("cpu").compile(g, OPTS.replace(fuse=fuse))
    check_plan(cg.graph, cg.memory_plan)
    xv = rng.standard_normal((3, 4)).astype(np.float32)
    for _ in range(3):
        ps = {k: rng.standard_normal((3, 4)).astype(np.float32) for k in names}
        cg.set_params(ps)
        want = g.evaluate({"x": xv}, ps)
        for _ in range(2):
            for got, w in zip(cg.run({"x": xv}), want, strict=True):
                np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)


def _mlp() -> Graph:
    g = Graph("mlp")
    x = g.input("x", (8, 64))
    h = g.gelu(g.add(g.matmul(x, g.param("w0", (64, 96))), g.param("b0", (96,))))
    g.set_outputs([g.matmul(h, g.param("w1", (96, 40)))])
    return g


def _mlp_params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w0": rng.standard_normal((64, 96)).astype(np.float32) / 8,
        "b0": rng.standard_normal(96).astype(np.float32),
        "w1": rng.standard_normal((96, 40)).astype(np.float32) / 10,
    }


@needs_gcc
@pytest.mark.parametrize("fuse", [False, True])
def test_amp_bf16_runtime_params_equal_frozen(fuse: bool) -> None:
    g = _mlp()
    xv = np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32)
    opts = OPTS.replace(precision=PrecisionPolicy.AutoMixedBf16, fuse=fuse)
    live: CompiledGraph = Session("cpu").compile(g, opts, params=_mlp_params(0))
    ex = live._executor_any()
    assert any(e.op == "cast" and e.prologue for e in ex.entries)
    notes = " ".join(n for e in ex.entries for n in e.notes)
    assert "every run" not in notes
    counts = count_calls(ex)
    for seed in (0, 1):
        ps = _mlp_params(seed)
        if seed:
            live.set_params(ps)
        frozen = Session("cpu").compile(g, opts.replace(freeze_params=True), params=ps)
        want = frozen.run({"x": xv})[0]
        for _ in range(3):
            np.testing.assert_array_equal(live.run({"x": xv})[0], want)
        ref = g.evaluate({"x": xv}, ps)[0]
        assert np.max(np.abs(want - ref)) / np.max(np.abs(ref)) < 3e-2
    assert counts == [2] * len(counts)


def test_failing_prologue_stays_stale_and_names_the_node() -> None:
    g, _ = weight_graph()
    cg = Session("cpu").compile(
        g,
        OPTS.replace(fuse=False),
        params={"w": np.ones((3, 8), np.float32), "b": np.ones(3, np.float32)},
    )
    ex = cg._executor_any()
    good = list(ex.prologue)

    def boom() -> None:
        raise ValueError("boom")

    ex.prologue[0] = boom
    xv = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="boom") as info:
        cg.run({"x": xv})
    assert ex.stale
    assert any(f"%{ex.prologue_entries[0].node}" in n for n in info.value.__notes__)
    ex.prologue[:] = good
    got = cg.run({"x": xv})
    want = g.evaluate({"x": xv}, {"w": np.ones((3, 8), np.float32), "b": np.ones(3, np.float32)})
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)
