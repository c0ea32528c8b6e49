"""The layout rules of docs/architecture.md, checked on the source tree.

1. Module-level imports run one way, down the layers (``LAYERS``): foundation -> ops -> ir
   -> passes / autodiff -> backends -> runtime -> quant -> frontends -> models -> train /
   cli / distributed / serve. Read with ``ast``, so nothing is imported: an import counts
   when it runs at import time (module body, class bodies, ``if`` / ``try`` / ``with``
   blocks, ``importlib.import_module("literal")``), not under ``if TYPE_CHECKING:`` and
   not inside a function. Importing ``rlx.a.b.c`` also runs the package ``__init__`` of
   ``rlx.a`` and ``rlx.a.b``, so those count too; a package ``__init__`` is checked like
   any module. Imports within one layer are fine. Every module has a layer.
2. No module is longer than ``MAX_LINES`` lines.
3. ``dir(rlx)`` is the curated ``rlx.__all__``, every name in it resolves, and nothing
   else public sits in the module (no ``Any``, ``annotations`` or ``importlib``).
4. mypy (run by .ci/run) checks the public API modules: none is among the modules whose
   errors pyproject.toml ignores.

The checkers take a source tree (or a module object), so the tests at the end run them
on planted violations and check that each one is caught.
"""

from __future__ import annotations

import ast
import tomllib
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

import rlx

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600

# (layer, module prefixes), lowest first. A module belongs to the layer of its longest
# matching prefix. "rlx" alone matches only itself: the package facade (rlx/__init__.py),
# the top. It may import anything, and a module that imports ``rlx`` itself (``import
# rlx``, ``from rlx import Graph``) imports the top.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "rlx.errors",
            "rlx.config",
            "rlx.options",
            "rlx.dtype",
            "rlx.shape",
            "rlx.source",
            "rlx.formats",
        ),
    ),
    ("ops", ("rlx.ops",)),
    ("ir", ("rlx.ir",)),
    ("passes / autodiff", ("rlx.passes", "rlx.autodiff")),
    ("backends", ("rlx.backends",)),
    ("runtime", ("rlx.runtime",)),
    ("quant", ("rlx.quant",)),
    # rlx.numpy / rlx.nn face the tracing front end; rlx.onnx / rlx.gguf alias importers
    ("frontends", ("rlx.frontends", "rlx.numpy", "rlx.nn", "rlx.onnx", "rlx.gguf")),
    ("models", ("rlx.models",)),
    (
        "train / cli / distributed / serve",
        (
            "rlx.train",
            "rlx.cli",
            "rlx.distributed",
            "rlx.serve",
            "rlx.viz",
            "rlx.info",
            "rlx.demo",
            "rlx.__main__",
        ),
    ),
    ("package facade", ("rlx",)),
)

# Known violations, each with the change that removes it. Only files another change is
# rewriting are listed; every entry must still be a violation (a fixed one is deleted).
KNOWN_IMPORTS: set[str] = set()
KNOWN_LONG: set[str] = set()


# ---- the checkers -----------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    """``importer`` imports ``target`` at import time, on ``line`` of ``path``."""

    importer: str
    target: str
    path: str
    line: int


def source_tree(root: Path, package: str = "rlx") -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``root/package``."""
    out: dict[str, Path] = {}
    for p in sorted((root / package).rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported (not function bodies, not
    ``if TYPE_CHECKING:`` bodies)."""
    for s in body:
        yield s
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(s, ast.If):
            if not _is_type_checking(s.test):
                yield from _import_time_statements(s.body)
            yield from _import_time_statements(s.orelse)
        elif isinstance(s, ast.Try):
            for block in (s.body, *(h.body for h in s.handlers), s.orelse, s.finalbody):
                yield from _import_time_statements(block)
        elif isinstance(s, ast.With | ast.For | ast.While | ast.ClassDef):
            yield from _import_time_statements(s.body)
            if isinstance(s, ast.For | ast.While):
                yield from _import_time_statements(s.orelse)


