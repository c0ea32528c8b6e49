"""Repacking GGUF weights at load (``RLX_DQ_REPACK``, ``native/dqgemm.py``: rows
interleaved per target) leaves a model's greedy text unchanged: a tiny random llama GGUF
(Q8_0 and F32 weights; its logits also against transformers) and the installed
Gemma-3-270M Q4_K_M (slow tier), each loaded with repacking on and off, f32 activations
and the int8-activation path."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import rlx.backends.cpu.native.dqgemm as dq  # noqa: E402
import rlx.models.llm as llm  # noqa: E402
from tests.models.llm.conftest import gemma_path, greedy  # noqa: E402
from tests.models.llm.tiny_llama import hf_model, hf_weights, write_gguf  # noqa: E402


def _count_repacks(monkeypatch) -> list[int]:
    seen: list[int] = []
    real = dq.repack

    def counting(*a, **k):  # noqa: ANN002, ANN003, ANN202
        seen.append(a[4])
        return real(*a, **k)

    monkeypatch.setattr(dq, "repack", counting)
    return seen


@pytest.mark.parametrize("act", ["f32", "q8"])
def test_tiny_llama_greedy_equal_repack_on_off(tmp_path, monkeypatch, act) -> None:
    monkeypatch.setenv("RLX_DQ_ACT", act)
    used = write_gguf(tmp_path / "tiny.gguf", hf_weights(seed=3, vocab=130))
    ids = [1, 17, 5, 42, 9, 33, 2]
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("RLX_DQ_REPACK", flag)
        seen = _count_repacks(monkeypatch)
        m = llm.load(tmp_path / "tiny.gguf", max_context=64, num_threads=2)
        runs[flag] = greedy(m, ids, 12)
        # Q8_0 q / down / output weights repacked only when on (N = 64, 130: tail rows)
        assert (len(seen) > 0) == (flag == "1"), seen
    assert runs["0"][0] == runs["1"][0]
    for a, b in zip(runs["0"][1], runs["1"][1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(a).max())
    if act == "f32":  # and both against transformers on the decoded weights
        with torch.no_grad():
            want = hf_model(used)(torch.tensor([ids])).logits[0, -1].numpy()
        np.testing.assert_allclose(runs["1"][1][0], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.slow
@pytest.mark.parametrize("act", ["f32", "q8"])
def test_gemma_greedy_equal_repack_on_off(monkeypatch, act) -> None:
    monkeypatch.setenv("RLX_DQ_ACT", act)
    path = gemma_path()
    ids = [2, 651, 6037, 576, 6081, 603, 573]
    toks = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("RLX_DQ_REPACK", flag)
        seen = _count_repacks(monkeypatch)
        m = llm.load(path, max_context=96, num_threads=2)
        toks[flag] = greedy(m, ids, 24)[0]
        assert (len(seen) > 0) == (flag == "1")
    assert toks["0"] == toks["1"]
