"""The per-op differential harness (tests/fuzz/test_ops_*.py): one graph, its inputs and an
independent oracle in; the rlx reference interpreter and the compiled CPU graph, under every
precision policy and every native build target this CPU runs, checked against the oracle.

In: a Graph, its inputs and params, and the oracle's outputs, given as a function of a
rounding ``rnd`` (``rnd(a)`` is ``a`` rounded to the precision the op runs at under a policy,
f32 / f16 / bf16, then widened to f64): the oracle applied to the rounded operands is what a
narrow kernel computes up to its own rounding. Out: nothing, or an AssertionError naming
the variant (reference, or compiled with its target and policy), the output and the error.

Checked, for each output (``check``):

* the reference interpreter on the original graph (f32), within ``tol.f32``;
* for every target in :data:`TARGETS` (``RLX_ISA`` forced while compiling and running) and
  every policy in :data:`POLICIES`: the compiled graph's run, and (first target only) the
  reference interpreter on the compiled, policy-rewritten graph, within the tolerance of
  the precision the policy gives the op's kind (``PrecisionPolicy.precision_for``); and
  the NumPy / BLAS kernels (``native=False``) under AlwaysF32 and AlwaysF16;
* integer and bool outputs, and outputs the test calls exact, must be equal; NaNs must
  sit where the oracle has them.

The error bound of a float output is ``tol.<precision> * scale`` elementwise, ``scale``
defaulting to ``1 + |oracle|`` (a test passes its own where cancellation makes the result
small next to its terms, e.g. ``|a| @ |b|`` for a product, or ``"max"``: ``1 +`` the
output's largest finite ``|value|``).

Examples per test: each test's own small count (CI: derandomized, see tests/conftest.py);
``RLX_FUZZ_EXAMPLES=<n>`` runs every test with ``n`` examples (docs/fuzzing.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from rlx.backends.cpu import native
from rlx.dtype import DType
from rlx.ir.mir import Graph
from rlx.ops.base import OpKind
from rlx.options import CompileOptions
from rlx.passes.precision import Precision, PrecisionPolicy
from rlx.runtime.compiled import CompiledGraph
from rlx.runtime.session import Session

__all__ = ["POLICIES", "TARGETS", "Tol", "EXACT", "Variant", "check", "compiled", "examples",
           "forced_isa", "narrowest", "rounder", "SEEDS", "exact_values", "leaves", "WEIGHTS", "check_runs"]  # fmt: skip

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
# the native build targets this CPU runs (None: no gcc, the NumPy kernels only)
TARGETS: list[str | None] = (
    [t.value for t in native.runnable_targets()] if native.available() else [None]
)
# the NumPy / BLAS kernels (native=False) under these policies too
NUMPY_POLICIES = ("AlwaysF32", "AlwaysF16")
SEEDS = st.integers(0, 2**32 - 1)
# how an op's weights arrive: graph inputs, params (the executor's prologue runs what
# only they feed), or params frozen into constants at compile time (folding)
WEIGHTS = st.sampled_from(["inputs", "params", "frozen"])
_ORDER = {"f32": 0, "f16": 1, "bf16": 2}
_ROUND = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


@dataclass(frozen=True, slots=True)
class Tol:
    """Error bounds per unit of ``scale`` at each precision the op may run at."""

    f32: float = 1e-5
    f16: float = 4e-3
    bf16: float = 3e-2

    def at(self, prec: str) -> float:
        return float(getattr(self, prec))


EXACT = Tol(0.0, 0.0, 0.0)


def examples(n: int, **kw) -> settings:
    """Hypothesis settings of a per-op test: ``n`` examples (``RLX_FUZZ_EXAMPLES``
    overrides), no deadline; the rest (derandomize, database) from the loaded profile."""
    raw = os.environ.get("RLX_FUZZ_EXAMPLES", "").strip()
    count = int(raw) if raw else n
    health = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
    return settings(max_examples=count, deadline=None, suppress_health_check=health, **kw)


def rounder(prec: str) -> Callable[[np.ndarray], np.ndarray]:
    """``a`` (through f32, as the graph holds it) rounded to ``prec``, as f64."""
    if prec == "f32":
        return lambda a: np.asarray(a, np.float32).astype(np.float64)
    t = _ROUND[prec]
    return lambda a: np.asarray(a, np.float32).astype(t).astype(np.float64)


def narrowest(policy: PrecisionPolicy, kinds: Sequence[OpKind]) -> str:
    """The narrowest precision ``policy`` gives any of ``kinds``."""
    precs = [policy.precision_for(k).value for k in kinds] or ["f32"]
    return max(precs, key=_ORDER.__getitem__)


def exact_values(rng: np.random.Generator, shape: Sequence[int], lim: int = 64) -> np.ndarray:
    """f32 values held exactly by f16 and bf16 (quarters in [-lim/4, lim/4]): data
    movement of them is exact under every policy."""
    return np.asarray(rng.integers(-lim, lim + 1, tuple(shape)) / 4.0, np.float32)


def leaves(
    g: Graph, arrays: Mapping[str, np.ndarray], as_params: Sequence[str] = ()
) -> tuple[dict[str, int], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Declare each array as an input of ``g``, or a param when its name is in
    ``as_params``; returns (node id by name, the inputs, the params)."""
    ids, inputs, params = {}, {}, {}
    for name, a in arrays.items():
        dt = DType.from_numpy(np.asarray(a).dtype)
        if name in as_params:
            ids[name], params[name] = g.param(name, np.shape(a), dt), a
        else:
            ids[name], inputs[name] = g.input(name, np.shape(a), dt), a
    return ids, inputs, params


