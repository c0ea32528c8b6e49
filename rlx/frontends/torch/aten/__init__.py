"""The one ATen table: ATen op name -> converter function.

Keys are ``"name"`` (every overload of ``aten.name``) or ``"name.overload"`` (that one
overload, looked up first). A converter takes a
:class:`~rlx.frontends.torch.context.NodeCtx` and returns a node id, a tuple of node ids
(ops with several results), or ``None`` (ops with no value, such as runtime asserts).
``@aten("add.Tensor", "add.Scalar")`` registers one; each module of this package holds
one op family and registers into the one TABLE. Keys are strings, matched against
``str(node.target)`` (``aten.add.Tensor``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["TABLE", "aten", "lookup", "supported_aten_ops"]

Converter = Callable[[Any], Any]
TABLE: dict[str, Converter] = {}


def aten(*names: str) -> Callable[[Converter], Converter]:
    """Register the decorated converter for each ATen op ``name`` / ``name.overload``."""

    def deco(fn: Converter) -> Converter:
        for n in names:
            if n in TABLE:
                raise ValueError(
                    f"aten op {n} is mapped twice ({TABLE[n].__name__}, {fn.__name__})"
                )
            TABLE[n] = fn
        return fn

    return deco


def op_key(target: Any) -> tuple[str, str]:
    """``('add', 'add.Tensor')`` for ``torch.ops.aten.add.Tensor`` (any str(target))."""
    name = str(target).removeprefix("aten.")
    return name.split(".", 1)[0], name


def lookup(target: Any) -> Converter | None:
    """The converter of an FX node target, or None."""
    packet, full = op_key(target)
    if not str(target).startswith("aten."):
        return None
    return TABLE.get(full) or TABLE.get(packet)


def supported_aten_ops() -> list[str]:
    """The mapped ATen op names (``name`` or ``name.overload``), sorted."""
    return sorted(TABLE)


_MODULES = ("elementwise", "shape", "create", "indexing", "reduce", "nn", "linalg")
for _m in _MODULES:
    importlib.import_module(f"rlx.frontends.torch.aten.{_m}")
