"""Generated C depends on structure only, and each library exports its own symbol
(issue 19, faults 8 and 2).

* Scalar constants of an elementwise region are run-time arguments: compiles that differ
  only in a constant share one library (before: one gcc build and one loaded ``.so`` per
  distinct value), and the results still equal the reference interpreter's.
* Region and row functions are named after their text (``rlx_region_<hex>``): a library
  holding another kernel's code lacks the symbol, so loading it is a CompileError (the
  kernel falls back to NumPy) instead of silently running the other kernel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.codegen import elementwise as codegen
from rlx.backends.cpu.codegen.elementwise import C_TYPES, CModule
from rlx.backends.cpu.codegen.rows import RowKind, RowSpec, render_rows
from rlx.backends.cpu.engines import region as kernels_region
from rlx.backends.cpu.kernels import KernelKind
from rlx.backends.reference import evaluate
from rlx.dtype import DType
from rlx.errors import CompileError
from rlx.options import CompileOptions
from rlx.runtime.session import Session

pytestmark = pytest.mark.skipif(not native.available(), reason="gcc is not installed")

RAW = CompileOptions(optimize=False, fuse=False, use_cache=False)
FULL = CompileOptions(use_cache=False)


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every (library name, source) given to ``native.build`` while the test runs."""
    seen: list[tuple[str, str]] = []
    real = native.build

    def spy(source: str, *args: object, **kw: object) -> Path:
        name = args[1] if len(args) > 1 else kw.get("name", "kernel")
        seen.append((str(name), source))
        return real(source, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(native, "build", spy)
    return seen


def region_entries(cg: object) -> list[object]:
    entries = cg._executor_any().entries  # type: ignore[attr-defined]
    return [e for e in entries if e.op == "elementwise_region"]


def test_fifty_scalars_one_library(builds: list[tuple[str, str]]) -> None:
    """50 compiles of one region differing in one scalar: one region source, results
    equal to the reference's (f32 mul and add: bit for bit)."""
    x = np.random.default_rng(0).normal(size=(8, 33)).astype(np.float32)
    for k in range(50):
        s = float(np.float32(0.37 * k - 4.1))
        g = rlx.Graph(f"scaled{k}")
        xi = g.input("x", x.shape)
        g.set_outputs([g.elementwise_region([xi], lambda sg, a, s=s: sg.add(sg.mul(a, s), 1.5))])
        cg = Session("cpu").compile(g, RAW)
        (entry,) = region_entries(cg)
        assert entry.kind is KernelKind.NATIVE, entry.notes  # type: ignore[attr-defined]
        np.testing.assert_array_equal(cg.run({"x": x})[0], evaluate(g, {"x": x})[0])
    regions = [src for name, src in builds if name == "region"]  # (not the schedule's)
    assert len(regions) == 50 and len(set(regions)) == 1


def test_fused_graphs_differing_in_constants_share_a_library(
    builds: list[tuple[str, str]],
) -> None:
    """Through the default pipeline (the fuser builds the region from plain ops)."""
    x = np.random.default_rng(1).normal(size=(4, 40)).astype(np.float32)
    b = np.random.default_rng(2).normal(size=40).astype(np.float32)
    for k, (s, t) in enumerate([(0.5, 2.0), (1.25, -3.0), (0.01, 0.25), (7.0, 1e-3)]):
        g = rlx.Graph(f"mlp{k}")
        xi, bi = g.input("x", x.shape), g.input("b", b.shape)
        h = g.add(g.mul(g.add(xi, bi), s), t)
        g.set_outputs([g.add(g.tanh(h), g.mul(h, t))])
        cg = Session("cpu").compile(g, FULL)
        assert [e.kind for e in region_entries(cg)] == [KernelKind.NATIVE]  # type: ignore[attr-defined]
        feed = {"x": x, "b": b}
        np.testing.assert_allclose(cg.run(feed)[0], evaluate(g, feed)[0], 2e-6, 1e-6)
    assert len({src for name, src in builds if name == "region"}) == 1


# every dtype's constants, with the values that are easiest to get wrong
CONSTANTS: dict[DType, list[float | int | bool]] = {
    DType.F32: [0.1, -0.0, np.inf, -np.inf, np.nan, 3.4e38, 1e-45],
    DType.F64: [0.1, -0.0, np.inf, np.nan, 1e308, 5e-324, -2.5],
    DType.F16: [0.1, -0.0, 65504.0, -np.inf, 6e-8],
    DType.BF16: [0.1, -0.0, 3.0e38, np.nan, -1.5],
    DType.I8: [-128, 127, 0, -1],
    DType.I32: [-(2**31), 2**31 - 1, 7, -3],
    DType.I64: [-(2**63), 2**63 - 1, 2**53 + 1, -5],
    DType.U8: [0, 255, 17],
    DType.U32: [0, 2**32 - 1, 2**31 + 5],
}


def operand(dt: DType) -> np.ndarray:
    rng = np.random.default_rng(3)
    if dt.is_float:
        return rng.normal(0, 3, (3, 7)).astype(dt.np)
    info = np.iinfo(dt.np)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), (3, 7)).astype(dt.np)


