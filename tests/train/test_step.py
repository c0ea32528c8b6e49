"""The compiled training step (rlx/train/step.py): one graph for forward, backward and
update against a PyTorch training loop; split mode (grads / apply) against step; state
files resume exactly; recompute keeps the gradients and lowers the planned peak; errors."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.errors import AutodiffError, InputError
from rlx.ops.compose.losses import cross_entropy
from rlx.options import CompileOptions
from rlx.train import SGD, Adam, AdamW, TrainStep, warmup_linear

torch = pytest.importorskip("torch")

D, H, C = 6, 16, 3


def mlp(batch: object = 8, layers: int = 2, act: str = "relu") -> rlx.Graph:
    """x [batch, D] -> (linear, act) * layers -> linear -> cross-entropy with labels y."""
    g = rlx.Graph("mlp")
    if not isinstance(batch, int):
        batch = g.sym("batch", 1, 64)
    x, y = g.input("x", (batch, D)), g.input("y", (batch,), "i64")
    h, d = x, D
    for i in range(layers):
        h = getattr(g, act)(g.add(g.matmul(h, g.param(f"w{i}", (d, H))), g.param(f"b{i}", (H,))))
        d = H
    logits = g.add(g.matmul(h, g.param("wo", (d, C))), g.param("bo", (C,)))
    g.set_outputs([cross_entropy(g, logits, y), logits])
    return g


def init(g: rlx.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        n.op.name: (rng.standard_normal(n.shape.concrete()) * 0.4).astype(np.float32)
        for n in g.param_nodes()
    }


def batches(n: int, batch: int = 8, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "x": rng.standard_normal((batch, D)).astype(np.float32),
            "y": rng.integers(0, C, batch),
        }
        for _ in range(n)
    ]


def torch_train(params, data, make_opt, layers=2, clip=None, sched=None):
    tp = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in params.items()}
    opt = make_opt(list(tp.values()))
    lr_sched = torch.optim.lr_scheduler.LambdaLR(opt, sched) if sched else None
    losses = []
    for b in data:
        opt.zero_grad()
        h = torch.tensor(b["x"])
        for i in range(layers):
            h = torch.relu(h @ tp[f"w{i}"] + tp[f"b{i}"])
        loss = torch.nn.functional.cross_entropy(h @ tp["wo"] + tp["bo"], torch.tensor(b["y"]))
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(tp.values()), clip)
        opt.step()
        if lr_sched is not None:
            lr_sched.step()
        losses.append(loss.item())
    return losses, {k: t.detach().numpy() for k, t in tp.items()}


def assert_params_close(got, want, atol=2e-6):
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=atol, err_msg=k)


@pytest.mark.parametrize(
    "ours,theirs",
    [
        (lambda: SGD(0.1, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
        (lambda: AdamW(1e-2), lambda ps: torch.optim.AdamW(ps, lr=1e-2)),
    ],
    ids=["sgd_momentum", "adamw"],
)
def test_step_matches_a_pytorch_training_loop(ours, theirs):
    g = mlp()
    params, data = init(g), batches(6)
    want_losses, want = torch_train(params, data, theirs, clip=1.0)
    step = TrainStep(g, ours(), params, clip_norm=1.0)
    losses = [step.step(b) for b in data]
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    assert_params_close(step.params(), want)
    assert step.steps == 6
    np.testing.assert_array_equal(params["w0"], init(g)["w0"])  # the caller's arrays stay


@pytest.mark.parametrize(
    "options",
    [CompileOptions(native=False), CompileOptions(optimize=False, fuse=False)],
    ids=["numpy_kernels", "no_passes"],
)
def test_step_matches_pytorch_without_native_kernels_or_passes(options):
    g = mlp()
    params, data = init(g), batches(3)
    want_losses, want = torch_train(params, data, lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    step = TrainStep(g, AdamW(1e-2), params, options=options)
    np.testing.assert_allclose([step.step(b) for b in data], want_losses, rtol=1e-5, atol=1e-6)
    assert_params_close(step.params(), want)


def test_schedule_feeds_the_lr_without_recompiling():
    g = mlp()
    params, data = init(g), batches(6)
    sched = warmup_linear(0.2, warmup=2, total=6)
    want_losses, want = torch_train(
        params, data, lambda ps: torch.optim.SGD(ps, lr=0.2), sched=lambda t: sched(t) / 0.2
    )
    step = TrainStep(g, SGD(0.2), params, schedule=sched)
    compiled = step.compiled
    losses = [step.step(b) for b in data]
    assert step.compiled is compiled and [step.lr()] == [sched(6)]
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    assert_params_close(step.params(), want)


def test_split_grads_and_apply_give_the_params_of_step():
    g = mlp()
    params, data = init(g), batches(4)
    fused = TrainStep(g, Adam(1e-2), params, clip_norm=0.5)
    split = TrainStep(g, Adam(1e-2), params, clip_norm=0.5)
    for b in data:
        want = fused.step(b)
        loss, grads = split.grads(b)
        assert set(grads) == {"w0", "b0", "w1", "b1", "wo", "bo"}
        assert abs(loss - want) <= 1e-6
        split.apply(grads)
    assert_params_close(split.params(), fused.params(), atol=1e-6)
    got, want = split.state_dict(), fused.state_dict()
    assert_params_close(got, want, atol=1e-6)
    assert float(got["train.step"]) == 4.0


def test_switching_between_step_and_split_keeps_the_values():
    g = mlp()
    params, data = init(g), batches(4)
    ref = TrainStep(g, SGD(0.05, momentum=0.9), params)
    mixed = TrainStep(g, SGD(0.05, momentum=0.9), params)
    for i, b in enumerate(data):
        ref.step(b)
        if i % 2:
            mixed.apply(mixed.grads(b)[1])
        else:
            mixed.step(b)
    assert_params_close(mixed.state_dict(), ref.state_dict(), atol=1e-6)


def test_save_and_load_resume_with_identical_losses(tmp_path):
    g = mlp()
    params, data = init(g), batches(6)
    a = TrainStep(g, AdamW(1e-2), params, clip_norm=1.0)
    for b in data[:3]:
        a.step(b)
    a.save(tmp_path / "state.rlx")
    want = [a.step(b) for b in data[3:]]
    b_ = TrainStep(g, AdamW(1e-2), params, clip_norm=1.0)
    b_.load(tmp_path / "state.rlx")
    assert b_.steps == 3
    got = [b_.step(b) for b in data[3:]]
    assert got == want
    graph, values = rlx.load(tmp_path / "state.rlx")  # an ordinary graph file
    assert {"w0", "adamw.m.w0", "adamw.v.w0", "train.step"} <= set(values)
    assert float(values["train.step"]) == 3.0


def test_trainable_subset_leaves_the_other_params_alone():
    g = mlp()
    params, data = init(g), batches(2)
    step = TrainStep(g, SGD(0.1), params, trainable=["wo", "bo"])
    for b in data:
        step.step(b)
    now = step.params()
    for k in ("w0", "b0", "w1", "b1"):
        np.testing.assert_array_equal(now[k], params[k])
    assert not np.array_equal(now["wo"], params["wo"])


@pytest.mark.parametrize("recompute", [False, True])
def test_symbolic_batch_trains_on_batches_of_any_size(recompute):
    g = mlp(batch="batch")
    params = init(g)
    data = batches(2, 8) + batches(2, 5, seed=3)
    want_losses, want = torch_train(params, data, lambda ps: torch.optim.SGD(ps, lr=0.1))
    step = TrainStep(g, SGD(0.1), params, recompute=recompute)
    losses = [step.step(b) for b in data]
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    assert_params_close(step.params(), want)


def test_recompute_keeps_gradients_and_lowers_the_planned_peak():
    # gelu: its backward reads the pre-activation (relu's reads the output, which the next
    # layer's weight gradient keeps anyway: a ReLU MLP has nothing worth recomputing)
    g = mlp(batch=64, layers=3, act="gelu")
    params = init(g)
    (data,) = batches(1, 64)
    kept = TrainStep(g, SGD(0.1), params)
    again = TrainStep(g, SGD(0.1), params, recompute=True)
    l1, g1 = kept.grads(data)
    l2, g2 = again.grads(data)
    assert l1 == l2
    for k in g1:
        np.testing.assert_array_equal(g1[k], g2[k])
    assert again.step(data) == kept.step(data)
    assert_params_close(again.params(), kept.params(), atol=0)
    peak_kept = kept.compiled.memory_plan.peak_bytes
    peak_again = again.compiled.memory_plan.peak_bytes
    assert peak_again < 0.9 * peak_kept
    barriers = [n for n in again.step_graph.nodes if n.op.mnemonic == "barrier"]
    assert barriers and not any(n.op.mnemonic == "barrier" for n in kept.step_graph.nodes)


def test_recompute_everything_from_the_inputs_gives_the_same_step():
    g = mlp(layers=1)
    params, (data,) = init(g), batches(1)
    a = TrainStep(g, SGD(0.1), params)
    b = TrainStep(g, SGD(0.1), params, recompute=[])
    assert a.step(data) == b.step(data)
    assert_params_close(b.params(), a.params(), atol=1e-7)


def test_errors_name_what_is_wrong():
    g = mlp()
    params = init(g)
    with pytest.raises(InputError, match="freeze_params must be False"):
        TrainStep(g, SGD(), params, options=CompileOptions(freeze_params=True))
    with pytest.raises(InputError, match=r"missing \['bo'\]"):
        TrainStep(g, SGD(), {k: v for k, v in params.items() if k != "bo"})
    with pytest.raises(InputError, match=r"trainable \['nope'\] are not params"):
        TrainStep(g, SGD(), params, trainable=["nope"])
    with pytest.raises(InputError, match="optimizer must be an rlx.train Optimizer"):
        TrainStep(g, "sgd", params)  # type: ignore[arg-type]
    with pytest.raises(AutodiffError, match=r"loss .* must be one float element, got f32\[8,3\]"):
        TrainStep(g, SGD(), params, loss_output=1)
    step = TrainStep(g, SGD(), params)
    (b,) = batches(1)
    with pytest.raises(InputError, match="'train.lr' is fed by the step"):
        step.step({**b, "train.lr": 1.0})
    with pytest.raises(InputError, match=r"missing \['bo'\], unknown \['zz'\]"):
        step.apply({**{k: v for k, v in params.items() if k != "bo"}, "zz": 0})
    with pytest.raises(InputError, match=r"expected the values .* missing"):
        step.load_state_dict({"w0": params["w0"]})
    with pytest.raises(InputError, match="TrainStep takes a dict of input name -> array"):
        step.grads([b])  # type: ignore[arg-type]
    r = rlx.Graph("r")
    r.set_outputs([r.sum(r.mul(r.param("train.step", (2,)), r.input("x", (2,))))])
    with pytest.raises(InputError, match="'train.step' is reserved"):
        TrainStep(r, SGD(), {"train.step": np.zeros(2, np.float32)})
    before = step.params()
    with pytest.raises(InputError):
        step.step({"x": b["x"]})  # a missing input changes nothing
    assert_params_close(step.params(), before, atol=0)
