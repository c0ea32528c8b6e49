"""torch dtypes and symbolic sizes -> rlx. In: ``torch.dtype`` objects, the SymInts of an
exported graph's ``meta['val']`` (sympy expressions over torch's shape symbols) and the
user's ``dynamic_shapes``. Out: :class:`~rlx.dtype.DType` values and rlx dims (ints or
:class:`~rlx.shape.Sym` monomials named after the user's ``torch.export.Dim`` names)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rlx.dtype import DType
from rlx.frontends.torch.errors import TorchImportError
from rlx.ir.mir import Graph
from rlx.shape import Dim, Sym

__all__ = ["to_dtype", "to_torch_dtype", "SymTable", "dim_names"]

_DTYPES: dict[torch.dtype, DType] = {
    torch.float32: DType.F32,
    torch.float16: DType.F16,
    torch.bfloat16: DType.BF16,
    torch.float64: DType.F64,
    torch.int8: DType.I8,
    torch.int16: DType.I16,
    torch.int32: DType.I32,
    torch.int64: DType.I64,
    torch.uint8: DType.U8,
    torch.uint32: DType.U32,
    torch.bool: DType.BOOL,
    torch.complex64: DType.C64,
    torch.float8_e4m3fn: DType.F8E4M3,
    torch.float8_e5m2: DType.F8E5M2,
}
_BACK = {v: k for k, v in _DTYPES.items()}


def to_dtype(dt: torch.dtype, what: str) -> DType:
    """The rlx DType of torch dtype ``dt``; ``what`` names the tensor in the error."""
    try:
        return _DTYPES[dt]
    except KeyError:
        have = ", ".join(str(d).removeprefix("torch.") for d in _DTYPES)
        raise TorchImportError(
            f"{what}: torch dtype {dt} has no rlx dtype (rlx has {have})"
        ) from None


def to_torch_dtype(dt: DType) -> torch.dtype:
    """The torch dtype of rlx DType ``dt``."""
    return _BACK[dt]


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else f"d_{out}"


def dim_names(fn: Callable[..., Any], args: Sequence[Any], spec: Any) -> dict[tuple[int, int], str]:
    """``(flat tensor input index, axis) -> Dim name`` from a ``dynamic_shapes`` spec (a
    tuple/list aligned with ``args``, or a dict keyed by ``fn``'s parameter names; each
    entry a ``{axis: Dim}`` dict or a per-axis tuple). Unnamed dims are left out."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        params = list(inspect.signature(fn).parameters)
        spec = [spec.get(p) for p in params[: len(args)]]
    out: dict[tuple[int, int], str] = {}
    k = 0
    for a, s in zip(args, spec, strict=False):
        leaves, _ = torch.utils._pytree.tree_flatten(a)
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        per = s if isinstance(s, list | tuple) and len(tensors) > 1 else [s]
        for j, t in enumerate(tensors):
            ts = per[j] if j < len(per) else None
            items = ts.items() if isinstance(ts, Mapping) else enumerate(ts or ())
            for ax, d in items:
                name = getattr(d, "__name__", None)
                if isinstance(name, str) and isinstance(ax, int):
                    out[(k + j, ax % max(t.dim(), 1))] = _ident(name)
        k += len(tensors)
    return out


def _finite(v: Any) -> int | None:
    """A range bound as an int, or None when infinite (sympy's oo, torch's int_oo)."""
    try:
        i = int(v)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return i if abs(i) < 2**62 else None


class SymTable:
    """torch shape symbols (``s0``, ``s77``) -> rlx symbolic dims declared on ``g`` with the
    bounds of the exported program's range constraints."""

    def __init__(self, g: Graph, ranges: Mapping[Any, Any]):
        self.g = g
        self.ranges = ranges
        self.names: dict[Any, str] = {}

    def declare(self, symbol: Any, name: str) -> None:
        """Name torch symbol ``symbol`` (first name wins) and declare its bounds."""
        if symbol in self.names:
            return
        taken = set(self.names.values())
        base, i = name, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        self.names[symbol] = name
        lo, hi = 1, None
        vr = self.ranges.get(symbol)
        if vr is not None:
            lo = max(_finite(vr.lower) or 0, 0)
            hi = _finite(vr.upper)
        self.g.sym(name, min=lo, max=hi)

    def dim(self, d: Any, what: str) -> Dim:
        """The rlx dim of int or SymInt ``d``: an int, or a monomial over declared symbols."""
        if isinstance(d, int):
            return int(d)
        if isinstance(d, torch.SymInt):
            expr = d.node.expr
        else:
            expr = d
        return self.expr(expr, what)

    def expr(self, expr: Any, what: str) -> Dim:
        if expr.is_Integer:
            return int(expr)
        if expr.is_Symbol:
            if expr not in self.names:
                self.declare(expr, _ident(str(expr)))
            return Sym.named(self.names[expr])
        if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 1:
            base = self.expr(expr.base, what)
            out: Dim = 1
            for _ in range(int(expr.exp)):
                out = base * out if isinstance(base, Sym) else out * base
            return out
        if expr.is_Mul:
            out = 1
            for f in expr.args:
                v = self.expr(f, what)
                out = v * out if isinstance(v, Sym) else out * v
            return out
        raise TorchImportError(
            f"{what}: the symbolic size {expr} is not a product of symbols; rlx symbolic "
            "dims are monomials (batch, batch*seq), so sums and differences of dynamic dims "
            "need static sizes"
        )
