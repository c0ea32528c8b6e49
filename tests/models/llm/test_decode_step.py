"""The decode step's fused ops: on a tiny random qwen3 GGUF file (per-head q / k norms)
each layer's q and k run as one native ``rope_norm`` each (no ``rope`` or per-head
``rms_norm`` node left), and the logits still equal transformers' Qwen3ForCausalLM
(f32 activations); the schedule's native kernels run as native segments."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import rlx.models.llm as llm  # noqa: E402
from tests.models.llm.tiny_llama import CFG, hf_model, hf_weights, write_gguf  # noqa: E402


def test_qwen3_step_runs_fused_rope_norm(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLX_DQ_ACT", "f32")
    used = write_gguf(tmp_path / "q3.gguf", hf_weights(seed=5, arch="qwen3"), arch="qwen3")
    ref = hf_model(used, "qwen3")
    m = llm.load(tmp_path / "q3.gguf", max_context=64, num_threads=1)
    ids = [1, 9, 4, 33, 2]
    m.prefill(ids)
    got = m.step(7)
    with torch.no_grad():
        want = ref(torch.tensor([[*ids, 7]])).logits[0, -1].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    ops = [n.op.mnemonic for n in m.graph.nodes]
    assert ops.count("rope_norm") == 2 * CFG["layers"]
    assert "rope" not in ops
    rows = [r for r in m.compiled.report().kernels if r.op == "rope_norm"]
    assert len(rows) == 2 * CFG["layers"]
    assert all(r.kind.name == "NATIVE" for r in rows)
