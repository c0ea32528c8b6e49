"""rlx.save and the runtime apply one rule to param values (issue 29): save used to round an
f64 array for an f32 param to f32 silently while CompiledGraph.set_param, run and
Session.compile refuse it. Now save converts exactly what set_param converts (lossless
casts, Python values of a fitting kind) and refuses the rest with the same InputError."""

import ml_dtypes
import numpy as np
import pytest

import rlx
from rlx.errors import InputError
from rlx.ir.serialize import dumps, load, loads, save


def _graph(dtype: str = "f32") -> rlx.Graph:
    g = rlx.Graph("p")
    x = g.input("x", (2, 3), dtype)
    g.set_outputs(g.add(x, g.param("w", (2, 3), dtype)))
    return g


def _runtime_error(g: rlx.Graph, value) -> str:
    compiled = rlx.Session("cpu").compile(g)
    with pytest.raises(InputError) as info:
        compiled.set_param("w", value)
    return str(info.value)


@pytest.mark.parametrize(
    ("dtype", "value"),
    [
        ("f32", np.full((2, 3), 0.1)),  # f64 -> f32 rounds 0.1
        ("f32", np.ones((2, 3), np.int32)),  # i32 -> f32 rounds above 2**24
        ("f16", np.ones((2, 3), np.float32)),
        ("bf16", np.ones((2, 3), np.float32)),
        ("i32", np.ones((2, 3), np.int64)),
        ("i32", np.ones((2, 3), np.float32)),
    ],
)
def test_save_refuses_what_set_param_refuses_with_the_same_error(tmp_path, dtype, value):
    g = _graph(dtype)
    want = _runtime_error(g, value)
    with pytest.raises(InputError) as info:
        save(g, tmp_path / "m.rlx", {"w": value})
    assert str(info.value) == want
    assert "converting would lose precision or range, cast it first" in want
    assert not (tmp_path / "m.rlx").exists()
    with pytest.raises(InputError, match="cast it first"):
        rlx.Session("cpu").compile(g, params={"w": value})


def test_an_f64_param_for_an_f32_graph_is_not_rounded_into_the_file():
    g = _graph("f32")
    with pytest.raises(InputError, match=r"param 'w': expected dtype f32 .*given float64 array"):
        dumps(g, {"w": np.full((2, 3), 0.1)})
    stored = loads(dumps(g, {"w": np.full((2, 3), 0.1, np.float32)}))[1]["w"]
    assert stored.dtype == np.float32  # after the caller's explicit cast


def test_a_param_declared_f64_keeps_every_bit(tmp_path):
    g = _graph("f64")
    w = np.array([[0.1, 1 / 3, np.pi], [2.0**-1074, -0.0, 1e308]])
    save(g, tmp_path / "m.rlx", {"w": w})
    g2, params = load(tmp_path / "m.rlx")
    assert params["w"].dtype == np.float64
    assert params["w"].tobytes() == w.tobytes()
    compiled = rlx.Session("cpu").compile(g2, params=params)
    (y,) = compiled.run({"x": np.zeros((2, 3))})
    np.testing.assert_array_equal(y, w)


@pytest.mark.parametrize(
    ("dtype", "value", "want"),
    [
        ("f32", np.ones((2, 3), np.int8), np.float32),  # exact
        ("f64", np.full((2, 3), 0.1, np.float32), np.float64),  # exact
        ("f32", [[0.5, 1, 2], [3, 4, 5]], np.float32),  # Python values: weak types
        ("bf16", np.ones((2, 3), ml_dtypes.bfloat16), ml_dtypes.bfloat16),
        ("i32", np.ones((2, 3), np.uint8), np.int32),
    ],
)
def test_save_converts_what_set_param_converts(dtype, value, want):
    g = _graph(dtype)
    rlx.Session("cpu").compile(g).set_param("w", value)  # the runtime takes it
    stored = loads(dumps(g, {"w": value}))[1]["w"]
    assert stored.dtype == want
    np.testing.assert_array_equal(stored.astype(np.float64), np.asarray(value, np.float64))
