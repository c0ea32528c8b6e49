"""The compiled artifact of the CPU backend. In: a Graph or GraphModule, CompileOptions
and optional params. Out: a :class:`CpuProgram`: the optimized MIR graph, the pass
records, and the buffer plans per symbol binding (an LRU of ``options.max_shape_plans``).

A program holds no arena and no params: those belong to each CompiledGraph, so the
compile cache can hand one program to several CompiledGraphs. The executor built at
compile time (the probe) comes with its own ParamStore and Workspace, which the first
CompiledGraph made from the program adopts; params given to the compile are set in that
ParamStore before the probe is built, so it never allocates zero-filled storage for them
(for a model whose weights are a file mapping that storage would be a second copy of the
model, left resident in the heap). Compiling builds one
schedule (the static shape, or every symbol at its lower bound) so an op the backend
cannot run fails here, at compile time, listing every such node.

The binding-independent part of planning (schedule, aliases, lifetimes) is done once
(:class:`~rlx.backends.cpu.planner.PlanTemplate`); a new binding only sizes and places
the buffers. Every plan puts the graph's param-derived nodes (``hoisted``: see
:func:`~rlx.backends.cpu.planner.param_derived_nodes`) in its persistent region, so each
executor computes them in its prologue, once per param change, not once per run.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx.backends.cpu.executor import Executor
from rlx.backends.cpu.memory import ParamStore, Workspace
from rlx.backends.cpu.planner import PlanTemplate, param_derived_nodes
from rlx.ir.lir import BufferPlan
from rlx.ir.mir import Graph
from rlx.ops.core import Input, Param
from rlx.options import CompileOptions
from rlx.passes.pipeline import CompilePipeline, CompileResult, to_mir
from rlx.shape import Shape

__all__ = ["CpuProgram", "BindingKey", "compile_program", "binding_key"]

BindingKey = tuple[tuple[str, int], ...]


def binding_key(bindings: Mapping[str, int]) -> BindingKey:
    """A hashable, order-independent key for a set of symbol bindings."""
    return tuple(sorted(bindings.items()))


@dataclass
class CpuProgram:
    """What ``compile`` produced (see the module docstring).

    source: the graph as given (its input/param names and outputs are the user's API).
    graph: the optimized graph that runs.
    result: the pipeline's CompileResult (pass records, fusion and precision reports).
    is_static: no symbolic dim anywhere (one plan serves every run).
    hoisted: the param-derived nodes every plan keeps persistent (the prologue).
    """

    source: Graph
    graph: Graph
    result: CompileResult
    options: CompileOptions
    backend: str
    compile_seconds: float
    input_shapes: dict[str, Shape]
    param_shapes: dict[str, Shape]
    frozen_params: frozenset[str]
    is_static: bool = True
    hoisted: frozenset[int] = frozenset()
    _plans: OrderedDict[BindingKey, BufferPlan] = field(default_factory=OrderedDict)
    _probe: tuple[Executor, dict[str, np.ndarray], dict[str, np.ndarray]] | None = None
    _template: PlanTemplate | None = None
    plan_builds: int = 0
    # CompiledGraphs on several threads share one program: plan() and take_probe() lock.
    _lock: Any = field(default_factory=threading.Lock, repr=False, compare=False)

    def plan(self, bindings: Mapping[str, int]) -> BufferPlan:
        """The buffer plan for ``bindings`` (planned on first use, then cached LRU)."""
        with self._lock:
            return self._plan(bindings)

    def _plan(self, bindings: Mapping[str, int]) -> BufferPlan:
        key = binding_key(bindings)
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            return plan
        if self._template is None:
            self._template = PlanTemplate(self.graph, persistent=self.hoisted)
        plan = self._template.plan(bindings)
        self.plan_builds += 1
        self._plans[key] = plan
        while len(self._plans) > max(1, self.options.max_shape_plans):
            self._plans.popitem(last=False)
        return plan

    def cached_bindings(self) -> list[BindingKey]:
        return list(self._plans)

    def take_probe(self) -> tuple[Executor, dict[str, np.ndarray], dict[str, np.ndarray]] | None:
        """The executor built at compile time with its live param/input dicts (once)."""
        with self._lock:
            probe, self._probe = self._probe, None
        return probe

    def probe_bindings(self) -> dict[str, int]:
        """Every symbol at its declared lower bound (1 when undeclared)."""
        names: set[str] = set()
        for n in self.graph.nodes:
            names |= n.shape.symbols
        return {s: self.graph.sym_bounds.get(s, (1, None))[0] for s in sorted(names)}


def compile_program(
    graph_or_module: Any,
    options: CompileOptions,
    params: Mapping[str, np.ndarray] | None,
    backend: str = "cpu",
) -> CpuProgram:
    """Lower, optimize, plan and build one schedule (raising UnsupportedOpError there)."""
    t0 = time.perf_counter()
    source = to_mir(graph_or_module)
    source.verify()
    result = CompilePipeline(options, params=params).run(source)
    graph = result.graph
    input_shapes = {n.op.name: n.shape for n in graph.nodes if isinstance(n.op, Input)}
    param_shapes = {n.op.name: n.shape for n in graph.nodes if isinstance(n.op, Param)}
    source_params = {n.op.name for n in source.nodes if isinstance(n.op, Param)}
    frozen = frozenset(source_params - set(param_shapes)) if options.freeze_params else frozenset()
    prog = CpuProgram(
        source=source,
        graph=graph,
        result=result,
        options=options,
        backend=backend,
        compile_seconds=0.0,
        input_shapes=input_shapes,
        param_shapes=param_shapes,
        frozen_params=frozen,
        is_static=all(n.shape.is_static for n in graph.nodes),
        hoisted=param_derived_nodes(graph),
    )
    live_inputs: dict[str, np.ndarray] = {}
    store = ParamStore(graph)
    if params:  # seeded: the probe reads the given arrays, no zero-filled stand-ins
        for name, arr in params.items():
            if name in param_shapes:
                store.set(name, arr)
    probe = Executor(
        graph,
        prog.plan(prog.probe_bindings()),
        store.params,
        live_inputs,
        num_threads=options.num_threads,
        native=options.native,
        store=store,
        workspace=Workspace(),
        native_schedule=options.native_schedule,
        batch_invariant=options.batch_invariant,
    )
    prog._probe = (probe, store.params, live_inputs)
    prog.compile_seconds = time.perf_counter() - t0
    return prog
