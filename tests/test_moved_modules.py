"""Modules that moved keep their old import paths as re-exports: the same objects, and
nothing inside rlx imports the old paths."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

import rlx

MOVED = {
    "rlx.runtime.options": "rlx.options",
    "rlx.train.losses": "rlx.ops.compose.losses",
    "rlx.quant.schemes": "rlx.formats.schemes",
    "rlx.autodiff.rules": "rlx.ops.rules",
    "rlx.ir.source": "rlx.source",
}
# old-path imports still inside rlx, in files another change is editing (each entry goes
# when that file imports the new path; tests/test_layout.py lists them too)
NOT_YET: set[str] = set()


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_old_path_reexports_the_new_module(old: str, new: str) -> None:
    o, n = importlib.import_module(old), importlib.import_module(new)
    assert o.__all__ == n.__all__
    for name in n.__all__:
        assert getattr(o, name) is getattr(n, name), f"{old}.{name}"


def test_rlx_does_not_import_old_paths() -> None:
    root = pathlib.Path(rlx.__file__).parent
    shims = {root.joinpath(*old.split(".")[1:]).with_suffix(".py") for old in MOVED}
    pattern = re.compile(
        "|".join(rf"\b{re.escape(o)}\b" for o in MOVED)
        + r"|from rlx\.(runtime import options|train import losses|quant import schemes"
        r"|autodiff import rules|ir import source)\b"
    )
    hits = [
        f"{p.relative_to(root)}:{i}"
        for p in sorted(root.rglob("*.py"))
        if p not in shims
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line) and line.lstrip().startswith(("from ", "import "))
    ]
    assert not set(hits) - NOT_YET, f"old module paths imported inside rlx: {hits}"
