"""Gemma-3-270M Q4_K_M against transformers run now (not stored): the reference script's
Gemma3ForCausalLM on the file's weights decoded by gguf.quants, every logit of the prefill
and of two decode steps (f32 activations: RLX_DQ_ACT=f32)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests.models.llm.conftest import gemma_path

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "make_llm_references.py"


@pytest.mark.slow
def test_every_logit_matches_transformers_now(monkeypatch) -> None:
    monkeypatch.setenv("RLX_DQ_ACT", "f32")
    spec = importlib.util.spec_from_file_location("make_llm_references", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    path = gemma_path()
    ref = script.torch_model(path)
    import rlx.models.llm as llm

    m = llm.load(path, max_context=32, num_threads=1)
    ids = script.PROMPTS["water"]
    with torch.no_grad():
        res = ref(torch.tensor([ids]), use_cache=True)
        past = res.past_key_values
        want = [res.logits[0, -1].numpy()]
        got = [m.prefill(ids)]
        for _ in range(2):
            tok = int(np.argmax(want[-1]))
            res = ref(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past = res.past_key_values
            want.append(res.logits[0, -1].numpy())
            got.append(m.step(tok))
    for g, w in zip(got, want, strict=True):
        assert np.abs(g - w).max() < 1e-5 * np.abs(w).max()
