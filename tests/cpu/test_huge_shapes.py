"""Huge static shapes (issue 29): an input declared [2**40, 4], an Expand / ONNX Tile to
2**40 elements, a param of that size left unset, or a symbolic dim bound at run time to
a size no machine holds used to end in NumPy's bare ``MemoryError: Unable to allocate 16.0
TiB`` from the arena allocator, naming nothing. The executor now compares its plan with
the machine's memory first: above the RAM a CompileError names the graph, the bindings and
the largest buffers with their shapes; above half of it (or above what is available now)
the arena is allocated with a RuntimeWarning that says so."""

import re
import warnings

import numpy as np
import pytest

import rlx
from rlx.backends.cpu import memory
from rlx.errors import CompileError

TiB16 = r"16384\.00 GiB \(17592186044\d+ bytes\)"


def _compile(g: rlx.Graph, **params):
    return rlx.Session("cpu").compile(g, params=params or None)


def test_an_input_of_2_40_rows_is_a_compile_error_naming_it():
    g = rlx.Graph("big_input")
    x = g.input("x", (2**40, 4))
    g.set_outputs(g.relu(x))
    with pytest.raises(CompileError) as info:
        _compile(g)
    text = str(info.value)
    assert re.search(r"graph 'big_input': its memory plan needs " + TiB16, text), text
    assert "'x' f32[1099511627776,4], 16384.00 GiB" in text
    assert "more than this machine's RAM" in text and "MemTotal" in text
    assert not isinstance(info.value.__cause__, MemoryError)


def test_an_expand_to_2_40_elements_names_the_expand():
    g = rlx.Graph("tile")
    x = g.input("x", (4,))
    g.set_outputs(g.exp(g.expand(x, (2**38, 4))))
    with pytest.raises(CompileError, match=r"expand \(test_huge_shapes\.py:\d+\): f32\[274877"):
        _compile(g)


def test_an_unset_param_of_2_40_elements_is_named():
    g = rlx.Graph("big_param")
    x = g.input("x", (4,))
    g.set_outputs(g.add(g.sum(g.param("w", (2**40, 4)), axes=0), x))
    with pytest.raises(CompileError, match=r"param \(test_huge_shapes\.py:\d+\): 'w' f32\[1099"):
        _compile(g)


def test_a_symbolic_dim_bound_at_run_time_to_a_huge_size_is_named():
    g = rlx.Graph("outer")
    n = g.sym("n")
    x = g.input("x", (n,))
    g.set_outputs(g.exp(g.expand(g.reshape(x, (1, n)), (n, n))))
    compiled = _compile(g)
    (y,) = compiled.run({"x": np.zeros(3, np.float32)})
    assert y.shape == (3, 3)
    with pytest.raises(CompileError, match=r"graph 'outer' at n=1048576: .*f32\[1048576,1048576\]"):
        compiled.run({"x": np.zeros(2**20, np.float32)})
    (y,) = compiled.run({"x": np.zeros(2, np.float32)})  # still usable
    assert y.shape == (2, 2)


def test_an_onnx_input_declared_2_40_by_4_is_a_compile_error():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**40, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**40, 4])
    reps = helper.make_tensor("reps", TensorProto.INT64, [2], [2**40, 1])
    t = helper.make_tensor_value_info("t", TensorProto.FLOAT, [2**40, 4])
    one = helper.make_tensor_value_info("one", TensorProto.FLOAT, [1, 4])
    relu = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "onnx_big", [x], [y])
    tile = helper.make_graph(
        [helper.make_node("Tile", ["one", "reps"], ["t"])], "onnx_tile", [one], [t], [reps]
    )
    for graph, name in ((relu, "'x' f32[1099511627776,4]"), (tile, "f32[1099511627776,")):
        model = rlx.onnx.load(helper.make_model(graph))
        with pytest.raises(CompileError) as info:
            model.compile()
        assert re.search(f"graph '{graph.name}': its memory plan needs " + TiB16, str(info.value))
        assert name in str(info.value)


# ---- the bound: the machine's memory (faked here, so the sizes stay small) -----------

MiB = 1 << 20


def _graph_of(nbytes: int) -> rlx.Graph:
    g = rlx.Graph("sized")
    x = g.input("x", (nbytes // 4,))
    g.set_outputs(g.exp(x))  # in place: one buffer of nbytes
    return g


def _fake_machine(monkeypatch, total: int | None, available: int | None) -> None:
    monkeypatch.setattr(memory, "machine_memory", lambda: (total, available))


def test_a_plan_just_under_the_ram_is_allocated_with_a_warning(monkeypatch):
    _fake_machine(monkeypatch, total=100 * MiB, available=90 * MiB)
    g = _graph_of(96 * MiB)
    with pytest.warns(RuntimeWarning) as record:
        compiled = _compile(g)
    (w,) = [r for r in record if "memory plan" in str(r.message)]
    text = str(w.message)
    assert "graph 'sized': its memory plan needs 96.00 MiB (100663296 bytes)" in text
    assert "'x' f32[25165824], 96.00 MiB" in text
    assert "more than half of this machine's RAM (100.00 MiB)" in text
    assert "more than is available now (90.00 MiB, MemAvailable)" in text
    (y,) = compiled.run({"x": np.zeros(24 * MiB, np.float32)})  # and it works
    assert y[0] == 1.0 and y[-1] == 1.0


def test_a_plan_above_the_ram_is_refused_and_below_half_is_quiet(monkeypatch):
    _fake_machine(monkeypatch, total=100 * MiB, available=90 * MiB)
    with pytest.raises(CompileError, match=r"needs 128\.00 MiB .*RAM \(100\.00 MiB"):
        _compile(_graph_of(128 * MiB))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning at all
        _compile(_graph_of(48 * MiB))


def test_a_failed_allocation_under_an_unknown_ram_is_a_compile_error(monkeypatch):
    """/proc/meminfo and sysconf both unreadable: the allocation itself fails (1 PiB, more
    than x86-64's address space, so even an always-overcommitting kernel refuses it), and
    that is a CompileError naming the buffers too, not NumPy's MemoryError."""
    _fake_machine(monkeypatch, total=None, available=None)
    g = rlx.Graph("unknown_ram")
    g.set_outputs(g.relu(g.input("x", (2**46, 4))))
    with pytest.raises(CompileError, match=r"'x' f32\[70368744177664,4\].*allocating it failed"):
        _compile(g)


def test_machine_memory_reads_meminfo():
    total, available = memory.machine_memory()
    assert total is not None and available is not None
    assert 0 < available <= total
    with open("/proc/meminfo") as f:
        first = f.readline().split()
    assert first[0] == "MemTotal:" and total == int(first[1]) * 1024
