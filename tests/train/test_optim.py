"""Optimizers and gradient clipping (rlx/train/optim.py) against torch.optim and
torch.nn.utils.clip_grad_norm_: the same weights, the same gradient sequence (fed to the
update graph of split mode), 8 steps, f32, max abs difference of the params <= 1e-6."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.errors import InputError
from rlx.ops.compose.losses import mse
from rlx.train import SGD, Adam, AdamW, TrainStep

torch = pytest.importorskip("torch")

STEPS = 8
SHAPES = {"w": (6, 4), "b": (4,)}


def _model() -> rlx.Graph:
    g = rlx.Graph("lin")
    x, y = g.input("x", (3, 6)), g.input("y", (3, 4))
    w, b = g.param("w", SHAPES["w"]), g.param("b", SHAPES["b"])
    g.set_outputs([mse(g, g.add(g.matmul(x, w), b), y)])
    return g


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    grads = [
        {k: (rng.standard_normal(s) * 2.0**-i).astype(np.float32) for k, s in SHAPES.items()}
        for i in range(STEPS)
    ]
    return params, grads


def _torch_run(make, params, grads, clip=None):
    tp = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in params.items()}
    opt = make(list(tp.values()))
    out = []
    for gs in grads:
        for k, t in tp.items():
            t.grad = torch.tensor(gs[k].copy())
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(tp.values()), clip)
        opt.step()
        out.append({k: t.detach().numpy().copy() for k, t in tp.items()})
    return out


def _rlx_run(opt, params, grads, clip=None):
    step = TrainStep(_model(), opt, params, clip_norm=clip)
    out = []
    for gs in grads:
        step.apply(gs)
        out.append(step.params())
    return out


CASES = [
    ("sgd", lambda: SGD(0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    (
        "sgd_momentum_wd",
        lambda: SGD(0.05, momentum=0.9, weight_decay=0.01),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01),
    ),
    (
        "sgd_nesterov",
        lambda: SGD(0.05, momentum=0.8, nesterov=True),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True),
    ),
    ("adam", lambda: Adam(1e-2), lambda ps: torch.optim.Adam(ps, lr=1e-2)),
    (
        "adam_l2",
        lambda: Adam(3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
        lambda ps: torch.optim.Adam(ps, lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    ),
    ("adamw", lambda: AdamW(1e-2), lambda ps: torch.optim.AdamW(ps, lr=1e-2)),
    (
        "adamw_wd",
        lambda: AdamW(5e-3, weight_decay=0.2, betas=(0.85, 0.95)),
        lambda ps: torch.optim.AdamW(ps, lr=5e-3, weight_decay=0.2, betas=(0.85, 0.95)),
    ),
]


@pytest.mark.parametrize("clip", [None, 0.5], ids=["noclip", "clip"])
@pytest.mark.parametrize("name,ours,theirs", CASES, ids=[c[0] for c in CASES])
def test_update_matches_torch_optim(name, ours, theirs, clip):
    params, grads = _data()
    want = _torch_run(theirs, params, grads, clip)
    got = _rlx_run(ours(), params, grads, clip)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        for k in SHAPES:
            diff = float(np.abs(a[k] - b[k]).max())
            assert diff <= 1e-6, f"{name} step {i + 1} {k}: max abs diff {diff:.3g}"


def test_clip_coefficient_when_the_norm_is_below_the_limit_is_one():
    params, grads = _data(1)
    want = _torch_run(lambda ps: torch.optim.SGD(ps, lr=0.1), params, grads[:1])
    got = _rlx_run(SGD(0.1), params, grads[:1], clip=1e6)
    for k in SHAPES:
        np.testing.assert_allclose(got[0][k], want[0][k], atol=1e-7, rtol=0)


def test_state_params_are_named_by_optimizer_and_param():
    params, _ = _data()
    names = set(TrainStep(_model(), AdamW(), params).state_dict())
    assert names == {"w", "b", "adamw.m.w", "adamw.v.w", "adamw.m.b", "adamw.v.b", "train.step"}
    names = set(TrainStep(_model(), SGD(momentum=0.9), params).state_dict())
    assert names == {"w", "b", "sgd.buf.w", "sgd.buf.b", "train.step"}
    assert set(TrainStep(_model(), SGD(), params).state_dict()) == {"w", "b", "train.step"}


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: SGD(-1.0), r"SGD lr must be >= 0.0, given -1.0"),
        (lambda: SGD(0.1, nesterov=True), r"nesterov needs a momentum > 0"),
        (lambda: Adam(betas=(0.9, 1.0)), r"Adam beta2 must be \[0.0, 1.0\), given 1.0"),
        (lambda: AdamW(betas=(0.9,)), r"AdamW betas must be two floats"),
        (lambda: Adam(eps=float("nan")), r"Adam eps must be >= 0.0, given nan"),
    ],
)
def test_bad_hyperparameters_raise_naming_them(make, match):
    with pytest.raises(InputError, match=match):
        make()


# ---- learning-rate schedules ----------------------------------------------------------


def _torch_lrs(make_sched, steps: int, lr: float = 0.5) -> list[float]:
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    sched = make_sched(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_schedules_match_torch_and_transformers():
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    from rlx.train import constant, cosine, step_decay, warmup_cosine, warmup_linear

    lrs = torch.optim.lr_scheduler
    cases = [
        (constant(0.5), lambda o: lrs.ConstantLR(o, factor=1.0)),
        (step_decay(0.5, 3, 0.5), lambda o: lrs.StepLR(o, step_size=3, gamma=0.5)),
        (cosine(0.5, 12), lambda o: lrs.CosineAnnealingLR(o, T_max=12)),
        (cosine(0.5, 12, 0.05), lambda o: lrs.CosineAnnealingLR(o, T_max=12, eta_min=0.05)),
        (warmup_cosine(0.5, 3, 12), lambda o: get_cosine_schedule_with_warmup(o, 3, 12)),
        (warmup_linear(0.5, 3, 12), lambda o: get_linear_schedule_with_warmup(o, 3, 12)),
    ]
    for ours, theirs in cases:
        want = _torch_lrs(theirs, 13)
        got = [ours(t) for t in range(13)]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=repr(ours))


def test_warmup_schedules_end_at_min_lr_and_reject_bad_arguments():
    from rlx.train import step_decay, warmup_cosine, warmup_linear

    assert warmup_cosine(1.0, 2, 10, min_lr=0.1)(10) == pytest.approx(0.1)
    assert warmup_linear(1.0, 2, 10, min_lr=0.1)(50) == pytest.approx(0.1)
    assert warmup_linear(1.0, 4, 10)(2) == 0.5
    with pytest.raises(InputError, match=r"warmup_cosine: warmup \(5\) is longer than total"):
        warmup_cosine(1.0, 5, 4)
    with pytest.raises(InputError, match="step_decay: every must be an int >= 1, given 0"):
        step_decay(1.0, 0)
    with pytest.raises(InputError, match="schedule step must be an int >= 0, given -1"):
        warmup_linear(1.0, 1, 2)(-1)


ADAMS = [c for c in CASES if c[0].startswith("adam")]


@pytest.mark.parametrize("fused", [True, False], ids=["adam_update", "graph"])
@pytest.mark.parametrize("name,ours,theirs", ADAMS, ids=[c[0] for c in ADAMS])
def test_adam_fused_node_and_graph_path_both_match_torch(name, ours, theirs, fused):
    opt = ours()
    opt.fused = fused
    params, grads = _data(1)
    want = _torch_run(theirs, params, grads, 0.5)
    step = TrainStep(_model(), opt, params, clip_norm=0.5)
    effects = [n.op.mnemonic for n in step.step_graph.nodes if n.op.effect]
    assert effects.count("adam_update") == (2 if fused else 0)
    for i, gs in enumerate(grads):
        step.apply(gs)
        got = step.params()
        for k in SHAPES:
            diff = float(np.abs(got[k] - want[i][k]).max())
            assert diff <= 1e-6, f"{name} fused={fused} step {i + 1} {k}: {diff:.3g}"
    state = step.state_dict()
    assert {f"{opt.prefix}.m.w", f"{opt.prefix}.v.b"} <= set(state)
