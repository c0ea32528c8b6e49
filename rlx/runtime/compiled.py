"""CompiledGraph: a compiled program plus its own params and arena, run many times.

In: a :class:`~rlx.backends.cpu.program.CpuProgram` (shared, possibly by several
CompiledGraphs through the compile cache) and params. Out: ``run(inputs)`` returns one
NumPy array per graph output.

Contract of ``run``:

* inputs are checked (names, shapes, dtypes, symbol bounds, optionally finiteness) and
  converted only where lossless (see :mod:`rlx.runtime.inputs`); they are never modified.
  A feed that needs no conversion (a dict of NumPy arrays of the declared dtypes) is
  remembered by its signature (names, dtypes, dims) once it passed: a later feed of the
  same signature skips the name / dtype / dim / bound checks and the symbol binding (the
  finiteness check, when on, still runs), any other feed gets the full check;
* the returned arrays are fresh copies: a later run does not overwrite them;
* a run that raises leaves the CompiledGraph usable;
* a new binding of the symbolic dims plans and builds a new schedule (a few ms: no
  arena is allocated and no weight copied), kept in an LRU (``options.max_shape_plans``);
  a binding seen before costs nothing extra, one evicted costs what a new one does.

Memory (:mod:`rlx.backends.cpu.memory`): the schedules of every shape share one
:class:`~rlx.backends.cpu.memory.ParamStore` (params, constants, prologue values) and
one :class:`~rlx.backends.cpu.memory.Workspace` (activations and kernel scratch, grown
to the largest plan in use; runs never overlap, see the lock below). A param is stored
as given when it is safe to read in place (a read-only, aligned, C-ordered array of its
dtype that no writable array shares: a memory-mapped safetensors file) and copied once
otherwise; kernels get read-only views of it.

Nodes that depend only on params and constants (e.g. the bf16 cast of an f32 weight that
auto mixed precision inserts) form each executor's prologue: ``set_param`` marks every
executor stale and the next run on it computes them (and lets kernels repack such
weights) before the main schedule; runs without a param change skip them.

Params are per CompiledGraph: compiling the same graph twice shares the optimized graph
and plans but gives each CompiledGraph its own params and workspace. One CompiledGraph runs
one call at a time (its arena is reused by every run). Thread safety: ``run``,
``set_param(s)`` and ``report`` hold a per-CompiledGraph lock, so calls from several
threads are serialised and each gets its own correct result. A lock rather than one arena
per thread: an arena per thread would multiply the memory (an arena is the whole
activation footprint) and the BLAS and native kernels already use every core, so two
runs at once would only compete for them. The uncontended lock costs 0.2-0.3 us per
run on one thread, against a 4 us run of a one-kernel graph (benchmarks/dispatch.py,
benchmarks/results/BENCHMARKS_dispatch.md). For parallel runs,
compile the graph again per thread (a compile-cache hit: the program is shared, the
arena is not).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.backends.cpu import threads
from rlx.backends.cpu.executor import Executor
from rlx.backends.cpu.memory import ParamStore, Workspace, check_param_dims
from rlx.backends.cpu.program import BindingKey, CpuProgram, binding_key
from rlx.errors import InputError
from rlx.ir.lir import BufferPlan, LirModule
from rlx.ir.mir import Graph, Node
from rlx.ops.core import Input, Param
from rlx.options import CompileOptions
from rlx.runtime.inputs import bind_inputs, check_dims, check_finite, to_array

if TYPE_CHECKING:
    from rlx.backends.cpu.report import Report

__all__ = ["CompiledGraph"]


def _named(graph: Graph, cls: type) -> dict[str, Node]:
    """Name -> node of ``graph``'s Input (or Param) nodes, in declaration order."""
    return {n.op.name: n for n in graph.nodes if isinstance(n.op, cls)}  # type: ignore[attr-defined]


