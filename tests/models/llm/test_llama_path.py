"""The ``llama``, ``qwen2`` and ``qwen3`` architectures against transformers'
LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM on tiny random GGUF files (llama:
adjacent-pair rope on llama.cpp's permuted q / k; qwen2: q / k / v biases; qwen3: q / k
norms; SwiGLU, untied head, grouped-query attention; f32 activations: RLX_DQ_ACT=f32);
bad files: unknown architecture, missing tensor."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import rlx.models.llm as llm  # noqa: E402
from rlx.errors import ModelError  # noqa: E402
from tests.models.llm.tiny_llama import hf_model, hf_weights, write_gguf  # noqa: E402


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_logits_and_greedy_match_transformers(tmp_path, monkeypatch, arch) -> None:
    monkeypatch.setenv("RLX_DQ_ACT", "f32")  # f32 products, as transformers computes
    used = write_gguf(tmp_path / "tiny.gguf", hf_weights(arch=arch), arch=arch)
    ref = hf_model(used, arch)
    m = llm.load(tmp_path / "tiny.gguf", max_context=64, num_threads=1)
    c = m.config
    assert c.arch.name == arch and not c.tied_embeddings
    assert (c.attn_bias, c.qk_norm) == (arch == "qwen2", arch == "qwen3")
    ids = [1, 17, 5, 42, 9, 33, 2, 70, 11, 4, 61]  # 11 tokens: padded to the 16 class
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    got = m.prefill(ids)
    np.testing.assert_allclose(got, want[-1], rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # greedy decode: each step's logits against transformers on the whole sequence
    seq = list(ids)
    tok = int(got.argmax())
    for _ in range(6):
        seq.append(tok)
        got = m.step(tok)
        with torch.no_grad():
            want = ref(torch.tensor([seq])).logits[0, -1].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        tok = int(got.argmax())


def test_unknown_architecture_is_named(tmp_path) -> None:
    write_gguf(tmp_path / "x.gguf", hf_weights(), arch="mamba9")
    with pytest.raises(ModelError, match=r"architecture 'mamba9' is not supported.*gemma3"):
        llm.load(tmp_path / "x.gguf")


def test_missing_tensor_is_named(tmp_path) -> None:
    write_gguf(tmp_path / "x.gguf", hf_weights(), skip="blk.1.ffn_up.weight")
    with pytest.raises(ModelError, match=r"'blk\.1\.ffn_up\.weight' is missing"):
        llm.load(tmp_path / "x.gguf")
