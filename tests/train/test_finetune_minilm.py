"""Fine-tuning the real all-MiniLM-L6-v2 for a few steps with the contrastive loss
(rlx.models.hf.contrastive): rlx's compiled TrainStep (AdamW) against transformers'
BertModel + torch.optim.AdamW from the same weights on the same batches: the loss curves
and the final weights agree within f32 noise.

The task is made hard on purpose: each question is paired with the answer of the next one
(so the loss starts high and the fine-tuning has something to learn)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlx.models import hf
from rlx.models.hf.contrastive import mnrl_graph, mnrl_inputs, trainable
from rlx.options import CompileOptions
from rlx.train import AdamW, TrainStep
from tests.models.conftest import minilm_path
from tests.train.torch_twins import PAIRS, minilm_torch, mnrl_loss, one_thread, to_rlx_layout

SCALE, LR, WD, STEPS = 20.0, 1e-4, 0.01, 4
#: one thread: on a loaded machine (CI) OpenMP barriers across threads cost more than they give
ONE = CompileOptions(num_threads=1)


@pytest.mark.slow
def test_loss_curve_matches_pytorch():
    path = minilm_path()
    model = hf.load(path)
    graph = mnrl_graph(model.config, SCALE)
    halves = [PAIRS[:4], PAIRS[4:]]
    feeds = [mnrl_inputs(model, [a for a, _ in h], [p for _, p in h[1:] + h[:1]]) for h in halves]
    ts = TrainStep(
        graph, AdamW(lr=LR, weight_decay=WD), trainable(model.params, graph), options=ONE
    )
    ours = [ts.step(feeds[i % 2]) for i in range(STEPS)]

    tm = minilm_torch(str(path))
    opt = torch.optim.AdamW(tm.parameters(), lr=LR, weight_decay=WD)
    theirs = []
    with one_thread():
        for i in range(STEPS):
            opt.zero_grad()
            loss = mnrl_loss(tm, feeds[i % 2], SCALE)
            loss.backward()
            opt.step()
            theirs.append(float(loss.detach()))

    rel = np.abs(np.subtract(ours, theirs)) / np.abs(theirs)
    print("rlx  ", " ".join(f"{x:.7f}" for x in ours))
    print("torch", " ".join(f"{x:.7f}" for x in theirs))
    print(f"largest per-step relative difference: {rel.max():.2e}")
    assert rel.max() <= 1e-4
    assert ours[-2] < ours[0] - 0.01 and ours[-1] < ours[1] - 0.01  # it does train
    final = ts.params()
    want = {k: to_rlx_layout(k, p.detach().numpy()) for k, p in tm.named_parameters()}
    moved = {k: np.linalg.norm(final[k] - model.params[k]) for k in graph.param_names}
    for k in graph.param_names:
        if k.endswith("attention.self.key.bias"):
            continue  # its true gradient is 0: both engines move it by Adam-normalized noise
        err = np.linalg.norm(final[k] - want[k])
        assert err <= 1e-2 * moved[k] + 1e-6, (k, err, moved[k])