def _literal_import_module(s: ast.stmt) -> str | None:
    """``importlib.import_module("rlx.x")`` as a statement or an assignment's value."""
    call = s.value if isinstance(s, ast.Expr | ast.Assign) else None
    if not (isinstance(call, ast.Call) and call.args):
        return None
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    arg = call.args[0]
    if name == "import_module" and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def module_imports(name: str, path: Path, modules: Mapping[str, Path]) -> list[tuple[str, int]]:
    """The ``rlx`` modules that ``name`` imports at import time, with the line: ``from
    pkg import sub`` names ``pkg.sub`` when that is a module, else ``pkg``; relative
    imports are resolved; ``from rlx import X`` (not a module) is the facade ``rlx``."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found: list[tuple[str, int]] = []
    for s in _import_time_statements(ast.parse(path.read_text(), str(path)).body):
        if isinstance(s, ast.Import):
            found += [(a.name, s.lineno) for a in s.names]
        elif isinstance(s, ast.ImportFrom):
            if s.level:
                base = here[: len(here) - (s.level - 1)]
                mod = ".".join([*base, *([s.module] if s.module else [])])
            else:
                mod = s.module or ""
            for a in s.names:
                sub = f"{mod}.{a.name}"
                found.append((sub if sub in modules else mod, s.lineno))
        else:
            lit = _literal_import_module(s)
            if lit is not None:
                found.append((lit, s.lineno))
    unique = dict.fromkeys(found)  # one entry per (module, line), in order
    return [(m, line) for m, line in unique if m == "rlx" or m.startswith("rlx.")]


def layer_of(name: str, layers: Sequence[tuple[str, Sequence[str]]] = LAYERS) -> int | None:
    """Index in ``layers`` of the longest prefix matching module ``name``, or None. The
    bare package name (``rlx``) matches only itself."""
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            hit = name == p or ("." in p and name.startswith(p + "."))
            if hit and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def _imported(target: str) -> list[str]:
    """What importing ``target`` runs: each enclosing package below the ``rlx`` facade,
    then ``target`` (the facade alone when the target is ``rlx``)."""
    parts = target.split(".")
    if len(parts) == 1:
        return [target]
    return [".".join(parts[:k]) for k in range(2, len(parts) + 1)]


def unassigned(root: Path, layers: Sequence[tuple[str, Sequence[str]]] = LAYERS) -> list[str]:
    """Modules of the tree that no layer claims."""
    return [m for m in source_tree(root) if m != "rlx" and layer_of(m, layers) is None]


def upward_imports(
    root: Path, layers: Sequence[tuple[str, Sequence[str]]] = LAYERS
) -> list[tuple[Import, str]]:
    """Each import-time import of a module in a higher layer, with the message naming the
    two layers (one entry per import statement and target)."""
    modules = source_tree(root)
    out: list[tuple[Import, str]] = []
    for name, path in modules.items():
        mine = layer_of(name, layers)
        if mine is None:
            continue
        for target, line in module_imports(name, path, modules):
            for ran in _imported(target):
                theirs = layer_of(ran, layers)
                if theirs is not None and theirs > mine:
                    imp = Import(name, target, str(path.relative_to(root)), line)
                    out.append(
                        (
                            imp,
                            f"{imp.path}:{line}: {name} ({layers[mine][0]}) imports {ran} "
                            f"({layers[theirs][0]}) at import time",
                        )
                    )
                    break
    return out


def long_modules(root: Path, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """(path, lines) of each module over ``limit`` lines."""
    out = []
    for path in source_tree(root).values():
        n = len(path.read_text().splitlines())
        if n > limit:
            out.append((str(path.relative_to(root)), n))
    return out


def surface_problems(mod: types.ModuleType) -> list[str]:
    """How the public surface of ``mod`` differs from its ``__all__``: ``dir`` shows other
    names, a name of ``__all__`` does not resolve or is listed twice, or a public global
    that is neither in ``__all__`` nor a sub-module sits in the module (a leaked import)."""
    problems: list[str] = []
    names = list(getattr(mod, "__all__", []))
    if len(set(names)) != len(names):
        problems.append(
            f"__all__ lists a name twice: {sorted(n for n in names if names.count(n) > 1)}"
        )
    shown, listed = set(dir(mod)), set(names)
    if shown != listed:
        problems.append(
            f"dir() is not __all__: only in dir {sorted(shown - listed)}, "
            f"only in __all__ {sorted(listed - shown)}"
        )
    for n in names:
        try:
            getattr(mod, n)
        except AttributeError:
            problems.append(f"{n!r} is in __all__ but does not resolve")
    prefix = mod.__name__ + "."
    leaked = sorted(
        k
        for k, v in vars(mod).items()
        if not k.startswith("_")
        and k not in listed
        and not (isinstance(v, types.ModuleType) and v.__name__.startswith(prefix))
    )
    if leaked:
        problems.append(f"public names outside __all__: {leaked}")
    return problems


def public_modules(pkg: types.ModuleType) -> set[str]:
    """``pkg`` and the modules the names of its ``__all__`` come from: where each is
    defined, where the package imports it from (its ``_LAZY`` table) and, for a
    sub-module, the module itself under both its names."""
    lazy: Mapping[str, str] = getattr(pkg, "_LAZY", {})
    out = {pkg.__name__}
    for name in pkg.__all__:
        obj = getattr(pkg, name)
        if isinstance(obj, types.ModuleType):
            out |= {obj.__name__, f"{pkg.__name__}.{name}"}
            continue
        out.add(obj.__module__)
        if name in lazy:
            out.add(lazy[name])
    return out


def mypy_ignored(module: str, patterns: Sequence[str]) -> bool:
    """Whether a mypy ``[[tool.mypy.overrides]]`` module pattern matches ``module``
    (``a.b.*`` matches ``a.b`` and everything under it)."""
    return any(
        module == p or (p.endswith(".*") and (module + ".").startswith(p[:-1])) for p in patterns
    )


def ignored_patterns(pyproject: Path) -> list[str]:
    """The module patterns of the overrides that set ``ignore_errors``."""
    overrides = tomllib.loads(pyproject.read_text())["tool"]["mypy"].get("overrides", [])
    out: list[str] = []
    for o in overrides:
        if o.get("ignore_errors"):
            mods = o["module"]
            out += [mods] if isinstance(mods, str) else list(mods)
    return out


# ---- the rules, on rlx ------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    assert not unassigned(ROOT), (
        f"modules no layer claims (add them to LAYERS in {__file__}): {unassigned(ROOT)}"
    )


def test_imports_run_down_the_layers() -> None:
    found = upward_imports(ROOT)
    new = [msg for imp, msg in found if f"{imp.importer} -> {imp.target}" not in KNOWN_IMPORTS]
    assert not new, (
        "module-level imports must run down the layers (docs/architecture.md): move what "
        "the module needs to a lower layer, import it under TYPE_CHECKING when only types "
        "need it, or inside the function that uses it at run time:\n" + "\n".join(new)
    )


def test_known_import_exceptions_are_still_needed() -> None:
    found = {f"{imp.importer} -> {imp.target}" for imp, _ in upward_imports(ROOT)}
    assert not KNOWN_IMPORTS - found, (
        f"fixed, delete from KNOWN_IMPORTS: {sorted(KNOWN_IMPORTS - found)}"
    )


def test_no_module_is_over_the_line_budget() -> None:
    over = [f"{p} ({n} lines)" for p, n in long_modules(ROOT) if p not in KNOWN_LONG]
    assert not over, f"modules over {MAX_LINES} lines (split them by concern): {over}"


def test_known_long_modules_are_still_long() -> None:
    long = {p for p, _ in long_modules(ROOT)}
    assert not KNOWN_LONG - long, f"fixed, delete from KNOWN_LONG: {sorted(KNOWN_LONG - long)}"


def test_dir_rlx_is_the_curated_all() -> None:
    assert not surface_problems(rlx), surface_problems(rlx)
    assert sorted(dir(rlx)) == sorted(rlx.__all__)


def test_public_api_modules_are_type_checked() -> None:
    patterns = ignored_patterns(ROOT / "pyproject.toml")
    ignored = sorted(m for m in public_modules(rlx) if mypy_ignored(m, patterns))
    assert not ignored, f"public API modules whose type errors mypy ignores: {ignored}"


# ---- the checkers catch planted violations ----------------------------------------


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    """A source tree under ``tmp_path``: ``{"rlx/ops/x.py": text}``; package
    ``__init__.py`` files are added (empty) where missing."""
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        for d in p.relative_to(tmp_path).parents:
            if str(d) != "." and not (tmp_path / d / "__init__.py").exists():
                (tmp_path / d / "__init__.py").write_text("")
    return tmp_path


MIR = "class Graph: ...\n"


def test_planted_upward_import_is_caught(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"rlx/ir/mir.py": MIR, "rlx/ops/bad.py": "from rlx.ir.mir import Graph\n"},
    )
    (imp, msg), *rest = upward_imports(root)
    assert not rest
    assert (imp.importer, imp.target, imp.line) == ("rlx.ops.bad", "rlx.ir.mir", 1)
    assert "rlx.ops.bad (ops) imports rlx.ir (ir)" in msg


@pytest.mark.parametrize(
    "text",
    [
        "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from rlx.ir.mir import Graph\n",
        "import typing\nif typing.TYPE_CHECKING:\n    from rlx.ir import mir\n",
        "def f():\n    from rlx.ir.mir import Graph\n    return Graph()\n",
        "from rlx.errors import RlxError\nfrom rlx.ops import other\n",
    ],
    ids=["type-checking", "typing.TYPE_CHECKING", "in-a-function", "down-or-same-layer"],
)
def test_imports_that_do_not_count(tmp_path: Path, text: str) -> None:
    root = _tree(
        tmp_path,
        {"rlx/ir/mir.py": MIR, "rlx/errors.py": "", "rlx/ops/other.py": "", "rlx/ops/ok.py": text},
    )
    assert upward_imports(root) == []


@pytest.mark.parametrize(
    "text",
    [
        "try:\n    import rlx.ir.mir\nexcept ImportError:\n    pass\n",
        "class A:\n    from rlx.ir.mir import Graph\n",
        "import importlib\nimportlib.import_module('rlx.ir.mir')\n",
        "from ..ir import mir\n",
        "from rlx.ir import mir\n",
        "if True:\n    pass\nelse:\n    from rlx import ir\n",
    ],
    ids=["try", "class-body", "import_module", "relative", "from-package", "else-branch"],
)
def test_import_time_imports_count(tmp_path: Path, text: str) -> None:
    root = _tree(tmp_path, {"rlx/ir/mir.py": MIR, "rlx/ops/bad.py": text})
    assert [imp.importer for imp, _ in upward_imports(root)] == ["rlx.ops.bad"]


def test_package_init_is_checked_like_a_module(tmp_path: Path) -> None:
    """The cycle that held rlx together: the ops package importing the IR."""
    root = _tree(
        tmp_path, {"rlx/ir/mir.py": MIR, "rlx/ops/__init__.py": "from rlx.ir import mir\n"}
    )
    assert [imp.importer for imp, _ in upward_imports(root)] == ["rlx.ops"]


def test_enclosing_package_init_counts(tmp_path: Path) -> None:
    """Importing ``rlx.pkg.low`` runs ``rlx/pkg/__init__.py``: a module of a lower layer
    than ``rlx.pkg`` may sit inside it, but importing it from below still runs the
    package's layer."""
    layers = (("foundation", ("rlx.base", "rlx.pkg.low")), ("high", ("rlx.pkg",)))
    root = _tree(
        tmp_path,
        {
            "rlx/pkg/low.py": "",
            "rlx/pkg/__init__.py": "",
            "rlx/base.py": "from rlx.pkg import low\n",
        },
    )
    ((imp, msg),) = upward_imports(root, layers)
    assert imp.importer == "rlx.base" and "imports rlx.pkg (high)" in msg


