"""The converter table: (domain, op_type, opset range) -> converter function.

A converter takes a :class:`~rlx.frontends.onnx.context.NodeCtx` and returns the node id
of the op's output, or a list with one id (or None for an output it does not make) per
ONNX output. ``@converter("Softmax", since=13)`` registers one; an op whose semantics
changed at an opset has one entry per range (``since`` inclusive, ``until`` exclusive).
Each module of this package holds one op family and registers into the one TABLE."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlx.frontends.onnx.context import NodeCtx

__all__ = ["TABLE", "Entry", "converter", "lookup", "supported_op_types"]

Converter = Callable[[NodeCtx], "int | Sequence[int | None]"]


@dataclass(frozen=True)
class Entry:
    """One row of the table: ``fn`` converts ``domain::op_type`` for opsets
    ``since <= opset < until`` (``until`` None: every later opset)."""

    domain: str
    op_type: str
    since: int
    until: int | None
    fn: Converter


TABLE: dict[tuple[str, str], list[Entry]] = {}


def converter(
    *op_types: str, since: int = 1, until: int | None = None, domain: str = ""
) -> Callable[[Converter], Converter]:
    """Register the decorated function for ``op_types`` over ``[since, until)``."""

    def deco(fn: Converter) -> Converter:
        for op in op_types:
            rows = TABLE.setdefault((domain, op), [])
            for r in rows:
                lo, hi = r.since, r.until or 10**9
                if since < hi and lo < (until or 10**9):
                    raise ValueError(f"{domain}::{op}: opset ranges overlap ({fn.__name__})")
            rows.append(Entry(domain, op, since, until, fn))
        return fn

    return deco


def lookup(domain: str, op_type: str, opset: int) -> Entry | None:
    """The entry converting ``domain::op_type`` at ``opset``, or None."""
    for e in TABLE.get((domain, op_type), ()):
        if e.since <= opset and (e.until is None or opset < e.until):
            return e
    return None


def supported_op_types(domain: str = "") -> set[str]:
    """The op types of ``domain`` with at least one converter."""
    return {op for (d, op) in TABLE if d == domain}


_MODULES = (
    "elementwise",
    "reduce",
    "shape",
    "gather",
    "nn",
    "norm",
    "quant",
    "misc",
    "attention",
    "loss",
    "resize",
    "signal",
    "rnn",
    "rotary",
    "dft",
    "conv_transpose",
    "einsum",
    "grid_sample",
    "linear_attention",
    "scatter_misc",
    "legacy",
)
for _m in _MODULES:
    importlib.import_module(f"rlx.frontends.onnx.ops.{_m}")
importlib.import_module("rlx.frontends.onnx.control")  # If / Loop / Scan
