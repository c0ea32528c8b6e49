"""Param-only matmuls under every precision policy (issue 19, fault 13).

A matmul whose operands are all params is hoisted into the executor's prologue; under a
reduced-precision policy its kernel packs (bf16) or widens (f16) its weight in a
``KernelCtx.prologue`` step. That step must run before the hoisted matmul itself, on the
first run and after every ``set_params``, never after it (the first run then read
uninitialised memory, the later ones the previous params' weight). Checked for the four
patterns the fuzzer found, under every named PrecisionPolicy, against a NumPy f64 oracle,
with new param values after ``set_params``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

import rlx
from rlx.ir.mir import Graph
from rlx.options import CompileOptions
from rlx.passes.precision import PrecisionPolicy
from rlx.runtime.session import Session

POLICIES = {
    "AlwaysF32": PrecisionPolicy.AlwaysF32,
    "AlwaysF16": PrecisionPolicy.AlwaysF16,
    "AutoMixedConservative": PrecisionPolicy.AutoMixedConservative,
    "AutoMixed": PrecisionPolicy.AutoMixed,
    "AutoMixedBf16": PrecisionPolicy.AutoMixedBf16,
}
# error bound relative to max |oracle|: a few roundings of the inputs, the product, the sum
TOL = {
    "AlwaysF32": 1e-5,
    "AlwaysF16": 1e-2,
    "AutoMixedConservative": 1e-2,
    "AutoMixed": 1e-2,
    "AutoMixedBf16": 5e-2,
}

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


Oracle = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], np.ndarray]


def _pp() -> tuple[Graph, dict[str, tuple[int, ...]], Oracle]:
    g = rlx.Graph("pp")
    a, b = g.param("a", (3, 5)), g.param("b", (5, 24))
    g.set_outputs([g.matmul(a, b)])
    return g, {"a": (3, 5), "b": (5, 24)}, lambda x, p: p["a"] @ p["b"]


def _x_plus_pp() -> tuple[Graph, dict[str, tuple[int, ...]], Oracle]:
    g = rlx.Graph("x_pp")
    x = g.input("x", (6, 24))
    a, b = g.param("a", (6, 9)), g.param("b", (9, 24))
    g.set_outputs([g.add(x, g.matmul(a, b))])
    return g, {"x": (6, 24), "a": (6, 9), "b": (9, 24)}, lambda x, p: x["x"] + p["a"] @ p["b"]


def _gelu_pp_bias() -> tuple[Graph, dict[str, tuple[int, ...]], Oracle]:
    g = rlx.Graph("gelu_pp")
    x = g.input("x", (4, 16))
    a, b, c = g.param("a", (4, 7)), g.param("b", (7, 16)), g.param("c", (16,))
    g.set_outputs([g.add(x, g.gelu(g.add(g.matmul(a, b), c)))])
    return (
        g,
        {"x": (4, 16), "a": (4, 7), "b": (7, 16), "c": (16,)},
        lambda x, p: x["x"] + _gelu(p["a"] @ p["b"] + p["c"]),
    )


def _lora() -> tuple[Graph, dict[str, tuple[int, ...]], Oracle]:
    g = rlx.Graph("lora")
    x = g.input("x", (5, 32))
    w, a, b = g.param("w", (32, 20)), g.param("la", (32, 4)), g.param("lb", (4, 20))
    g.set_outputs([g.matmul(x, g.add(w, g.matmul(a, b)))])
    shapes = {"x": (5, 32), "w": (32, 20), "la": (32, 4), "lb": (4, 20)}
    return g, shapes, lambda x, p: x["x"] @ (p["w"] + p["la"] @ p["lb"])


PATTERNS = {"param@param": _pp, "x+param@param": _x_plus_pp, "gelu": _gelu_pp_bias, "lora": _lora}


def _draw(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]], names) -> dict:
    return {k: rng.standard_normal(shapes[k]).astype(np.float32) for k in names}


def _check(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    assert np.all(np.isfinite(got)), f"{what}: non-finite output"
    err = float(np.max(np.abs(got.astype(np.float64) - want)))
    scale = float(np.max(np.abs(want)))
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol} * {scale:.3g}"


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("fuse", [True, False])
def test_param_only_matmul_first_run_and_after_set_params(
    pattern: str, policy: str, fuse: bool
) -> None:
    g, shapes, oracle = PATTERNS[pattern]()
    inputs = [n.op.name for n in g.input_nodes()]
    params = list(g.param_names)
    rng = np.random.default_rng(sum(map(ord, pattern + policy)))
    xs = _draw(rng, shapes, inputs)
    opts = CompileOptions(precision=POLICIES[policy], fuse=fuse, use_cache=False, verbose=False)
    ps = _draw(rng, shapes, params)
    cg = Session("cpu").compile(g, opts, params=ps)
    wide = lambda d: {k: v.astype(np.float64) for k, v in d.items()}  # noqa: E731
    for step in range(3):
        if step:  # new values: the prologue and its prepare steps must see them
            ps = _draw(rng, shapes, params)
            cg.set_params(ps)
        want = oracle(wide(xs), wide(ps))
        for rep in range(2):
            (got,) = cg.run(xs)
            _check(got, want, TOL[policy], f"{pattern} {policy} step {step} run {rep}")
