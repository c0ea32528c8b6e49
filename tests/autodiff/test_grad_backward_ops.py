"""Autodiff emits the seed's backward ops (ReluBackward, ActivationBackward,
LayerNormBackwardGamma, MaxPool2dBackward, FakeQuantizeBackward, FakeQuantizeLSQBackwardX,
FakeQuantizeLSQBackwardScale, ScanBackward, ScanBackwardXs) instead of primitive graphs:
the backward graphs contain them (counted by mnemonic), their gradients match
torch.autograd (reference interpreter and compiled CPU graph), and their own derivatives
(Hessian-vector products through an activation and through a scan; vmap of the
activation backward ops) match PyTorch too."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import rlx
from rlx.autodiff import grad, hvp, vmap
from rlx.ops.activation_grad import ActivationBackward, ReluBackward
from rlx.ops.unary_kinds import UnaryKind
from rlx.runtime.session import Session

TORCH_ACT = {
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "hardswish": F.hardswish,
}


def _ops(g: rlx.Graph) -> Counter[str]:
    return Counter(n.op.mnemonic for n in g.nodes)


def _both(g: rlx.Graph, feed: dict, params: dict) -> list[list[np.ndarray]]:
    """The reference interpreter's results and the compiled CPU graph's."""
    cg = Session("cpu").compile(g)
    cg.set_params(params)
    return [g.evaluate(feed, params), cg.run(feed)]


def _mlp(act: str) -> rlx.Graph:
    g = rlx.Graph(f"mlp_{act}")
    x = g.input("x", (8, 6))
    h = getattr(g, act)(g.add(g.matmul(x, g.param("w1", (6, 16))), g.param("b1", (16,))))
    h = getattr(g, act)(g.matmul(h, g.param("w2", (16, 16))))
    y = g.matmul(h, g.param("w3", (16, 1)))
    g.set_outputs([g.sum(g.square(y))])
    return g


@pytest.mark.parametrize("act", sorted(TORCH_ACT))
def test_mlp_gradients_use_one_backward_op_per_activation(act: str) -> None:
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal((6, 16)).astype(np.float32) * 0.5,
        "b1": rng.standard_normal(16).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((16, 16)).astype(np.float32) * 0.3,
        "w3": rng.standard_normal((16, 1)).astype(np.float32) * 0.3,
    }
    x = rng.standard_normal((8, 6)).astype(np.float32) * 2
    fwd = _mlp(act)
    back = grad(fwd, list(params))
    ops = _ops(back)
    name = "relu_backward" if act == "relu" else "activation_backward"
    assert ops[name] == 2, ops
    # no primitive derivative graph: the unary nodes are the forward's (activations, square)
    assert ops["unary"] == _ops(fwd)["unary"], ops
    assert ops["where"] == 0 and ops["compare"] == 0, ops
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    f = TORCH_ACT[act]
    h = f(f(torch.tensor(x) @ tp["w1"] + tp["b1"]) @ tp["w2"])
    ((h @ tp["w3"]) ** 2).sum().backward()
    for got in _both(back, {"x": x}, params):
        for k, gr in zip(params, got, strict=True):
            want = tp[k].grad.numpy()
            np.testing.assert_allclose(gr, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("act", ["tanh", "gelu", "silu", "sigmoid"])
def test_hessian_vector_product_through_activation_backward(act: str) -> None:
    """hvp is forward over reverse: it differentiates ActivationBackward (its lowering)."""
    rng = np.random.default_rng(1)
    g = rlx.Graph("h")
    x = g.input("x", (3, 4), "f64")
    w = g.input("w", (4, 5), "f64")
    g.set_outputs([g.sum(getattr(g, act)(g.matmul(x, w)))])
    xv, wv, vv = (
        rng.standard_normal((3, 4)),
        rng.standard_normal((4, 5)),
        rng.standard_normal((4, 5)),
    )
    h = hvp(g, ["w"])
    assert any(n.op.mnemonic == "activation_backward" for n in h.nodes)
    (got,) = h.evaluate({"x": xv, "w": wv, "v_w": vv}, {})
    f = TORCH_ACT[act]
    _, want = torch.autograd.functional.hvp(
        lambda wt: f(torch.tensor(xv) @ wt).sum(), torch.tensor(wv), torch.tensor(vv)
    )
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-10)


def test_vmap_of_relu_and_activation_backward_matches_a_loop() -> None:
    rng = np.random.default_rng(2)
    g = rlx.Graph("v")
    y, ct = g.input("y", (3, 4), "f64"), g.input("ct", (3, 4), "f64")
    g.set_outputs([g.add(g.apply(ReluBackward(), [y, ct]),
                         g.apply(ActivationBackward(UnaryKind.GELU), [y, ct]))])  # fmt: skip
    ys, cts = rng.standard_normal((5, 3, 4)), rng.standard_normal((3, 4, 5))
    mapped = vmap(g, {"y": 0, "ct": 2}, size="batch")
    (got,) = mapped.evaluate({"y": ys, "ct": cts}, {})
    for i in range(5):
        (want,) = g.evaluate({"y": ys[i], "ct": cts[..., i]}, {})
        np.testing.assert_allclose(got[i], want, rtol=1e-12, atol=1e-12)


def test_max_pool2d_gradient_is_one_max_pool2d_backward() -> None:
    rng = np.random.default_rng(3)
    xv = np.round(rng.standard_normal((2, 3, 7, 6)) * 2) / 2  # ties: the first maximum wins
    g = rlx.Graph("mp")
    x = g.input("x", xv.shape, "f32")
    w = g.input("w", (2, 3, 4, 4), "f32")
    g.set_outputs([g.sum(g.mul(g.max_pool(x, (3, 2), (2, 2), 1), w))])
    back = grad(g, ["x"])
    ops = _ops(back)
    assert ops["max_pool2d_backward"] == 1 and ops["pool_backward"] == 0, ops
    wv = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    xt = torch.tensor(xv.astype(np.float32), requires_grad=True)
    (F.max_pool2d(xt, (3, 2), (2, 2), 1) * torch.tensor(wv)).sum().backward()
    for (dx,) in _both(back, {"x": xv.astype(np.float32), "w": wv}, {}):
        np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-6, atol=1e-6)
    # a 1-D max pool keeps the generic PoolBackward
    g1 = rlx.Graph("mp1")
    x1 = g1.input("x", (2, 3, 8), "f32")
    g1.set_outputs([g1.sum(g1.max_pool(x1, 2))])
    assert _ops(grad(g1, ["x"]))["pool_backward"] == 1


def test_fake_quantize_gradients_are_the_backward_ops() -> None:
    """STE and LSQ: one FakeQuantizeBackward, one FakeQuantizeLSQBackwardX and one
    FakeQuantizeLSQBackwardScale node, matching torch's autograd."""
    rng = np.random.default_rng(4)
    xv = (rng.standard_normal((4, 6)) * 0.6).astype(np.float32)
    ctv = rng.standard_normal((4, 6)).astype(np.float32)
    sv = np.array([0.05, 0.1, 0.2, 0.1, 0.05, 0.3], np.float32)
    g = rlx.Graph("fq")
    x, s, c = g.input("x", (4, 6)), g.input("s", (6,)), g.input("c", (4, 6))
    fq = g.fake_quantize(x, 0.05, qmin=-8, qmax=7)
    y = g.fake_quantize_lsq(fq, s, axis=1, qmin=-8, qmax=7, grad_factor=0.5)
    g.set_outputs([g.sum(g.mul(y, c))])
    back = grad(g, ["x", "s"])
    ops = _ops(back)
    for name in ("fake_quantize_backward", "fake_quantize_lsq_backward_x",
                 "fake_quantize_lsq_backward_scale"):  # fmt: skip
        assert ops[name] == 1, ops
    assert ops["quantize"] == 0 and ops["round"] == 0, ops
    xt, st = torch.tensor(xv, requires_grad=True), torch.tensor(sv, requires_grad=True)
    f1 = torch.fake_quantize_per_tensor_affine(xt, 0.05, 0, -8, 7)
    z = torch.zeros(6)
    y = torch._fake_quantize_learnable_per_channel_affine(f1, st, z, 1, -8, 7, 0.5)
    (y * torch.tensor(ctv)).sum().backward()
    for dx, ds in _both(back, {"x": xv, "s": sv, "c": ctv}, {}):
        np.testing.assert_array_equal(dx, xt.grad.numpy())
        np.testing.assert_allclose(ds, st.grad.numpy(), rtol=1e-5, atol=1e-5)


