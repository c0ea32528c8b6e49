"""The op registry is complete: every built-in op class carries all of its facets, and
every op is exercised by some test.

Walks ``rlx.ops.OPS`` (built-in families only: classes defined under ``rlx.ops``) and
fails with the exact list of offending ops.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import rlx  # noqa: F401  (importing rlx registers every built-in op)
from rlx.ops import OPS, Op, OpKind

TESTS = Path(__file__).resolve().parents[1]
BUILTIN = sorted(
    (cls for cls in OPS.values() if cls.__module__.startswith("rlx.ops.")),
    key=lambda c: c.mnemonic,
)


def _auto_doc(cls: type) -> str:
    """The docstring ``dataclasses`` invents for a class that has none."""
    try:
        return cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
    except (TypeError, ValueError):  # pragma: no cover - no signature to show
        return ""


def _facet_problems(cls: type[Op]) -> list[str]:
    own = cls.__dict__
    problems = []
    if "mnemonic" not in own or not isinstance(own["mnemonic"], str) or not own["mnemonic"]:
        problems.append("no mnemonic of its own")
    elif OPS.get(cls.mnemonic) is not cls:
        problems.append(f"OPS[{cls.mnemonic!r}] is {OPS.get(cls.mnemonic)}, not this class")
    for facet in ("infer", "reference"):
        if not callable(own.get(facet)):
            problems.append(f"no {facet}() of its own")
    doc = own.get("__doc__")
    if not doc or not doc.strip() or doc == _auto_doc(cls):
        problems.append("no docstring")
    if not isinstance(cls.kind, OpKind):
        problems.append(f"kind {cls.kind!r} is not an OpKind")
    for flag in ("elementwise", "pure", "view"):
        if not isinstance(getattr(cls, flag), bool):
            problems.append(f"flag {flag} is not a bool")
    arity = cls.arity
    if arity is not None and (not isinstance(arity, int) or arity < 0):
        problems.append(f"arity {arity!r} is not None or an int >= 0")
    return problems


def test_registry_has_builtin_ops():
    assert BUILTIN, "rlx.ops registered no op"
    for m in ("input", "param", "constant", "reduce", "softmax", "layer_norm", "reshape"):
        assert m in OPS, f"op {m!r} is not registered"


@pytest.mark.parametrize("cls", BUILTIN, ids=lambda c: c.mnemonic)
def test_op_class_has_every_facet(cls):
    problems = _facet_problems(cls)
    assert not problems, f"op {cls.mnemonic!r} ({cls.__module__}.{cls.__name__}): " + "; ".join(
        problems
    )


def _test_sources() -> str:
    me = Path(__file__).resolve()
    return "\n".join(
        p.read_text(encoding="utf-8", errors="replace")
        for p in sorted(TESTS.rglob("*.py"))
        if p.resolve() != me
    )


def _mentioned(cls: type[Op], text: str) -> bool:
    """The op appears as its quoted mnemonic, its class name, or a ``.mnemonic(`` call."""
    m = re.escape(cls.mnemonic)
    patterns = (
        rf"[\"']{m}[\"']",
        rf"(?<![\w.]){re.escape(cls.__name__)}\b",
        rf"\.{m}\(",
    )
    return any(re.search(p, text) for p in patterns)


def test_every_op_is_exercised_by_a_test():
    text = _test_sources()
    missing = sorted(f"{c.mnemonic} ({c.__module__})" for c in BUILTIN if not _mentioned(c, text))
    assert not missing, (
        f"{len(missing)} of {len(BUILTIN)} registered ops appear in no test under "
        f"{TESTS} (as a quoted mnemonic, class name or .mnemonic( call): " + ", ".join(missing)
    )
