"""An independent checker of buffer plans. In: a MIR graph and a BufferPlan.
Out: nothing, or a CompileError naming the first broken rule.

It shares no code with the planner: it does not group aliases or compute buffer
lifetimes. It replays the run as a sequence of *writes* and *reads* of byte ranges:

* params and constants are written once, before everything, one after another, and are
  read forever after (later runs reuse them);
* inputs are written next, one after another, before step 0;
* the node at schedule step ``t`` reads its inputs' ranges and then writes its own
  range at time ``t``; views write nothing (they reinterpret bytes already written);
* graph outputs and ``keep_alive`` nodes are read at the end.

A plan is sound when no write lands on bytes whose value is still to be read: for every
node ``x`` written at ``w(x)`` and last read at ``r(x)``, no other write at a time in
``(w(x), r(x)]`` overlaps ``x``'s range. The one exception is the definition of in
place: an elementwise node may write at ``r(x)`` exactly over ``x`` (same offset and
size) when ``x`` is one of its inputs (it reads each element before writing it).
Besides: every node has a slot sized by its shape, offsets are aligned, ranges lie in
the arena, params/constants lie in the persistent region, views alias their source.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rlx.errors import CompileError
from rlx.ir.lir import BufferPlan
from rlx.ir.mir import Graph, NodeId

__all__ = ["check_plan"]


def _fail(graph: Graph, msg: str) -> CompileError:
    return CompileError(f"buffer plan of graph {graph.name!r} is unsound: {msg}")


def check_plan(graph: Graph, plan: BufferPlan, keep_alive: Iterable[NodeId] = ()) -> None:
    """Raise CompileError unless ``plan`` is a sound arena layout for ``graph`` (see the
    module docstring for the rules). ``keep_alive`` adds to ``plan.keep_alive``."""
    _check_schedule(graph, plan)
    _check_slots(graph, plan)
    _check_aliases(graph, plan)
    _check_conflicts(graph, plan, set(plan.keep_alive) | {int(k) for k in keep_alive})


def _check_schedule(graph: Graph, plan: BufferPlan) -> None:
    if sorted(plan.schedule) != list(range(len(graph.nodes))):
        raise _fail(
            graph,
            f"schedule {list(plan.schedule)} is not a permutation of the {len(graph.nodes)} nodes",
        )
    seen: set[NodeId] = set()
    for nid in plan.schedule:
        for i in graph.nodes[nid].inputs:
            if i not in seen:
                raise _fail(graph, f"node %{nid} is scheduled before its input %{i}")
        seen.add(nid)


def _is_persistent(graph: Graph, nid: NodeId) -> bool:
    from rlx.ops.core import Constant, Param

    return isinstance(graph.nodes[nid].op, (Param, Constant))


def _check_slots(graph: Graph, plan: BufferPlan) -> None:
    if plan.alignment <= 0 or plan.alignment & (plan.alignment - 1):
        raise _fail(graph, f"alignment {plan.alignment} is not a power of two")
    if not 0 <= plan.persistent_bytes <= plan.arena_bytes:
        raise _fail(
            graph, f"persistent region {plan.persistent_bytes} B vs arena {plan.arena_bytes} B"
        )
    for n in graph.nodes:
        if n.id not in plan.slots:
            raise _fail(graph, f"node %{n.id} has no slot")
        s = plan.slots[n.id]
        want = n.shape.nbytes(plan.bindings)
        if s.node != n.id or s.nbytes != want:
            raise _fail(
                graph, f"slot of %{n.id} is {s} but the node needs {want} bytes ({n.shape})"
            )
        if s.offset % plan.alignment:
            raise _fail(graph, f"%{n.id} offset {s.offset} is not {plan.alignment}-byte aligned")
        if s.offset < 0 or s.offset + s.nbytes > plan.arena_bytes:
            raise _fail(
                graph,
                f"%{n.id} range [{s.offset}, {s.offset + s.nbytes}) is outside the arena of {plan.arena_bytes} B",
            )
        if _is_persistent(graph, n.id) and s.offset + s.nbytes > plan.persistent_bytes:
            raise _fail(
                graph,
                f"param/constant %{n.id} at [{s.offset}, {s.offset + s.nbytes}) is outside the persistent region of {plan.persistent_bytes} B",
            )


def _check_aliases(graph: Graph, plan: BufferPlan) -> None:
    for n in graph.nodes:
        s = plan.slots[n.id]
        if s.view_of is not None:
            if not n.op.view or s.inplace_of is not None:
                raise _fail(
                    graph, f"%{n.id} ({n.op.mnemonic}) is marked a view but is not a view op"
                )
            src = n.inputs[0]
            while plan.slots[src].view_of is not None:
                src = graph.nodes[src].inputs[0]
            if src != s.view_of:
                raise _fail(
                    graph, f"view %{n.id} names %{s.view_of} but its bytes come from %{src}"
                )
            t = plan.slots[src]
            if (t.offset, t.nbytes) != (s.offset, s.nbytes):
                raise _fail(
                    graph,
                    f"view %{n.id} at [{s.offset}, +{s.nbytes}] does not match %{src} at [{t.offset}, +{t.nbytes}]",
                )
        if s.inplace_of is not None:
            i = s.inplace_of
            if not n.op.elementwise or i not in n.inputs:
                raise _fail(
                    graph,
                    f"%{n.id} ({n.op.mnemonic}) runs in place of %{i}, which needs an elementwise op reading %{i}",
                )
            t = plan.slots[i]
            src_node = graph.nodes[i]
            same_layout = src_node.shape.concrete(plan.bindings) == n.shape.concrete(plan.bindings)
            if (t.offset, t.nbytes) != (s.offset, s.nbytes) or not same_layout:
                raise _fail(
                    graph,
                    f"%{n.id} runs in place of %{i} but their ranges or layouts differ ({s.describe()} vs {t.describe()})",
                )


def _timeline(
    graph: Graph, plan: BufferPlan, keep: set[NodeId]
) -> tuple[dict[NodeId, int], dict[NodeId, int]]:
    """Node -> time its bytes were written (views: when they come into being) and time
    of its last read. Setup writes get negative times; the end is len(schedule)."""
    from rlx.ops.core import Input

    end = len(plan.schedule)
    write: dict[NodeId, int] = {}
    setup = [n.id for n in graph.nodes if _is_persistent(graph, n.id)]
    setup += [n.id for n in graph.nodes if isinstance(n.op, Input)]
    for k, nid in enumerate(setup):
        write[nid] = k - len(setup)
    for t, nid in enumerate(plan.schedule):
        write.setdefault(nid, t)
    read = dict(write)
    for t, nid in enumerate(plan.schedule):
        for i in graph.nodes[nid].inputs:
            read[i] = max(read[i], t)
    forever = end + 1
    for nid in (*graph.outputs, *keep):
        read[nid] = max(read[nid], end)
    for nid in setup:
        if _is_persistent(graph, nid):
            read[nid] = forever
    return write, read


def _check_conflicts(graph: Graph, plan: BufferPlan, keep: set[NodeId]) -> None:
    write, read = _timeline(graph, plan, keep)
    ids = np.array([n.id for n in graph.nodes], dtype=np.int64)
    lo = np.array([plan.slots[i].offset for i in ids], dtype=np.int64)
    hi = lo + np.array([plan.slots[i].nbytes for i in ids], dtype=np.int64)
    w = np.array([write[i] for i in ids], dtype=np.int64)
    r = np.array([read[i] for i in ids], dtype=np.int64)
    # views of params/constants are read forever too
    for n in graph.nodes:
        if plan.slots[n.id].view_of is not None and _is_persistent(graph, plan.slots[n.id].view_of):
            r[n.id] = max(r[n.id], read[plan.slots[n.id].view_of])
    writers = [n for n in graph.nodes if plan.slots[n.id].view_of is None and hi[n.id] > lo[n.id]]
    for n in writers:
        tw = write[n.id]
        hit = (lo < hi[n.id]) & (lo[n.id] < hi) & (hi > lo) & (w < tw) & (tw <= r)
        hit[n.id] = False
        for x in np.nonzero(hit)[0]:
            x = int(x)
            if _inplace_ok(graph, plan, n.id, x, tw, int(r[x])):
                continue
            sx, sn = plan.slots[x], plan.slots[n.id]
            raise _fail(
                graph,
                f"%{n.id} writes {sn.describe()} at step {tw} over %{x} {sx.describe()}, "
                f"which is written at {write[x]} and still read at step {int(r[x])}",
            )


def _inplace_ok(
    graph: Graph, plan: BufferPlan, writer: NodeId, x: NodeId, tw: int, rx: int
) -> bool:
    """The in-place exception: ``writer`` reads ``x`` last, at the same step, and writes
    exactly over it (same range) as an elementwise op declared in place."""
    s, t = plan.slots[writer], plan.slots[x]
    return (
        s.inplace_of is not None
        and rx == tw
        and x in graph.nodes[writer].inputs
        and (s.offset, s.nbytes) == (t.offset, t.nbytes)
        and graph.nodes[writer].op.elementwise
    )
