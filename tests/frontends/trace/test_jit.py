"""rlx.jit: tracing once per signature, pytrees, static and dynamic arguments, lower /
inspect, weak typing of Python scalars, and errors that point at the user's line."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
import rlx.numpy as rnp
from rlx.errors import ShapeError, TraceError

f32 = np.float32


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(f32)


def test_traces_once_per_signature():
    calls = []

    @rlx.jit
    def f(x, y):
        calls.append(1)
        return x * y + 1.0

    a, b = rand(3, 4), rand(3, 4, seed=1)
    for _ in range(3):
        np.testing.assert_allclose(f(a, b), a * b + 1, rtol=1e-6, atol=1e-6)
    assert f.trace_count == 1 and len(calls) == 1
    f(rand(2, 4), rand(2, 4))  # new shape: a new trace
    f(a.astype(np.float64), b.astype(np.float64))  # new dtype: a new trace
    assert f.trace_count == 3 and f.cache_size() == 3
    f(a, b)
    assert f.trace_count == 3


def test_pytree_inputs_and_outputs():
    @rlx.jit
    def f(params, xs):
        h = xs[0] @ params["w"] + params["b"]
        return {"h": h, "pair": (h.sum(), [xs[1] * 2.0])}

    p = {"w": rand(4, 2), "b": rand(2, seed=1)}
    xs = (rand(3, 4, seed=2), rand(5, seed=3))
    out = f(p, xs)
    h = xs[0] @ p["w"] + p["b"]
    assert set(out) == {"h", "pair"} and isinstance(out["pair"], tuple)
    np.testing.assert_allclose(out["h"], h, rtol=1e-5)
    np.testing.assert_allclose(out["pair"][0], h.sum(), rtol=1e-5)
    np.testing.assert_allclose(out["pair"][1][0], xs[1] * 2)
    names = f.lower(p, xs).graph.input_names
    assert names == ["params.b", "params.w", "xs.0", "xs.1"]


def test_static_argnums_retrace_per_value():
    @rlx.jit
    def plain(x, n):
        return x * n

    f = rlx.jit(lambda x, n, axis: rnp.sum(x**n, axis=axis), static_argnums=(1, 2))
    x = rand(3, 4)
    np.testing.assert_allclose(f(x, 2, 0), np.sum(x**2, axis=0), rtol=1e-5)
    np.testing.assert_allclose(f(x, 3, 1), np.sum(x**3, axis=1), rtol=1e-5)
    f(x, 2, 0)
    assert f.trace_count == 2
    with pytest.raises(TraceError, match="hashable"):
        f(x, [2], 0)
    # without static_argnums a Python int is a traced weak scalar: one trace for all values
    assert plain(x, 2).dtype == f32 and plain(x, 5).dtype == f32
    np.testing.assert_allclose(plain(x, 5), x * 5, rtol=1e-6, atol=1e-6)
    assert plain.trace_count == 1


def test_dynamic_batch_one_compile_serves_two_sizes():
    f = rlx.jit(lambda x, w: rnp.tanh(x @ w), dynamic={"x": {0: "batch"}})
    w = rand(4, 3, seed=1)
    for b in (2, 7, 1):
        x = rand(b, 4, seed=b)
        np.testing.assert_allclose(f(x, w), np.tanh(x @ w), rtol=1e-5, atol=1e-6)
    assert f.trace_count == 1
    assert "batch" in f.lower(rand(2, 4), w).inspect()


def test_dynamic_symbol_shared_by_two_arguments_must_agree():
    f = rlx.jit(lambda x, y: x + y, dynamic={"x": {0: "n"}, "y": {0: "n"}})
    np.testing.assert_allclose(f(rand(3, 2), rand(3, 2)), rand(3, 2) + rand(3, 2))
    with pytest.raises(TraceError, match="dynamic dim 'n'"):
        f(rand(3, 2), rand(4, 2))


def test_bad_dynamic_spec_names_the_arguments():
    with pytest.raises(TraceError, match=r"no positional argument 'z'.*\['x'\]"):
        rlx.jit(lambda x: x, dynamic={"z": {0: "b"}})


def test_lower_inspect_shows_the_mir():
    def f(x, w):
        return rlx.nn.relu(x @ w)

    low = rlx.jit(f).lower(rand(2, 3), rand(3, 4))
    text = low.inspect()
    assert "matmul" in text and "relu" in text and "input 'x'" in text
    assert low.graph.outputs and isinstance(low.graph, rlx.Graph)
    cg = low.compile()
    x, w = rand(2, 3), rand(3, 4)
    np.testing.assert_allclose(
        cg.run({"x": x, "w": w})[0], np.maximum(x @ w, 0), rtol=1e-6, atol=1e-6
    )


def test_keyword_arguments_and_defaults():
    @rlx.jit
    def f(x, scale=2.0):
        return x * scale

    x = rand(3)
    np.testing.assert_allclose(f(x), x * 2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(f(x, scale=3.0), x * 3, rtol=1e-6, atol=1e-6)


def test_weak_typing_of_python_scalars():
    def f(x, i, h):
        return x * 2.5 + 1, i + 1, i * 1.5, h + 1.0, x > 1, (i + 2) // 3

    x = rand(3)
    i = np.array([1, 2, 3], np.int8)
    h = np.array([1, 2], np.float16)
    got = rlx.jit(f)(x, i, h)
    assert [g.dtype for g in got] == [f32, np.int8, f32, np.float16, np.bool_, np.int8]
    np.testing.assert_allclose(got[2], i * 1.5)


def test_strong_types_promote_by_the_lattice():
    got = rlx.jit(lambda a, b: a + b)(np.ones(2, np.int32), np.ones(2, f32))
    assert got.dtype == f32
    got = rlx.jit(lambda a, b: a * b)(np.ones(2, np.int8), np.ones(2, np.uint8))
    assert got.dtype == np.int16
    got = rlx.jit(lambda a: a / 2)(np.array([3, 4], np.int32))
    assert got.dtype == f32
    np.testing.assert_allclose(got, [1.5, 2])


def test_numpy_array_on_the_left_defers_to_the_traced_value():
    c = np.arange(3, dtype=f32)
    got = rlx.jit(lambda x: (c + x, c * x, c - x))(np.ones(3, f32))
    np.testing.assert_allclose(got[0], c + 1)
    np.testing.assert_allclose(got[1], c)
    np.testing.assert_allclose(got[2], c - 1)


def test_python_control_flow_raises_with_the_alternatives():
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(TraceError, match=r"rlx\.cond.*rlx\.while_loop.*rlx\.scan"):
        rlx.jit(f)(rand(3))
    for bad in (lambda x: int(x[0]), lambda x: float(x[0]), lambda x: [v for v in x]):
        with pytest.raises(TraceError, match="concrete value"):
            rlx.jit(bad)(rand(3))


def test_errors_while_tracing_point_at_the_user_line():
    def f(x, w):
        y = x + 1.0
        return y @ w  # the offending line

    line = f.__code__.co_firstlineno + 2
    with pytest.raises(ShapeError) as e:
        rlx.jit(f)(rand(2, 3), rand(4, 5))
    assert e.value.loc is not None and e.value.loc.line == line
    assert e.value.loc.file == __file__
    assert f"{__file__}:{line}" in str(e.value)


def test_control_flow_error_points_at_the_user_line():
    def f(x):
        return 1 if x > 0 else 0

    with pytest.raises(TraceError) as e:
        rlx.jit(f)(np.float32(1))
    assert e.value.loc.line == f.__code__.co_firstlineno + 1


def test_unsupported_argument_types_name_the_path():
    with pytest.raises(TraceError, match="'cfg.mode'.*static_argnums"):
        rlx.jit(lambda cfg: cfg["x"])({"x": rand(2), "mode": "fast"})


def test_nested_jit_inlines_and_leaked_values_are_caught():
    inner = rlx.jit(lambda x: x * 2.0)
    outer = rlx.jit(lambda x: inner(x) + 1.0)
    x = rand(3)
    np.testing.assert_allclose(outer(x), x * 2 + 1, rtol=1e-6, atol=1e-6)
    assert inner.trace_count == 0
    leaked = []
    rlx.jit(lambda x: leaked.append(x) or x)(x)
    with pytest.raises(TraceError, match="outside"):
        rlx.jit(lambda y: y + leaked[0])(x)
    with pytest.raises(TraceError, match="inside a function traced"):
        rnp.exp(x)


def test_outputs_may_be_inputs_constants_and_repeated():
    @rlx.jit
    def f(x):
        y = x * 3.0
        return x, y, y, np.float32(7)

    x = rand(3)
    a, b, c, d = f(x)
    np.testing.assert_array_equal(a, x)
    np.testing.assert_allclose(b, x * 3)
    np.testing.assert_allclose(c, x * 3)
    assert float(d) == 7.0
    b[0] = 100.0
    assert c[0] != 100.0  # outputs are fresh arrays


def test_num_threads_reaches_the_compile_options():
    f = rlx.jit(lambda x: x + 1.0, num_threads=1)
    f(rand(2))
    assert f.options.num_threads == 1


def test_keyword_only_arguments_are_rejected_by_name():
    def f(x, *, scale):
        return x * scale

    with pytest.raises(TraceError, match=r"keyword-only arguments \['scale'\]"):
        rlx.jit(f)(rand(2), scale=2.0)


def _entry(f):
    (entry,) = {id(e): e for e in f._cache.values()}.values()
    return entry


def test_steady_calls_skip_the_checked_run(monkeypatch):
    f = rlx.jit(lambda x, w: x @ w)
    x, w = rand(2, 3), rand(3, 4, seed=1)
    f(x, w)
    cg = _entry(f).compiled

    def no_run(*a, **k):
        raise AssertionError("CompiledGraph.run called on the steady path")

    monkeypatch.setattr(cg, "run", no_run)
    np.testing.assert_allclose(f(x, w), x @ w, rtol=1e-6, atol=1e-6)


def test_frozen_arrays_are_params_set_once_per_object(monkeypatch):
    f = rlx.jit(lambda p, x: x @ p["w"] + p["b"])
    p = rlx.freeze({"w": rand(3, 4), "b": rand(4, seed=1)})
    x = rand(2, 3, seed=2)
    np.testing.assert_allclose(f(p, x), x @ p["w"] + p["b"], rtol=1e-6, atol=1e-6)
    graph = f.lower(p, x).graph
    assert graph.param_names == ["p.b", "p.w"] and graph.input_names == ["x"]
    cg = _entry(f).compiled
    sets = []
    real = cg.set_param
    monkeypatch.setattr(cg, "set_param", lambda n, v: (sets.append(n), real(n, v)))
    f(p, x)
    f(p, x)
    assert sets == []  # the same objects: nothing set again
    p2 = {"w": rlx.freeze(rand(3, 4, seed=5)), "b": p["b"]}  # a new w, the same b
    np.testing.assert_allclose(f(p2, x), x @ p2["w"] + p2["b"], rtol=1e-6, atol=1e-6)
    assert sets == ["p.w"]
    assert f.trace_count == 2  # the lower() above traced once more


def test_read_only_view_of_writable_memory_is_set_on_every_call():
    base = rand(3, 4)
    view = base[:]
    view.flags.writeable = False
    f = rlx.jit(lambda w, x: x @ w)
    x = rand(2, 3, seed=1)
    np.testing.assert_allclose(f(view, x), x @ base, rtol=1e-6, atol=1e-6)
    base *= 2.0  # changes what the read-only view shows
    np.testing.assert_allclose(f(view, x), x @ base, rtol=1e-6, atol=1e-6)


def test_writable_and_frozen_arguments_trace_separately():
    f = rlx.jit(lambda w, x: x @ w)
    w, x = rand(3, 4), rand(2, 3, seed=1)
    f(w, x)
    f(rlx.freeze(w), x)
    assert f.trace_count == 2
    w[0, 0] = 100.0  # a writable argument is read afresh on every call
    np.testing.assert_allclose(f(w, x), x @ w, rtol=1e-6, atol=1e-6)


def test_calls_from_threads_with_different_frozen_params_get_their_own_results():
    import threading

    f = rlx.jit(lambda w, x: x @ w)
    x = rand(4, 3)
    ws = [rlx.freeze(rand(3, 2, seed=s)) for s in range(4)]
    errors = []

    def worker(w):
        for _ in range(20):
            got = f(w, x)
            if not np.allclose(got, x @ w, rtol=1e-5, atol=1e-6):
                errors.append(1)

    f(ws[0], x)
    threads = [threading.Thread(target=worker, args=(w,)) for w in ws]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