class CompiledGraph:
    """A compiled graph bound to its params (see the module docstring)."""

    def __init__(
        self,
        program: CpuProgram,
        params: Mapping[str, Any] | None = None,
        options: CompileOptions | None = None,
    ):
        """``options``: the ones this compile was asked with (a cached program may have
        been compiled with options that differ only in run-time knobs such as
        ``max_shape_plans``); default: the program's."""
        self.program = program
        self.options = opts = options or program.options
        self.num_threads: int = threads.resolve_threads(opts.num_threads)
        self._lock = threading.RLock()
        self._live_inputs: dict[str, np.ndarray] = {}
        self._executors: OrderedDict[BindingKey, Executor] = OrderedDict()
        self._last: Executor | None = None
        self._profile: tuple[Executor, list[float]] | None = None  # last profiled run
        self._trusted_blas: tuple[Executor | None, int] = (None, 1)  # BLAS threads per executor
        self._input_nodes = _named(program.graph, Input)
        self._param_nodes = _named(program.graph, Param)
        self._source_inputs = _named(program.source, Input)
        self._source_params = _named(program.source, Param)
        self._unset: set[str] = set(self._param_nodes)  # read by the running graph, not set yet
        # feeds already checked: signature (see _signature) -> (binding key, bindings, whether
        # the feed also names inputs the optimized graph dropped)
        self._feeds: dict[tuple[Any, ...], tuple[BindingKey, dict[str, int], bool]] = {}
        self._feed_names = tuple(
            (name, name in self._input_nodes, node.dtype.np)
            for name, node in self._source_inputs.items()
        )
        probe = program.take_probe()
        if probe is not None and probe[0].workspace.shared:
            ex, _, live_inputs = probe
            self._store, self._workspace = ex.store, ex.workspace
            if opts.native_schedule != program.options.native_schedule:
                ex.use_native_schedule(opts.native_schedule)
            self._live_inputs = live_inputs
            self._executors[binding_key(ex.bindings)] = ex
            self._last = ex
        else:
            self._store = ParamStore(program.graph)
            self._workspace = Workspace()
        self._params = self._store.params
        if params:  # params frozen into constants by the compile are already in the graph
            self.set_params({k: v for k, v in params.items() if k not in program.frozen_params})

    # ---- metadata -------------------------------------------------------------------

    @property
    def graph(self) -> Graph:
        """The optimized graph that runs."""
        return self.program.graph

    @property
    def input_names(self) -> list[str]:
        """Names ``run`` accepts, in the order the source graph declared them."""
        return list(self._source_inputs)

    @property
    def param_names(self) -> list[str]:
        return list(self._source_params)

    @property
    def output_names(self) -> list[str]:
        """One name per output: the node it comes from in the source graph (``%id``), or
        the input/param name when an output is one."""
        names = []
        for o in self.program.source.outputs:
            op = self.program.source.nodes[o].op
            names.append(op.name if isinstance(op, (Input, Param)) else f"%{o}")  # type: ignore[attr-defined]
        return names

    @property
    def memory_plan(self) -> BufferPlan:
        """The buffer plan of the most recent run (or of the compile-time schedule)."""
        with self._lock:
            return self._executor_any().plan

    @property
    def shape_plans(self) -> list[dict[str, int]]:
        """The symbol bindings that have an arena and schedule, least recently used first."""
        return [dict(k) for k in self._executors]

    def _executor_any(self) -> Executor:
        if self._last is None:
            self._last = self._executor(self.program.probe_bindings())
        return self._last

    # ---- params ---------------------------------------------------------------------

    def set_param(self, name: str, value: Any) -> None:
        """Check and store one param. A writable array is copied (later changes to
        ``value`` do not leak in); a read-only one that no writable array shares (a
        memory-mapped file, an array whose ``writeable`` flag the caller cleared) is used
        in place and must not change afterwards."""
        with self._lock:
            self._set_param(name, value)

    def _set_param(self, name: str, value: Any) -> None:
        node = self._source_params.get(name)
        if node is None:
            raise InputError(
                f"unknown param {name!r}; params of graph {self.program.source.name!r}: {self.param_names}"
            )
        if name in self.program.frozen_params:
            raise InputError(
                f"param {name!r} was frozen into a constant at compile time (freeze_params=True); "
                f"compile again to change it",
                node=node.id,
                loc=node.loc,
            )
        arr = to_array("param", name, value, node.shape, node)
        check_dims("param", name, arr, node.shape, node)
        if self.options.check_finite:
            check_finite("param", name, arr, node)
        if name in self._param_nodes:
            # an array to_array made (a conversion) is ours: stored without a copy
            self._store.set(name, arr, fresh=arr is not value and arr.base is None)
        self._unset.discard(name)
        self._prune()

    def _prune(self) -> None:
        """Drop executors whose views point at moved bytes (rebuilt when next needed)."""
        for key in [k for k, ex in self._executors.items() if not ex.is_current()]:
            del self._executors[key]
        if self._last is not None and not self._last.is_current():
            self._last = None
        if self._profile is not None and not self._profile[0].is_current():
            self._profile = None

    def set_params(self, params: Mapping[str, Any]) -> None:
        """``set_param`` for each item (all names are checked before any is stored)."""
        unknown = [k for k in params if k not in self._source_params]
        if unknown:
            raise InputError(
                f"unknown params {unknown}; params of graph {self.program.source.name!r}: {self.param_names}"
            )
        with self._lock:
            for k, v in params.items():
                self._set_param(k, v)

    # ---- running --------------------------------------------------------------------

    def _check_inputs(
        self, inputs: Mapping[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        if not isinstance(inputs, Mapping):
            raise InputError(
                f"run() takes a dict of input name -> array, given {type(inputs).__name__}; inputs: {self.input_names}"
            )
        unknown = [k for k in inputs if k not in self._source_inputs]
        if unknown:
            raise InputError(
                f"unknown input(s) {unknown}; inputs of graph {self.program.source.name!r}: {self.input_names}"
            )
        missing = [k for k in self._input_nodes if k not in inputs]
        if missing:
            raise InputError(
                f"missing input(s) {missing}; inputs of graph {self.program.source.name!r}: {self.input_names}"
            )
        check = self.options.check_finite
        arrays: dict[str, np.ndarray] = {}
        for name, node in self._input_nodes.items():
            arr = to_array("input", name, inputs[name], node.shape, node)
            check_dims("input", name, arr, node.shape, node)
            if check:
                check_finite("input", name, arr, node)
            arrays[name] = arr
        if self._unset and (unset := [k for k in self._param_nodes if k in self._unset]):
            raise InputError(
                f"param(s) {unset} never set; call set_param/set_params (or pass params= to compile)",
                node=self._param_nodes[unset[0]].id,
                loc=self._param_nodes[unset[0]].loc,
            )
        if self.program.is_static:
            return arrays, {}
        return arrays, bind_inputs(arrays, self._input_nodes, self.program.graph.sym_bounds)

    def _executor(self, bindings: Mapping[str, int]) -> Executor:
        key = binding_key(bindings)
        ex = self._executors.get(key)
        if ex is not None and ex.is_current():
            self._executors.move_to_end(key)
            return ex
        bad = check_param_dims(self._store, bindings)
        if bad:
            name, want, given = bad[0]
            node = self._param_nodes[name]
            raise InputError(
                f"param {name!r}: expected {node.shape} = {want} with {dict(bindings)}, "
                f"given shape {given}",
                node=node.id,
                loc=node.loc,
            )
        plan = self.program.plan(bindings)
        ex = Executor(
            self.program.graph,
            plan,
            self._params,
            self._live_inputs,
            num_threads=self.num_threads,
            native=self.options.native,
            store=self._store,
            workspace=self._workspace,
            native_schedule=self.options.native_schedule,
            batch_invariant=self.options.batch_invariant,
        )
        self._executors[key] = ex
        self._executors.move_to_end(key)
        self._prune()  # the workspace may have grown
        while len(self._executors) > max(1, self.options.max_shape_plans):
            self._executors.popitem(last=False)
        return ex

    def run(self, inputs: Mapping[str, Any], *, profile: bool = False) -> list[np.ndarray]:
        """Run on ``inputs`` (name -> array/list/scalar); returns fresh output arrays.

        Arrays of another dtype are converted only when the cast is lossless (i8 -> f32,
        f32 -> f64; never f64 -> f32 or i32 -> f32); lists and Python scalars take the
        declared dtype when their kind fits. InputError otherwise (see
        :mod:`rlx.runtime.inputs`). With ``profile=True`` each kernel is timed (see
        :meth:`report`). Safe to call from several threads (serialised)."""
        with self._lock:
            return self._run(inputs, profile)

    def _signature(self, inputs: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """What makes a feed's check and binding: per source input (in declaration order)
        the dims of its array, or None when absent. None (the full check runs) unless
        ``inputs`` is a dict naming only inputs of the graph, with every input the
        optimized graph reads given as a NumPy array of exactly its declared dtype (the
        case where the check converts nothing)."""
        if type(inputs) is not dict:
            return None
        sig: list[Any] = []
        found = 0
        for name, used, dtype in self._feed_names:
            v = inputs.get(name)
            if v is None:
                if used:
                    return None
                sig.append(None)
                continue
            found += 1
            if used and (type(v) is not np.ndarray or v.dtype is not dtype):
                return None
            sig.append(v.shape if used else ())
        if found != len(inputs):
            return None
        return tuple(sig)

    def _remember_feed(self, sig: tuple[Any, ...], bindings: dict[str, int], extra: bool) -> None:
        """Record a feed signature whose full check passed (oldest dropped past a bound)."""
        feeds = self._feeds
        if len(feeds) >= max(16, 4 * self.options.max_shape_plans):
            del feeds[next(iter(feeds))]
        feeds[sig] = (binding_key(bindings), bindings, extra)

    def _checked(self, inputs: Mapping[str, Any]) -> tuple[Mapping[str, np.ndarray], Executor]:
        """The arrays to run and the executor of their binding. A feed whose signature
        (:meth:`_signature`) passed the full check before skips it: its names, dtypes and
        dims are those of that feed, so only the values (``check_finite``) are checked
        again. Any other feed gets the full check (InputError, nothing recorded)."""
        sig = self._signature(inputs)
        hit = self._feeds.get(sig) if sig is not None else None
        if hit is None:
            arrays, bindings = self._check_inputs(inputs)
            ex = self._executor(bindings)
            if sig is not None and not self._unset:
                self._remember_feed(sig, bindings, len(arrays) != len(inputs))
            return arrays, ex
        key, bound, extra = hit
        feed: Mapping[str, np.ndarray] = inputs
        if extra:
            feed = {name: inputs[name] for name in self._input_nodes}
        if self.options.check_finite:
            for name, node in self._input_nodes.items():
                check_finite("input", name, feed[name], node)
        known = self._executors.get(key)
        if known is None or not known.is_current():
            known = self._executor(bound)
        elif known is not self._last:
            self._executors.move_to_end(key)
        return feed, known

    def _blas_threads(self, ex: Executor) -> None:
        """Set the BLAS thread count ``ex`` wants (worked out once per executor)."""
        blas = self._trusted_blas
        if blas[0] is not ex:
            blas = self._trusted_blas = (ex, threads.blas_threads_for(self.num_threads, ex))
        threads.ensure_blas_threads(blas[1])

    def _run(self, inputs: Mapping[str, Any], profile: bool) -> list[np.ndarray]:
        arrays, ex = self._checked(inputs)
        self._last = ex
        live = self._live_inputs
        live.clear()
        live.update(arrays)
        self._blas_threads(ex)
        if ex.quiet and not profile and not ex.stale:
            return ex.run(arrays)  # C kernels only: nothing for np.errstate to silence
        with np.errstate(all="ignore"):
            if profile:
                outs, times = ex.run_profiled(arrays)
                self._profile = (ex, times)
                return outs
            return ex.run(arrays)

    __call__ = run

    def run_trusted(
        self, arrays: Mapping[str, np.ndarray], bindings: Mapping[str, int]
    ) -> list[np.ndarray]:
        """``run`` for a caller that checked the inputs itself: every input given, an array
        of its declared dtype and dims, ``bindings`` the symbol values those dims give
        (``rlx.jit``, whose cache key is that check). Skips ``run``'s per-input checks
        (about 30 us of a 45 us call of a three-node graph); params must be set."""
        with self._lock:
            if self._unset:
                return self._run(arrays, False)  # raises the missing-param error
            ex = self._executor(bindings)
            self._last = ex
            live = self._live_inputs
            live.clear()
            live.update(arrays)
            self._blas_threads(ex)
            if ex.quiet and not ex.stale:
                return ex.run(arrays)
            with np.errstate(all="ignore"):
                return ex.run(arrays)

    # ---- introspection --------------------------------------------------------------

    def inspect(self) -> str:
        """The optimized graph with each node's arena slot, then the plan summary."""
        return LirModule(self.program.graph, self.memory_plan).inspect()

    def to_html(self, path: str | None = None, **kw: Any) -> str:
        """One self-contained HTML page of the compiled graph: fused kernels coloured by
        fusion group, each node's precision and kernel, the memory plan of the most
        recent run as a timeline; written to ``path`` when given. Options:
        :func:`rlx.viz.compiled_to_html` (``engine``, ``expand``)."""
        from rlx.viz import compiled_to_html

        return compiled_to_html(self, path, **kw)

    def report(self) -> Report:
        """Kernel schedule, memory figures and pass records of the most recent run's
        shape, with each kernel's time when that run was profiled."""
        from rlx.backends.cpu.report import Report

        with self._lock:
            ex = self._executor_any()
            prof = self._profile
        times = prof[1] if prof is not None and prof[0] is ex else None
        return Report.build(self.program, ex, times)

    def __repr__(self) -> str:
        p = self.program
        return (
            f"<CompiledGraph {p.source.name!r} on {p.backend}: {len(p.graph)} nodes, "
            f"inputs={self.input_names}, outputs={self.output_names}>"
        )
