"""Every documented ``rlx.X`` namespace imports by its name: ``import rlx.onnx`` and
``from rlx.gguf import load`` work as well as the attribute ``rlx.onnx.load`` (issue 38).

The names come from the README, docs/ and examples/: each dotted ``rlx.a.b.c`` is walked
attribute by attribute from ``rlx``; every prefix that is a module must import by that
name and be the same object, and the last name must import with ``from ... import``."""

from __future__ import annotations

import importlib
import re
import types
from pathlib import Path

import pytest

import rlx

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES += sorted((ROOT / "examples").glob("*.py"))
DOTTED = re.compile(r"(?<![\w./-])rlx(?:\.[A-Za-z_]\w*)+")
# dotted words in the docs that are not Python names: files and the CLI's cache folder
NOT_NAMES = re.compile(r"\.(md|py|c|h|so|json|onnx|gguf|toml|txt)$")


def documented_names() -> list[str]:
    found: set[str] = set()
    for path in SOURCES:
        for m in DOTTED.finditer(path.read_text()):
            name = m.group(0)
            if not NOT_NAMES.search(name):
                found.add(name)
    return sorted(found)


def test_the_docs_name_namespaces() -> None:
    names = documented_names()
    assert {"rlx.onnx.load", "rlx.gguf.load", "rlx.numpy", "rlx.nn"} <= set(names)


def _import(name: str) -> types.ModuleType | None:
    """``import name``, or None when no module has that name (other errors propagate)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return None


@pytest.mark.parametrize("dotted", documented_names())
def test_documented_name_imports_by_its_path(dotted: str) -> None:
    """Walk ``rlx.a.b.c``: a prefix is either a module that ``import`` finds (and is the
    attribute of its parent, once imported) or an attribute that is not a module."""
    parts = dotted.split(".")
    obj: object = rlx
    for i in range(1, len(parts)):
        prefix = ".".join(parts[: i + 1])
        mod = _import(prefix) if isinstance(obj, types.ModuleType) else None
        if mod is not None:
            assert getattr(obj, parts[i]) is mod, f"{prefix}: the attribute is another object"
            obj = mod
            continue
        assert hasattr(obj, parts[i]), f"{dotted}: {'.'.join(parts[:i])} has no {parts[i]!r}"
        obj = getattr(obj, parts[i])
        assert not isinstance(obj, types.ModuleType), f"import {prefix} fails: not a module"


def test_lazy_modules_are_real_modules() -> None:
    for name in ("numpy", "nn", "onnx", "gguf"):
        mod = importlib.import_module(f"rlx.{name}")
        assert getattr(rlx, name) is mod
        assert name in dir(rlx) or name in rlx.__all__


@pytest.mark.parametrize("name", sorted(rlx._MOVED))
def test_names_that_left_the_public_api_still_resolve_with_a_warning(name: str) -> None:
    """A name of rlx's old top level (before the curated ``__all__``) still works, with a
    DeprecationWarning that names the module to import it from; it is not in dir(rlx)."""
    module = rlx._MOVED[name]
    with pytest.warns(DeprecationWarning, match=rf"from {re.escape(module)} import {name}"):
        value = getattr(rlx, name)
    assert value is getattr(importlib.import_module(module), name)
    assert name not in dir(rlx) and name not in rlx.__all__


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        rlx.not_a_name  # noqa: B018