def test_importing_the_facade_is_the_top(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"rlx/__init__.py": "", "rlx/models/m.py": "import rlx\n"})
    ((imp, msg),) = upward_imports(root)
    assert imp.target == "rlx" and "(package facade)" in msg


def test_planted_module_without_a_layer_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"rlx/__init__.py": "", "rlx/stray.py": "", "rlx/ops/x.py": ""})
    assert unassigned(root) == ["rlx.stray"]


def test_planted_700_line_module_is_caught(tmp_path: Path) -> None:
    root = _tree(
        tmp_path, {"rlx/ops/long.py": "x = 1\n" * 700, "rlx/ops/short.py": "x = 1\n" * 600}
    )
    assert long_modules(root) == [("rlx/ops/long.py", 700)]


def _module(name: str, **attrs: object) -> types.ModuleType:
    mod = types.ModuleType(name)
    vars(mod).update(attrs)
    return mod


def test_planted_surface_problems_are_caught() -> None:
    def one() -> int:
        return 1

    def curated() -> list[str]:
        return ["one"]

    sub = types.ModuleType("pkg.sub")
    good = _module("pkg", __all__=["one"], one=one, sub=sub, __dir__=curated)
    assert surface_problems(good) == []
    # no __dir__: dir() shows every global
    assert any(
        "dir() is not __all__" in p
        for p in surface_problems(_module("pkg", __all__=["one"], one=one))
    )
    # a leaked import, even with __dir__ curated
    leaky = _module("pkg", __all__=["one"], one=one, Any=object, __dir__=curated)
    assert surface_problems(leaky) == ["public names outside __all__: ['Any']"]
    # a name listed but missing
    broken = _module("pkg", __all__=["one", "two"], one=one, __dir__=lambda: ["one", "two"])
    assert surface_problems(broken) == ["'two' is in __all__ but does not resolve"]


def test_planted_mypy_ignore_of_a_public_module_is_caught(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[tool.mypy]\n[[tool.mypy.overrides]]\nmodule = ["rlx.ir.*", "rlx.viz.svg"]\n'
        "ignore_errors = true\n"
    )
    patterns = ignored_patterns(pyproject)
    assert "rlx.ir.mir" in public_modules(rlx)
    assert mypy_ignored("rlx.ir.mir", patterns) and mypy_ignored("rlx.ir", patterns)
    assert not mypy_ignored("rlx.irx", patterns) and not mypy_ignored("rlx.viz", patterns)
