"""The arena executor. In: a MIR graph and its BufferPlan (one binding of the symbols).
Out: an :class:`Executor` holding one 64-byte-aligned uint8 arena, a typed NumPy view per
node at its planned offset, and the schedule: a flat list of zero-argument closures.

A run copies the inputs into their slots, calls every closure in order
(``for f in schedule: f()``) and copies the outputs out. Params and constants live in the
arena's persistent region: constants are written once here, params whenever they are set.
View nodes (reshape) and boundary nodes (input, param, constant) have no kernel: their
view already is their value.

The prologue: when the plan put param-derived nodes (see
:func:`rlx.backends.cpu.planner.param_derived_nodes`, e.g. the bf16 cast of an f32
weight) in its persistent region, their kernels form a separate list, ``prologue``, that
runs on the first run after a param is loaded (``stale``) and is skipped otherwise: their
values only change when a param does. Their entries say ``prologue=True``. Kernels may
add steps on such inputs (``KernelCtx.prologue``: the bf16 GEMM packs a param-derived
weight there); ``prepare`` holds them and they run right after the prologue kernels. A
prologue kernel's own steps run inside it, just before it: their inputs are prologue
values computed by the kernels before it.

Every kernel factory gets ``KernelCtx.num_threads`` (``num_threads``, resolved by
:func:`rlx.runtime.threads.resolve_threads`) and ``KernelCtx.native``: pass the
CompileOptions' values (``CpuProgram`` does).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx.backends.cpu.kernels import (
    KERNELS,
    Kernel,
    KernelCtx,
    KernelKind,
    ScratchPool,
    kernel_kind,
    load_kernels,
    reference_kernel,
)
from rlx.errors import RlxError, UnsupportedOpError
from rlx.ir.lir import BufferPlan
from rlx.ir.mir import Graph, Node, NodeId
from rlx.ops.core import Constant, Input, Param
from rlx.runtime.threads import resolve_threads

__all__ = ["Executor", "ScheduleEntry", "ARENA_ALIGNMENT"]

ARENA_ALIGNMENT = 64


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


def aligned_arena(nbytes: int, alignment: int = ARENA_ALIGNMENT) -> np.ndarray:
    """A zeroed uint8 array of ``nbytes`` whose first byte is ``alignment``-aligned."""
    raw = np.zeros(nbytes + alignment, dtype=np.uint8)
    skip = (-raw.ctypes.data) % alignment
    return raw[skip : skip + nbytes]


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
    """One arena and kernel schedule for ``graph`` under ``plan`` (see module docstring).
    ``num_threads`` and ``native`` are ``CompileOptions.num_threads`` / ``.native``: they
    reach every kernel factory as ``KernelCtx.num_threads`` / ``KernelCtx.native``."""

    def __init__(
        self,
        graph: Graph,
        plan: BufferPlan,
        params: Mapping[str, np.ndarray],
        inputs: Mapping[str, np.ndarray],
        *,
        num_threads: int | None = None,
        native: bool = True,
    ):
        load_kernels()
        self.num_threads = resolve_threads(num_threads)
        self.native = native
        self.graph = graph
        self.plan = plan
        self.bindings = dict(plan.bindings)
        self.arena = aligned_arena(plan.arena_bytes, max(plan.alignment, ARENA_ALIGNMENT))
        self.pool = ScratchPool()
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
            elif isinstance(n.op, Constant):
                np.copyto(self.views[n.id], n.op.value.array(), casting="unsafe")
        self.output_views = [self.views[o] for o in graph.outputs]
        self.hoisted = self._hoisted()
        self.prologue: list[Kernel] = []
        self.prepare: list[Kernel] = []  # kernels' steps on stable inputs (KernelCtx.prologue)
        self.stable = self.hoisted | frozenset(n.id for n in graph.nodes if isinstance(n.op, Param))
        self.schedule: list[Kernel] = []
        self.entries: list[ScheduleEntry] = []
        self.stale = True  # the prologue's values are out of date
        self.prologue_runs = 0
        self._build(params, inputs)

    def _view(self, n: Node) -> np.ndarray:
        slot = self.plan.slot(n.id)
        dims = n.shape.concrete(self.bindings)
        dt = n.dtype.np
        want = math.prod(dims) * dt.itemsize
        if slot.nbytes < want:
            raise AssertionError(f"plan gives %{n.id} {slot.nbytes} bytes, it needs {want}")
        return self.arena[slot.offset : slot.offset + want].view(dt).reshape(dims)

    def _hoisted(self) -> frozenset[NodeId]:
        """Param-derived nodes the plan keeps in its persistent region (the prologue)."""
        from rlx.backends.cpu.planner import param_derived_nodes

        top = self.plan.persistent_bytes
        keep = set(self.plan.keep_alive)
        return frozenset(
            nid
            for nid in param_derived_nodes(self.graph)
            if nid in keep and self.plan.slot(nid).offset + self.plan.slot(nid).nbytes <= top
        )

    def _build(self, params: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> None:
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
            (self.prologue if pro else self.schedule).append(fn)
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
        """Write a (checked, converted) param into its persistent slot; the prologue
        runs again before the next run."""
        view = self.param_views.get(name)
        if view is not None:
            np.copyto(view, value, casting="unsafe")
            self.stale = True

    def run_prologue(self) -> list[float]:
        """Compute the param-derived nodes now; returns each prologue kernel's seconds."""
        self.stale = True  # until every kernel has run
        times = self._run_timed(self.prologue, self.prologue_entries)
        for f in self.prepare:
            f()
        self.stale = False
        self.prologue_runs += 1
        return times

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run once on checked inputs (the prologue first when a param changed since the
        last run); returns fresh copies of the outputs."""
        if self.stale:
            self.run_prologue()
        for name, view in self.input_views:
            np.copyto(view, inputs[name], casting="unsafe")
        try:
            for f in self.schedule:
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
        pro = iter(self.run_prologue())
        for name, view in self.input_views:
            np.copyto(view, inputs[name], casting="unsafe")
        it = iter(self._run_timed(self.schedule, self.kernel_entries))
        times = [next(pro) if e.prologue else next(it) for e in self.entries if e.view_of is None]
        return [v.copy() for v in self.output_views], times

    def _run_timed(self, kernels: Sequence[Kernel], entries: Sequence[Any]) -> list[float]:
        """Call each kernel, timing it; an exception is annotated with its node."""
        times: list[float] = []
        clock = time.perf_counter
        for i, f in enumerate(kernels):
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
        return self.pool.nbytes
