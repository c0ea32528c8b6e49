"""rlx: a machine-learning compiler and runtime for the CPU.

Build a graph (``rlx.Graph``) or a HIR module (``rlx.GraphModule.define``), evaluate it
with the reference interpreter (``graph.evaluate``), compile it with
``rlx.Session("cpu").compile(graph)`` and run it.
"""

from __future__ import annotations

import importlib
from typing import Any

from rlx import ops as _ops  # noqa: F401  (registers the built-in ops)
from rlx.dtype import DType, promote
from rlx.errors import RlxError
from rlx.ir.mir import Graph, Node
from rlx.shape import Shape, Sym, sym

__version__ = "0.1.0"

# Public names that live in heavier modules, imported on first use.
_LAZY: dict[str, str] = {
    "GraphModule": "rlx.ir.module",
    "GraphStage": "rlx.ir.module",
    "HirModule": "rlx.ir.hir",
    "FusionPolicy": "rlx.ir.hir",
    "Activation": "rlx.ops.fused",
    "LirModule": "rlx.ir.lir",
    "BufferPlan": "rlx.ir.lir",
    "save": "rlx.ir.serialize",
    "load": "rlx.ir.serialize",
    "Session": "rlx.runtime.session",
    "CompiledGraph": "rlx.runtime.compiled",
    "CompileOptions": "rlx.options",
    "Calibrator": "rlx.quant.calibrate",
    "CompilePipeline": "rlx.passes.pipeline",
    "PrecisionPolicy": "rlx.passes.precision",
    "quantize": "rlx.quant.api",
    "MaskKind": "rlx.ops.nn",
    "QuantScheme": "rlx.ops.quant",
    "register_custom_op": "rlx.ops.custom",
    "MaskType": "rlx.ops.nn",
    "PoolKind": "rlx.ops.nn",
    "FftKind": "rlx.ops.fft",
    "FftNorm": "rlx.ops.fft",
    "ReduceKind": "rlx.ops.reduce",
    "UnaryKind": "rlx.ops.elementwise",
    "BinaryKind": "rlx.ops.elementwise",
    "CompareKind": "rlx.ops.elementwise",
    "dumps": "rlx.ir.serialize",
    "loads": "rlx.ir.serialize",
    "BufferSlot": "rlx.ir.lir",
    "PlanStrategy": "rlx.ir.lir",
    "plan_memory": "rlx.backends.cpu.planner",
    "check_plan": "rlx.backends.cpu.plancheck",
    "Precision": "rlx.passes.precision",
    "FusionReport": "rlx.passes.report",
    "PercentileCalibrator": "rlx.quant.calibrate",
    "EntropyCalibrator": "rlx.quant.calibrate",
    "CalibrationMethod": "rlx.quant.calibrate",
    "calibrate": "rlx.quant.calibrate",
    "compile_cache_info": "rlx.runtime.session",
    "clear_compile_cache": "rlx.runtime.session",
    "native_cache_info": "rlx.backends.cpu.native",
    "clear_native_cache": "rlx.backends.cpu.native",
    "Report": "rlx.backends.cpu.report",
    "KernelKind": "rlx.backends.cpu.kernels",
    "QuantizeResult": "rlx.quant.api",
    "AccuracyReport": "rlx.quant.report",
    "QuantLowering": "rlx.quant.lower",
    "info": "rlx.info",
    "from_torch": "rlx.frontends.torch.export",
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
}
# Public sub-modules imported on first use: ``rlx.numpy`` and ``rlx.nn`` (the tracing
# front end), ``rlx.onnx`` and ``rlx.gguf`` (the importers, aliases of rlx.frontends.*;
# a ModelError names the extra when it is missing). Each is a real module, so
# ``import rlx.onnx`` works as well as the attribute.
_LAZY_MODULES = ("numpy", "nn", "onnx", "gguf")

__all__ = ["DType", "Graph", "Node", "RlxError", "Shape", "Sym", "promote", "sym", *_LAZY]
__all__ += list(_LAZY_MODULES)


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        value = importlib.import_module(f"rlx.{name}")
        globals()[name] = value
        return value
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rlx' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value