@contextlib.contextmanager
def forced_isa(target: str | None) -> Iterator[None]:
    """``RLX_ISA=target`` inside the block (unchanged for None), restored after."""
    if target is None:
        yield
        return
    old = os.environ.get("RLX_ISA")
    os.environ["RLX_ISA"] = target
    try:
        yield
    finally:
        if old is None:
            del os.environ["RLX_ISA"]
        else:
            os.environ["RLX_ISA"] = old


@dataclass(frozen=True, slots=True)
class Variant:
    """One compiled variant: its target ("numpy": native kernels off), policy name, the
    op's precision, the graph."""

    target: str | None
    policy: str
    prec: str
    cg: CompiledGraph

    @property
    def label(self) -> str:
        where = "native=False" if self.target == "numpy" else f"RLX_ISA={self.target}"
        return f"compiled ({where}, {self.policy})"


def compiled(
    g: Graph,
    params: Mapping[str, np.ndarray],
    kinds: Sequence[OpKind],
    policies: Sequence[str] | None = None,
    **opts,
) -> Iterator[Variant]:
    """Each (target, policy) variant of ``g``, compiled with ``params``; ``RLX_ISA`` stays
    forced while the caller runs it (until the next variant is drawn)."""
    runs = [(t, n, True) for t in TARGETS for n in policies or POLICIES]
    runs += [(None, n, False) for n in NUMPY_POLICIES if policies is None or n in policies]
    for target, name, native_kernels in runs:
        with forced_isa(target):
            pol = POLICIES[name]
            o = CompileOptions(
                precision=pol, use_cache=False, verbose=False, native=native_kernels, **opts
            )
            cg = Session("cpu").compile(g, o, params=dict(params))
            yield Variant(target if native_kernels else "numpy", name, narrowest(pol, kinds), cg)


Oracle = Callable[[Callable[[np.ndarray], np.ndarray]], Sequence[np.ndarray]]
Scale = Callable[[Callable], Sequence] | Sequence | str | None