@pytest.mark.parametrize("dt", list(CONSTANTS), ids=str)
def test_constants_of_every_dtype(dt: DType) -> None:
    """One source for every value; each value read back exactly (vs the reference)."""
    x = operand(dt)
    sources = set()
    for v in CONSTANTS[dt]:
        g = rlx.Graph("c")
        a = g.input("in0", x.shape, dt)
        c = g.constant(np.array(v, dt.np))
        flag = g.constant(np.array(bool(v == v and v), np.bool_))
        g.set_outputs([g.where(g.logical_and(g.gt(a, c), flag), a, g.sub(c, a))])
        out = np.empty_like(x)
        fn, arrays = codegen.render_region(g, [x], out)
        sources.add(fn.source)
        kernels_region.bind(kernels_region.load_function(fn), arrays)()
        with np.errstate(all="ignore"):
            want = evaluate(g, {"in0": x})[0]
        if dt in (DType.BF16, DType.F16):  # NaN-aware comparison in a NumPy float type
            out, want = out.astype(np.float32), want.astype(np.float32)
        np.testing.assert_array_equal(out, want, err_msg=f"{dt} constant {v}")
    assert len(sources) == 1


def test_values_gcc_compiles_into_the_code_stay_literals() -> None:
    """``pow(x, 2)`` and integer division by a constant keep their literal (gcc turns
    them into ``x * x`` / a multiply-high); another exponent or a float divisor is an
    argument."""

    def source(dt: DType, fn: Callable[..., int]) -> str:
        g = rlx.Graph("lit")
        g.set_outputs([fn(g, g.input("in0", (5,), dt))])
        x = operand(dt).reshape(-1)[:5]
        return codegen.render_region(g, [x], np.empty_like(x))[0].source

    f32 = DType.F32
    assert source(f32, lambda g, a: g.pow(a, 3.0)) == source(f32, lambda g, a: g.pow(a, 0.5))
    assert "c[0]" not in source(f32, lambda g, a: g.pow(a, 2.0))
    assert source(f32, lambda g, a: g.div(a, 3.0)) == source(f32, lambda g, a: g.div(a, 7.0))
    i32 = DType.I32

    def int_op(kind: str, v: int) -> Callable[..., int]:
        return lambda g, a: getattr(g, kind)(a, g.constant(np.array(v, np.int32)))

    assert "c[0]" not in source(i32, int_op("div", 7))
    assert source(i32, int_op("div", 7)) != source(i32, int_op("div", 9))
    assert source(i32, int_op("add", 7)) == source(i32, int_op("add", 9))


def test_row_kernels_share_one_library_across_eps() -> None:
    """eps is a run-time argument of the row kernels: one function for every eps, each
    result equal to the reference's."""
    x = np.random.default_rng(4).normal(size=(5, 24)).astype(np.float32)
    gamma = np.random.default_rng(5).normal(size=24).astype(np.float32)
    names = set()
    for eps in (1e-12, 1e-5, 0.5, 3.0):
        g = rlx.Graph("ln")
        g.set_outputs([g.layer_norm(g.input("x", x.shape), g.input("w", gamma.shape), eps=eps)])
        cg = Session("cpu").compile(g, RAW)
        (entry,) = [e for e in cg._executor_any().entries if e.op == "layer_norm"]
        assert entry.kind is KernelKind.NATIVE, entry.notes
        feed = {"x": x, "w": gamma}
        np.testing.assert_allclose(cg.run(feed)[0], evaluate(g, feed)[0], 1e-5, 1e-5)
        names.add(render_rows(RowSpec(RowKind.LAYER_NORM, C_TYPES[DType.F32])).name)
    assert len(names) == 1


# ---- symbols ---------------------------------------------------------------------------