T, B, H, D = 5, 2, 4, 3


def _rnn() -> rlx.Graph:
    """h <- tanh(h W + x U) over T steps; loss = sum(ys^2) + sum(h_T)."""
    g = rlx.Graph("rnn")
    h0 = g.input("h0", (B, H), "f64")
    w, u = g.input("W", (H, H), "f64"), g.input("U", (D, H), "f64")
    xs = g.input("xs", (T, B, D), "f64")

    def body(s, h, wv, uv, x):
        hn = s.tanh(s.add(s.matmul(h, wv), s.matmul(x, uv)))
        return [hn, wv, uv, hn]

    ys = g.scan(body, [h0, w, u], [xs], output_index=3)
    h_t = g.scan(body, [h0, w, u], [xs], output_index=0)
    g.set_outputs([g.add(g.sum(g.square(ys)), g.sum(h_t))])
    return g


def _torch_rnn(h0, w, u, xs):
    h, ys = h0, []
    for t in range(T):
        h = torch.tanh(h @ w + xs[t] @ u)
        ys.append(h)
    return (torch.stack(ys) ** 2).sum() + h.sum()


def _rnn_values(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "h0": rng.standard_normal((B, H)),
        "W": rng.standard_normal((H, H)) * 0.5,
        "U": rng.standard_normal((D, H)),
        "xs": rng.standard_normal((T, B, D)),
    }


