"""What an ATen converter sees of one node of the exported FX graph. In: the node, the
values of its arguments (tensors as :class:`TVal` wrapping rlx node ids, SymInts as rlx
dims, Python scalars and lists as they are) and the node's ``meta['val']`` (torch's fake
result: the output dtype and shape). Out: helpers to read tensor inputs as node ids, turn
scalars into constants, read the expected output shape/dtype, and raise errors that name
the op, the module path and the source line."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlx.dtype import DType
from rlx.frontends.torch.dims import SymTable, to_dtype
from rlx.frontends.torch.errors import TorchImportError, TorchUnsupportedError
from rlx.ir.mir import Graph
from rlx.ops.elementwise import Cast
from rlx.shape import Shape

__all__ = ["TVal", "NodeCtx", "where_from"]


@dataclass(frozen=True, slots=True)
class TVal:
    """A tensor value of the FX graph: the rlx node id holding it."""

    id: int


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def source_frame(node: Any) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of the innermost frame of the node's ``stack_trace``
    outside torch itself (the model's code), or None."""
    trace = node.meta.get("stack_trace") or ""
    found = None
    for ln in trace.splitlines():
        ln = ln.strip()
        if not ln.startswith("File "):
            continue
        parts = ln.split('"')  # File "x.py", line 12, in forward
        try:
            rest = parts[2].split(",")
            frame = (parts[1], int(rest[1].strip().removeprefix("line ")), rest[2].strip()[3:])
        except (IndexError, ValueError):
            continue
        if not frame[0].startswith(_TORCH_DIR) or found is None:
            found = frame
    return found


def where_from(node: Any) -> tuple[str, str, str]:
    """``(module path, module class, 'file:line')`` of an FX node ('' when unknown)."""
    stack = node.meta.get("nn_module_stack") or {}
    path, cls = "", ""
    if stack:
        path, cls = list(stack.values())[-1]
        cls = cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))
    frame = source_frame(node)
    src = f"{frame[0]}:{frame[1]}" if frame else ""
    return path, cls.rsplit(".", 1)[-1], src


class NodeCtx:
    """One FX node being converted: ``ctx.t(i)`` (tensor argument i as a node id),
    ``ctx.arg(i, default)`` / ``ctx.kw(name, default)`` (resolved arguments),
    ``ctx.out_shape()`` / ``ctx.out_dtype`` (torch's result), ``ctx.g`` (the rlx Graph)."""

    def __init__(
        self, g: Graph, node: Any, args: Sequence[Any], kwargs: dict[str, Any], syms: SymTable
    ):
        self.g = g
        self.node = node
        self.args = list(args)
        self.kwargs = kwargs
        self.syms = syms
        self.op = str(node.target)

    # ---- arguments --------------------------------------------------------------------
    def arg(self, i: int, default: Any = None, name: str | None = None) -> Any:
        """Positional argument ``i`` (or keyword ``name``), else ``default``."""
        if i < len(self.args):
            return self.args[i]
        if name is not None and name in self.kwargs:
            return self.kwargs[name]
        return default

    def kw(self, name: str, default: Any = None) -> Any:
        return self.kwargs.get(name, default)

    def t(self, i: int, name: str | None = None) -> int:
        """Tensor argument ``i`` as a node id."""
        v = self.arg(i, None, name)
        if not isinstance(v, TVal):
            raise self.unsupported(f"argument {i} is {v!r}, expected a tensor")
        return v.id

    def opt_t(self, i: int, name: str | None = None) -> int | None:
        v = self.arg(i, None, name)
        return v.id if isinstance(v, TVal) else None

    def shape(self, nid: int) -> Shape:
        return self.g.shape(nid)

    def dtype(self, nid: int) -> DType:
        return self.g.shape(nid).dtype

    # ---- the expected result ----------------------------------------------------------
    def meta(self, k: int | None = None) -> Any:
        v = self.node.meta.get("val")
        return v if k is None else v[k]

    def out_shape(self, k: int | None = None) -> Shape:
        """The rlx Shape of the node's (k-th) result, from torch's fake tensor."""
        v = self.meta(k)
        if not isinstance(v, torch.Tensor):
            raise self.error(f"result {k or 0} is {type(v).__name__}, expected a tensor")
        dims = tuple(self.syms.dim(d, f"{self.op} result") for d in v.shape)
        return Shape(dims, to_dtype(v.dtype, f"{self.op} result"))

    @property
    def out_dtype(self) -> DType:
        v = self.meta()
        v = v[0] if isinstance(v, list | tuple) else v
        return to_dtype(v.dtype, f"{self.op} result")

    # ---- builders ---------------------------------------------------------------------
    def const(self, value: Any, dtype: DType) -> int:
        """A constant node holding ``value`` as ``dtype``."""
        return self.g.constant(np.asarray(value, dtype=dtype.np))

    def cast(self, x: int, to: DType) -> int:
        return x if self.dtype(x) is to else self.g.apply(Cast(to), [x])

    def operand(self, v: Any, dtype: DType) -> int:
        """Tensor or Python scalar ``v`` as a node id of ``dtype``."""
        if isinstance(v, TVal):
            return self.cast(v.id, dtype)
        if isinstance(v, bool | int | float):
            return self.const(v, dtype)
        raise self.unsupported(f"operand {v!r} is neither a tensor nor a number")

    # ---- errors -----------------------------------------------------------------------
    def where(self) -> str:
        path, cls, src = where_from(self.node)
        mod = f"module {path!r} ({cls})" if path else "the root module"
        return f"{mod}{', ' + src if src else ''}"

    def unsupported(self, why: str) -> TorchUnsupportedError:
        path, _, src = where_from(self.node)
        return TorchUnsupportedError(
            f"ATen op {self.op} (node {self.node.name!r}, in {self.where()}): {why}",
            op=self.op,
            module_path=path,
            source=src,
        )

    def error(self, why: str) -> TorchImportError:
        return TorchImportError(
            f"ATen op {self.op} (node {self.node.name!r}, in {self.where()}): {why}"
        )
