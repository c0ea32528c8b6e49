"""Session / CompiledGraph behaviour: compile, run contract, symbolic shapes, params,
compile cache, threads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from threadpoolctl import threadpool_info

import rlx
from rlx.errors import CompileError
from rlx.ir.module import GraphModule
from rlx.ops.nn import MaskKind
from rlx.options import CompileOptions
from rlx.runtime.compiled import CompiledGraph
from rlx.runtime.session import Session, available_backends, clear_compile_cache, compile_cache_info


def mlp(name: str = "mlp") -> rlx.Graph:
    g = rlx.Graph(name)
    b = g.sym("batch", max=16)
    x = g.input("x", (b, 4))
    w = g.param("w", (4, 3))
    h = g.gelu(x)  # planned in place of x: the caller's array must stay intact
    y = g.add(g.matmul(h, w), 1.0)
    g.set_outputs([y, h])
    return g


W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10


def test_compile_and_run_matches_reference() -> None:
    g = mlp()
    cg = Session("cpu").compile(g, params={"w": W})
    assert isinstance(cg, CompiledGraph)
    assert cg.input_names == ["x"] and cg.param_names == ["w"] and len(cg.output_names) == 2
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    for got, want in zip(cg.run({"x": x}), g.evaluate({"x": x}, {"w": W}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_compile_graph_module() -> None:
    mod = GraphModule.from_graph(mlp())
    cg = Session("cpu").compile(mod, params={"w": W})
    (y, _) = cg.run({"x": np.ones((2, 4), np.float32)})
    assert y.shape == (2, 3)


def test_unknown_backend_lists_available() -> None:
    with pytest.raises(CompileError, match=r"unknown backend 'gpu'.*\['cpu'\]"):
        Session("gpu")
    assert "cpu" in available_backends()


def test_inputs_never_modified_and_outputs_are_fresh() -> None:
    cg = Session("cpu").compile(mlp(), params={"w": W})
    assert cg.memory_plan.slot(2).inplace_of == 0  # gelu writes over the input slot
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    keep = x.copy()
    y1, h1 = cg.run({"x": x})
    np.testing.assert_array_equal(x, keep)
    y1_copy = y1.copy()
    y2, _ = cg.run({"x": x * 3})
    np.testing.assert_array_equal(y1, y1_copy)  # the next run did not overwrite it
    assert not np.shares_memory(y1, y2) and not np.shares_memory(h1, y1)
    y1[:] = 0  # writing into a returned output does not disturb the next run
    y3, _ = cg.run({"x": x})
    np.testing.assert_array_equal(y3, y1_copy)


def test_lists_scalars_and_lossless_conversions() -> None:
    g = rlx.Graph("conv")
    a = g.input("a", (3,))
    s = g.input("s", ())
    i = g.input("i", (2,), "i32")
    g.set_outputs([g.mul(a, s), g.add(i, i)])
    cg = Session("cpu").compile(g)
    y, z = cg.run({"a": [1, 2, 3], "s": 2.5, "i": np.array([3, 4], np.int8)})
    np.testing.assert_array_equal(y, np.array([2.5, 5, 7.5], np.float32))
    assert z.dtype == np.int32 and z.tolist() == [6, 8]
    y, _ = cg.run({"a": np.array([1, 2, 3], np.int16), "s": np.float32(1), "i": [True, False]})
    assert y.dtype == np.float32 and y.tolist() == [1, 2, 3]


def test_symbolic_dims_one_compiled_graph_many_sizes_lru() -> None:
    g = mlp("sym_lru")
    cg = Session("cpu").compile(
        g, CompileOptions(max_shape_plans=2, use_cache=False), params={"w": W}
    )
    prog = cg.program
    for n in (1, 5, 16, 5):
        x = np.full((n, 4), 0.5, np.float32)
        (y, _) = cg.run({"x": x})
        want = g.evaluate({"x": x}, {"w": W})[0]
        np.testing.assert_allclose(y, want, rtol=1e-5)
        assert cg.memory_plan.bindings == {"batch": n}
    # batch=1 (compile probe), 5, 16, then 5 again (an LRU hit): three plans built
    assert prog.plan_builds == 3
    assert len(prog.cached_bindings()) == 2
    assert cg.shape_plans == [{"batch": 16}, {"batch": 5}]


def test_failed_run_leaves_graph_usable() -> None:
    g = rlx.Graph("fail")
    x = g.input("x", (3,))
    idx = g.input("idx", (2,), "i32")
    g.set_outputs([g.gather(g.exp(x), idx)])
    cg = Session("cpu").compile(g)
    with pytest.raises(rlx.errors.InputError, match="out of range"):
        cg.run({"x": [1.0, 2.0, 3.0], "idx": [0, 7]})
    with pytest.raises(rlx.errors.InputError):
        cg.run({"x": [1.0, 2.0]})
    (y,) = cg.run({"x": [0.0, 1.0, 2.0], "idx": [2, -3]})
    np.testing.assert_allclose(y, np.exp([2.0, 0.0]).astype(np.float32), rtol=1e-6)


def test_compile_cache_shares_program_not_params() -> None:
    clear_compile_cache()
    assert compile_cache_info().size == 0
    a = Session("cpu").compile(mlp("c1"))
    b = Session("cpu").compile(mlp("c2"))  # structurally equal: a cache hit
    info = compile_cache_info()
    assert (info.hits, info.misses, info.size) == (1, 1, 1)
    assert a.program is b.program
    a.set_param("w", W)
    b.set_param("w", W * 2)
    x = np.ones((2, 4), np.float32)
    ya, yb = a.run({"x": x})[0], b.run({"x": x})[0]
    np.testing.assert_allclose(yb - 1, (ya - 1) * 2, rtol=1e-6)
    c = Session("cpu").compile(mlp("c3"), CompileOptions(check_finite=True))
    assert c.program is not a.program  # options that change the result are in the key
    d = Session("cpu").compile(mlp("c4"), CompileOptions(use_cache=False))
    assert d.program is not a.program
    clear_compile_cache()
    assert compile_cache_info() == type(info)(0, 0, 0, info.maxsize)


def test_params_copied_and_settable_between_runs() -> None:
    cg = Session("cpu").compile(mlp(), CompileOptions(use_cache=False))
    w = W.copy()
    cg.set_params({"w": w})
    w[:] = 100  # later changes to the caller's array do not leak in
    x = np.ones((1, 4), np.float32)
    y1 = cg.run({"x": x})[0]
    cg.set_param("w", np.zeros((4, 3), np.float32))
    y2 = cg.run({"x": x})[0]
    np.testing.assert_allclose(y2, np.ones((1, 3)))
    assert not np.allclose(y1, y2)


def test_num_threads_applied_to_blas() -> None:
    cg = Session("cpu").compile(
        mlp(), CompileOptions(num_threads=1, use_cache=False), params={"w": W}
    )
    cg.run({"x": np.ones((2, 4), np.float32)})
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    assert blas and all(i["num_threads"] == 1 for i in blas)
    # native=False: BLAS runs the matmul (at num_threads > 1 rlx's own sgemm would, and BLAS
    # would then keep one thread: see test_threads_pool)
    cg2 = Session("cpu").compile(
        mlp(), CompileOptions(num_threads=2, use_cache=False, native=False), params={"w": W}
    )
    cg2.run({"x": np.ones((2, 4), np.float32)})
    assert all(i["num_threads"] == 2 for i in threadpool_info() if i["user_api"] == "blas")


def test_inspect_and_repr() -> None:
    cg = Session("cpu").compile(mlp(), params={"w": W})
    text = cg.inspect()
    assert "arena" in text and "in place of %0" in text and "matmul" in text
    assert "CompiledGraph" in repr(cg) and "'x'" in repr(cg)


def transformer_block(d: int = 16, heads: int = 2) -> rlx.Graph:
    g = rlx.Graph("block")
    b = g.sym("batch", max=4)
    s = g.sym("seq", max=9)
    x = g.input("x", (b, s, d))
    h = g.layer_norm(
        x,
        g.constant(np.linspace(0.5, 1.5, d, dtype=np.float32)),
        g.constant(np.zeros(d, np.float32)),
    )
    flat = g.reshape(h, (b * s, d))
    qkv = [
        g.reshape(g.matmul(flat, g.constant(np.eye(d, dtype=np.float32) * (k + 1) / 4)), (b, s, d))
        for k in range(3)
    ]
    a = g.attention(*qkv, heads, d // heads, mask=MaskKind.causal())
    y = g.add(x, g.softmax(a, axis=-1))
    g.set_outputs([g.reduce(rlx.ops.reduce.ReduceKind.SUM, y, (1,), False), y])
    return g


@given(sizes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 9)), min_size=1, max_size=6))
def test_symbolic_block_any_size_matches_reference(sizes: list[tuple[int, int]]) -> None:
    g = transformer_block()
    cg = Session("cpu").compile(g, CompileOptions(max_shape_plans=2))
    rng = np.random.default_rng(len(sizes))
    for b, s in sizes:
        x = rng.standard_normal((b, s, 16)).astype(np.float32)
        for got, want in zip(cg.run({"x": x}), g.evaluate({"x": x}), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert len(cg.shape_plans) <= 2


def test_params_checked_at_compile_and_frozen_params() -> None:
    g = rlx.Graph("frz")
    x = g.input("x", (2, 3))
    w = g.param("w", (3, 3))
    g.set_outputs([g.matmul(x, g.exp(w))])
    with pytest.raises(
        rlx.errors.InputError, match=r"param 'w': expected rank 2 f32\[3,3\], given shape \(3,\)"
    ):
        Session("cpu").compile(g, params={"w": np.zeros(3, np.float32)})
    with pytest.raises(rlx.errors.InputError, match=r"unknown params \['v'\]"):
        Session("cpu").compile(g, params={"v": np.zeros(3, np.float32)})
    eye = np.eye(3, dtype=np.float32)
    cg = Session("cpu").compile(
        g, CompileOptions(freeze_params=True, use_cache=False), params={"w": eye}
    )
    x_val = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(
        cg.run({"x": x_val})[0], g.evaluate({"x": x_val}, {"w": eye})[0], rtol=1e-6
    )
    assert cg.program.frozen_params == {"w"}  # folded into a constant by the pipeline
    assert not cg.graph.param_nodes()
    with pytest.raises(rlx.errors.InputError, match="frozen into a constant"):
        cg.set_param("w", eye)


def test_cached_program_with_other_runtime_options() -> None:
    clear_compile_cache()
    a = Session("cpu").compile(mlp("o1"), CompileOptions(max_shape_plans=1), params={"w": W})
    b = Session("cpu").compile(mlp("o2"), CompileOptions(max_shape_plans=3), params={"w": W})
    assert a.program is b.program and b.options.max_shape_plans == 3
    for n in (2, 3, 4):
        b.run({"x": np.ones((n, 4), np.float32)})
        a.run({"x": np.ones((n, 4), np.float32)})
    assert len(b.shape_plans) == 3 and len(a.shape_plans) == 1
