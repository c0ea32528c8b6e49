"""What the family kernel tests share: compile a small graph, run it against the reference
interpreter (to a dtype's tolerance, or exactly), check the report names a kernel other
than ``reference``, and measure what the schedule's closures allocate per run."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import ml_dtypes
import numpy as np
from hypothesis import settings

import rlx
from rlx import DType
from rlx.backends.cpu.dispatch import KernelKind
from rlx.options import CompileOptions
from rlx.runtime.session import Session

RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)
TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
FLOATS = ("float32", "float64", "float16", "bfloat16")
DT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
FAST = settings(max_examples=40, deadline=None)
SESSION = rlx.Session("cpu")


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def rand(rng: np.random.Generator, dims: tuple[int, ...], dtype: str) -> np.ndarray:
    dt = np_dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -50), min(info.max, 50), dims, endpoint=True).astype(dt)
    return rng.standard_normal(dims).astype(dt)


def check_numpy_kernel(
    build: Callable[[rlx.Graph], object],
    feed: dict[str, np.ndarray],
    op: str,
    options: CompileOptions = RAW,
) -> None:
    """Compile ``build``, run it twice (scratch reuse), compare with the reference and
    check the output node's kernel is not the reference kernel."""
    g = rlx.Graph(op)
    g.set_outputs([build(g)])
    cg = Session("cpu").compile(g, options)
    (want,) = g.evaluate(feed)
    for _ in range(2):
        (got,) = cg.run(feed)
        assert got.dtype == want.dtype and got.shape == want.shape
        if want.dtype.kind in "iub":
            np.testing.assert_array_equal(got, want)
        else:
            tol = TOL[want.dtype.name]
            np.testing.assert_allclose(
                got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol
            )
    recs = [k for k in cg.report().kernels if k.op == op]
    assert recs and all(k.kind is KernelKind.NUMPY for k in recs), recs


def compile_graph(build, **arrays):
    g = rlx.Graph("k")
    ids = {k: g.input(k, v.shape, DType.from_numpy(v.dtype)) for k, v in arrays.items()}
    outs = build(g, **ids)
    g.set_outputs(list(outs) if isinstance(outs, (list, tuple)) else [outs])
    return g, SESSION.compile(g)


def check_exact(build, kinds=None, **arrays):
    """Compiled == reference (exactly, NaN == NaN); no reference kernel; returns both."""
    g, cg = compile_graph(build, **arrays)
    ref = g.evaluate(arrays)
    got = cg.run(arrays)
    for r, c in zip(ref, got, strict=True):
        assert c.dtype == r.dtype and c.shape == r.shape
        if c.dtype.name == "bfloat16":  # NaN == NaN only once NumPy sees a float dtype
            c, r = c.astype(np.float32), r.astype(np.float32)
        np.testing.assert_array_equal(c, r)
    rep = cg.report()
    used = {k.kind for k in rep.kernels if k.view_of is None}
    assert KernelKind.REFERENCE not in used, str(rep)
    if kinds is not None:
        assert used <= kinds, used
    return ref, got, cg


def schedule_allocations(cg, feed):
    """Peak bytes NumPy allocates while the compiled schedule's closures run (inputs
    already in the arena, outputs not copied out)."""
    cg.run(feed)
    ex = cg._last  # the executor of that run
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        for f in ex.schedule:
            f()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
