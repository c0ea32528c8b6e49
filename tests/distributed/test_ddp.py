"""Data-parallel training (rlx/distributed/ddp.py) on two local processes joined by gloo: a
small MLP on deterministic data gives the loss curve and params of one process training on
the global batch (PyTorch autograd + torch.optim, and rlx's own TrainStep.step) within f32
reduction-order noise; the ranks' params are identical after every step, also when they
start from different values (rank 0's are broadcast) and when their batches differ in size
(gradients weighted by the local batch size)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlx
from rlx.distributed.ddp import DataParallel, run_data_parallel
from rlx.errors import DistributedError, InputError
from rlx.ops.compose.losses import cross_entropy
from rlx.options import CompileOptions
from rlx.train import SGD, Adam, TrainStep

D, H, C = 6, 16, 3
GLOBAL, STEPS = 16, 10
OPTIMIZERS = ("sgd", "adam")


def mlp(batch: int) -> rlx.Graph:
    """x [batch, D] -> linear, tanh -> linear -> mean cross-entropy with labels y."""
    g = rlx.Graph("mlp")
    x, y = g.input("x", (batch, D)), g.input("y", (batch,), "i64")
    h = g.tanh(g.add(g.matmul(x, g.param("w0", (D, H))), g.param("b0", (H,))))
    logits = g.add(g.matmul(h, g.param("wo", (H, C))), g.param("bo", (C,)))
    g.set_outputs([cross_entropy(g, logits, y)])
    return g


def init(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"w0": (D, H), "b0": (H,), "wo": (H, C), "bo": (C,)}
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def data() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [
        {"x": rng.standard_normal((GLOBAL, D)).astype(np.float32), "y": rng.integers(0, C, GLOBAL)}
        for _ in range(STEPS)
    ]


def optimizer(name: str) -> tuple[object, type, dict]:
    """The rlx optimizer and its torch.optim twin (class, keyword arguments)."""
    if name == "sgd":
        return SGD(0.2, momentum=0.9), torch.optim.SGD, {"lr": 0.2, "momentum": 0.9}
    return Adam(0.05), torch.optim.Adam, {"lr": 0.05}


def split(world: int, rank: int, sizes: tuple[int, ...] | None) -> slice:
    sizes = sizes or (GLOBAL // world,) * world
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def train_rank(rank: int, world: int, sizes: tuple[int, ...] | None) -> dict[str, dict]:
    """One rank, for each optimizer: its own initial values (rank 0's are broadcast), its
    slice of every global batch."""
    part = split(world, rank, sizes)
    rows = part.stop - part.start
    out = {}
    for opt in OPTIMIZERS:
        step = TrainStep(mlp(rows), optimizer(opt)[0], init(seed=rank), options=opts())
        dp = DataParallel(step)
        losses, spreads = [], []
        for b in data():
            local = {"x": b["x"][part], "y": b["y"][part]}
            losses.append(dp.step(local, weight=rows if sizes else 1.0))
            spreads.append(dp.max_param_spread())
        out[opt] = {"losses": losses, "spreads": spreads, "params": step.params()}
    return out


def opts() -> CompileOptions:
    return CompileOptions(num_threads=1)


def torch_global(opt: str) -> tuple[list[float], dict[str, np.ndarray]]:
    """The oracle: PyTorch autograd + torch.optim on the global batches."""
    _, cls, kw = optimizer(opt)
    p = {k: torch.tensor(v, requires_grad=True) for k, v in init(seed=0).items()}
    o = cls(list(p.values()), **kw)
    losses = []
    for b in data():
        o.zero_grad()
        h = torch.tanh(torch.tensor(b["x"]) @ p["w0"] + p["b0"])
        loss = torch.nn.functional.cross_entropy(h @ p["wo"] + p["bo"], torch.tensor(b["y"]))
        loss.backward()
        o.step()
        losses.append(loss.item())
    return losses, {k: t.detach().numpy() for k, t in p.items()}


def check_against_global(ranks: list[dict[str, dict]]) -> None:
    for opt in OPTIMIZERS:
        want_losses, want_params = torch_global(opt)
        single = TrainStep(mlp(GLOBAL), optimizer(opt)[0], init(seed=0), options=opts())
        single_losses = [single.step(b) for b in data()]
        res = [r[opt] for r in ranks]
        for r in res:
            assert r["spreads"] == [0.0] * STEPS  # identical params on every rank, every step
            np.testing.assert_allclose(r["losses"], want_losses, rtol=2e-5, atol=1e-6)
            np.testing.assert_allclose(r["losses"], single_losses, rtol=2e-5, atol=1e-6)
            for k, v in want_params.items():
                np.testing.assert_allclose(r["params"][k], v, rtol=0, atol=5e-5, err_msg=k)
        for k in want_params:
            assert np.array_equal(res[0]["params"][k], res[1]["params"][k])


@pytest.mark.slow
def test_two_ranks_match_one_process_on_the_global_batch() -> None:
    check_against_global(run_data_parallel(train_rank, 2, (None,), timeout_s=120))


@pytest.mark.slow
def test_unequal_batches_weighted_by_size() -> None:
    check_against_global(run_data_parallel(train_rank, 2, ((11, 5),), timeout_s=120))


def _fails(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("rank one is broken")


@pytest.mark.slow
def test_a_failing_rank_is_reported() -> None:
    with pytest.raises(DistributedError, match=r"rank 1 failed:(.|\n)*rank one is broken"):
        run_data_parallel(_fails, 2, timeout_s=60)


def test_errors_without_a_process_group() -> None:
    step = TrainStep(mlp(4), SGD(0.1), init(0))
    with pytest.raises(DistributedError, match="torch.distributed is not initialized"):
        DataParallel(step)
    with pytest.raises(InputError, match="wraps an rlx.train.TrainStep"):
        DataParallel(object())
    with pytest.raises(InputError, match="world_size must be an int >= 1"):
        run_data_parallel(_fails, 0)
