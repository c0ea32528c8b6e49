"""Type checks for values read from a graph file. In: a class (an op or an rlx dataclass)
and the attribute values decoded for it. Out: nothing, or a SerializationError naming the
node, the class, the attribute, the type its field declares and the value given.

A file that passes its checksum may still have been crafted. Dataclasses do not check
their field types, so without this an ``int`` field given a string, or a ``bytes`` field
given a tuple, builds an op that fails later with a bare TypeError. Each value is checked
against the field's annotation (resolved with ``typing.get_type_hints``): ``int`` (not a
bool), ``float`` (an int is accepted, a bool is not), ``bool`` (not an int), ``str``,
``bytes``, ``None``, unions (``X | None``), ``tuple[T, ...]`` and fixed tuples, ``Any``,
and classes (enums, DType, Shape, Sym, ConstValue, Graph, rlx dataclasses) by
``isinstance``. An annotation that cannot be resolved or is of another kind is not
checked.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from rlx.errors import SerializationError
from rlx.ir.mir import Graph, Node, NodeId

__all__ = ["check_fields", "conforms", "describe"]

_HINTS: dict[type, dict[str, Any]] = {}
# the IR names op modules import for type checking only (ops sit below the IR): an op's
# sub-graph field (``body: Graph``) resolves to the class all the same
_IR_NAMES: dict[str, Any] = {"Graph": Graph, "Node": Node, "NodeId": NodeId}


def _field_hints(cls: type) -> dict[str, Any]:
    """Field name -> resolved annotation (fields whose annotation does not resolve are
    left out), cached per class."""
    hints = _HINTS.get(cls)
    if hints is not None:
        return hints
    try:
        resolved = typing.get_type_hints(cls, localns=_IR_NAMES)
    except Exception:  # an annotation names something only a type checker sees
        resolved = {}
        ns = {**vars(sys.modules.get(cls.__module__, typing)), **_IR_NAMES}
        for f in dataclasses.fields(cls):
            try:
                resolved[f.name] = (
                    eval(str(f.type), dict(ns)) if isinstance(f.type, str) else f.type
                )
            except Exception:
                continue
    names = {f.name for f in dataclasses.fields(cls)}
    hints = {k: v for k, v in resolved.items() if k in names}
    _HINTS[cls] = hints
    return hints


def check_fields(cls: type, values: Mapping[str, Any], where: str) -> None:
    """Raise SerializationError unless every value fits the type its field declares."""
    hints = _field_hints(cls)
    for name, value in values.items():
        t = hints.get(name)
        if t is not None and not conforms(value, t):
            raise SerializationError(
                f"{where}: {cls.__qualname__}.{name} must be {type_text(t)}, got {describe(value)}"
            )


def describe(v: Any) -> str:
    """``type value`` of a decoded value, shortened for messages."""
    text = repr(v)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(v).__name__} {text}"


def type_text(t: Any) -> str:
    """How a message spells annotation ``t``."""
    if isinstance(t, type):
        return t.__qualname__
    return str(t).replace("typing.", "").replace("rlx.shape.", "")


def conforms(v: Any, t: Any) -> bool:
    """Whether decoded value ``v`` fits annotation ``t`` (see the module docstring)."""
    if t is Any or t is typing.Any:
        return True
    if t is None or t is type(None):
        return v is None
    origin = typing.get_origin(t)
    if origin is typing.Union or origin is types.UnionType:
        return any(conforms(v, a) for a in typing.get_args(t))
    if origin is tuple:
        if type(v) is not tuple:
            return False
        args = typing.get_args(t)
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(x, args[0]) for x in v)
        return len(args) == len(v) and all(conforms(x, a) for x, a in zip(v, args))
    if origin is typing.Literal:
        return any(type(v) is type(a) and v == a for a in typing.get_args(t))
    if origin is typing.ClassVar:
        return True
    if origin is not None:
        if origin is Callable or origin is getattr(typing, "Callable", None):
            return callable(v)
        return isinstance(origin, type) and isinstance(v, origin)
    if t is float:  # the numeric tower: an int is a float (a bool is neither here)
        return type(v) in (int, float)
    if t is int:
        return type(v) is int
    if t is bool:
        return type(v) is bool
    if isinstance(t, type):
        return isinstance(v, t)
    return True  # a TypeVar, a forward reference, ...: not checked