def two_regions() -> tuple[codegen.CFunction, codegen.CFunction, list[np.ndarray]]:
    x = np.linspace(-2, 2, 12, dtype=np.float32)
    fns = []
    for fn in (lambda g, a: g.add(a, a), lambda g, a: g.mul(a, a)):
        g = rlx.Graph("r")
        g.set_outputs([fn(g, g.input("in0", x.shape))])
        fns.append(codegen.render_region(g, [x], np.empty_like(x)))
    (fa, arrays), (fb, _) = fns
    return fa, fb, arrays


def test_symbols_are_derived_from_the_code() -> None:
    fa, fb, _ = two_regions()
    assert fa.name.startswith("rlx_region_") and fb.name.startswith("rlx_region_")
    assert fa.name != fb.name
    assert f"void {fa.name}(" in fa.source and codegen.NAME_PLACEHOLDER not in fa.source
    a = render_rows(RowSpec(RowKind.SOFTMAX, C_TYPES[DType.F32]))
    b = render_rows(RowSpec(RowKind.LOG_SOFTMAX, C_TYPES[DType.F32]))
    assert a.name.startswith("rlx_rows_softmax_float_") and a.name != b.name


def library_of(fn: codegen.CFunction) -> Path:
    module = CModule((fn,), vector_math=kernels_region.vector_math_available())
    return native.build(module.source, native.Isa.PLAIN, "region")


def test_another_kernels_library_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_function`` given another region's library (as a swapped or damaged cache
    entry would be): CompileError naming the missing symbol, not the other kernel."""
    fa, fb, _ = two_regions()
    other = library_of(fb)
    monkeypatch.setattr(native, "build", lambda *a, **k: other)
    with pytest.raises(CompileError, match=f"does not export {fa.name}"):
        kernels_region.load_function(fa)
    ra = render_rows(RowSpec(RowKind.SOFTMAX, C_TYPES[DType.F32]))
    with pytest.raises(CompileError, match=f"does not export {ra.name}"):
        kernels_region.load_function(ra)


def test_executor_falls_back_on_another_kernels_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """The region then runs the NumPy kernel, with the reason in its notes, and is right."""
    _, fb, _ = two_regions()
    other = library_of(fb)
    monkeypatch.setattr(native, "build", lambda *a, **k: other)
    g = rlx.Graph("swapped")
    x = g.input("x", (12,))
    g.set_outputs([g.elementwise_region([x], lambda sg, a: sg.add(sg.exp(a), a))])
    cg = Session("cpu").compile(g, RAW)
    (entry,) = region_entries(cg)
    assert entry.kind is KernelKind.NUMPY  # type: ignore[attr-defined]
    assert any("does not export rlx_region_" in n for n in entry.notes)  # type: ignore[attr-defined]
    feed = {"x": np.linspace(-2, 2, 12, dtype=np.float32)}
    np.testing.assert_allclose(cg.run(feed)[0], evaluate(g, feed)[0], 1e-6)


SCRIPT = r"""
import json, sys
import numpy as np
import rlx
from rlx.backends.cpu import native
from rlx.backends.reference import evaluate
from rlx.options import CompileOptions
from rlx.runtime.session import Session

paths = []
real = native.build
native.build = lambda src, *a, **k: paths.append(str(real(src, *a, **k))) or paths[-1]
ops = {"add": lambda sg, a: sg.add(sg.exp(a), a), "mul": lambda sg, a: sg.mul(sg.exp(a), a)}
out = {}
for name in sys.argv[1].split(","):
    g = rlx.Graph(name)
    x = g.input("x", (12,))
    g.set_outputs([g.elementwise_region([x], ops[name])])
    cg = Session("cpu").compile(g, CompileOptions(optimize=False, fuse=False, use_cache=False))
    feed = {"x": np.linspace(-2, 2, 12, dtype=np.float32)}
    err = float(np.max(np.abs(cg.run(feed)[0] - evaluate(g, feed)[0])))
    out[name] = {"path": paths[-1], "err": err}
print(json.dumps(out))
"""


def run_script(names: str, cache: Path) -> dict[str, dict[str, object]]:
    env = dict(os.environ, RLX_CACHE_DIR=str(cache))
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, names], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_swapped_library_in_the_cache_gives_right_results(tmp_path: Path) -> None:
    """End to end, in fresh processes: region B's library copied over region A's path in
    the cache; compiling A again still gives A's results (the symbol check, and the
    cache's digest check, refuse B's code)."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    first = run_script("add,mul", cache)
    assert all(v["err"] < 1e-5 for v in first.values()), first
    a, b = Path(str(first["add"]["path"])), Path(str(first["mul"]["path"]))
    assert a != b
    shutil.copyfile(b, a)
    again = run_script("add", cache)
    assert again["add"]["err"] < 1e-5, again
