"""Differential fuzzing of random graphs: the compiled CPU graph and rlx's reference
interpreter against an independent oracle, under every precision policy.

In: hypothesis-drawn random programs (tests/fuzz/programs.py), each built as an rlx
Graph and evaluated by the oracle (tests/fuzz/oracle.py, a float64 NumPy interpreter
that shares no code with rlx's op references), with fuse / native kernels /
freeze_params drawn too. Out: for each policy, the compiled result on its first run and
again after ``set_params`` with new values (the prologue must follow them), and the
reference interpreter on the compiled (policy-rewritten) graph, each within the policy's
tolerance of the oracle; the reference on the original graph within the f32 tolerance.
40 programs per policy, derandomized (the same programs every run), about 1 s per policy
with a warm native cache (``slow``: about 10 s in all with a cold one).

The error bound is ``tol * max(1, largest |intermediate value|)``: rounding at a narrow
precision is relative to the operands, so a difference of two large values may carry an
error that is large next to the (small) result. Programs whose values leave
[-1e3, 1e3] are discarded (f16 overflows at 65504, and such values are not what the
comparison is about). Excluded on purpose, until their fixes land (issue 19): quantize
to i32 (fault 14), pad (fault 15), f64 -> bf16 casts (fault 16, no f64 values here) and
softmax over non-finite or huge rows (fault 17, values stay within [-1e3, 1e3]).
Leaves are drawn next to the comparison thresholds too (``NEAR``, see programs.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rlx.ops.base import OpKind
from rlx.options import CompileOptions
from rlx.passes.precision import Precision, PrecisionPolicy
from rlx.runtime.session import Session

from . import oracle
from .programs import NEAR, THRESHOLDS, Program, build, programs

POLICIES: dict[str, PrecisionPolicy] = {
    "AlwaysF32": PrecisionPolicy.AlwaysF32,
    "AlwaysF16": PrecisionPolicy.AlwaysF16,
    "AutoMixedConservative": PrecisionPolicy.AutoMixedConservative,
    "AutoMixed": PrecisionPolicy.AutoMixed,
    "AutoMixedBf16": PrecisionPolicy.AutoMixedBf16,
    "Custom": PrecisionPolicy.Custom(
        {OpKind.COMPUTE: Precision.BF16, OpKind.ELEMENTWISE: Precision.F16}
    ),
}
# per unit of the scale above; a handful of roundings at the policy's narrowest dtype
TOL = {
    "AlwaysF32": 1e-4,
    "AlwaysF16": 2e-2,
    "AutoMixedConservative": 2e-2,
    "AutoMixed": 2e-2,
    "AutoMixedBf16": 1.2e-1,
    "Custom": 1.2e-1,
}
LIMIT = 1e3  # programs whose oracle values leave [-LIMIT, LIMIT] are discarded

# ---- the test ---------------------------------------------------------------------------


def _values(p: Program, rng: np.random.Generator, kind: str) -> dict[str, np.ndarray]:
    """Random values for the leaves of ``kind``; params scaled like weights
    (1/sqrt(fan-in)) so products stay O(1)."""
    out = {}
    for i, leaf in p.leaves:
        if leaf.kind == kind:
            shape = p.shapes[i]
            scale = 1.0 / math.sqrt(shape[0]) if kind == "param" and len(shape) == 2 else 1.0
            v = rng.standard_normal(shape) * scale
            # one value in eight next to a threshold (see NEAR), a quarter of those on it
            off = 10.0 ** rng.uniform(*np.log10(NEAR), shape) * rng.choice((-1.0, 1.0), shape)
            off *= rng.random(shape) < 0.75
            near = rng.random(shape) < 0.125
            v = np.where(near, rng.choice(THRESHOLDS, shape) + off, v)
            out[leaf.name] = v.astype(np.float32)
    return out


def _check(got: list[np.ndarray], want: list[np.ndarray], bound: float, what: str) -> None:
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.shape == b.shape, f"{what} output {i}: shape {a.shape}, oracle {b.shape}"
        assert np.all(np.isfinite(a)), f"{what} output {i}: non-finite values {a}"
        err = float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0))
        assert err <= bound, f"{what} output {i}: max error {err:.3g} > bound {bound:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("policy", list(POLICIES))
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    prog=programs(),
    seed=st.integers(0, 2**32 - 1),
    fuse=st.booleans(),
    native=st.booleans(),
    freeze=st.booleans(),
)
def test_compiled_and_reference_match_the_oracle(
    policy: str, prog: Program, seed: int, fuse: bool, native: bool, freeze: bool
) -> None:
    rng = np.random.default_rng(seed)
    inputs, params = _values(prog, rng, "input"), _values(prog, rng, "param")
    want, scale = oracle.run(prog, {**inputs, **params})
    assume(scale <= LIMIT)
    g = build(prog)
    bound32 = TOL["AlwaysF32"] * max(1.0, scale)
    _check(g.evaluate(inputs, params), want, bound32, "reference (original graph)")
    opts = CompileOptions(
        precision=POLICIES[policy],
        fuse=fuse,
        native=native,
        freeze_params=freeze,
        use_cache=False,
        verbose=False,
    )
    cg = Session("cpu").compile(g, opts, params=params)
    bound = TOL[policy] * max(1.0, scale)
    _check(cg.run(inputs), want, bound, f"compiled {policy} first run")
    kept = {k: params[k] for k in cg.graph.param_names}  # none when frozen
    _check(cg.graph.evaluate(inputs, kept), want, bound, f"reference of the {policy} graph")
    if freeze:  # the params are constants of the compiled graph now
        return
    # new param values: the prologue (param-only products) must follow them
    params2 = _values(prog, rng, "param")
    want2, scale2 = oracle.run(prog, {**inputs, **params2})
    assume(scale2 <= LIMIT)
    cg.set_params(params2)
    _check(
        cg.run(inputs), want2, TOL[policy] * max(1.0, scale2), f"compiled {policy} after set_params"
    )
