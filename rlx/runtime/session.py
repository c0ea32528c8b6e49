"""Session: the one entry point from a model to something that runs.

In: a backend name, then a Graph (MIR) or GraphModule, CompileOptions and optional params.
Out: a :class:`~rlx.runtime.compiled.CompiledGraph`.

``Session("cpu").compile(g)`` lowers the model to MIR, runs the CompilePipeline, plans the
arena and builds the kernel schedule. Compiles are cached in-process by (graph
fingerprint, ``options.cache_key()``, backend, params digest): compiling an equal graph
again returns a new CompiledGraph sharing the compiled program (its own params and arena).
``compile_cache_info()`` and ``clear_compile_cache()`` inspect and empty that cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlx.backends.cpu import threads
from rlx.backends.cpu.cache import CacheInfo, CompileCache, params_digest
from rlx.backends.cpu.program import CpuProgram, compile_program
from rlx.errors import CompileError, InputError
from rlx.ir.mir import Graph
from rlx.options import CompileOptions
from rlx.passes.pipeline import to_mir
from rlx.runtime.compiled import CompiledGraph
from rlx.runtime.inputs import check_dims, to_array

__all__ = ["Session", "compile_cache_info", "clear_compile_cache", "available_backends"]

BackendCompiler = Callable[
    [Any, CompileOptions, "Mapping[str, np.ndarray] | None", str], CpuProgram
]
_BACKENDS: dict[str, BackendCompiler] = {"cpu": compile_program}
_CACHE = CompileCache()


def available_backends() -> list[str]:
    """Names ``Session`` accepts."""
    return sorted(_BACKENDS)


def compile_cache_info() -> CacheInfo:
    """Hits, misses and size of the process-wide compile cache."""
    return _CACHE.info()


def clear_compile_cache() -> None:
    """Forget every cached compile (and reset the counters)."""
    _CACHE.clear()


def _checked_params(graph: Graph, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``params`` as arrays of the declared dtypes, checked against ``graph``'s param nodes
    (names, dtypes, static dims) before any pass sees them."""
    nodes = {n.op.name: n for n in graph.param_nodes()}  # type: ignore[attr-defined]
    unknown = [k for k in params if k not in nodes]
    if unknown:
        raise InputError(f"unknown params {unknown}; params of graph {graph.name!r}: {list(nodes)}")
    out = {}
    for k, v in params.items():
        n = nodes[k]
        arr = to_array("param", k, v, n.shape, n)
        check_dims("param", k, arr, n.shape, n)
        out[k] = arr
    return out


class Session:
    """A backend to compile for: ``Session("cpu")``."""

    def __init__(self, backend: str = "cpu"):
        if backend not in _BACKENDS:
            raise CompileError(
                f"unknown backend {backend!r}; available backends: {available_backends()}"
            )
        self.backend = backend

    def compile(
        self,
        graph_or_module: Any,
        options: CompileOptions | None = None,
        *,
        params: Mapping[str, Any] | None = None,
    ) -> CompiledGraph:
        """Compile a Graph or GraphModule (any stage) into a :class:`CompiledGraph`.

        ``params`` (param name -> array) are set on the result (and given to the passes,
        which fold them when ``options.freeze_params``). Raises CompileError for bad
        options or a failing pass, VerifyError for a malformed graph, InputError for a
        param of the wrong name, shape or dtype."""
        options = options or CompileOptions()
        if not isinstance(options, CompileOptions):
            raise CompileError(f"options must be a CompileOptions, given {type(options).__name__}")
        if options.max_shape_plans < 1:
            raise CompileError(
                f"options.max_shape_plans must be >= 1, given {options.max_shape_plans}"
            )
        threads.resolve_threads(options.num_threads)  # CompileError / clamp warning now
        graph = to_mir(graph_or_module)
        if params is not None and not isinstance(params, Mapping):
            raise InputError(
                f"compile(params=...) takes a dict of param name -> array, given "
                f"{type(params).__name__}; params of graph {graph.name!r}: {graph.param_names}"
            )
        np_params = _checked_params(graph, params) if params else None
        # the params' digest reads every weight byte (about 0.6 s per GB): only for the cache
        key = (
            (graph.fingerprint(), options.cache_key(), self.backend, params_digest(np_params))
            if options.use_cache
            else None
        )
        prog = _CACHE.get(key) if key is not None else None
        if prog is None:
            prog = _BACKENDS[self.backend](graph, options, np_params, self.backend)
            if key is not None:
                _CACHE.put(key, prog)
        compiled = CompiledGraph(prog, params, options)
        if options.verbose:
            print(compiled.report())
        return compiled

    def __repr__(self) -> str:
        return f"Session({self.backend!r})"
