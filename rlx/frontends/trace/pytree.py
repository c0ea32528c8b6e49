"""Pytrees: nests of tuples, lists, dicts (and namedtuples, None) around leaves.

In: a Python nest. Out: its leaves in a fixed order (dict keys sorted, as JAX does) and a
hashable tree definition that rebuilds the nest around new leaves; ``paths`` names each
leaf (``params.w1``, ``xs.0``) for graph input names and error messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["flatten", "unflatten", "paths", "LEAF"]

LEAF = "*"
_NONE = ("none",)


def flatten(tree: Any, leaves: list[Any] | None = None) -> tuple[list[Any], Any]:
    """``(leaves, treedef)`` of ``tree``."""
    out: list[Any] = [] if leaves is None else leaves
    return out, _flat(tree, out)


def _flat(tree: Any, out: list[Any]) -> Any:
    t = type(tree)
    if t is tuple or t is list:
        sub = []
        for x in tree:
            sub.append(_flat(x, out))
        return ("tuple" if t is tuple else "list", tuple(sub))
    if t is dict:
        keys = sorted(tree)
        sub = []
        for k in keys:
            sub.append(_flat(tree[k], out))
        return ("dict", tuple(keys), tuple(sub))
    if tree is None:
        return _NONE
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # namedtuple
        return ("named", t, tuple([_flat(x, out) for x in tree]))
    out.append(tree)
    return LEAF


def unflatten(treedef: Any, leaves: Any) -> Any:
    """The nest ``treedef`` describes, with ``leaves`` (an iterable) in leaf order."""
    return _build(treedef, iter(leaves))


def _build(d: Any, it: Iterator[Any]) -> Any:
    if d == LEAF:
        return next(it)
    kind = d[0]
    if kind == "tuple":
        return tuple(_build(x, it) for x in d[1])
    if kind == "list":
        return [_build(x, it) for x in d[1]]
    if kind == "dict":
        return {k: _build(x, it) for k, x in zip(d[1], d[2])}
    if kind == "named":
        return d[1](*(_build(x, it) for x in d[2]))
    return None


def paths(treedef: Any, prefix: str = "") -> list[str]:
    """A dotted name per leaf, in leaf order (``prefix`` for a leaf at the root)."""
    out: list[str] = []
    _paths(treedef, prefix, out)
    return out


def _join(prefix: str, k: Any) -> str:
    return f"{prefix}.{k}" if prefix else str(k)


def _paths(d: Any, prefix: str, out: list[str]) -> None:
    if d == LEAF:
        out.append(prefix or "leaf")
        return
    kind = d[0]
    if kind in ("tuple", "list"):
        for i, x in enumerate(d[1]):
            _paths(x, _join(prefix, i), out)
    elif kind == "dict":
        for k, x in zip(d[1], d[2]):
            _paths(x, _join(prefix, k), out)
    elif kind == "named":
        for f, x in zip(d[1]._fields, d[2]):
            _paths(x, _join(prefix, f), out)
