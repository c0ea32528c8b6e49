"""Quantization-aware training (rlx.train.qat): prepare -> train -> convert.

Oracles: ``rlx.quantize`` itself for "the same INT8 path" (an untrained QAT model converts
to the very graph PTQ builds, bit for bit), PyTorch's fake-quantize autograd for the QAT
graph's gradients, the fake-quantized graph for the converted INT8 model, and the real
run on scikit-learn's digits (examples/train_digits_qat.py over examples/train_digits.py's
split and model): float MLP >= 97 %, INT8 after QAT within 0.5 points of float, and two
settings where rounding loses > 5 points and QAT wins them back (2-bit weights, outlier
activations).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import rlx
from rlx.autodiff import value_and_grad
from rlx.errors import QuantizationError
from rlx.ops.fake_quant import FakeQuantizeLSQ
from rlx.ops.quant import FakeQuantize
from rlx.runtime.session import Session
from rlx.train import qat

H = 32


def mlp(hidden: int = H, name: str = "mlp") -> rlx.Graph:
    g = rlx.Graph(name)
    x = g.input("x", ("B", 64))
    h = g.relu(g.add(g.matmul(x, g.param("w1", (64, hidden))), g.param("b1", (hidden,))))
    g.set_outputs([g.add(g.matmul(h, g.param("w2", (hidden, 10))), g.param("b2", (10,)))])
    return g


def init(seed: int = 0, hidden: int = H) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    return {
        "w1": (r.standard_normal((64, hidden)) * np.sqrt(2 / 64)).astype(np.float32),
        "b1": (r.standard_normal(hidden) * 0.1).astype(np.float32),
        "w2": (r.standard_normal((hidden, 10)) * np.sqrt(1 / hidden)).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }


def with_loss(g: rlx.Graph) -> rlx.Graph:
    """``g`` (logits) plus a one-hot input ``y`` and the mean cross-entropy as output."""
    g = g.copy(f"{g.name}.loss")
    t = g.input("y", ("B", 10))
    logp = g.log_softmax(g.outputs[0], -1)
    g.set_outputs([g.neg(g.mean(g.sum(g.mul(logp, t), -1)))])
    return g


def batches(x: np.ndarray, n: int = 128) -> list[dict[str, np.ndarray]]:
    return [{"x": x[i : i + n]} for i in range(0, len(x), n)]


def test_untrained_qat_converts_to_exactly_what_rlx_quantize_builds():
    x = np.random.default_rng(1).random((96, 64)).astype(np.float32)
    p = init()
    cal = batches(x, 32)
    ptq = rlx.quantize(mlp(), cal, params=p, rank_layers=False, reduce_range=False)
    model = qat.convert(*qat.prepare(mlp(), p, cal))
    np.testing.assert_array_equal(model.run({"x": x})[0], ptq.compiled.run({"x": x})[0])
    kinds = [k.op for k in model.compiled.report().kernels]
    assert kinds.count("qmatmul") == 2 and "matmul" not in kinds
    assert sorted(model.entries) == ["w1", "w2"]
    assert all("integer" in d for d in model.decisions)


def test_convs_go_the_same_way_to_qconv2d_and_train():
    g = rlx.Graph("cnn")
    x = g.input("x", ("B", 1, 8, 8))
    c = g.relu(g.conv(x, g.param("k", (4, 1, 3, 3)), padding=1))
    g.set_outputs([g.matmul(g.flatten(c, 1), g.param("w", (256, 10)))])
    r = np.random.default_rng(5)
    p = {
        "k": (r.standard_normal((4, 1, 3, 3)) * 0.3).astype(np.float32),
        "w": (r.standard_normal((256, 10)) * 0.1).astype(np.float32),
    }
    xs = r.random((8, 1, 8, 8)).astype(np.float32)
    ptq = rlx.quantize(g, [{"x": xs}], params=p, rank_layers=False, reduce_range=False)
    qg, qp = qat.prepare(g, p, [{"x": xs}])
    model = qat.convert(qg, qp)
    np.testing.assert_array_equal(model.run({"x": xs})[0], ptq.compiled.run({"x": xs})[0])
    kinds = [k.op for k in model.compiled.report().kernels]
    assert "qconv2d" in kinds and "qmatmul" in kinds
    lg = qg.copy()
    lg.set_outputs([lg.sum(lg.outputs[0])])
    _, dk, dw = Session("cpu").compile(value_and_grad(lg, ["k", "w"]), params=qp).run({"x": xs})
    assert dk.shape == (4, 1, 3, 3) and np.abs(dk).sum() > 0 and np.abs(dw).sum() > 0


@pytest.mark.parametrize("learn", [False, True])
def test_converted_int8_computes_what_the_trained_qat_graph_computes(learn):
    r = np.random.default_rng(2)
    x = r.random((64, 64)).astype(np.float32)
    qg, qp = qat.prepare(mlp(), init(), batches(x), learn_scales=learn)
    # "training": every param moves, scales included
    trained = {k: (v + 0.05 * r.standard_normal(v.shape)).astype(np.float32) for k, v in qp.items()}
    model = qat.convert(qg, trained)
    fq = Session("cpu").compile(qg, params=trained).run({"x": x})[0]
    got = model.run({"x": x})[0]
    np.testing.assert_allclose(got, fq, rtol=1e-5, atol=1e-5 * np.abs(fq).max())
    if learn:  # the learned scales became the INT8 model's scales
        np.testing.assert_allclose(
            model.entries["w1"][1].scales, np.exp(trained["w1.log_qscale"]), rtol=1e-6
        )
        assert model.entries["w2"][0].scales[0] == pytest.approx(
            float(np.exp(trained["qat.act1.log_qscale"][0])), rel=1e-6
        )


def test_prepare_puts_a_fake_quantizer_on_each_operand_of_each_layer():
    x = np.random.default_rng(3).random((32, 64)).astype(np.float32)
    qg, qp = qat.prepare(mlp(), init(), batches(x))
    assert len(qg.find(FakeQuantize)) == 2  # activations: fixed calibrated scales
    lsq = qg.find(FakeQuantizeLSQ)  # weights: scale max|w|/127 from the current weight
    assert len(lsq) == 2 and not any(n.op.learn_scale for n in lsq)
    assert sorted(qp) == ["b1", "b2", "w1", "w2"]
    qg2, qp2 = qat.prepare(mlp(), init(), batches(x), learn_scales=True, weight_bits=4)
    assert all(n.op.learn_scale and n.op.qmin in (-7, 0, -128) for n in qg2.find(FakeQuantizeLSQ))
    assert {k for k in qp2 if "qscale" in k} == {
        "w1.log_qscale",
        "w2.log_qscale",
        "qat.act0.log_qscale",
        "qat.act1.log_qscale",
    }
    np.testing.assert_allclose(
        np.exp(qp2["w1.log_qscale"]), np.abs(init()["w1"]).max(0) / 7, rtol=1e-6
    )


def test_prepare_and_convert_errors_name_the_problem():
    x = {"x": np.ones((4, 64), np.float32)}
    with pytest.raises(QuantizationError, match="unknown calibration method 'median'"):
        qat.prepare(mlp(), init(), [x], method="median")
    with pytest.raises(QuantizationError, match=r"exclude names unknown layers \['w9'\]"):
        qat.prepare(mlp(), init(), [x], exclude=["w9"])
    with pytest.raises(QuantizationError, match="no quantizable matmul"):
        qat.prepare(mlp(), init(), [x], exclude=["w1", "w2"])
    with pytest.raises(QuantizationError, match="weight_bits must be an int in 2..8"):
        qat.prepare(mlp(), init(), [x], weight_bits=1)
    with pytest.raises(QuantizationError, match="no matmul or conv with fake-quantized"):
        qat.convert(mlp(), init())


@pytest.mark.parametrize("learn", [False, True])
def test_qat_gradients_match_torch_fake_quantize_autograd(learn):
    r = np.random.default_rng(4)
    x = r.random((16, 64)).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[r.integers(0, 10, 16)]
    qg, qp = qat.prepare(mlp(), init(), batches(x), learn_scales=learn)
    names = sorted(qp)
    out = Session("cpu").compile(value_and_grad(with_loss(qg), names), params=qp)
    loss, *grads = out.run({"x": x, "y": y})
    factors = {  # learned scale param -> the grad_factor of the quantizer reading it
        qg.nodes[qg.nodes[n.inputs[1]].inputs[0]].op.name: n.op.grad_factor
        for n in qg.find(FakeQuantizeLSQ)
        if n.op.learn_scale
    }

    t = {k: torch.tensor(v, requires_grad=True) for k, v in qp.items()}
    acts = {n.inputs[0]: n.op for n in qg.find(FakeQuantize)}
    fqa = [acts[k] for k in sorted(acts)]

    def act(v, k):
        if learn:
            s = torch.exp(t[f"qat.act{k}.log_qscale"])
            z = torch.zeros(1)
            return torch._fake_quantize_learnable_per_tensor_affine(v, s, z, 0, 255, 1.0)
        op = fqa[k]
        return torch.fake_quantize_per_tensor_affine(
            v, op.scales[0], op.zero_points[0], op.qmin, op.qmax
        )

    def weight(name):
        w = t[name]
        if learn:
            s = torch.exp(t[f"{name}.log_qscale"])
            z = torch.zeros(s.shape[0])
            return torch._fake_quantize_learnable_per_channel_affine(w, s, z, 1, -127, 127, 1.0)
        amax = w.detach().abs().amax(0)
        s = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
        z = torch.zeros(s.shape[0], dtype=torch.int32)
        return torch.fake_quantize_per_channel_affine(w, s, z, 1, -127, 127)

    xt = torch.tensor(x)
    h = torch.relu(act(xt, 0) @ weight("w1") + t["b1"])
    logits = act(h, 1) @ weight("w2") + t["b2"]
    ref = torch.nn.functional.cross_entropy(logits, torch.tensor(y.argmax(1)))
    ref.backward()
    assert float(loss) == pytest.approx(ref.item(), rel=1e-5)
    for name, got in zip(names, grads, strict=True):
        want = t[name].grad.numpy()
        if learn and "qscale" in name:
            # torch's op was given grad_factor 1; prepare's nodes carry LSQ's 1/sqrt(n qmax)
            want = want * factors[name]
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6, err_msg=name)


# ---- the real run: scikit-learn's digits (examples/train_digits_qat.py) --------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_digits_qat.py"


def _example():
    spec = importlib.util.spec_from_file_location("train_digits_qat", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_digits_int8_after_qat_is_within_half_a_point_of_float():
    pytest.importorskip("sklearn")
    res = _example().run(epochs=30, qat_epochs=3)
    assert res["float"] >= 0.97, res
    assert res["int8 qat"] >= res["float"] - 0.005, res
    # the converted model runs integer GEMMs for all three layers
    assert res["kinds"].count("qmatmul") == 3 and "matmul" not in res["kinds"]
    # where rounding loses accuracy, QAT wins it back: 2-bit weights, outlier activations
    assert res["w2 rounding"] < res["float"] - 0.05, res
    assert res["w2 qat"] > res["w2 rounding"] + 0.10, res
    assert res["outlier float"] == res["float"]  # the reparametrization keeps the function
    assert res["outlier int8 ptq"] < res["float"] - 0.05, res
    assert res["outlier int8 qat"] > res["outlier int8 ptq"] + 0.05, res
