"""The classes a graph file may name: the enums and frozen dataclasses found in the
modules that define registered ops (and in the rlx modules those classes come from). In:
a qualname from a file's header. Out: the one class it names, or a SerializationError;
a file can never make the loader build an arbitrary type."""

from __future__ import annotations

import dataclasses
import enum
import sys
from types import ModuleType

from rlx.errors import SerializationError
from rlx.ops.base import OPS

__all__ = ["is_frozen_dataclass", "known_classes", "lookup"]


def is_frozen_dataclass(cls: type) -> bool:
    return dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


_KNOWN: tuple[tuple[type, ...], dict[str, list[type]]] | None = None


def known_classes(fresh: bool = False) -> dict[str, list[type]]:
    """Qualname -> enum and frozen dataclass classes found in the modules of registered
    ops (and in the rlx modules those classes are defined in). Cached while the op
    registry is unchanged; ``fresh`` rescans."""
    global _KNOWN
    ops = tuple(OPS.values())
    if not fresh and _KNOWN is not None and _KNOWN[0] == ops:
        return _KNOWN[1]
    found = _scan()
    _KNOWN = (ops, found)
    return found


def _scan() -> dict[str, list[type]]:
    found: dict[str, list[type]] = {}
    todo = [sys.modules[c.__module__] for c in OPS.values() if c.__module__ in sys.modules]
    seen: set[str] = set()

    def visit(cls: type) -> None:
        if not (issubclass(cls, enum.Enum) or is_frozen_dataclass(cls)):
            return
        entry = found.setdefault(cls.__qualname__, [])
        if cls in entry:
            return
        entry.append(cls)
        mod = sys.modules.get(cls.__module__)
        if mod is not None and mod.__name__.startswith("rlx."):
            todo.append(mod)
        for v in vars(cls).values():
            if isinstance(v, type) and v.__qualname__.startswith(cls.__qualname__ + "."):
                visit(v)

    while todo:
        mod: ModuleType = todo.pop()
        if mod.__name__ in seen:
            continue
        seen.add(mod.__name__)
        for v in list(vars(mod).values()):
            if isinstance(v, type):
                visit(v)
    return found


def lookup(classes: dict[str, list[type]], name: str, where: str) -> type:
    got = classes.get(name) or known_classes(fresh=True).get(name, [])
    if not got:
        raise SerializationError(f"{where}: unknown class {name!r} (not an rlx enum or dataclass)")
    if len(got) > 1:
        mods = sorted(c.__module__ for c in got)
        raise SerializationError(f"{where}: class name {name!r} is ambiguous, defined in {mods}")
    return got[0]
