"""Region builds batched into one gcc run (``engines.region.batch`` / ``batched``, issue 31
cold start): the same bits as each region built alone, the NumPy reference interpreter as
the oracle, one gcc run per batch, a cache hit for a batch built before, and the per-region
fallback when a region does not build."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.codegen import elementwise as codegen
from rlx.backends.cpu.codegen.elementwise import UNARY_C
from rlx.backends.cpu.engines import region
from rlx.backends.reference import evaluate
from rlx.dtype import DType
from rlx.ops.elementwise import UnaryKind

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

TOL = {np.dtype(np.float32): 2e-6, np.dtype(np.float64): 1e-12}


def _body(dt: DType, dims: list[tuple[int, ...]], fn: Callable[..., int]) -> rlx.Graph:
    g = rlx.Graph("body")
    ids = [g.input(f"in{k}", d, dt) for k, d in enumerate(dims)]
    g.set_outputs([fn(g, *ids)])
    return g


def _cases(seed: int) -> list[tuple[rlx.Graph, list[np.ndarray]]]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(7, 33)).astype(np.float32)
    b = rng.normal(size=33).astype(np.float32)
    d = rng.normal(size=(5, 9))
    return [
        (_body(DType.F32, [x.shape, b.shape], lambda g, a, c: g.gelu(g.add(a, c))), [x, b]),
        (_body(DType.F32, [x.shape], lambda g, a: g.mul(g.tanh(a), g.exp(a))), [x]),
        (_body(DType.F64, [d.shape], lambda g, a: g.sub(g.silu(a), g.mul(a, 0.25))), [d]),
        (_body(DType.F32, [x.shape, b.shape], lambda g, a, c: g.maximum(a, c)), [x, b]),
    ]


def _run(batch: bool, cases: list[tuple[rlx.Graph, list[np.ndarray]]]) -> list[np.ndarray]:
    """Each case's output: built alone (``batch`` False) or all in one batch."""
    kernels = []
    outs = []
    with region.batch() if batch else _nothing():
        for g, ins in cases:
            ref = evaluate(g, {f"in{k}": a for k, a in enumerate(ins)})[0]
            out = np.full(ref.shape, 7, ref.dtype)
            fn, arrays = codegen.render_region(g, ins, out)
            kernels.append(region.bind(region.load_function(fn), arrays))
            outs.append(out)
    for k in kernels:
        k()
    return outs


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


def test_batch_gives_the_bits_of_regions_built_alone() -> None:
    for seed in (0, 1, 2):
        cases = _cases(seed)
        alone = _run(False, cases)
        batched = _run(True, cases)
        for (g, ins), a, b in zip(cases, alone, batched, strict=True):
            np.testing.assert_array_equal(a, b)
            ref = evaluate(g, {f"in{k}": v for k, v in enumerate(ins)})[0]
            np.testing.assert_allclose(b, ref, TOL[ref.dtype], TOL[ref.dtype])


def test_one_gcc_run_per_batch_and_a_cache_hit_after(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path))
    tmp_path.chmod(0o700)
    runs: list[str] = []
    real = native._build_entry

    def spy(source: str, lib: Path, *a: object) -> None:
        runs.append(lib.name)
        real(source, lib, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(native, "_build_entry", spy)
    # constants unlike the other tests': sources no earlier test built in this process
    cases = _cases(3)
    cases.append((_body(DType.F32, [(3, 4)], lambda g, a: g.mul(g.exp(a), 0.8125)), []))
    cases[-1] = (cases[-1][0], [np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)])
    _run(True, cases)
    assert len(runs) == 1 and runs[0].startswith("regions-"), runs
    _run(True, cases)  # the same set again: no gcc (memo, then disk cache)
    assert len(runs) == 1, runs


def test_the_native_schedule_takes_deferred_kernels() -> None:
    from rlx.backends.cpu.native.schedule import native_call

    x = np.linspace(-3, 3, 40, dtype=np.float32).reshape(5, 8)
    g = _body(DType.F32, [x.shape], lambda g, a: g.sigmoid(a))
    out = np.empty_like(x)
    with region.batch():
        fn, arrays = codegen.render_region(g, [x], out)
        k = region.bind(region.load_function(fn), arrays)
        assert isinstance(k, region.DeferredKernel)
    spec = native_call(k)
    assert spec is not None
    k()
    np.testing.assert_allclose(out, 1 / (1 + np.exp(-x.astype(np.float64))), 2e-6, 1e-6)


def test_a_kernel_used_inside_its_batch_builds_what_is_deferred_so_far() -> None:
    """A kernel factory that runs (or schedules) a region kernel while the batch is still
    open (a fused block building its inner schedule) gets it built then; later regions
    of the same batch are built when it ends."""
    from rlx.backends.cpu.native.schedule import native_call

    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    first = _body(DType.F32, [x.shape], lambda g, a: g.mul(g.tanh(a), 0.375))
    second = _body(DType.F32, [x.shape], lambda g, a: g.add(g.exp(a), 0.625))
    o1, o2 = np.empty_like(x), np.empty_like(x)
    with region.batch():
        fn, arrays = codegen.render_region(first, [x], o1)
        k1 = region.bind(region.load_function(fn), arrays)
        assert native_call(k1) is not None  # asked inside the batch: built now
        k1()
        fn, arrays = codegen.render_region(second, [x], o2)
        k2 = region.bind(region.load_function(fn), arrays)
    k2()
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(o1, np.tanh(x64) * 0.375, 2e-6, 1e-6)
    np.testing.assert_allclose(o2, np.exp(x64) + 0.625, 2e-6, 1e-6)


def test_batched_falls_back_per_region_when_one_does_not_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A region gcc rejects makes the batch fail; ``batched`` resets and builds again
    without a batch, where that region's caller falls back (here: a NumPy result) and the
    others are native."""
    good = _body(DType.F32, [(4, 6)], lambda g, a: g.mul(g.tanh(a), 3.0))
    bad = _body(DType.F32, [(4, 6)], lambda g, a: g.add(g.exp(a), 1.0))
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    monkeypatch.setitem(UNARY_C, UnaryKind.EXP, lambda a, t: f"({a[0]} @@ not C)")
    resets: list[int] = []
    kinds: list[str] = []
    outs: list[np.ndarray] = []

    def build() -> list[Callable[[], object]]:
        kinds.clear()
        outs.clear()
        ks = []
        for g in (good, bad):
            out = np.empty_like(x)
            outs.append(out)
            try:
                fn, arrays = codegen.render_region(g, [x], out)
                ks.append(region.bind(region.load_function(fn), arrays))
                kinds.append("native")
            except rlx.errors.CompileError:
                ref = evaluate(g, {"in0": x})[0]
                ks.append(lambda out=out, ref=ref: np.copyto(out, ref))
                kinds.append("numpy")
        return ks

    ks = region.batched(build, reset=lambda: resets.append(1))
    assert resets == [1] and kinds == ["native", "numpy"]
    for k in ks:
        k()
    np.testing.assert_allclose(outs[0], np.tanh(x.astype(np.float64)) * 3, 2e-6, 1e-6)
    np.testing.assert_allclose(outs[1], np.exp(x.astype(np.float64)) + 1, 2e-6, 1e-6)