def _compare(
    got: Sequence[np.ndarray],
    want: Sequence[np.ndarray],
    t: float,
    scale: Sequence[np.ndarray | float] | None,
    what: str,
) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} outputs, the oracle has {len(want)}"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, f"{what} output {i}: shape {a.shape}, oracle {b.shape}"
        if b.dtype.kind in "biu" or a.dtype.kind in "biu":
            bad = a.astype(np.int64) != b.astype(np.int64)
            assert not bad.any(), (
                f"{what} output {i}: {int(bad.sum())} of {b.size} differ, first at "
                f"{np.argwhere(bad)[0].tolist()}: {a[bad][0]} vs oracle {b[bad][0]}"
            )
            continue
        if b.dtype.kind == "c" or a.dtype.kind == "c":
            a, b = a.astype(np.complex128), b.astype(np.complex128)
        else:
            a, b = a.astype(np.float64), b.astype(np.float64)
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        assert np.array_equal(nan_a, nan_b), (
            f"{what} output {i}: NaN at {np.argwhere(nan_a != nan_b)[0].tolist()} "
            f"(got {a[nan_a != nan_b][0]}, oracle {b[nan_a != nan_b][0]})"
        )
        ok = ~nan_b
        sc = (1.0 + np.abs(b)) if scale is None or scale[i] is None else scale[i]
        with np.errstate(invalid="ignore"):
            bound = t * np.broadcast_to(np.asarray(sc, np.float64), b.shape)  # 0 * inf: NaN
            same = a == b  # equal infinities
            err = np.where(same, 0.0, np.abs(a - b))
        bad = ok & ~same & ~(err <= bound)
        if bad.any():
            j = tuple(np.argwhere(bad)[0])
            raise AssertionError(
                f"{what} output {i}: {int(bad.sum())} of {b.size} beyond the bound; first "
                f"at {list(j)}: got {a[j]!r}, oracle {b[j]!r}, error {err[j]:.3g} > "
                f"bound {bound[j]:.3g}; max error {float(np.max(np.where(ok, err, 0))):.3g}"
            )


def check(
    g: Graph,
    inputs: Mapping[str, np.ndarray],
    params: Mapping[str, np.ndarray],
    oracle: Oracle | Sequence[np.ndarray],
    kinds: Sequence[OpKind],
    tol: Tol = Tol(),
    scale: Scale = None,
    policies: Sequence[str] | None = None,
    **opts,
) -> None:
    """The reference interpreter and every compiled variant of ``g`` against ``oracle``
    (see the module docstring). ``kinds``: the op kinds whose precision the policies
    decide (the narrowest one sets the tolerance)."""
    check_runs(g, [(inputs, oracle)], params, kinds, tol, scale, policies, **opts)


def check_runs(
    g: Graph,
    cases: Sequence[tuple[Mapping[str, np.ndarray], Oracle | Sequence[np.ndarray]]],
    params: Mapping[str, np.ndarray],
    kinds: Sequence[OpKind],
    tol: Tol = Tol(),
    scale: Scale = None,
    policies: Sequence[str] | None = None,
    **opts,
) -> None:
    """``check`` of several (inputs, oracle) cases run one after the other by each
    compiled variant: one compiled graph serves inputs of several sizes when ``g`` has
    symbolic dims."""
    cache: dict[tuple[int, str], tuple[Sequence[np.ndarray], Sequence | None]] = {}

    def want(k: int, prec: str) -> tuple[Sequence[np.ndarray], Sequence | None]:
        if (k, prec) not in cache:
            rnd, oracle = rounder(prec), cases[k][1]
            w = [np.asarray(a) for a in (oracle(rnd) if callable(oracle) else oracle)]
            if isinstance(scale, str):  # "max": 1 + the largest finite |value| of each output
                s = [1.0 + float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)) for a in w]
            else:
                s = scale(rnd) if callable(scale) else scale
            cache[k, prec] = (w, s)
        return cache[k, prec]

    many = len(cases) > 1
    for k, (inputs, _) in enumerate(cases):
        w32, s32 = want(k, "f32")
        what = f"reference (run {k})" if many else "reference"
        _compare(g.evaluate(dict(inputs), dict(params)), w32, tol.f32, s32, what)
    seen: set[str] = set()
    for v in compiled(g, params, kinds, policies, **opts):
        t = tol.at(v.prec)
        for k, (inputs, _) in enumerate(cases):
            w, s = want(k, v.prec)
            _compare(v.cg.run(dict(inputs)), w, t, s, v.label + (f" run {k}" if many else ""))
        if v.policy not in seen:  # the policy's graph is the same on every target
            seen.add(v.policy)
            kept = {n: params[n] for n in v.cg.graph.param_names}
            for k, (inputs, _) in enumerate(cases):
                w, s = want(k, v.prec)
                got = v.cg.graph.evaluate(dict(inputs), kept)
                _compare(
                    got,
                    w,
                    t,
                    s,
                    f"reference of the {v.policy} graph" + (f" run {k}" if many else ""),
                )
