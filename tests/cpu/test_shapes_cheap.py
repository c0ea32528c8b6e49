"""Many shapes of one CompiledGraph (rlx/backends/cpu/memory.py, executor.py, planner.py
``PlanTemplate``): every binding's result against the reference interpreter, more
distinct shapes than the plan cache holds, one arena and one copy of the params shared
by the schedules of every shape, params never written, the prologue computed once per
param change for all shapes. No timing: costs are checked by counting (params copied,
buffers allocated, kernels run)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx
from rlx.backends.cpu.kernels import KernelCtx, KernelKind, ScratchPool
from rlx.backends.cpu.memory import ParamStore, Workspace, safe_to_share
from rlx.backends.cpu.plancheck import check_plan
from rlx.backends.cpu.planner import PlanTemplate, plan_memory
from rlx.models import encoder, random_params
from rlx.options import CompileOptions
from rlx.runtime.session import Session
from tests.cpu.call_counts import count_calls

OPTS = CompileOptions(use_cache=False, verbose=False, num_threads=1)


def small_encoder() -> rlx.Graph:
    return encoder(layers=1, hidden=32, heads=4, ffn=64, batch=rlx.sym("batch"), seq=rlx.sym("seq"))


_ENC = small_encoder()
_PARAMS = random_params(_ENC, 3)


def _check(cg, g, params, b: int, s: int, seed: int) -> None:  # noqa: ANN001
    x = np.random.default_rng(seed).standard_normal((b, s, 32)).astype(np.float32)
    (got,) = cg.run({"x": x})
    (want,) = g.evaluate({"x": x}, params)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 40)), min_size=1, max_size=8))
def test_every_binding_matches_the_reference(shapes: list[tuple[int, int]]) -> None:
    cg = Session("cpu").compile(_ENC, OPTS.replace(max_shape_plans=3), params=_PARAMS)
    for k, (b, s) in enumerate(shapes):
        _check(cg, _ENC, _PARAMS, b, s, k)
    assert len(cg.shape_plans) <= 3


def test_more_shapes_than_the_cache_holds_stay_correct() -> None:
    cg = Session("cpu").compile(_ENC, OPTS.replace(max_shape_plans=2), params=_PARAMS)
    lengths = [3, 9, 17, 5, 33, 12]
    for rnd in range(3):
        for k, s in enumerate(lengths):
            _check(cg, _ENC, _PARAMS, 1 + (k + rnd) % 3, s, 10 * rnd + k)
    assert len(cg.shape_plans) == 2
    assert cg._store.nbytes <= sum(a.nbytes for a in _PARAMS.values())  # params copied once


def test_plans_of_one_compiled_graph_share_one_arena_and_the_params() -> None:
    cg = Session("cpu").compile(_ENC, OPTS, params=_PARAMS)
    big = {"batch": 4, "seq": 20}
    _check(cg, _ENC, _PARAMS, 4, 20, 0)  # the biggest first: the workspace grows once
    gen = cg._workspace.generation
    for k, (b, s) in enumerate([(1, 3), (2, 7), (4, 20), (1, 3), (3, 11), (2, 7)]):
        _check(cg, _ENC, _PARAMS, b, s, k + 1)
    assert cg._workspace.generation == gen  # no arena allocated for the smaller shapes
    exs = list(cg._executors.values())
    assert len(exs) >= 4
    assert len({ex.arena.ctypes.data for ex in exs}) == 1  # one arena buffer
    assert len({id(ex.store) for ex in exs}) == 1
    biggest = max(ex.plan.arena_bytes - ex.plan.persistent_bytes for ex in exs)
    assert cg._workspace.nbytes >= biggest
    assert cg._executor(big).plan.bindings == big
    name = "layer0.attn.q.weight"
    nid = next(n.id for n in cg.graph.param_nodes() if n.op.name == name)
    views = [ex.views[nid] for ex in exs]
    assert all(np.shares_memory(views[0], v) for v in views[1:])  # one copy of the weight


def test_a_growing_workspace_rebuilds_older_schedules() -> None:
    cg = Session("cpu").compile(_ENC, OPTS.replace(max_shape_plans=8), params=_PARAMS)
    for k, (b, s) in enumerate([(1, 2), (1, 5), (2, 30), (1, 2), (5, 40), (1, 5)]):
        _check(cg, _ENC, _PARAMS, b, s, k)
        assert all(ex.is_current() for ex in cg._executors.values())
    assert cg._workspace.generation >= 2


def test_params_are_never_written_and_read_only_to_kernels() -> None:
    params = {k: v.copy() for k, v in _PARAMS.items()}
    for v in params.values():
        v.flags.writeable = False  # owns its memory and is read-only: used in place
    before = {k: v.copy() for k, v in params.items()}
    cg = Session("cpu").compile(_ENC, OPTS, params=params)
    for k, (b, s) in enumerate([(2, 5), (1, 9), (3, 4)]):
        _check(cg, _ENC, params, b, s, k)
    for k, v in params.items():
        np.testing.assert_array_equal(v, before[k])
        assert np.shares_memory(cg._params[k], v)  # not copied
    for ex in cg._executors.values():
        for n in cg.graph.param_nodes():
            assert not ex.views[n.id].flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            ex.param_views["layer0.attn.q.weight"][0, 0] = 1.0


def test_a_writable_param_is_copied_once_and_later_changes_do_not_leak_in() -> None:
    params = {k: v.copy() for k, v in _PARAMS.items()}
    cg = Session("cpu").compile(_ENC, OPTS, params=params)
    for v in params.values():
        v[...] = 0  # the caller reuses its arrays: the compiled graph kept its own copy
    _check(cg, _ENC, _PARAMS, 2, 6, 0)
    _check(cg, _ENC, _PARAMS, 1, 3, 1)
    own = sum(a.nbytes for a in _PARAMS.values())
    assert cg._store.nbytes == own  # one copy, whatever the number of shapes


def test_memory_mapped_params_are_used_in_place(tmp_path: Path) -> None:
    mapped = {}
    for k, v in _PARAMS.items():
        f = tmp_path / f"{k}.npy"
        np.save(f, v)
        mapped[k] = np.load(f, mmap_mode="r")
        assert safe_to_share(np.asarray(mapped[k]))
    cg = Session("cpu").compile(_ENC, OPTS, params=mapped)
    _check(cg, _ENC, _PARAMS, 2, 5, 0)
    assert cg._store.nbytes == 0
    assert all(np.shares_memory(cg._params[k], mapped[k]) for k in mapped)


def test_safe_to_share_refuses_views_of_writable_memory() -> None:
    a = np.ones((4, 4), np.float32)
    ro = a.view()
    ro.flags.writeable = False
    assert not safe_to_share(ro)  # writable through `a`
    assert not safe_to_share(a)
    assert not safe_to_share(np.ones((4, 4), np.float32)[:, ::2])
    own = np.ones(3, np.float32)
    own.flags.writeable = False
    assert safe_to_share(own)
    assert safe_to_share(np.frombuffer(b"\0" * 16, np.float32))


def weight_graph() -> rlx.Graph:
    """tanh(x) @ (w * -w) with the param-only product in the prologue."""
    g = rlx.Graph("prologue_shapes")
    n = g.sym("n", max=64)
    x = g.input("x", (n, 6))
    w = g.param("w", (6, 5))
    g.set_outputs([g.matmul(g.tanh(x), g.mul(g.neg(w), w))])
    return g


def test_the_prologue_runs_once_per_param_change_for_all_shapes(monkeypatch) -> None:
    # the NumPy / BLAS schedule: with rlx's sgemm (native for a product this small since
    # issue 31) the weight's packing is a prepare step, a once-per-param-change wrapper
    # that every schedule calls and that packs only the first time (tests/cpu/engines/
    # test_sgemm.py), so the call counts below would count the wrapper
    monkeypatch.setenv("RLX_SGEMM", "blas")
    g = weight_graph()
    rng = np.random.default_rng(4)
    cg = Session("cpu").compile(g, OPTS.replace(fuse=False))
    w = rng.standard_normal((6, 5)).astype(np.float32)
    cg.set_param("w", w)
    first = cg._executor({"n": 3})
    counts_a = count_calls(first)
    assert first.prologue
    second = cg._executor({"n": 7})
    counts_b = count_calls(second)
    for rows in (3, 7, 3, 7):
        x = rng.standard_normal((rows, 6)).astype(np.float32)
        np.testing.assert_allclose(
            cg.run({"x": x})[0], g.evaluate({"x": x}, {"w": w})[0], rtol=1e-5
        )
    assert counts_a == [1] * len(counts_a)  # computed once ...
    assert counts_b == [0] * len(counts_b)  # ... and read by the other shape
    w = rng.standard_normal((6, 5)).astype(np.float32)
    cg.set_param("w", w)
    for rows in (7, 3):
        x = rng.standard_normal((rows, 6)).astype(np.float32)
        np.testing.assert_allclose(
            cg.run({"x": x})[0], g.evaluate({"x": x}, {"w": w})[0], rtol=1e-5
        )
    assert counts_b == [1] * len(counts_b) and counts_a == [1] * len(counts_a)


def test_kernel_ctx_keep_and_prologue_once_span_the_schedules_of_one_store() -> None:
    g = weight_graph()
    store = ParamStore(g)
    made: list[int] = []
    ran: list[int] = []
    node = g.nodes[g.outputs[0]]

    def ctx() -> KernelCtx:
        return KernelCtx(
            node, g, {}, store.params, {}, ScratchPool(), KernelKind.NUMPY, store=store
        )

    a, b = ctx(), ctx()
    obj = a.keep(("packed", 1), lambda: made.append(1) or np.zeros(3))
    assert b.keep(("packed", 1), lambda: made.append(2)) is obj and made == [1]
    a.prologue_once("pack", lambda: ran.append(1))
    b.prologue_once("pack", lambda: ran.append(2))
    for step in (*a.prologue, *b.prologue):
        step()
    assert ran == [1]
    store.set("w", np.ones((6, 5), np.float32))  # a param change: once more
    for step in (*b.prologue, *a.prologue):
        step()
    assert ran == [1, 2]
    alone = KernelCtx(node, g, {}, {}, {}, ScratchPool(), KernelKind.NUMPY)
    assert alone.keep("k", lambda: 5) == 5  # without a store: the ctx's own objects


def test_plan_template_plans_every_binding_soundly() -> None:
    graph = encoder(
        layers=2, hidden=32, heads=4, ffn=64, seq=rlx.sym("seq"), batch=rlx.sym("batch")
    )
    template = PlanTemplate(graph)
    for b, s in [(1, 1), (1, 3), (2, 5), (7, 2), (3, 64)]:
        binds = {"batch": b, "seq": s}
        plan = template.plan(binds)
        check_plan(graph, plan)
        assert plan == plan_memory(graph, binds)
        assert plan.naive_bytes >= plan.peak_bytes >= plan.lower_bound_bytes


def test_a_workspace_only_grows() -> None:
    ws = Workspace()
    ws.ensure(1000)
    gen, size = ws.generation, ws.nbytes
    ws.ensure(10)
    assert (ws.generation, ws.nbytes) == (gen, size)
    ws.ensure(size + 1)
    assert ws.generation == gen + 1 and ws.nbytes >= 1.25 * size
    assert ws.buffer.ctypes.data % 64 == 0


def test_a_constant_prepared_at_build_survives_other_shapes() -> None:
    """A bf16 dot_general whose constant operand is transposed once at build time (into a
    layout of its own, not scratch that other shapes' activations reuse)."""
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    g = rlx.Graph("const_b")
    n = g.sym("n", max=64)
    x = g.input("x", (2, n, 8), "bf16")
    c = np.random.default_rng(7).standard_normal((2, 6, 8)).astype(bf16)
    g.set_outputs([g.dot_general(x, g.constant(c), ((2,), (2,)), ((0,), (0,)))])
    cg = Session("cpu").compile(g, OPTS)
    rng = np.random.default_rng(8)
    for rows in (40, 3, 40, 3, 5, 40, 5):
        xv = rng.standard_normal((2, rows, 8)).astype(bf16)
        got = cg.run({"x": xv})[0].astype(np.float32)
        want = g.evaluate({"x": xv}, {})[0].astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
