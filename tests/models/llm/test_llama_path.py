"""The ``llama`` architecture (adjacent-pair rope on llama.cpp's permuted q / k, SwiGLU,
untied head, grouped-query attention) against transformers' LlamaForCausalLM on a tiny
random GGUF; bad files: unknown architecture, missing tensor."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import rlx.models.llm as llm  # noqa: E402
from rlx.errors import ModelError  # noqa: E402
from tests.models.llm.tiny_llama import hf_model, hf_weights, write_gguf  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    used = write_gguf(d / "tiny.gguf", hf_weights())
    return d, used


def test_llama_logits_and_greedy_match_transformers(files) -> None:
    d, used = files
    ref = hf_model(used)
    m = llm.load(d / "tiny.gguf", max_context=64, num_threads=1)
    assert m.config.arch.name == "llama" and not m.config.tied_embeddings
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
