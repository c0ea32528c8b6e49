"""The op registry is complete: every built-in op class carries all of its facets, and
every op is exercised by some test.

Walks ``rlx.ops.OPS`` (built-in families only: classes defined under ``rlx.ops``) and
fails with the exact list of offending ops.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import ClassVar

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


def test_every_op_is_fuzzed_against_an_independent_oracle():
    """tests/fuzz/coverage.py names, for each built-in op, the differential fuzz test that
    checks it (reference interpreter and compiled graph, every precision policy and native
    target) and its independent oracle: its keys are exactly the registry's built-in ops
    (ops registered by tests are not built-in), and every test it names exists."""
    from tests.fuzz.coverage import COVERAGE

    ops = {c.mnemonic for c in BUILTIN}
    missing, stale = sorted(ops - set(COVERAGE)), sorted(set(COVERAGE) - ops)
    assert not missing, (
        f"ops without a differential fuzz entry in tests/fuzz/coverage.py: {missing}"
    )
    assert not stale, f"tests/fuzz/coverage.py lists ops that are not registered: {stale}"
    fuzz = TESTS / "fuzz"
    absent = []
    for op, (oracle, tests) in sorted(COVERAGE.items()):
        assert oracle and tests, f"{op}: an oracle and at least one test"
        for t in tests:
            path, _, fn = t.partition("::")
            src = (fuzz / path).read_text(encoding="utf-8") if (fuzz / path).is_file() else ""
            if not re.search(rf"^def {re.escape(fn)}\(", src, re.M):
                absent.append(f"{op}: {t}")
    assert not absent, "tests named in tests/fuzz/coverage.py that do not exist: " + ", ".join(
        absent
    )


def test_registry_scope_undoes_every_kind_of_registration():
    """Registries are process-global: ``registry_scope`` (used by an autouse fixture in
    ``tests/conftest.py``) makes a test's registrations vanish with it."""
    from rlx.ir.mir import Graph
    from rlx.ops.base import graph_method, register, registry_scope
    from rlx.ops.custom import custom_op_names, register_custom_op

    before_ops, before_custom = dict(OPS), custom_op_names()
    with registry_scope():

        @register
        class ScopedOnly(Op):
            """An op that exists only inside the scope."""

            mnemonic: ClassVar[str] = "scoped_only"
            arity: ClassVar[int] = 1

            def infer(self, ins):
                return ins[0]

            def reference(self, xs, ctx):
                return xs[0]

        @graph_method
        def scoped_only(g, x):
            return g.apply(ScopedOnly(), [x])

        register_custom_op("scoped_custom", lambda ins, a: ins[0], lambda xs, a, c: xs[0])
        g = Graph("g")
        assert g.shape(g.scoped_only(g.input("x", (2,)))).dims == (2,)
        assert "scoped_only" in OPS and "scoped_custom" in custom_op_names()
    assert OPS == before_ops and custom_op_names() == before_custom
    assert not hasattr(Graph, "scoped_only")

    def add(g, a, b):
        return a

    with pytest.raises(TypeError, match="Graph.add defined twice"):
        graph_method(add)  # builder names are unique: a second one is a TypeError


def test_adding_an_op_takes_one_class_and_one_builder():
    """What docs/architecture.md promises: a registered class plus a builder is all a new
    op needs to be built, verified, printed, saved, evaluated and compiled for the CPU."""
    import numpy as np

    from rlx.ir.mir import Graph
    from rlx.ir.serialize import dumps, loads
    from rlx.ops.base import graph_method, register, registry_scope
    from rlx.options import CompileOptions
    from rlx.runtime.session import Session

    with registry_scope():

        @register
        class ClampAbove(Op):
            """``min(x, limit)`` elementwise."""

            mnemonic: ClassVar[str] = "clamp_above_test"
            arity: ClassVar[int] = 1
            kind: ClassVar[OpKind] = OpKind.ELEMENTWISE
            elementwise: ClassVar[bool] = True
            limit: float = 1.0

            def infer(self, ins):
                return ins[0]

            def reference(self, xs, ctx):
                return np.minimum(xs[0], self.limit)

        @graph_method
        def clamp_above_test(g, x, limit=1.0):
            return g.apply(ClampAbove(float(limit)), [x])

        g = Graph("g")
        g.set_outputs(g.clamp_above_test(g.exp(g.input("x", ("n",))), 2.0))
        g.verify()
        assert "clamp_above_test[limit=2] %1" in g.inspect()
        g2, _ = loads(dumps(g))
        assert g2 == g
        x = np.array([-1.0, 0.5, 1.0, 3.0], np.float32)
        want = np.minimum(np.exp(x), 2.0)
        np.testing.assert_allclose(g2.evaluate({"x": x})[0], want, rtol=1e-6)
        compiled = Session("cpu").compile(g, CompileOptions(use_cache=False))
        np.testing.assert_allclose(compiled.run({"x": x})[0], want, rtol=1e-6)


def test_register_rejects_class_facets_declared_as_fields():
    """Without ``ClassVar`` the dataclass would turn ``mnemonic`` & co. into fields."""
    from rlx.ops.base import register, registry_scope

    namespace = {
        "__annotations__": {"mnemonic": "str", "arity": "int", "limit": "float"},
        "__doc__": "broken",
        "mnemonic": "facet_as_field_test",
        "arity": 1,
        "limit": 1.0,
        "infer": lambda self, ins: ins[0],
        "reference": lambda self, xs, ctx: xs[0],
    }
    with registry_scope():
        with pytest.raises(TypeError, match="arity, mnemonic became dataclass fields"):
            register(type("FacetAsField", (Op,), namespace))
        assert "facet_as_field_test" not in OPS
