"""rlx: a machine-learning compiler and runtime for the CPU.

Build a graph (``rlx.Graph``) or a HIR module (``rlx.GraphModule.define``), evaluate it
with the reference interpreter (``graph.evaluate``), compile it with
``rlx.Session("cpu").compile(graph)`` and run it.

The public surface is ``__all__`` (``dir(rlx)`` shows exactly it; docs/api.md says what
each name is). Everything else is reachable by its module path: ``rlx.ir.lir.BufferPlan``,
``rlx.quant.calibrate.Calibrator``, ``rlx.ops.nn.MaskKind``.
"""

import importlib as _importlib
import warnings as _warnings

from rlx import ops as _ops  # noqa: F401  (registers the built-in ops)
from rlx.dtype import DType
from rlx.errors import RlxError
from rlx.ir.mir import Graph
from rlx.shape import Shape, sym

__version__ = "0.1.0"

__all__ = [
    # build a model
    "Graph",
    "GraphModule",
    "Shape",
    "DType",
    "sym",
    "Activation",
    "register_custom_op",
    # compile and run it
    "Session",
    "CompiledGraph",
    "CompileOptions",
    "PrecisionPolicy",
    # keep it
    "save",
    "load",
    # quantize it
    "quantize",
    # trace Python functions
    "jit",
    "cond",
    "while_loop",
    "scan",
    "freeze",
    "numpy",
    "nn",
    # transform them
    "grad",
    "value_and_grad",
    "vjp",
    "jvp",
    "hvp",
    "vmap",
    # import models
    "onnx",
    "gguf",
    "from_torch",
    # errors and the environment
    "RlxError",
    "info",
]

# Public names that live in heavier modules, imported on first use.
_LAZY: dict[str, str] = {
    "GraphModule": "rlx.ir.module",
    "Activation": "rlx.ops.fused",
    "register_custom_op": "rlx.ops.custom",
    "Session": "rlx.runtime.session",
    "CompiledGraph": "rlx.runtime.compiled",
    "CompileOptions": "rlx.options",
    "PrecisionPolicy": "rlx.passes.precision",
    "save": "rlx.ir.serialize",
    "load": "rlx.ir.serialize",
    "quantize": "rlx.quant.api",
    "jit": "rlx.frontends.trace",
    "cond": "rlx.frontends.trace",
    "while_loop": "rlx.frontends.trace",
    "scan": "rlx.frontends.trace",
    "freeze": "rlx.frontends.trace",
    "grad": "rlx.autodiff",
    "value_and_grad": "rlx.autodiff",
    "vjp": "rlx.autodiff",
    "jvp": "rlx.autodiff",
    "hvp": "rlx.autodiff",
    "vmap": "rlx.autodiff",
    "from_torch": "rlx.frontends.torch.export",
}
# Public sub-modules imported on first use: ``rlx.numpy`` and ``rlx.nn`` (the tracing
# front end), ``rlx.onnx`` and ``rlx.gguf`` (the importers, aliases of rlx.frontends.*;
# a ModelError names the extra when it is missing). Each is a real module, so
# ``import rlx.onnx`` works as well as the attribute. ``rlx.info`` is the module
# rlx/info.py, which is callable: ``rlx.info()`` is ``rlx.info.info()`` (a name that is
# both a module and a function would be one or the other depending on import order).
_MODULES = ("numpy", "nn", "onnx", "gguf", "info")
# Names that left the public surface (before the curated API of issue 30): code written
# against them still runs, with a DeprecationWarning naming the module to import them from;
# they are not in __all__ or dir(rlx), and not cached here.
_MOVED: dict[str, str] = {
    "KernelKind": "rlx.backends.cpu.dispatch",
    "clear_native_cache": "rlx.backends.cpu.native",
    "native_cache_info": "rlx.backends.cpu.native",
    "check_plan": "rlx.backends.cpu.plancheck",
    "plan_memory": "rlx.backends.cpu.planner",
    "Report": "rlx.backends.cpu.report",
    "promote": "rlx.dtype",
    "FusionPolicy": "rlx.ir.hir",
    "HirModule": "rlx.ir.hir",
    "BufferPlan": "rlx.ir.lir",
    "BufferSlot": "rlx.ir.lir",
    "LirModule": "rlx.ir.lir",
    "PlanStrategy": "rlx.ir.lir",
    "Node": "rlx.ir.mir",
    "GraphStage": "rlx.ir.module",
    "dumps": "rlx.ir.serialize",
    "loads": "rlx.ir.serialize",
    "BinaryKind": "rlx.ops.elementwise",
    "CompareKind": "rlx.ops.elementwise",
    "UnaryKind": "rlx.ops.elementwise",
    "FftKind": "rlx.ops.fft",
    "FftNorm": "rlx.ops.fft",
    "MaskKind": "rlx.ops.nn",
    "MaskType": "rlx.ops.nn",
    "PoolKind": "rlx.ops.nn",
    "QuantScheme": "rlx.ops.quant",
    "ReduceKind": "rlx.ops.reduce",
    "CompilePipeline": "rlx.passes.pipeline",
    "Precision": "rlx.passes.precision",
    "FusionReport": "rlx.passes.report",
    "QuantizeResult": "rlx.quant.api",
    "CalibrationMethod": "rlx.quant.calibrate",
    "Calibrator": "rlx.quant.calibrate",
    "EntropyCalibrator": "rlx.quant.calibrate",
    "PercentileCalibrator": "rlx.quant.calibrate",
    "calibrate": "rlx.quant.calibrate",
    "QuantLowering": "rlx.quant.lower",
    "AccuracyReport": "rlx.quant.report",
    "clear_compile_cache": "rlx.runtime.session",
    "compile_cache_info": "rlx.runtime.session",
    "Sym": "rlx.shape",
}


def __getattr__(name: str) -> object:
    if name in _MODULES:
        value: object = _importlib.import_module(f"rlx.{name}")
    elif name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
    elif name in _MOVED:
        _warnings.warn(
            f"rlx.{name} is no longer part of rlx's public API (docs/api.md): use "
            f"'from {_MOVED[name]} import {name}'",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_importlib.import_module(_MOVED[name]), name)
    else:
        raise AttributeError(f"module 'rlx' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
