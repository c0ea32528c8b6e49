"""The arena executor. In: a MIR graph and its BufferPlan (one binding of the symbols).
Out: an :class:`Executor` holding a typed NumPy view per node and the schedule: a flat
list of zero-argument closures.

Where the views live (:mod:`rlx.backends.cpu.memory`): the plan's working region (and
the kernels' scratch above it) in a :class:`~rlx.backends.cpu.memory.Workspace` buffer,
at the planned offsets; params, constants and prologue values (the plan's persistent
region) in a :class:`~rlx.backends.cpu.memory.ParamStore`. A CompiledGraph gives every
executor of its shapes the same two objects, so a new shape allocates no arena and
copies no weight; an executor built without them gets private ones (what a control-flow
sub-program does). Params and constants are read-only views.

A run copies the inputs into their slots, calls every closure in order
(``for f in schedule: f()``) and copies the outputs out. View nodes (reshape) and
boundary nodes (input, param, constant) have no kernel: their view already is their
value.

The prologue: when the plan put param-derived nodes (see
:func:`rlx.backends.cpu.planner.param_derived_nodes`, e.g. the bf16 cast of an f32
weight) in its persistent region, their kernels form a separate list, ``prologue``, that
runs on the first run after a param is loaded (``stale``) and is skipped otherwise: their
values only change when a param does. Their entries say ``prologue=True``. Executors
sharing a store share these values: once one executor computed them for the store's
current params, another skips the kernels whose output lives in the store (a kernel
with steps of its own, or with a private output, always runs). Kernels may
add steps on such inputs (``KernelCtx.prologue``: the bf16 GEMM packs a param-derived
weight there); ``prepare`` holds them and they run right after the prologue kernels. A
prologue kernel's own steps run inside it, just before it: their inputs are prologue
values computed by the kernels before it.

Every kernel factory gets ``KernelCtx.num_threads`` (``num_threads``, resolved by
:func:`rlx.backends.cpu.threads.resolve_threads`) and ``KernelCtx.native``: pass the
CompileOptions' values (``CpuProgram`` does).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx.backends.cpu.dispatch import (
    KERNELS,
    Kernel,
    KernelCtx,
    KernelKind,
    kernel_kind,
    load_kernels,
    reference_kernel,
)
from rlx.backends.cpu.engines import region
from rlx.backends.cpu.memory import (
    ARENA_ALIGNMENT,
    ArenaScratch,
    ParamStore,
    Workspace,
    aligned_arena,
    check_memory,
)
from rlx.backends.cpu.native.schedule import Segment, native_call, segments
from rlx.backends.cpu.threads import resolve_threads
from rlx.errors import CompileError, RlxError, UnsupportedOpError
from rlx.ir.lir import BufferPlan, BufferSlot, format_bytes
from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.core import Constant, Input, Param
from rlx.shape import Shape

__all__ = ["Executor", "ScheduleEntry", "ARENA_ALIGNMENT", "aligned_arena"]

#: Scratch a shared workspace could not hold beyond this many bytes: grow it and rebuild.
SPILL_REBUILD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class ScheduleEntry:
    """One scheduled kernel, as the report shows it."""

    node: NodeId
    op: str
    dtype: str
    dims: tuple[int, ...]
    offset: int
    nbytes: int
    kind: KernelKind
    view_of: NodeId | None = None
    inplace_of: NodeId | None = None
    notes: tuple[str, ...] = ()
    prologue: bool = False


def _where(node: Node) -> str:
    """The node as reports name it (the user's graph: ``%19 matmul (model.py:42)``)."""
    loc = node.loc
    if loc is not None and loc.file:
        return f"{node.label} (built at {loc})"
    return node.label


def _after(steps: Sequence[Kernel], fn: Kernel) -> Kernel:
    """One kernel running ``steps`` then ``fn``."""
    todo = (*steps, fn)

    def run() -> None:
        for f in todo:
            f()

    return run


class Executor:
    """Views and kernel schedule for ``graph`` under ``plan`` (see module docstring).
    ``num_threads`` and ``native`` are ``CompileOptions.num_threads`` / ``.native``: they
    reach every kernel factory as ``KernelCtx.num_threads`` / ``KernelCtx.native``.
    ``store`` / ``workspace``: shared with the other executors of one CompiledGraph
    (None: private ones; ``params`` then becomes the private store's live mapping).
    ``native_schedule``: :meth:`run` calls ``fast``, the schedule with each run of
    consecutive native kernels made one C call (:mod:`rlx.backends.cpu.native.schedule`);
    ``schedule`` (one closure per kernel) stays what profiling and failure location run."""

    def __init__(
        self,
        graph: Graph,
        plan: BufferPlan,
        params: Mapping[str, np.ndarray],
        inputs: Mapping[str, np.ndarray],
        *,
        num_threads: int | None = None,
        native: bool = True,
        store: ParamStore | None = None,
        workspace: Workspace | None = None,
        native_schedule: bool = False,
        batch_invariant: bool = False,
    ):
        load_kernels()
        self.num_threads = resolve_threads(num_threads)
        self.native = native
        self.batch_invariant = batch_invariant
        self.graph = graph
        self.plan = plan
        self.bindings = dict(plan.bindings)
        if store is None:
            live = params if isinstance(params, dict) else dict(params)
            store = ParamStore(graph, live)
        self.store = store
        self.workspace = workspace if workspace is not None else Workspace(shared=False)
        self.hoisted = self._hoisted()
        self.stable = self.hoisted | frozenset(n.id for n in graph.nodes if isinstance(n.op, Param))
        self.prologue_runs = 0
        self._prologue_at = -1  # the store version the prologue last ran at
        self._private: dict[NodeId, np.ndarray] = {}  # prologue values of symbolic shape
        working = plan.arena_bytes - plan.persistent_bytes
        ws = self.workspace
        need = self._new_bytes(working)
        check_memory(need, lambda: self._memory_text(need))
        for attempt in range(2):
            try:
                ws.ensure(working + (ws.scratch_hint if ws.shared else 0))
                self._layout()
            except MemoryError as e:  # under the RAM, but the OS said no
                raise CompileError(
                    f"{self._memory_text(need)}; allocating it failed: {e}"
                ) from None
            if region.in_batch():  # a nested graph's executor: the outer batch builds
                self._build(store.params, inputs)
            else:  # the graph's generated regions in one gcc run (each alone if that fails)
                region.batched(lambda: self._build(store.params, inputs), reset=self._layout)
            pool = self.pool
            ws.scratch_hint = max(ws.scratch_hint, pool.scratch_bytes)
            if attempt or not ws.shared or pool.spilled <= SPILL_REBUILD_BYTES:
                break
            try:
                ws.ensure(pool.needed)  # grows: this schedule is rebuilt on the bigger buffer
            except MemoryError as e:
                raise CompileError(
                    f"{self._memory_text(need)}; allocating it failed: {e}"
                ) from None
        self._generations = (ws.generation, store.generation)
        self.fast: list[Kernel] = self.schedule  # what run() calls
        self.use_native_schedule(native_schedule)

    def _new_bytes(self, working: int) -> int:
        """Bytes this schedule allocates: its working region, its prologue values and
        zeroed storage for the params not set yet (set ones are the caller's arrays)."""
        slots = self.plan.slots
        unset = sum(
            slots[n.id].nbytes
            for n in self.graph.nodes
            if isinstance(n.op, Param) and n.op.name not in self.store.params
        )
        return working + unset + sum(slots[h].nbytes for h in self.hoisted)

    def _memory_text(self, need: int) -> str:
        """What needs ``need`` bytes: the graph, its bindings and its largest buffers."""
        at = ", ".join(f"{k}={v}" for k, v in sorted(self.bindings.items()))
        head = f"graph {self.graph.name!r}" + (f" at {at}" if at else "")
        owners = [
            s
            for s in self.plan.slots.values()
            if s.view_of is None and s.inplace_of is None and s.nbytes
        ]
        owners.sort(key=lambda s: -s.nbytes)
        parts = []
        for slot in owners[:3]:
            n = self.graph.nodes[slot.node]
            name = f"{n.op.name!r} " if isinstance(n.op, (Input, Param)) else ""
            shape = Shape(n.shape.concrete(self.bindings), n.dtype)
            parts.append(f"{n.label}: {name}{shape}, {format_bytes(slot.nbytes)}")
        return (
            f"{head}: its memory plan needs {format_bytes(need)} ({need} bytes); the largest "
            f"buffers: {'; '.join(parts)}"
        )

    def use_native_schedule(self, on: bool) -> None:
        """Make :meth:`run` call each run of consecutive native kernels as one C call
        (``on``) or every kernel from Python."""
        self.fast = segments(self.schedule) if on and self.native else self.schedule
        #: every kernel of ``fast`` is C (native schedule segments or single native calls):
        #: no NumPy floating-point warnings to silence around a run (np.errstate costs ~1 us)
        self.quiet = bool(self.fast) and all(
            isinstance(f, Segment) or native_call(f) is not None for f in self.fast
        )

    # ---- views ----------------------------------------------------------------------

    def _layout(self) -> None:
        """Views of every node, the scratch pool and empty schedules."""
        graph = self.graph
        self.arena = self.workspace.buffer
        self.pool = ArenaScratch(self.arena, self.plan.arena_bytes - self.plan.persistent_bytes)
        self.views: dict[NodeId, np.ndarray] = {}
        for n in graph.nodes:
            self.views[n.id] = self._view(n)
        self.input_views: list[tuple[str, np.ndarray]] = []
        self.param_views: dict[str, np.ndarray] = {}
        for n in graph.nodes:
            if isinstance(n.op, Input):
                self.input_views.append((n.op.name, self.views[n.id]))
            elif isinstance(n.op, Param):
                self.param_views[n.op.name] = self.views[n.id]
        self.output_views = [self.views[o] for o in graph.outputs]
        self._snapshots = self._snapshot_written_params()
        self.prologue: list[Kernel] = []
        self._skippable: list[bool] = []  # prologue kernel whose value lives in the store
        self.prepare: list[Kernel] = []  # kernels' steps on stable inputs (KernelCtx.prologue)
        self.schedule: list[Kernel] = []
        self.entries: list[ScheduleEntry] = []

    def _snapshot_written_params(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """An output that is (a view of) a param which an effect of the same graph writes
        (``assign``, ``adam_update``) gives the value from before the run, as every other
        reader of the param does: such an output is redirected into a private copy of the
        param's storage, taken at the start of each run. Returns (copy, param storage)
        pairs; empty for the usual graph."""
        graph = self.graph
        written = {
            graph.nodes[n.inputs[0]].id
            for n in graph.nodes
            if n.op.effect and n.inputs and isinstance(graph.nodes[n.inputs[0]].op, Param)
        }
        snaps: dict[NodeId, np.ndarray] = {}
        for i, out in enumerate(self.output_views):
            for pid in written:
                src = self.views[pid]
                if not (out.size and src.size and np.shares_memory(out, src)):
                    continue
                snap = snaps.setdefault(pid, np.empty_like(src, order="C"))
                offset = out.__array_interface__["data"][0] - src.__array_interface__["data"][0]
                self.output_views[i] = np.ndarray(
                    out.shape, out.dtype, buffer=snap, offset=offset, strides=out.strides
                )
                break
        return [(snap, self.views[pid]) for pid, snap in snaps.items()]

    def _view(self, n: Node) -> np.ndarray:
        cached = self.store.views.get(n.id)
        if cached is not None:  # a param / constant / prologue value of static shape
            return cached
        slot = self.plan.slot(n.id)
        dims = n.shape.concrete(self.bindings)
        dt = n.dtype.np
        want = math.prod(dims) * dt.itemsize
        if slot.nbytes < want:
            raise AssertionError(f"plan gives %{n.id} {slot.nbytes} bytes, it needs {want}")
        base = self._persistent_bytes(n, slot)
        if base is None:
            off = slot.offset - self.plan.persistent_bytes
            return self.arena[off : off + want].view(dt).reshape(dims)
        view = base[:want].view(dt).reshape(dims)
        if n.shape.is_static and (slot.view_of or n.id) not in self._private:
            self.store.views[n.id] = view
        return view

    def _persistent_bytes(self, n: Node, slot: BufferSlot) -> np.ndarray | None:
        """The bytes of a node of the persistent region (None for a working node)."""
        owner = n.id if slot.view_of is None else slot.view_of
        if slot.offset >= self.plan.persistent_bytes and owner not in self.hoisted:
            if not isinstance(self.graph.nodes[owner].op, (Param, Constant)):
                return None
        node = self.graph.nodes[owner]
        if isinstance(node.op, Param):
            return self.store.param_bytes(node.op.name, node.shape.concrete(self.bindings))
        if isinstance(node.op, Constant):
            return self.store.constant_bytes(owner)
        nbytes = self.plan.slot(owner).nbytes
        if node.shape.is_static:
            return self.store.hoisted_bytes(owner, nbytes)
        if owner not in self._private:
            self._private[owner] = aligned_arena(nbytes)
        return self._private[owner]

    def _hoisted(self) -> frozenset[NodeId]:
        """Param-derived nodes the plan keeps in its persistent region (the prologue)."""
        top = self.plan.persistent_bytes
        keep = set(self.plan.keep_alive)
        slots = self.plan.slots
        return frozenset(
            nid
            for nid in self.store.derived
            if nid in keep and slots[nid].offset + slots[nid].nbytes <= top
        )

    def is_current(self) -> bool:
        """False once bytes this executor's views point into moved (the workspace grew,
        a param's array was replaced): it must be rebuilt."""
        return self._generations == (self.workspace.generation, self.store.generation)

    def arena_offset(self, nid: NodeId) -> int:
        """Byte offset of working node ``nid``'s value in :attr:`arena` (the workspace)."""
        off = self.plan.slot(nid).offset - self.plan.persistent_bytes
        if off < 0:
            raise KeyError(f"%{nid} lives in the persistent region, not in the arena")
        return off

    def _build(self, params: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> None:
        from rlx.backends.cpu.engines.sgemm import prebuild

        prebuild(self.graph, self.native)  # gcc in the background while other kernels build
        unsupported: list[str] = []
        for nid in self.plan.schedule:
            n = self.graph.nodes[nid]
            if isinstance(n.op, (Input, Param, Constant)):
                continue
            slot = self.plan.slot(nid)
            if slot.view_of is not None:
                if not n.op.view:
                    raise AssertionError(
                        f"plan makes %{nid} {n.op} a view, but it is not a view op"
                    )
                self._record(
                    n,
                    KernelKind.VIEW,
                    slot.view_of,
                    None,
                    slot.offset,
                    slot.nbytes,
                    prologue=nid in self.hoisted,
                )
                continue
            ins = [self.views[i] for i in n.inputs]
            out = self.views[nid]
            ctx = KernelCtx(
                n,
                self.graph,
                self.bindings,
                params,
                inputs,
                self.pool,
                kernel_kind(type(n.op)),
                num_threads=self.num_threads,
                native=self.native,
                stable=self.stable,
                store=self.store,
                batch_invariant=self.batch_invariant,
            )
            factory = KERNELS.get(type(n.op))
            try:
                fn = factory(n, ins, out, ctx) if factory is not None else None
                if fn is None:
                    ctx.kind = KernelKind.REFERENCE
                    fn = reference_kernel(n, ins, out, ctx)
            except UnsupportedOpError as e:
                unsupported.append(f"{_where(n)}: {e.bare_message}")
                continue
            pro = nid in self.hoisted
            if pro and ctx.prologue:
                # a hoisted kernel's steps on its stable inputs read prologue values
                # computed just before it: run them first, not after the whole prologue
                fn = _after(ctx.prologue, fn)
            else:
                self.prepare += ctx.prologue
            if pro:
                self.prologue.append(fn)
                owner = nid if slot.view_of is None else slot.view_of
                self._skippable.append(not ctx.prologue and owner not in self._private)
            else:
                self.schedule.append(fn)
            self._record(
                n,
                ctx.kind,
                None,
                slot.inplace_of,
                slot.offset,
                slot.nbytes,
                tuple(ctx.notes),
                pro,
            )
        if unsupported:
            raise UnsupportedOpError(
                f"the cpu backend does not support {len(unsupported)} node(s):\n  "
                + "\n  ".join(unsupported)
            )

    def _record(
        self,
        n: Node,
        kind: KernelKind,
        view_of: NodeId | None,
        inplace_of: NodeId | None,
        off: int,
        nb: int,
        notes: tuple[str, ...] = (),
        prologue: bool = False,
    ) -> None:
        dims = tuple(self.views[n.id].shape)
        self.entries.append(
            ScheduleEntry(
                n.id,
                n.op.mnemonic,
                n.dtype.value,
                dims,
                off,
                nb,
                kind,
                view_of,
                inplace_of,
                notes,
                prologue,
            )
        )

    @property
    def kernel_entries(self) -> list[ScheduleEntry]:
        """Entries that own a closure in ``schedule`` (same order), without views or
        prologue kernels."""
        return [e for e in self.entries if e.view_of is None and not e.prologue]

    @property
    def prologue_entries(self) -> list[ScheduleEntry]:
        """Entries that own a closure in ``prologue`` (same order)."""
        return [e for e in self.entries if e.view_of is None and e.prologue]

    def load_param(self, name: str, value: np.ndarray) -> None:
        """Copy a (checked, converted) param into its storage; the prologue runs again
        before the next run."""
        view = self.param_views.get(name)
        if view is not None:
            arr = np.broadcast_to(np.asarray(value).astype(view.dtype, copy=False), view.shape)
            self.store.set(name, arr, share=False)

    @property
    def stale(self) -> bool:
        """Whether the prologue's values are out of date for this executor."""
        return self._prologue_at != self.store.version

    @stale.setter
    def stale(self, value: bool) -> None:
        self._prologue_at = -1 if value else self.store.version

    def _prologue_skip(self, full: bool) -> list[bool]:
        """Which prologue kernels may be skipped now: their value lives in the store and
        another executor computed it for the current params."""
        if full or self.store.hoisted_version != self.store.version:
            return [False] * len(self.prologue)
        return self._skippable

    def run_prologue(self, *, full: bool = False) -> list[float]:
        """Compute the param-derived nodes now (``full``: even those another executor
        computed); returns each prologue kernel's seconds (0 when skipped)."""
        self._prologue_at = -1  # until every kernel has run
        version = self.store.version
        times = self._run_timed(self.prologue, self.prologue_entries, self._prologue_skip(full))
        for f in self.prepare:
            f()
        self._prologue_at = self.store.hoisted_version = version
        self.prologue_runs += 1
        return times

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run once on checked inputs (the prologue first when a param changed since the
        last run); returns fresh copies of the outputs."""
        if self._prologue_at != self.store.version:
            self.run_prologue()
        for name, view in self.input_views:
            view[...] = inputs[name]  # np.copyto(casting="unsafe") in half the time
        for snap, param in self._snapshots:
            np.copyto(snap, param)
        try:
            for f in self.fast:
                f()
        except Exception as e:
            nid = self._locate_failure(inputs)
            new = e if nid is None else self._annotate(e, nid)
            if new is e:
                raise
            raise new from e
        return [v.copy() for v in self.output_views]

    def run_profiled(
        self, inputs: Mapping[str, np.ndarray]
    ) -> tuple[list[np.ndarray], list[float]]:
        """Like :meth:`run`, also returning each kernel's wall time in seconds, in the
        order of ``entries`` without views: prologue kernels are run (and timed) too, so
        a profile shows every kernel's cost."""
        pro = iter(self.run_prologue(full=True))
        for name, view in self.input_views:
            np.copyto(view, inputs[name], casting="unsafe")
        for snap, param in self._snapshots:
            np.copyto(snap, param)
        it = iter(self._run_timed(self.schedule, self.kernel_entries))
        times = [next(pro) if e.prologue else next(it) for e in self.entries if e.view_of is None]
        return [v.copy() for v in self.output_views], times

    def _run_timed(
        self, kernels: Sequence[Kernel], entries: Sequence[Any], skip: Sequence[bool] = ()
    ) -> list[float]:
        """Call each kernel (but those ``skip`` marks), timing it; an exception is
        annotated with its node."""
        times: list[float] = []
        clock = time.perf_counter
        for i, f in enumerate(kernels):
            if skip and skip[i]:
                times.append(0.0)
                continue
            t0 = clock()
            try:
                f()
            except Exception as e:
                new = self._annotate(e, entries[i].node)
                if new is e:
                    raise
                raise new from e
            times.append(clock() - t0)
        return times

    def _locate_failure(self, inputs: Mapping[str, np.ndarray]) -> NodeId | None:
        """Re-run the schedule (from fresh inputs: in-place kernels may have overwritten
        them) one kernel at a time to name the node that raised; the hot loop carries no
        index so that it costs nothing when nothing fails."""
        for name, view in self.input_views:
            np.copyto(view, inputs[name], casting="unsafe")
        entries = self.kernel_entries
        for i, f in enumerate(self.schedule):
            try:
                f()
            except Exception:
                return entries[i].node
        return None

    def _annotate(self, exc: Exception, nid: NodeId) -> Exception:
        """An rlx error without a node becomes the same error naming node ``nid`` (by the
        user's graph: its id there, op and line) and the user line that built it; any other
        exception gets a note naming the node."""
        n = self.graph.nodes[nid]
        if isinstance(exc, RlxError) and exc.node is None:
            user = n.loc.node if n.loc is not None and n.loc.node is not None else nid
            return type(exc)(f"{n.label}: {exc.bare_message}", node=user, loc=n.loc)
        exc.add_note(f"while running {_where(n)}")
        return exc

    def entry_by_node(self) -> dict[NodeId, ScheduleEntry]:
        return {e.node: e for e in self.entries}

    @property
    def scratch_bytes(self) -> int:
        """Bytes of the kernels' scratch arrays of this schedule."""
        return self.pool.nbytes
