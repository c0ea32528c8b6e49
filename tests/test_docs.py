"""The docs name real files and functions: every backticked ``rlx/...``, ``tests/...``,
``benchmarks/...`` or ``docs/...`` path in README.md and docs/*.md exists (a ``*`` in it
must match at least one file), and every ``path::name`` reference names a definition in
that file."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

# A backticked span, then the path-like references inside it.
_SPAN = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"\b((?:rlx|tests|benchmarks|docs)/[\w/.\-*]*[\w/*])(?:::([\w.]+))?")


def _refs() -> list[tuple[str, str, str | None]]:
    """(doc name, path, name or None) for each path reference in a backticked span. In a
    table cell, a bare ``test_...`` span after ``tests/x.py::test_a`` names another test of
    ``tests/x.py``."""
    out = []
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            for cell in line.split("|"):
                current = None
                for span in _SPAN.findall(cell):
                    found = _PATH.findall(span)
                    for path, name in found:
                        out.append((doc.name, path, name or None))
                        current = path if name and path.startswith("tests/") else None
                    if not found and current and re.fullmatch(r"test_\w+", span):
                        out.append((doc.name, current, span))
    return out


def _defined_names(path: Path) -> set[str]:
    """Top-level functions, classes and assignments of a Python file, plus ``Class.member``
    for the methods and attributes of its classes."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{item.name}")
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(f"{node.name}.{item.target.id}")
    return names


REFS = _refs()


def test_the_docs_reference_paths() -> None:
    """Guard against the regex silently matching nothing."""
    docs = {d for d, _, _ in REFS}
    assert {"README.md", "architecture.md", "issue2-checklist.md"} <= docs, docs
    assert len(REFS) > 50


@pytest.mark.parametrize("doc,path", sorted({(d, p) for d, p, _ in REFS}))
def test_every_documented_path_exists(doc: str, path: str) -> None:
    found = list(ROOT.glob(path)) if "*" in path else [ROOT / path]
    assert found and all(p.exists() for p in found), f"{doc} names `{path}`, which does not exist"


@pytest.mark.parametrize("doc,path,name", sorted({(d, p, n) for d, p, n in REFS if n is not None}))
def test_every_documented_function_exists(doc: str, path: str, name: str) -> None:
    file = ROOT / path
    assert file.suffix == ".py", f"{doc}: `{path}::{name}` does not name a Python file"
    assert name in _defined_names(file), f"{doc} names `{path}::{name}`, not defined there"
