"""rlx.quantize on degenerate calibration data and weights (issue 19, fault 11).

A tensor that saw only zeros keeps its layers in float (RuntimeWarning naming it, a
``kept_float`` entry saying why), so the model stays useful on real inputs; a tensor that
saw only NaN / Inf, and a weight holding NaN / Inf, are QuantizationErrors naming them;
the report never prints nan for an error: it says the error is unmeasured, and why.
Accuracy on real inputs is checked against a NumPy forward pass of the same model.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import rlx
from rlx.errors import QuantizationError
from rlx.ops.linalg import MatMul
from rlx.ops.quant import QMatMul
from rlx.quant.api import quantize
from rlx.quant.report import ErrorAccumulator

RNG = np.random.default_rng(11)
PARAMS = {
    "w0": (RNG.standard_normal((16, 32)) / 4).astype(np.float32),
    "w1": (RNG.standard_normal((32, 8)) / 4).astype(np.float32),
    "wz": (RNG.standard_normal((16, 8)) / 4).astype(np.float32),
}
NAN_IN_A_NUMBER = re.compile(r"(max abs|relative|cosine) nan", re.IGNORECASE)


def two_branch() -> rlx.Graph:
    """``relu(x @ w0) @ w1 + z @ wz``: two inputs, so one can be degenerate alone."""
    g = rlx.Graph("two_branch")
    x, z = g.input("x", (8, 16)), g.input("z", (8, 16))
    h = g.relu(g.matmul(x, g.param("w0", (16, 32))))
    g.set_outputs([g.add(g.matmul(h, g.param("w1", (32, 8))), g.matmul(z, g.param("wz", (16, 8))))])
    return g


def oracle(x: np.ndarray, z: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    f = np.float64
    return np.maximum(x.astype(f) @ p["w0"], 0) @ p["w1"] + z.astype(f) @ p["wz"]


def real(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {k: rng.standard_normal((8, 16)).astype(np.float32) for k in ("x", "z")} for _ in range(n)
    ]


def rel_error_on_real_inputs(result) -> float:
    """Relative L2 error of the quantized model vs the NumPy oracle on real inputs."""
    num = den = 0.0
    for b in real(3, seed=99):
        want = oracle(b["x"], b["z"], PARAMS)
        got = result.compiled.run(b)[0].astype(np.float64)
        num += float(np.sum((got - want) ** 2))
        den += float(np.sum(want**2))
    return (num / den) ** 0.5


def test_an_input_that_saw_only_zeros_keeps_its_layer_in_float():
    cal = [dict(b, z=np.zeros((8, 16), np.float32)) for b in real(4, seed=1)]
    with pytest.warns(RuntimeWarning, match=r"layer 'wz' is kept in float: activation input 'z'"):
        r = quantize(two_branch(), cal, params=PARAMS)
    rep = r.report
    assert rep.quantized == ["w0", "w1"] and list(rep.kept_float) == ["wz"]
    assert "saw only zeros (512 values)" in rep.kept_float["wz"]
    assert len(r.graph.find(QMatMul)) == 2 and len(r.graph.find(MatMul)) == 1
    # before: z quantized with the 1e-6 floor scale, relative error 0.7 on real inputs
    assert rel_error_on_real_inputs(r) < 0.05
    text = str(rep)
    assert re.search(r"kept float: wz\b.*: activation input 'z'", text)
    assert not NAN_IN_A_NUMBER.search(text)


def test_calibration_on_zeros_only_gives_the_float_model_and_an_unmeasured_error():
    zeros = [{"x": np.zeros((8, 16), np.float32), "z": np.zeros((8, 16), np.float32)}] * 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = quantize(two_branch(), zeros, params=PARAMS)
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 3 and all("saw only zeros" in m for m in msgs)
    assert any("activation %" in m and "relu" in m for m in msgs)  # w1 reads relu(x @ w0)
    rep = r.report
    assert rep.quantized == [] and sorted(rep.kept_float) == ["w0", "w1", "wz"]
    assert rel_error_on_real_inputs(r) < 1e-5  # before: 1.0
    (err,) = rep.outputs
    assert not err.measured and "all zeros" in err.note  # before: relative 0, cosine 1
    text = str(rep)
    assert "error unmeasured: the float output is all zeros" in text
    assert not NAN_IN_A_NUMBER.search(text)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_an_input_that_saw_only_non_finite_values_is_an_error(bad):
    cal = [dict(b, z=np.full((8, 16), bad, np.float32)) for b in real(2, seed=2)]
    with pytest.raises(
        QuantizationError,
        match=r"activation input 'z' .*'wz'.* saw only non-finite values .*256 NaN/Inf",
    ):
        quantize(two_branch(), cal, params=PARAMS)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_weight_holding_nan_or_inf_is_an_error(bad):
    p = {k: v.copy() for k, v in PARAMS.items()}
    p["w1"][3, 5] = bad
    with pytest.raises(
        QuantizationError, match=r"weight of layer 'w1' \(param 'w1'.* 1 NaN/Inf values .*\(3, 5\)"
    ):
        quantize(two_branch(), real(2, seed=3), params=p)
    # excluded, the layer is not quantized: no error (the float model keeps the NaN)
    r = quantize(two_branch(), real(2, seed=3), params=p, exclude=["w1"], rank_layers=False)
    assert r.report.quantized == ["w0", "wz"]


def test_unmeasurable_evaluation_data_is_said_not_printed_as_nan():
    eval_nan = real(2, seed=5)
    eval_nan[1]["x"][0, 0] = np.nan  # the float output is NaN there
    r = quantize(two_branch(), real(3, seed=4), params=PARAMS, eval_data=eval_nan)
    (err,) = r.report.outputs
    assert not err.measured and "float output holds 8 NaN/Inf values" in err.note
    assert r.report.budget_met is None
    assert all(not le.error.measured for le in r.report.layers)
    text = str(r.report)
    assert "error unmeasured" in text and not NAN_IN_A_NUMBER.search(text)
    with pytest.raises(QuantizationError, match=r"accuracy_budget 0.1 cannot be checked"):
        quantize(
            two_branch(), real(3, seed=4), params=PARAMS, eval_data=eval_nan, accuracy_budget=0.1
        )


def test_error_accumulator_on_non_finite_and_zero_outputs():
    acc = ErrorAccumulator(3)
    f = np.array([1.0, 2.0, 3.0], np.float32)
    acc.add(
        [np.array([1.0, np.nan, 3.0]), np.zeros(3), f],
        [f, np.zeros(3), f + 1],
    )
    broken, zero, fine = acc.stats()
    assert broken.measured and broken.relative == np.inf and broken.max_abs == np.inf
    assert str(broken).startswith("max abs inf, relative inf, cosine undefined (the quantized")
    assert not zero.measured and "all zeros" in str(zero)
    np.testing.assert_allclose(fine.relative, np.sqrt(3 / 29))  # ||1,1,1|| / ||2,3,4||
    assert not acc.worst().measured  # one output unmeasured: the worst is unknown
    for s in (broken, zero, fine, acc.worst()):
        assert not NAN_IN_A_NUMBER.search(str(s))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_quantize_weight_refuses_non_finite_values(bad):
    """A NaN weight used to become a finite int8 when quantize_weight was called directly."""
    from rlx.quant.lower import quantize_weight

    w = np.ones((4, 3), np.float32)
    w[2, 1] = bad
    with pytest.raises(QuantizationError, match=r"non-finite value.*index \(2, 1\)"):
        quantize_weight(w)
