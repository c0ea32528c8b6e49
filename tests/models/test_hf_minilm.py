"""all-MiniLM-L6-v2 through rlx vs the stored sentence-transformers / transformers
references (tests/data/hf/minilm.npz, scripts/make_hf_references.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.conftest import cosines


def test_tokenization_matches_transformers(minilm_dir, minilm_ref):
    import rlx.models.hf as hf

    m = hf.load(minilm_dir)
    texts = [str(t) for t in minilm_ref["texts"]]
    inp = m.inputs(texts, pad_to=minilm_ref["input_ids"].shape[1])
    np.testing.assert_array_equal(inp["input_ids"], minilm_ref["input_ids"])
    np.testing.assert_array_equal(inp["attention_mask"], minilm_ref["attention_mask"])
    assert m.max_length == 256  # sentence_bert_config.json, not tokenizer.json's 128


@pytest.mark.slow
def test_f32_one_padded_batch_matches_transformers(minilm_encoders, minilm_ref):
    enc = minilm_encoders["f32"]
    texts = [str(t) for t in minilm_ref["texts"]]
    got = enc.encode(texts, batch_size=len(texts))
    for ref in (minilm_ref["hf_embeddings"], minilm_ref["st_embeddings"]):
        assert cosines(got, ref).min() >= 0.99999
        assert np.abs(got - ref).max() <= 1e-5
    raw = enc.encode(texts, batch_size=len(texts), normalize=False)
    assert np.abs(raw - minilm_ref["hf_pooled"]).max() <= 1e-5


def test_f32_sorted_small_batches_match(minilm_encoders, minilm_ref):
    enc = minilm_encoders["f32"]
    texts = [str(t) for t in minilm_ref["texts"]]
    got = enc.encode(texts, batch_size=3)
    assert cosines(got, minilm_ref["st_embeddings"]).min() >= 0.99999
    assert np.abs(got - minilm_ref["st_embeddings"]).max() <= 1e-5


def _ranking(enc, ref):
    q = enc.encode([str(t) for t in ref["queries"]])
    d = enc.encode([str(t) for t in ref["docs"]])
    return np.argsort(-(q @ d.T), axis=1, kind="stable"), q, d


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_retrieval_ranking_unchanged(minilm_encoders, minilm_ref, precision):
    """Nearest neighbours unchanged; f32 keeps the whole order. bf16 keeps the top 3 (it
    swaps unrelated documents whose reference similarities differ by < 0.002)."""
    ranking, q, d = _ranking(minilm_encoders[precision], minilm_ref)
    np.testing.assert_array_equal(ranking[:, 0], minilm_ref["ranking"][:, 0])
    if precision == "f32":
        np.testing.assert_array_equal(ranking, minilm_ref["ranking"])
    else:
        np.testing.assert_array_equal(
            np.sort(ranking[:, :3], axis=1), np.sort(minilm_ref["ranking"][:, :3], axis=1)
        )


@pytest.mark.slow
def test_bf16_cosine(minilm_encoders, minilm_ref):
    texts = [str(t) for t in minilm_ref["texts"]]
    got = minilm_encoders["bf16"].encode(texts, batch_size=len(texts))
    assert cosines(got, minilm_ref["st_embeddings"]).min() >= 0.999


@pytest.mark.slow
def test_int8_dynamic_by_default(minilm_encoders, minilm_ref):
    """precision="int8" quantizes activations per token at run time (dynamic u8, rlx.quantize
    activations="dynamic"): min cosine 0.996 against transformers on these texts (static
    per-tensor minmax: 0.98). The built-in sample (32 sentences, batches of 8) measures
    the report; nothing is calibrated. tests/quant/test_minilm_int8.py holds the 0.99 bar."""
    enc = minilm_encoders["int8"]
    rep = enc.quantization_report
    assert len(rep.quantized) == 36 and not rep.kept_float  # 6 layers x 6 matmuls
    assert rep.activations == "dynamic" and rep.calibration_batches == 0
    assert rep.eval_batches == 4
    texts = [str(t) for t in minilm_ref["texts"]]
    got = enc.encode(texts, batch_size=len(texts))
    assert cosines(got, minilm_ref["st_embeddings"]).min() >= 0.99
    ranking, _, _ = _ranking(enc, minilm_ref)
    np.testing.assert_array_equal(ranking[:, 0], minilm_ref["ranking"][:, 0])
