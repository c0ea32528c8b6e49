"""The arena planner and its independent checker.

Plans are checked three ways: by ``check_plan`` (replays writes and reads), by running
the graph inside a real byte arena laid out by the plan and comparing with the reference
interpreter, and by the bounds ``lower bound <= peak <= naive``.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.backends.cpu.plancheck import check_plan
from rlx.backends.cpu.planner import _best_gap_placement, _Buffer, plan_memory, plan_module
from rlx.backends.reference import evaluate_all
from rlx.errors import CompileError, InputError, ShapeError, VerifyError
from rlx.ir.lir import BufferPlan, LirModule, PlanStrategy
from rlx.models import decoder, encoder, random_inputs, random_params
from rlx.ops.base import RefCtx
from rlx.ops.core import Constant, Input, Param

# ---- running a graph inside the planned arena ----------------------------------------


def _slot_array(arena: np.ndarray, plan: BufferPlan, node: rlx.ir.mir.Node) -> np.ndarray:
    s = plan.slots[node.id]
    dims = node.shape.concrete(plan.bindings)
    return arena[s.offset : s.offset + s.nbytes].view(node.shape.dtype.np).reshape(dims)


def run_in_arena(graph, plan, inputs, params, keep_alive=()):
    """Execute ``graph`` with every value stored in one uint8 arena at the plan's offsets
    (views write nothing); return node id -> value for the outputs and ``keep_alive``."""
    arena = np.full(plan.arena_bytes, 0xAB, dtype=np.uint8)
    for n in graph.nodes:  # setup: params, constants, then inputs
        if isinstance(n.op, Param):
            _slot_array(arena, plan, n)[...] = params[n.op.name]
        elif isinstance(n.op, Constant):
            _slot_array(arena, plan, n)[...] = n.op.value.array()
    for n in graph.nodes:
        if isinstance(n.op, Input):
            _slot_array(arena, plan, n)[...] = inputs[n.op.name]
    for nid in plan.schedule:
        n = graph.nodes[nid]
        if isinstance(n.op, (Input, Param, Constant)):
            continue
        xs = [_slot_array(arena, plan, graph.nodes[i]).copy() for i in n.inputs]
        ctx = RefCtx(
            n.shape.concrete(plan.bindings), n.shape.dtype.np, plan.bindings, params, inputs
        )
        r = np.asarray(n.op.reference(xs, ctx)).astype(n.shape.dtype.np)
        if plan.slots[nid].view_of is None:
            _slot_array(arena, plan, n)[...] = r
        else:  # a view must already hold the value it names
            np.testing.assert_array_equal(_slot_array(arena, plan, n), r)
    wanted = (*graph.outputs, *keep_alive)
    return {o: _slot_array(arena, plan, graph.nodes[o]).copy() for o in wanted}


def assert_plan_runs(graph, plan, inputs, params=None, keep_alive=()):
    params = params or {}
    with np.errstate(all="ignore"):  # random graphs may overflow; both sides alike
        want = evaluate_all(graph, inputs, params)
        got = run_in_arena(graph, plan, inputs, params, keep_alive)
    for o, v in got.items():
        np.testing.assert_allclose(v, want[o], rtol=1e-6, atol=1e-6, err_msg=f"node %{o}")


def assert_bounds(plan: BufferPlan) -> None:
    assert plan.lower_bound_bytes <= plan.peak_bytes <= plan.naive_bytes
    assert plan.arena_bytes == plan.persistent_bytes + plan.peak_bytes


# ---- random DAGs ---------------------------------------------------------------------

_UNARY = ("relu", "neg", "abs", "tanh", "sigmoid")
_STEPS = (
    "unary",
    "binary",
    "bcast",
    "sum",
    "matmul",
    "reshape",
    "transpose",
    "const",
    "input",
    "dtype",
)


@st.composite
def random_dags(draw):
    """A random DAG of f32 ops (elementwise, broadcast, reduce, matmul, reshape views,
    transposes, constants) with random sizes, random outputs and keep_alive nodes."""
    g = rlx.Graph("random")
    m, n = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    nodes = [g.input("x", (m, n))]
    if draw(st.booleans()):
        nodes.append(g.input("y", (m, n)))
    row = g.param("row", (n,))
    for _ in range(draw(st.integers(1, 24))):
        step = draw(st.sampled_from(_STEPS))
        x = draw(st.sampled_from(nodes))
        dims = g.nodes[x].shape.dims
        if step == "unary":
            nodes.append(getattr(g, draw(st.sampled_from(_UNARY)))(x))
        elif step == "binary":
            same = [v for v in nodes if g.nodes[v].shape.dims == dims]
            nodes.append(
                g.binary(
                    draw(st.sampled_from(list(rlx.ops.elementwise.BinaryKind)[:4])),
                    x,
                    draw(st.sampled_from(same)),
                )
            )
        elif step == "bcast" and dims[-1] == n and len(dims) == 2:
            a, b = (x, row) if draw(st.booleans()) else (row, x)
            nodes.append(g.add(a, b))
        elif step == "sum" and len(dims) == 2:
            s = g.sum(x, axes=(1,), keepdims=True)
            nodes.append(g.mul(x, s) if draw(st.booleans()) else s)
        elif step == "matmul" and len(dims) == 2:
            k = draw(st.integers(1, 9))
            name = f"w{len(g.nodes)}"
            nodes.append(g.matmul(x, g.param(name, (dims[1], k))))
        elif step == "reshape":
            total = int(np.prod(dims))
            new = draw(st.sampled_from([(total,), (1, total), (total, 1), tuple(reversed(dims))]))
            nodes.append(g.reshape(x, new))
        elif step == "transpose" and len(dims) == 2:
            nodes.append(g.transpose(x, (1, 0)))
        elif step == "input":  # an input declared late is still written before step 0
            nodes.append(g.add(x, g.input(f"in{len(g.nodes)}", dims)))
        elif step == "dtype":  # elementwise ops whose output has another item size
            same = draw(st.sampled_from([v for v in nodes if g.nodes[v].shape.dims == dims]))
            if draw(st.booleans()):
                nodes.append(g.where(g.lt(x, same), x, same))
            else:
                nodes.append(g.cast(g.neg(g.cast(x, "f16")), "f32"))
        elif step == "const":
            c = g.constant(np.full(tuple(dims), 0.5, np.float32))
            nodes.append(g.mul(x, c))
    outs = draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=3, unique=True))
    g.set_outputs(outs)
    keep = draw(st.lists(st.sampled_from(range(len(g.nodes))), max_size=2, unique=True))
    return g, keep


def _feeds(graph, seed=0):
    params = random_params(graph, seed)
    return random_inputs(graph, None, seed), params


@given(random_dags(), st.booleans(), st.sets(st.sampled_from(PlanStrategy), min_size=1))
def test_random_dags_plan_is_sound(case, inplace, strategies):
    graph, keep = case
    order = tuple(s for s in PlanStrategy if s in strategies)
    plan = plan_memory(graph, keep_alive=keep, inplace=inplace, strategies=order)
    check_plan(graph, plan)
    assert_bounds(plan)
    assert plan.strategy in strategies
    assert plan.keep_alive == tuple(sorted(keep))
    if not inplace:
        assert all(s.inplace_of is None for s in plan.slots.values())
    for s in plan.slots.values():  # a view names the owner of its bytes, never a view
        assert s.view_of is None or plan.slots[s.view_of].view_of is None
    inputs, params = _feeds(graph)
    assert_plan_runs(graph, plan, inputs, params, keep)


@given(random_dags())
def test_checker_rejects_a_buffer_moved_onto_an_output(case):
    graph, keep = case
    plan = plan_memory(graph, keep_alive=keep)
    computed = {
        n.id
        for n in graph.nodes
        if n.inputs and plan.slots[n.id].view_of is None and plan.slots[n.id].nbytes
    }
    outs = [o for o in graph.outputs if o in computed]
    if not outs:
        return
    a = outs[0]  # intact to the end: nothing written after it may land on it
    later = [b for b in plan.schedule[plan.schedule.index(a) + 1 :] if b in computed]
    for b in later[:1]:
        moved = dataclasses.replace(plan.slots[b], offset=plan.slots[a].offset, inplace_of=None)
        with pytest.raises(CompileError, match="unsound"):
            check_plan(graph, dataclasses.replace(plan, slots={**plan.slots, b: moved}))


# ---- views and in place --------------------------------------------------------------


def test_elementwise_chain_runs_in_place_and_broadcast_does_not():
    g = rlx.Graph("chain")
    x = g.input("x", (4, 16))
    small = g.input("s", (16,))
    a = g.exp(x)
    b = g.tanh(a)
    c = g.add(small, b)  # b dies here and has the output's layout: in place of b
    d = g.add(c, small)  # s dies here but is smaller: c (full size) is taken instead
    g.set_outputs([d])
    plan = plan_memory(g)
    check_plan(g, plan)
    assert plan.slots[a].inplace_of == x
    assert plan.slots[b].inplace_of == a
    assert plan.slots[c].inplace_of == b
    assert plan.slots[d].inplace_of == c
    assert len({plan.slots[v].offset for v in (x, a, b, c, d)}) == 1
    assert plan.slots[small].offset != plan.slots[x].offset
    assert_plan_runs(
        g, plan, {"x": np.ones((4, 16), np.float32), "s": np.arange(16, dtype=np.float32)}
    )


def test_no_in_place_when_the_input_is_read_later_or_broadcast_up():
    g = rlx.Graph("t")
    x = g.input("x", (8, 8))
    v = g.input("v", (8,))
    a = g.exp(x)
    b = g.neg(a)  # a is read again below: b cannot take a's slot
    c = g.mul(a, b)
    e = g.add(v, g.sum(c, axes=(0,)))  # e has v's layout and v dies here: in place of v
    big = g.add(g.reshape(e, (1, 8)), c)  # [1,8] + [8,8] -> [8,8]: takes c's slot, not e's
    g.set_outputs([big])
    plan = plan_memory(g)
    check_plan(g, plan)
    assert plan.slots[b].inplace_of is None
    assert plan.slots[c].inplace_of in (a, b)
    assert plan.slots[e].inplace_of == v
    assert plan.slots[big].inplace_of == c
    inputs = {
        "x": np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8),
        "v": np.ones(8, np.float32),
    }
    assert_plan_runs(g, plan, inputs)
    off = plan_memory(g, inplace=False)
    check_plan(g, off)
    assert all(s.inplace_of is None for s in off.slots.values())
    assert off.peak_bytes >= plan.peak_bytes


def test_views_alias_their_source_and_extend_its_life():
    g = rlx.Graph("views")
    x = g.input("x", (4, 8))
    a = g.exp(x)
    r1 = g.reshape(a, (32,))
    r2 = g.reshape(r1, (8, 4))  # a view of a view names the owner
    t = g.transpose(g.neg(x), (1, 0))  # a copy, not a view
    u = g.mul(t, r2)  # r2 (hence a) is read here, after t was written
    g.set_outputs([u])
    plan = plan_memory(g)
    check_plan(g, plan)
    assert plan.slots[r1].view_of == a and plan.slots[r2].view_of == a
    assert plan.slots[t].view_of is None
    assert plan.slots[r2].offset == plan.slots[a].offset
    sa, st_ = plan.slots[a], plan.slots[t]
    assert sa.end <= st_.offset or st_.end <= sa.offset  # a is alive while t is written
    assert plan.slots[u].inplace_of in (t, r2)
    assert_plan_runs(g, plan, {"x": np.arange(32, dtype=np.float32).reshape(4, 8) / 32})


def test_view_of_a_param_stays_in_the_persistent_region():
    g = rlx.Graph("pview")
    x = g.input("x", (2, 6))
    w = g.param("w", (12,))
    y = g.add(x, g.reshape(w, (2, 6)))
    c = g.constant(np.ones((2, 6), np.float32))
    g.set_outputs([g.mul(y, c)])
    plan = plan_memory(g)
    check_plan(g, plan)
    for nid in (w, w + 1, c):
        s = plan.slots[nid]
        assert s.end <= plan.persistent_bytes
    assert plan.slots[x].offset >= plan.persistent_bytes
    assert plan.naive_bytes == 3 * 64  # x, y, the product; never params or views
    assert_plan_runs(
        g, plan, {"x": np.ones((2, 6), np.float32)}, {"w": np.arange(12, dtype=np.float32)}
    )


def test_outputs_and_keep_alive_stay_intact_to_the_end():
    g = rlx.Graph("early")
    x = g.input("x", (16, 16))
    first = g.exp(x)
    h = g.neg(first)
    tap = g.tanh(h)
    for _ in range(6):
        h = g.tanh(g.matmul(h, g.param(f"w{len(g.nodes)}", (16, 16))))
    g.set_outputs([first, h])
    plan = plan_memory(g, keep_alive=[tap])
    check_plan(g, plan)
    assert plan.slots[h].inplace_of is not None or plan.slots[h].offset >= plan.persistent_bytes
    later = [n for n in plan.schedule if n > tap and plan.slots[n].offset >= plan.persistent_bytes]
    for keep in (first, tap):
        s = plan.slots[keep]
        for n in later:
            o = plan.slots[n]
            if n != keep and o.view_of is None:
                assert o.end <= s.offset or s.end <= o.offset, (keep, n)
    inputs, params = _feeds(g)
    assert_plan_runs(g, plan, inputs, params, keep_alive=[tap])
    with pytest.raises(VerifyError, match="keep_alive node %99"):
        plan_memory(g, keep_alive=[99])


def test_control_flow_nodes_are_opaque():
    g = rlx.Graph("cf")
    x = g.input("x", (3, 5))
    p = g.input("p", (), "bool")
    a = g.exp(x)
    y = g.cond(p, lambda s, v: s.neg(v), lambda s, v: s.tanh(s.add(v, v)), [a])
    g.set_outputs([g.add(y, x)])
    plan = plan_memory(g)
    check_plan(g, plan)
    assert set(plan.slots) == set(range(len(g.nodes)))  # nothing planned inside branches
    assert plan.slots[y].inplace_of is None and plan.slots[y].view_of is None
    for pred in (True, False):
        inputs = {"x": np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5), "p": np.array(pred)}
        assert_plan_runs(g, plan, inputs)


# ---- symbolic sizes, errors, summaries ------------------------------------------------


def test_symbolic_bindings_give_concrete_sizes():
    g = rlx.Graph("sym")
    b = g.sym("batch", max=32)
    x = g.input("x", (b, 64))
    w = g.param("w", (64, 128))
    y = g.gelu(g.matmul(x, w))
    g.set_outputs([g.sum(y, axes=(1,))])
    p2, p8 = plan_memory(g, {"batch": 2}), plan_memory(g, {"batch": 8})
    for p, bv in ((p2, 2), (p8, 8)):
        check_plan(g, p)
        assert p.slots[x].nbytes == bv * 64 * 4
        assert p.slots[y].nbytes == bv * 128 * 4
        assert p.bindings == {"batch": bv}
        assert p.persistent_bytes == 64 * 128 * 4
    assert p8.peak_bytes > p2.peak_bytes
    params = {"w": np.ones((64, 128), np.float32) / 64}
    assert_plan_runs(g, p8, {"x": np.ones((8, 64), np.float32)}, params)
    with pytest.raises(ShapeError, match=r"node %0 \(input\).*'batch'"):
        plan_memory(g)
    with pytest.raises(InputError, match=r"'batch' = 33 is outside its declared bounds \[1, 32\]"):
        plan_memory(g, {"batch": 33})


def test_checker_rejects_misalignment_overflow_and_bad_views():
    g = rlx.Graph("bad")
    x = g.input("x", (4, 4))
    r = g.reshape(g.exp(x), (16,))
    g.set_outputs([g.neg(r), x])  # x stays alive: exp gets its own 64-byte slot
    plan = plan_memory(g)
    check_plan(g, plan)
    s = plan.slots[x]
    cases = {
        "aligned": {x: dataclasses.replace(s, offset=s.offset + 4)},
        "outside the arena": {x: dataclasses.replace(s, offset=plan.arena_bytes)},
        "does not match": {r: dataclasses.replace(plan.slots[r], offset=s.offset)},
        "needs 64 bytes": {x: dataclasses.replace(s, nbytes=8)},
    }
    for msg, change in cases.items():
        with pytest.raises(CompileError, match=msg):
            check_plan(g, dataclasses.replace(plan, slots={**plan.slots, **change}))
    with pytest.raises(CompileError, match="scheduled before its input"):
        check_plan(g, dataclasses.replace(plan, schedule=tuple(reversed(plan.schedule))))


def test_bad_alignment_and_empty_strategies_are_compile_errors():
    g = rlx.Graph("t")
    g.set_outputs([g.exp(g.input("x", (4,)))])
    with pytest.raises(CompileError, match="power of two, got 48"):
        plan_memory(g, alignment=48)
    with pytest.raises(CompileError, match="strategies is empty"):
        plan_memory(g, strategies=())
    plan = plan_memory(g, alignment=16, strategies=(PlanStrategy.BEST_FIT_IN_ORDER,))
    check_plan(g, plan)
    assert plan.alignment == 16 and plan.strategy is PlanStrategy.BEST_FIT_IN_ORDER


def test_summary_and_lir_inspect_show_offsets():
    g = rlx.Graph("small")
    x = g.input("x", (8,))
    g.set_outputs([g.exp(g.reshape(x, (2, 4)))])
    lir = plan_module(g)
    assert isinstance(lir, LirModule)
    text = lir.inspect()
    lines = text.split("\n")
    assert lines[1].startswith("  %0:f32[8] = input 'x'") and lines[1].endswith("[0, +32]")
    assert lines[2].endswith("[0, +32] view of %0")
    assert lines[3].endswith("[0, +32] in place of %1")  # exp overwrites x's bytes
    assert "peak 64 B" in str(lir.plan) and "lower bound 64 B" in str(lir.plan)
    assert lir.plan.strategy in tuple(PlanStrategy)
    again = pickle.loads(pickle.dumps(lir.plan))
    assert again == lir.plan and dict(again.slots) == dict(lir.plan.slots)
    assert copy.deepcopy(lir.plan).slots[1].view_of == 0
    with pytest.raises(TypeError):
        lir.plan.slots[0] = lir.plan.slots[1]  # the plan is read-only
    with pytest.raises(rlx.errors.RlxError, match="no slot for node %7"):
        lir.plan.slot(7)


def test_greedy_by_size_places_big_buffers_first():
    # three lifetimes: a big buffer live [1, 2] between two small ones live [0, 1] and
    # [2, 3]; in definition order the small ones fragment the space, by size they do not
    bufs = [
        _Buffer(0, 64, 0, 1),
        _Buffer(1, 128, 1, 2),
        _Buffer(2, 64, 2, 3),
        _Buffer(3, 128, 3, 3),
    ]
    by_size = sorted(bufs, key=lambda b: (-b.size, b.first))
    offsets, peak = _best_gap_placement(by_size)
    assert peak == 192 and offsets[1] == 0
    offsets, peak = _best_gap_placement(sorted(bufs, key=lambda b: b.first))
    assert peak == 192  # best fit reuses the freed hole for the last 128-byte buffer


# ---- the synthetic transformer graphs ----------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: encoder(),
        lambda: decoder(layers=24),
        lambda: decoder(layers=24, fused_attention=True, kv_heads=2),
    ],
    ids=["minilm_encoder", "decoder_24", "decoder_24_fused_gqa"],
)
def test_transformer_plans_are_near_the_lower_bound(build):
    graph = build()
    plan = plan_memory(graph)
    check_plan(graph, plan)
    assert_bounds(plan)
    assert plan.peak_bytes <= 1.15 * plan.lower_bound_bytes
    assert plan.naive_bytes >= 10 * plan.peak_bytes


def test_symbolic_encoder_plans_and_runs_per_binding():
    graph = encoder(
        layers=2, hidden=32, heads=4, ffn=64, seq=rlx.sym("seq"), batch=rlx.sym("batch")
    )
    params = random_params(graph, 1)
    sizes = set()
    for b in ({"batch": 1, "seq": 3}, {"batch": 2, "seq": 5}):
        plan = plan_memory(graph, b)
        check_plan(graph, plan)
        sizes.add(plan.peak_bytes)
        assert_plan_runs(graph, plan, random_inputs(graph, b, 2), params)
    assert len(sizes) == 2
