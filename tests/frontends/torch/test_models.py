"""rlx.from_torch on whole models against PyTorch (the oracle): an MLP, a CNN (conv,
batchnorm in eval mode, max / avg / adaptive pooling), a transformers BERT with an
attention mask and a Llama-style decoder (RMSNorm, rope, grouped-query causal SDPA,
SwiGLU), each exported with a dynamic batch: one compile serves two batch sizes.

Tolerance (f32): rtol 1e-4, atol 2e-5. rlx and PyTorch sum in different orders (blocked
GEMMs, fused attention with online softmax); the measured worst differences are ~6e-8
(MLP, CNN) and ~7e-7 (BERT, Llama)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.export import Dim

import rlx
from rlx.shape import Sym

from . import models

RTOL, ATOL = 1e-4, 2e-5
BATCH = Dim("batch", min=1, max=64)


def _check(tm: rlx.frontends.torch.TorchModel, cg, args, want) -> None:
    got = cg.run(dict(zip(tm.inputs, [a.numpy() for a in args], strict=True)))
    if hasattr(want, "to_tuple"):  # a transformers ModelOutput
        want = want.to_tuple()
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.detach().numpy(), rtol=RTOL, atol=ATOL)


def _serves_two_batches(module, make, n_out: int) -> rlx.frontends.torch.TorchModel:
    torch.manual_seed(0)
    example = make(2)
    tm = rlx.from_torch(module, example, dynamic_shapes=tuple({0: BATCH} for _ in example))
    for shape in tm.inputs.values():
        assert shape.dims[0] == Sym.named("batch")
    cg = tm.compile()
    for b in (3, 5):
        args = make(b)
        with torch.no_grad():
            want = module(*args)
        _check(tm, cg, args, want)
    assert len(tm.outputs) == n_out
    return tm


def test_mlp_dynamic_batch():
    torch.manual_seed(1)
    m = models.MLP().eval()
    tm = _serves_two_batches(m, lambda b: (torch.randn(b, 16),), 1)
    assert set(tm.params) == {
        f"{n}.{p}" for n in ("fc1", "fc2", "head") for p in ("weight", "bias")
    }
    np.testing.assert_array_equal(tm.params["fc1.weight"], m.fc1.weight.detach().numpy())


def test_cnn_dynamic_batch():
    torch.manual_seed(2)
    m = models.CNN().eval()
    tm = _serves_two_batches(m, lambda b: (torch.randn(b, 3, 16, 16),), 1)
    assert "bn1.running_mean" in tm.params and "bn2.running_var" in tm.params  # buffers
    ops = {type(n.op).__name__ for n in tm.graph.nodes}
    assert {"Conv", "Pool"} <= ops


def _ids_mask(b: int, seq: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 120, (b, seq))
    mask = torch.ones(b, seq, dtype=torch.long)
    mask[1, seq // 2 :] = 0  # the second sequence is padded
    return ids, mask


@pytest.mark.slow
def test_bert_dynamic_batch_with_attention_mask():
    torch.manual_seed(3)
    m = models.bert()
    tm = _serves_two_batches(m, _ids_mask, 2)  # last_hidden_state, pooler_output
    ops = [type(n.op).__name__ for n in tm.graph.nodes]
    assert ops.count("Attention") == 2 and ops.count("LayerNorm") == 5


@pytest.mark.slow
def test_llama_decoder_dynamic_batch():
    torch.manual_seed(4)
    m = models.Llama().eval()
    tm = _serves_two_batches(m, lambda b: (torch.randint(0, 120, (b, 8)),), 1)
    att = [n.op for n in tm.graph.nodes if type(n.op).__name__ == "Attention"]
    assert len(att) == 1 and att[0].num_heads == 4


def test_run_takes_torch_tensors_and_num_threads():
    torch.manual_seed(5)
    m = models.MLP().eval()
    x = torch.randn(4, 16)
    tm = rlx.from_torch(m, (x,), num_threads=1)
    assert tm.num_threads == 1
    (y,) = tm.run(x)
    np.testing.assert_allclose(y, m(x).detach().numpy(), rtol=RTOL, atol=ATOL)
    assert tm.inputs["x"].dims == (4, 16)  # no dynamic_shapes: static dims


@pytest.mark.slow
def test_bert_dynamic_batch_and_sequence():
    torch.manual_seed(6)
    m = models.bert()
    seq = Dim("seq", min=2, max=64)
    ids, mask = _ids_mask(2)
    tm = rlx.from_torch(m, (ids, mask), ({0: BATCH, 1: seq}, {0: BATCH, 1: seq}))
    assert tm.inputs["input_ids"].dims == (Sym.named("batch"), Sym.named("seq"))
    cg = tm.compile()
    for b, s in ((3, 5), (2, 11)):
        args = _ids_mask(b, s)
        with torch.no_grad():
            want = m(*args)
        _check(tm, cg, args, want)


def test_dynamic_shapes_by_parameter_name_and_unnamed_dims():
    m = models.MLP().eval()
    x = torch.randn(3, 16)
    tm = rlx.from_torch(m, (x,), dynamic_shapes={"x": {0: Dim("rows", max=32)}})
    assert tm.inputs["x"].dims == (Sym.named("rows"), 16)
    tm = rlx.from_torch(m, (x,), dynamic_shapes={"x": {0: Dim.AUTO}})  # torch names it
    assert isinstance(tm.inputs["x"].dims[0], Sym)
    x7 = torch.randn(7, 16)
    (y,) = tm.run(x7)
    np.testing.assert_allclose(y, m(x7).detach().numpy(), rtol=RTOL, atol=ATOL)