def test_scan_rnn_gradients_are_scan_backward_ops() -> None:
    vals = _rnn_values(5)
    back = grad(_rnn(), ["W", "U", "h0", "xs"])
    ops = _ops(back)
    # per forward scan: one ScanBackward per float carry, one ScanBackwardXs; the weights
    # pass through the body, so only h is stacked (one forward scan per forward scan)
    assert ops["scan_backward"] == 6 and ops["scan_backward_xs"] == 2, ops
    assert ops["scan"] == 4, ops
    leaves = [torch.tensor(vals[k], requires_grad=True) for k in ("W", "U", "h0", "xs")]
    w, u, h0, xs = leaves
    _torch_rnn(h0, w, u, xs).backward()
    for got in _both(back, vals, {}):
        for gr, t in zip(got, leaves, strict=True):
            np.testing.assert_allclose(gr, t.grad.numpy(), rtol=1e-10, atol=1e-10)


def test_scan_reverse_and_hessian_vector_product_match_torch() -> None:
    """Second order through ScanBackward (its lowering, a reverse scan) against torch's
    double backward."""
    vals = _rnn_values(6)
    rng = np.random.default_rng(7)
    v = rng.standard_normal((H, H))
    h = hvp(_rnn(), ["W"])
    assert any(n.op.mnemonic == "scan_backward" for n in h.nodes)
    (got,) = h.evaluate({**vals, "v_W": v}, {})
    consts = [torch.tensor(vals[k]) for k in ("U", "h0", "xs")]
    _, want = torch.autograd.functional.hvp(
        lambda w: _torch_rnn(consts[1], w, consts[0], consts[2]),
        torch.tensor(vals["W"]),
        torch.tensor(v),
    )
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dt", ["f32", "f16"])
@pytest.mark.parametrize(
    ("window", "stride", "pad"), [((2, 2), (2, 2), 0), ((3, 2), (1, 2), 1), ((3, 3), (2, 1), 1)]
)
def test_native_max_pool2d_backward_matches_the_reference(dt, window, stride, pad) -> None:
    """csrc/maxpool2d_grad.c (overlapping windows, padding, ties on a grid of halves) at a
    size that uses two threads, against the op's NumPy reference."""
    from rlx.ops.nn import Pool, PoolKind
    from rlx.ops.nn_grad import MaxPool2dBackward
    from rlx.options import CompileOptions

    rng = np.random.default_rng(8)
    fwd = Pool(PoolKind.MAX, window, stride, ((pad, pad), (pad, pad)))
    npdt = np.float32 if dt == "f32" else np.float16
    xs = (np.round(rng.standard_normal((4, 8, 20, 19)) * 2) / 2).astype(npdt)
    out = fwd.infer((rlx.Shape(xs.shape, dt),)).dims
    cts = rng.standard_normal(out).astype(npdt)
    g = rlx.Graph("mp2")
    g.set_outputs([g.apply(MaxPool2dBackward(fwd), [g.input("x", xs.shape, dt),
                                                    g.input("ct", out, dt)])])  # fmt: skip
    cg = Session("cpu").compile(g, CompileOptions(num_threads=2, use_cache=False))
    kinds = [k.kind.value for k in cg.report().kernels if k.op == "max_pool2d_backward"]
    assert kinds == ["native"]
    (got,) = cg.run({"x": xs, "ct": cts})
    (want,) = g.evaluate({"x": xs, "ct": cts}, {})
    tol = 1e-6 if dt == "f32" else 2e-3
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)
