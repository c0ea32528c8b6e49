"""An ``ExportedProgram`` -> an rlx Graph plus params. In: the program ``torch.export``
made, the names of its dynamic dims and whether it was decomposed. Out: the graph (MIR),
param name -> array (parameters and buffers, by module path), the user inputs' Shapes
and the output names.

Each FX node goes through the ATen table (``aten/``): the node's arguments are resolved
(tensors to node ids, SymInts to rlx dims), the converter builds rlx ops, and the result
is checked against torch's fake result (cast to its dtype; its shape must match, symbolic
dims included). The rlx nodes a converter made carry the model's source line (the
node's ``stack_trace``), so compile reports point at the PyTorch code."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from rlx.errors import RlxError
from rlx.frontends.torch.aten import lookup
from rlx.frontends.torch.context import NodeCtx, TVal, source_frame, where_from
from rlx.frontends.torch.dims import SymTable, to_dtype
from rlx.frontends.torch.errors import TorchImportError, TorchUnsupportedError
from rlx.ir.mir import Graph
from rlx.shape import Shape
from rlx.source import SourceLoc

__all__ = ["unmapped", "convert_program", "to_numpy"]

_PY_OPS = {operator.getitem}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy copy of ``t`` (bf16 through its bits)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


def _is_sym(v: Any) -> bool:
    return isinstance(v, torch.SymInt | int) and not isinstance(v, bool)


def unmapped(ep: ExportedProgram) -> list[Any]:
    """The call_function nodes of ``ep`` whose target has no converter (SymInt arithmetic
    and tuple indexing excepted)."""
    out = []
    for n in ep.graph.nodes:
        if n.op != "call_function" or n.target in _PY_OPS:
            continue
        if _is_sym(n.meta.get("val")):
            continue
        if lookup(n.target) is None:
            out.append(n)
    return out


def unsupported_error(node: Any) -> TorchUnsupportedError:
    path, cls, src = where_from(node)
    mod = f"module {path!r} ({cls})" if path else "the root module"
    from rlx.frontends.torch.aten import supported_aten_ops

    return TorchUnsupportedError(
        f"rlx has no mapping for ATen op {node.target} (node {node.name!r}, in {mod}"
        f"{', ' + src if src else ''}); rlx maps {len(supported_aten_ops())} ATen ops "
        "(rlx.frontends.torch.supported_aten_ops())",
        op=str(node.target),
        module_path=path,
        source=src,
    )


class _Converter:
    def __init__(self, ep: ExportedProgram, dim_names: Mapping[tuple[int, int], str], name: str):
        self.ep = ep
        self.g = Graph(name)
        self.syms = SymTable(self.g, ep.range_constraints)
        self.dim_names = dim_names
        self.env: dict[Any, Any] = {}
        self.params: dict[str, np.ndarray] = {}
        self.inputs: dict[str, Shape] = {}

    # ---- placeholders ---------------------------------------------------------------
    def placeholders(self) -> None:
        sig = self.ep.graph_signature
        nodes = {n.name: n for n in self.ep.graph.nodes if n.op == "placeholder"}
        state = dict(self.ep.state_dict)
        consts = dict(self.ep.constants)
        k = 0
        for spec in sig.input_specs:
            node = nodes.get(getattr(spec.arg, "name", ""))
            if node is None:
                continue
            if spec.kind is InputKind.USER_INPUT:
                self.user_input(node, k)
                k += 1
                continue
            target = spec.target
            value = state.get(target) if target in state else consts.get(target)
            if not isinstance(value, torch.Tensor):
                raise TorchImportError(
                    f"{spec.kind.name.lower()} {target!r} is not a tensor ({type(value).__name__})"
                )
            arr = to_numpy(value)
            shape = Shape(arr.shape, to_dtype(value.dtype, f"{spec.kind.name.lower()} {target!r}"))
            if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                self.params[target] = arr
                self.env[node] = TVal(self.g.param(target, shape))
            else:  # lifted tensor constants, custom objects
                self.env[node] = TVal(self.g.constant(arr))

    def user_input(self, node: Any, k: int) -> None:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            self.env[node] = (
                val if not isinstance(val, torch.SymInt) else self.syms.dim(val, node.name)
            )
            return
        for ax, d in enumerate(val.shape):
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                self.syms.declare(d.node.expr, self.dim_names.get((k, ax), f"{node.name}_{ax}"))
        dims = tuple(self.syms.dim(d, f"input {node.name!r}") for d in val.shape)
        shape = Shape(dims, to_dtype(val.dtype, f"input {node.name!r}"))
        self.inputs[node.name] = shape
        self.env[node] = TVal(self.g.input(node.name, shape))

    # ---- nodes ----------------------------------------------------------------------
    def resolve(self, node: Any, v: Any) -> Any:
        if isinstance(v, torch.fx.Node):
            if v not in self.env or self.env[v] is None:
                raise TorchImportError(
                    f"node {node.name!r} ({node.target}) uses {v.name!r}, a value rlx does not "
                    "compute (an unused result such as pooling indices or saved statistics)"
                )
            return self.env[v]
        if isinstance(v, list | tuple):
            return type(v)(self.resolve(node, a) for a in v)
        if isinstance(v, torch.SymInt):
            return self.syms.dim(v, node.name)
        if isinstance(v, torch.dtype | torch.device | torch.layout | torch.memory_format):
            return v
        return v

    def call(self, node: Any) -> None:
        val = node.meta.get("val")
        if node.target is operator.getitem:
            seq = self.resolve(node, node.args[0])
            self.env[node] = seq[node.args[1]]
            return
        if _is_sym(val):
            self.env[node] = self.syms.dim(val, node.name)
            return
        fn = lookup(node.target)
        if fn is None:
            raise unsupported_error(node)
        args = [self.resolve(node, a) for a in node.args]
        kwargs = {k: self.resolve(node, v) for k, v in node.kwargs.items()}
        ctx = NodeCtx(self.g, node, args, kwargs, self.syms)
        first = len(self.g.nodes)
        try:
            out = fn(ctx)
            out = self.check(ctx, out, val)
        except (TorchImportError, TorchUnsupportedError):
            raise
        except RlxError as e:
            raise ctx.error(f"{type(e).__name__}: {e}") from e
        self.stamp(node, first)
        self.env[node] = out

    def check(self, ctx: NodeCtx, out: Any, val: Any) -> Any:
        """``out`` as env values, cast to torch's dtypes, shapes checked against torch's."""
        if isinstance(val, torch.Tensor):
            if isinstance(out, tuple | list):
                out = out[0]
            return TVal(self.one(ctx, out, None))
        if isinstance(val, list | tuple):
            if not isinstance(out, tuple | list):
                out = (out,)
            return tuple(
                None if o is None else TVal(self.one(ctx, o, k)) for k, o in enumerate(out)
            )
        if val is None:
            return None
        raise ctx.unsupported(f"a result of type {type(val).__name__}")

    def one(self, ctx: NodeCtx, nid: int, k: int | None) -> int:
        want = ctx.out_shape(k)
        nid = ctx.cast(int(nid), want.dtype)
        got = ctx.shape(nid)
        if got.dims != want.dims:
            raise ctx.error(f"rlx computed {got} where torch computes {want}")
        return nid

    def stamp(self, node: Any, first: int) -> None:
        loc = source_frame(node)
        if loc is None:
            return
        file, line, func = loc
        for i in range(first, len(self.g.nodes)):
            n = self.g.nodes[i]
            old = n.loc
            new = SourceLoc(file, line, func, old.node if old else i, old.op if old else None)
            self.g.nodes[i] = replace(n, loc=new)

    def outputs(self) -> list[str]:
        sig = self.ep.graph_signature
        out_node = next(n for n in self.ep.graph.nodes if n.op == "output")
        vals = list(out_node.args[0])
        ids: list[int] = []
        names: list[str] = []
        for spec, v in zip(sig.output_specs, vals, strict=True):
            if spec.kind is not OutputKind.USER_OUTPUT:
                what = "buffer" if spec.kind is OutputKind.BUFFER_MUTATION else "input"
                raise TorchImportError(
                    f"the module's forward writes to {what} {spec.target!r} (e.g. BatchNorm "
                    "in training mode updating its running stats); call module.eval(), rlx "
                    "imports inference graphs"
                )
            r = self.env.get(v) if isinstance(v, torch.fx.Node) else v
            if not isinstance(r, TVal):
                raise TorchImportError(
                    f"output {len(ids)} ({getattr(v, 'name', v)!r}) is {type(r).__name__}, "
                    "not a tensor; rlx graphs return tensors"
                )
            ids.append(r.id)
            names.append(spec.arg.name)
        self.g.set_outputs(ids)
        return names


def convert_program(
    ep: ExportedProgram, dim_names: Mapping[tuple[int, int], str], name: str
) -> tuple[Graph, dict[str, np.ndarray], dict[str, Shape], list[str]]:
    """Convert ``ep`` (see the module docstring)."""
    c = _Converter(ep, dim_names, name)
    c.placeholders()
    for node in ep.graph.nodes:
        if node.op == "call_function":
            c.call(node)
        elif node.op == "get_attr":
            v = getattr(ep.graph_module, node.target)
            if not isinstance(v, torch.Tensor):
                raise TorchImportError(
                    f"attribute {node.target!r} is {type(v).__name__}, not a tensor"
                )
            c.env[node] = TVal(c.g.constant(to_numpy(v)))
        elif node.op not in ("placeholder", "output"):
            raise TorchImportError(f"node {node.name!r}: FX op {node.op!r} is not supported")
    names = c.outputs()
    c.g.verify()
    return c.g, c.params, c.inputs, names
