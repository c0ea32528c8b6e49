"""``rlx.from_torch(module, example_inputs, dynamic_shapes=...) -> TorchModel``.

In: an ``nn.Module`` (in eval mode), example inputs, and optionally ``dynamic_shapes`` as
``torch.export.export`` takes them (``torch.export.Dim("batch", max=64)`` on an axis makes
it an rlx symbolic dim named ``batch``). Out: a :class:`TorchModel`, as ``rlx.onnx.load``
returns an ``OnnxModel``: the graph (a GraphModule at MIR stage), the params (parameters
and buffers by module path), the inputs' Shapes and the output names, plus ``compile()``
and ``run(*tensors)``.

Steps: ``torch.export.export`` (PyTorch is imported here only, never by ``import rlx``);
the exported ATen graph goes through the one ATen table (``aten/``). Ops that rlx has as
one fused op (linear, layer_norm, scaled_dot_product_attention, gelu, silu, conv2d,
batch_norm, pooling, embedding, softmax, rms_norm ...) are mapped as exported; when the
graph holds an op without a mapping, the program is decomposed to the core ATen set
(``run_decompositions``, keeping every op the table maps) and mapped again; an op still
without a mapping is a :class:`TorchUnsupportedError` naming it, the module path that
called it and its source line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from rlx.frontends.torch.errors import TorchImportError
from rlx.ir.mir import Graph
from rlx.ir.module import GraphModule
from rlx.shape import Shape

__all__ = ["TorchModel", "from_torch"]


def _import_torch() -> Any:
    try:
        import torch
        import torch.export  # noqa: F401
    except ImportError as e:
        raise TorchImportError(
            "rlx.from_torch needs PyTorch, which is not installed: pip install 'rlx[torch]' "
            "(the torch extra)"
        ) from e
    return torch


@dataclass(frozen=True)
class TorchModel:
    """An imported PyTorch module: ``module`` (MIR), ``params`` (parameter / buffer path ->
    array), ``inputs`` (input name -> Shape, symbolic dims included), ``outputs`` (output
    names, in order), ``decomposed`` (whether the core-ATen decomposition ran) and
    ``num_threads`` (the default of :meth:`compile`)."""

    module: GraphModule
    params: Mapping[str, np.ndarray]
    inputs: Mapping[str, Shape]
    outputs: tuple[str, ...]
    decomposed: bool = False
    num_threads: int | None = None
    _compiled: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def graph(self) -> Graph:
        return self.module.into_graph()

    def compile(self, options: Any = None, **kw: Any) -> Any:
        """A CompiledGraph for the CPU with the params set (``kw``: CompileOptions fields;
        ``num_threads`` defaults to the one given to ``from_torch``)."""
        from rlx.options import CompileOptions
        from rlx.runtime.session import Session

        if options is None:
            kw.setdefault("num_threads", self.num_threads)
            options = CompileOptions(**kw)
        return Session("cpu").compile(self.module, options, params=dict(self.params))

    def run(self, *args: Any) -> list[np.ndarray]:
        """Run on tensors (torch tensors or arrays, in the order of the module's inputs):
        one array per output. Compiles on first use with the default options."""
        leaves = _flat_tensors(args)
        if len(leaves) != len(self.inputs):
            raise TorchImportError(
                f"run() takes {len(self.inputs)} tensors ({', '.join(self.inputs)}), given "
                f"{len(leaves)}"
            )
        cg = self._compiled.get("cpu")
        if cg is None:
            cg = self._compiled["cpu"] = self.compile()
        return cg.run(dict(zip(self.inputs, leaves, strict=True)))

    def __repr__(self) -> str:
        ins = ", ".join(f"{k}: {v}" for k, v in self.inputs.items())
        return f"TorchModel({ins} -> {list(self.outputs)}, {len(self.params)} params)"


def _flat_tensors(args: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for a in args:
        if isinstance(a, dict):
            out.extend(_flat_tensors(list(a.values())))
        elif isinstance(a, list | tuple):
            out.extend(_flat_tensors(a))
        elif isinstance(a, np.ndarray):
            out.append(a)
        elif type(a).__module__.startswith("torch"):
            from rlx.frontends.torch.program import to_numpy

            out.append(to_numpy(a))
    return out


def _mutates(op: Any) -> bool:
    """In-place ATen ops (``add_``): functionalisation in run_decompositions removes them."""
    schema = getattr(op, "_schema", None)
    return bool(getattr(schema, "is_mutable", False))


def _check_mutations(ep: Any, module: Any) -> None:
    sig = ep.graph_signature
    mutated = {**sig.buffers_to_mutate, **sig.user_inputs_to_mutate}
    if mutated:
        raise TorchImportError(
            f"{type(module).__name__}.forward writes to {sorted(mutated.values())} (e.g. "
            "BatchNorm in training mode updating its running stats); call module.eval(): "
            "rlx imports inference graphs"
        )


def from_torch(
    module: Any,
    example_inputs: Any,
    dynamic_shapes: Any = None,
    *,
    num_threads: int | None = None,
    strict: bool = False,
    name: str | None = None,
) -> TorchModel:
    """Import ``module`` through ``torch.export`` (see the module docstring).
    ``example_inputs`` is a tensor or a tuple of positional inputs; ``dynamic_shapes`` and
    ``strict`` go to ``torch.export.export``; ``num_threads`` is the default of
    ``TorchModel.compile``."""
    torch = _import_torch()
    from rlx.frontends.torch.aten import lookup
    from rlx.frontends.torch.dims import dim_names
    from rlx.frontends.torch.program import convert_program, unmapped, unsupported_error

    if not isinstance(module, torch.nn.Module):
        raise TorchImportError(f"from_torch takes a torch.nn.Module, given {type(module).__name__}")
    args = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
    try:
        ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as e:  # torch raises many types here; the message is what helps
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()][:3]
        why = " ".join(lines)[:600] or type(e).__name__
        if "Constraints violated" in why:
            why += (
                " (torch.export specializes an example size of 0 or 1: give the example "
                "inputs sizes >= 2 on their dynamic axes)"
            )
        raise TorchImportError(
            f"torch.export.export failed for {type(module).__name__}: {type(e).__name__}: {why}"
        ) from e
    _check_mutations(ep, module)
    decomposed = False
    missing = unmapped(ep)
    if missing:
        table = torch.export.default_decompositions()
        for op in list(table.keys()):
            if lookup(op) is not None:
                table.pop(op)
        final = [n for n in missing if n.target not in table and not _mutates(n.target)]
        if final:  # a core ATen op: decomposing would not remove it
            raise unsupported_error(final[0])
        try:
            ep = ep.run_decompositions(table)
        except Exception as e:
            raise unsupported_error(missing[0]) from e
        decomposed = True
        _check_mutations(ep, module)
        missing = unmapped(ep)
        if missing:
            raise unsupported_error(missing[0])
    names = dim_names(module.forward, args, dynamic_shapes)
    g, params, inputs, outs = convert_program(ep, names, name or type(module).__name__)
    return TorchModel(
        module=GraphModule.from_graph(g),
        params=MappingProxyType(params),
        inputs=MappingProxyType(inputs),
        outputs=tuple(outs),
        decomposed=decomposed,
        num_threads=num_threads,
    )
