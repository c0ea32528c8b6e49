"""The registry's derivative facet: every op with inputs declares its rules (``vjp`` and
``jvp``) or why it has none (``nondiff``), every differentiable op is mentioned in a
``tests/autodiff/test_grad_*.py`` file, and a generic gradient check runs over every
differentiable op (every kind of Unary / Binary / Trig / Reduce / Fft) with
hypothesis-drawn shapes: check_vjp and check_jvp against central differences in f64.

Sample builders are in ``tests/autodiff/samples.py``; an op without one fails
``test_every_differentiable_op_has_a_sample`` by name (nothing is skipped silently).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx.autodiff import jvp, vjp
from rlx.autodiff.check import check_jvp, check_vjp
from rlx.ops import OPS
from rlx.ops.base import Op

from .samples import KINDS, NO_GRADIENT_KINDS, SAMPLES, Case

HERE = Path(__file__).parent


def _with_inputs() -> dict[str, type[Op]]:
    return {k: c for k, c in sorted(OPS.items()) if c.arity != 0}


def _differentiable() -> dict[str, type[Op]]:
    return {k: c for k, c in _with_inputs().items() if not c.nondiff}


def test_every_op_declares_its_derivative_rules_or_why_not() -> None:
    missing = []
    for name, cls in _with_inputs().items():
        if not isinstance(cls.nondiff, str):
            missing.append(f"{name}: nondiff must be a str, got {cls.nondiff!r}")
            continue
        if cls.nondiff.strip():
            continue
        lacks = [f for f in ("vjp", "jvp") if getattr(cls, f) is getattr(Op, f)]
        if lacks:
            missing.append(f"{name} ({cls.__name__}): no {' / '.join(lacks)} and no nondiff reason")
    assert not missing, "ops without derivative rules:\n  " + "\n  ".join(missing)


def test_every_differentiable_op_is_mentioned_in_a_grad_test() -> None:
    text = "\n".join(p.read_text() for p in sorted(HERE.glob("test_grad_*.py")))
    missing = [
        f"{name} ({cls.__name__})"
        for name, cls in _differentiable().items()
        if not re.search(rf"\b{cls.__name__}\b", text)
        and f'"{name}"' not in text
        and f"'{name}'" not in text
    ]
    assert not missing, (
        "differentiable ops no tests/autodiff/test_grad_*.py file mentions:\n  "
        + "\n  ".join(missing)
    )


def test_every_differentiable_op_has_a_sample() -> None:
    covered = {k.split(":")[0] for k in SAMPLES}
    missing = sorted(set(_differentiable()) - covered)
    assert not missing, f"differentiable ops without a sample in samples.py: {missing}"


def test_every_kind_has_a_sample_or_a_reason() -> None:
    missing = [
        f"{op}:{kind.value}"
        for op, kinds in KINDS.items()
        for kind in kinds
        if f"{op}:{kind.value}" not in SAMPLES and (op, kind) not in NO_GRADIENT_KINDS
    ]
    assert not missing, f"kinds without a sample or a stated reason: {missing}"


def _transposed(case: Case, seed: int = 1) -> None:
    """The vjp graph is the transpose of the jvp graph: ``<J^T u, v> == <u, J v>``."""
    g, vals, wrt = case.graph, case.values, case.wrt
    rng = np.random.default_rng(seed)
    fwd, back = jvp(g, wrt), vjp(g, wrt)
    v = {f"t_{w}": rng.standard_normal(vals[w].shape).astype(vals[w].dtype) for w in wrt}
    outs = fwd.evaluate({**vals, **v})
    n = len(g.outputs)
    u = {f"ct{k}": rng.standard_normal(o.shape).astype(o.dtype) for k, o in enumerate(outs[:n])}
    grads = back.evaluate({**vals, **u})[n:]
    lhs = sum(float(np.vdot(u[f"ct{k}"], t).real) for k, t in enumerate(outs[n:]))
    rhs = sum(float(np.vdot(gr, v[f"t_{w}"]).real) for gr, w in zip(grads, wrt, strict=True))
    assert abs(lhs - rhs) <= case.atol + case.rtol * max(abs(lhs), abs(rhs), 1.0), (lhs, rhs)


def _check(case: Case) -> None:
    kw = {"eps": case.eps, "rtol": case.rtol, "atol": case.atol}
    _transposed(case)
    if case.surrogate:
        return
    check_vjp(case.graph, case.values, case.wrt, **kw)
    check_jvp(case.graph, case.values, case.wrt, **kw)


@pytest.mark.parametrize("name", sorted(SAMPLES))
@settings(max_examples=6)
@given(data=st.data())
def test_gradient_matches_finite_differences(name: str, data: st.DataObject) -> None:
    _check(SAMPLES[name](data))
