"""A training step differentiates the fused cross-entropy: ``TrainStep`` runs
``fuse_cross_entropy`` on the model before the backward pass, so the step graph holds
``softmax_cross_entropy`` and its backward op instead of log-softmax, gather, scatter
and their backward ops; the gradients are torch autograd's, with and without the
fusion, and with activation recomputation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlx.options import CompileOptions
from rlx.train import SGD, TrainStep
from tests.train.test_step import batches, init, mlp

UNFUSED = CompileOptions(disabled_passes=("fuse_cross_entropy",))


def _ops(step: TrainStep) -> set[str]:
    return {n.op.mnemonic for n in step.step_graph.nodes}


def _torch_grads(params: dict[str, np.ndarray], b: dict[str, np.ndarray]):
    tp = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in params.items()}
    h = torch.tensor(b["x"].astype(np.float64))
    for i in range(2):
        h = torch.relu(h @ tp[f"w{i}"] + tp[f"b{i}"])
    loss = torch.nn.functional.cross_entropy(h @ tp["wo"] + tp["bo"], torch.tensor(b["y"]))
    loss.backward()
    return loss.item(), {k: t.grad.numpy() for k, t in tp.items()}


def test_step_graph_holds_the_fused_loss_and_its_backward_op():
    g = mlp()
    fused, plain = TrainStep(g, SGD(0.1), init(g)), TrainStep(g, SGD(0.1), init(g), options=UNFUSED)
    assert {"softmax_cross_entropy", "softmax_cross_entropy_backward"} <= _ops(fused)
    assert not {"log_softmax", "log_softmax_backward", "gather_elements"} & _ops(fused)
    assert {"log_softmax_backward", "scatter_elements"} <= _ops(plain)
    assert "softmax_cross_entropy" not in _ops(plain)


@pytest.mark.parametrize("options,recompute", [(None, False), (None, True), (UNFUSED, False)])
def test_gradients_match_torch_autograd(options, recompute):
    g = mlp()
    params = init(g)
    step = TrainStep(g, SGD(0.1), params, options=options, recompute=recompute)
    for b in batches(2):
        loss, grads = step.grads(b)
        want_loss, want = _torch_grads(params, b)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
        for k, w in want.items():
            np.testing.assert_allclose(grads[k], w, rtol=1e-4, atol=1e-6, err_msg=k)
