"""Report: kernel schedule, memory figures, pass records, profiled times, Chrome trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx.backends.cpu.kernels import KernelKind
from rlx.backends.cpu.report import Report
from rlx.errors import RlxError
from rlx.ops.custom import register_custom_op
from rlx.options import CompileOptions
from rlx.runtime.session import Session


def compiled() -> tuple[rlx.Graph, object]:
    g = rlx.Graph("rep")
    x = g.input("x", (4, 8))
    w = g.param("w", (8, 8))
    h = g.reshape(g.matmul(x, w), (8, 4))  # reshape: a view, no kernel
    # a user's custom op: the one kind of node that keeps the reference kernel
    register_custom_op(
        "rep_twice",
        lambda ins, a: ins[0],
        lambda xs, a, c: xs[0] * 2,
        arity=1,
        replace=True,
    )
    y = g.custom("rep_twice", [g.softmax(h)])
    g.set_outputs([y])
    # native=False: softmax keeps its NumPy kernel (one of each kind in the report)
    cg = Session("cpu").compile(
        g, CompileOptions(use_cache=False, native=False), params={"w": np.eye(8, dtype=np.float32)}
    )
    return g, cg


def test_report_schedule_and_memory() -> None:
    g, cg = compiled()
    rep = cg.report()
    assert isinstance(rep, Report) and not rep.profiled
    by_op = {k.op: k for k in rep.kernels}
    assert by_op["matmul"].kind is KernelKind.BLAS
    assert by_op["softmax"].kind is KernelKind.NUMPY
    assert by_op["custom"].kind is KernelKind.REFERENCE
    assert (
        by_op["reshape"].view_of == by_op["matmul"].node
        and by_op["reshape"].kind is KernelKind.VIEW
    )
    assert by_op["reshape"].offset == by_op["matmul"].offset
    assert (
        by_op["matmul"].dtype == "f32"
        and by_op["matmul"].dims == (4, 8)
        and by_op["matmul"].nbytes == 128
    )
    assert all(k.offset % 64 == 0 for k in rep.kernels)
    assert [k.op for k in rep.reference_nodes()] == ["custom"]
    assert rep.kind_counts() == {KernelKind.NUMPY: 1, KernelKind.BLAS: 1, KernelKind.REFERENCE: 1}
    assert rep.plan is cg.memory_plan
    text = str(rep)
    for needle in (
        "graph 'rep'",
        "arena",
        "peak",
        "blas",
        "reference",
        "view of",
        "kernels (1 blas, 1 numpy, 1 reference)",
    ):
        assert needle in text, needle


def test_profiled_run_fills_times_and_trace(tmp_path: Path) -> None:
    g, cg = compiled()
    with pytest.raises(RlxError, match="profile=True"):
        cg.report().chrome_trace()
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    (plain,) = cg.run({"x": x})
    (prof,) = cg.run({"x": x}, profile=True)
    np.testing.assert_array_equal(plain, prof)
    rep = cg.report()
    assert rep.profiled and rep.total_seconds > 0
    kernels = [k for k in rep.kernels if k.view_of is None]
    assert all(k.seconds is not None and k.seconds >= 0 for k in kernels)
    assert all(k.seconds is None for k in rep.kernels if k.view_of is not None)
    assert "us" in str(rep) and "total kernel time" in str(rep)

    path = rep.to_chrome_trace(tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    assert isinstance(events, list)
    complete = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert [e["name"] for e in complete] == [f"#{k.node} {k.op}" for k in kernels]
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= set(e) and e["ph"] in ("X", "M")
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and isinstance(e["dur"], float) and e["dur"] >= 0
            assert e["cat"] in {k.value for k in KernelKind} | {"pass"}
    ts = [e["ts"] for e in complete]
    assert ts == sorted(ts) and ts[0] == 0.0
    for a, b in zip(complete, complete[1:], strict=False):
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
    assert complete[0]["args"]["kind"] in {k.value for k in KernelKind}
    assert {
        e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"
    } >= {"rlx run: rep"}


def test_report_includes_compile_pass_records() -> None:
    _, cg = compiled()
    rep = cg.report()
    assert rep.passes == tuple(cg.program.result.records)
    assert rep.compile_seconds > 0
    for p in rep.passes:
        assert p.name in str(rep)


def test_factory_notes_and_declines_reach_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx.backends.cpu.kernels import load_kernels
    from rlx.ops.reduce import Softmax

    KERNELS = load_kernels()  # register every kernel first: the patch must not be overwritten

    def declining(node, ins, out, ctx):  # noqa: ANN001, ANN202
        ctx.notes.append("no fast path in this test")
        return None

    monkeypatch.setitem(KERNELS, Softmax, declining)
    g, cg = compiled()
    rec = next(k for k in cg.report().kernels if k.op == "softmax")
    assert rec.kind is KernelKind.REFERENCE and rec.notes == ("no fast path in this test",)
    assert "# no fast path in this test" in str(cg.report())
    x = np.ones((4, 8), np.float32)
    np.testing.assert_allclose(
        cg.run({"x": x})[0], g.evaluate({"x": x}, {"w": np.eye(8, dtype=np.float32)})[0], rtol=1e-6
    )


def test_times_belong_to_the_shape_that_was_profiled() -> None:
    g = rlx.Graph("two_shapes")
    b = g.sym("batch", max=8)
    g.set_outputs([g.tanh(g.exp(g.input("x", (b, 4))))])
    cg = Session("cpu").compile(g, CompileOptions(use_cache=False))
    cg.run({"x": np.ones((2, 4), np.float32)}, profile=True)
    assert cg.report().profiled
    cg.run({"x": np.ones((3, 4), np.float32)})  # same kernel count, another arena
    assert not cg.report().profiled
