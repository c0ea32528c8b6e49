"""Gradient checks against finite differences: the oracle for every derivative rule.

In: a graph (float64 inputs and params recommended), values for its inputs and params,
and the names to check. Out: nothing when the rule agrees, AssertionError naming the
input and the two numbers otherwise.

``check_vjp`` compares ``<J^T u, v>`` from the vjp graph with the central difference
``<u, (f(x + e v) - f(x - e v)) / 2e>`` for random cotangents ``u`` and directions ``v``;
``check_jvp`` compares the jvp graph's ``J v`` with the same difference. Both evaluate
with the NumPy reference interpreter (and, with ``compiled=True``, also compile the
derivative graph for the CPU backend and compare it with the interpreter).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx.ir.mir import Graph

__all__ = ["check_vjp", "check_jvp", "numeric_directional"]


def _split(graph: Graph, values: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    ins = set(graph.input_names)
    return (
        {k: v for k, v in values.items() if k in ins},
        {k: v for k, v in values.items() if k not in ins},
    )


def _eval(graph: Graph, values: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    i, p = _split(graph, values)
    return [np.asarray(o) for o in graph.evaluate(i, p)]


def numeric_directional(
    graph: Graph,
    values: Mapping[str, np.ndarray],
    direction: Mapping[str, np.ndarray],
    eps: float = 1e-6,
) -> list[np.ndarray | None]:
    """``(f(x + eps v) - f(x - eps v)) / (2 eps)`` for every output of ``graph`` (None for
    an output that is not float)."""
    plus = dict(values)
    minus = dict(values)
    for k, v in direction.items():
        plus[k] = values[k] + eps * v
        minus[k] = values[k] - eps * v
    fp, fm = _eval(graph, plus), _eval(graph, minus)
    return [
        (a.astype(_wide(a)) - b.astype(_wide(a))) / (2 * eps) if _is_float(a) else None
        for a, b in zip(fp, fm, strict=True)
    ]


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind in "fc"


def _wide(a: np.ndarray) -> type:
    return np.complex128 if a.dtype.kind == "c" else np.float64


def _rand_like(rng: np.random.Generator, a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":  # both parts random: a real-only probe misses half the rule
        return (rng.standard_normal(a.shape) + 1j * rng.standard_normal(a.shape)).astype(a.dtype)
    return rng.standard_normal(a.shape).astype(a.dtype)


def check_vjp(
    graph: Graph,
    values: Mapping[str, Any],
    wrt: Sequence[str],
    *,
    seed: int = 0,
    trials: int = 2,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    compiled: bool = False,
) -> None:
    """Check the reverse-mode rules of every op in ``graph`` on the path from ``wrt``
    (input / param names) to its float outputs."""
    from rlx.autodiff.reverse import vjp

    values = {k: np.asarray(v) for k, v in values.items()}
    rng = np.random.default_rng(seed)
    back = vjp(graph, list(wrt))
    outs = _eval(graph, values)
    nout = len(graph.outputs)
    ct_names = [n for n in back.input_names if n not in graph.input_names]
    for t in range(trials):
        cts = {
            n: (_rand_like(rng, o) if _is_float(o) else np.zeros_like(o))
            for n, o in zip(ct_names, outs, strict=True)
        }
        feed = {**values, **cts}
        res = _eval(back, feed)
        if compiled:
            _compare_compiled(back, feed, res)
        grads = res[nout:]
        v = {w: _rand_like(rng, values[w]) for w in wrt}
        num = numeric_directional(graph, values, v, eps)
        lhs = sum(
            float(np.vdot(cts[n], d).real)
            for n, d in zip(ct_names, num, strict=True)
            if d is not None
        )
        rhs = sum(float(np.vdot(gr, v[w]).real) for gr, w in zip(grads, wrt, strict=True))
        scale = max(abs(lhs), abs(rhs), 1.0)
        if not abs(lhs - rhs) <= atol + rtol * scale:
            raise AssertionError(
                f"vjp of graph {graph.name!r} wrt {list(wrt)} (trial {t}): "
                f"<u, J v> by finite differences {lhs!r} vs <J^T u, v> {rhs!r}"
            )


def check_jvp(
    graph: Graph,
    values: Mapping[str, Any],
    wrt: Sequence[str],
    *,
    seed: int = 0,
    trials: int = 2,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    compiled: bool = False,
) -> None:
    """Check the forward-mode rules: the jvp graph's output tangents against central
    differences along random directions of the ``wrt`` inputs / params."""
    from rlx.autodiff import jvp  # type: ignore[attr-defined]

    values = {k: np.asarray(v) for k, v in values.items()}
    rng = np.random.default_rng(seed)
    fwd = jvp(graph, list(wrt))
    nout = len(graph.outputs)
    tan_names = [n for n in fwd.input_names if n not in graph.input_names]
    for t in range(trials):
        v = {w: _rand_like(rng, values[w]) for w in wrt}
        feed = {**values, **dict(zip(tan_names, [v[w] for w in wrt], strict=True))}
        res = _eval(fwd, feed)
        if compiled:
            _compare_compiled(fwd, feed, res)
        num = numeric_directional(graph, values, v, eps)
        for k, (got, want) in enumerate(zip(res[nout:], num, strict=True)):
            if want is None:
                continue
            err = float(np.max(np.abs(got - want), initial=0.0))
            bound = atol + rtol * max(float(np.max(np.abs(want), initial=0.0)), 1.0)
            if not err <= bound:
                raise AssertionError(
                    f"jvp of graph {graph.name!r} wrt {list(wrt)} (trial {t}), output {k}: "
                    f"max |J v - finite difference| = {err:.3g} > {bound:.3g}"
                )


def _compare_compiled(g: Graph, feed: Mapping[str, np.ndarray], want: list[np.ndarray]) -> None:
    from rlx.runtime.session import Session

    i, p = _split(g, feed)
    compiled = Session("cpu").compile(g, params=p)
    got = compiled.run(i)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        tol = 1e-9 if a.dtype == np.float64 else 1e-4
        np.testing.assert_allclose(
            a, b, rtol=tol, atol=tol, err_msg=f"graph {g.name!r} output {k}: compiled vs reference"
        )
