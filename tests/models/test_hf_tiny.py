"""BERT, RoBERTa and DistilBERT on tiny random checkpoints (tests/models/tiny_checkpoints.py)
vs transformers' outputs for the same files (tests/data/hf/tiny_*.npz)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rlx.models.hf as hf
from rlx.errors import ModelError
from rlx.models import SentenceEncoder
from tests.models import tiny_checkpoints as tc
from tests.models.conftest import cosines, st_layout, tiny_ref


def _hidden(model_dir, ref):
    m = hf.load(model_dir, num_threads=1)
    texts = list(tc.SENTENCES)
    inp = m.inputs(texts, pad_to=ref["input_ids"].shape[1])
    return m, inp, m.compile().run(inp)[0]


@pytest.mark.parametrize("family", tc.FAMILIES)
def test_last_hidden_state_matches_transformers(tiny_dirs, family):
    ref = tiny_ref(family)
    m, inp, h = _hidden(tiny_dirs[family], ref)
    np.testing.assert_array_equal(inp["input_ids"], ref["input_ids"])  # incl. truncation
    np.testing.assert_array_equal(inp["attention_mask"], ref["attention_mask"])
    assert ("token_type_ids" in inp) == (family != "distilbert")
    # every position, padding included (RoBERTa's pad positions use position pad_token_id)
    assert np.abs(h - ref["last_hidden_state"]).max() <= 1e-5
    assert m.config.family.value == family


@pytest.mark.parametrize("family", tc.FAMILIES)
def test_sentence_encoder_plain_hf_dir_mean_pools(tiny_dirs, family):
    ref = tiny_ref(family)
    enc = SentenceEncoder(tiny_dirs[family], num_threads=1)
    assert not enc.normalize_default  # no modules.json: mean pooling, not normalized
    got = enc.encode(list(tc.SENTENCES), batch_size=2)
    assert np.abs(got - ref["mean_pooled"]).max() <= 1e-5
    assert cosines(got, ref["mean_pooled"]).min() >= 0.99999


@pytest.mark.parametrize(
    ("dtype", "shards"), [("bf16", 1), ("f16", 1), ("f32", 3)], ids=["bf16", "f16", "sharded"]
)
def test_checkpoint_storage_variants(tmp_path, dtype, shards):
    """bf16 / f16 files and a 3-shard checkpoint with its index hold the same numbers
    (tiny weights are bf16- and f16-exact), so the f32 reference applies unchanged."""
    d = tc.build("bert", tmp_path / "m", dtype=dtype, shards=shards)
    if shards > 1:
        assert not (d / "model.safetensors").exists()
    m, _, h = _hidden(d, tiny_ref("bert"))
    assert all(v.dtype == np.float32 for v in m.params.values())
    assert np.abs(h - tiny_ref("bert")["last_hidden_state"]).max() <= 1e-5


def test_f32_weights_are_views_of_the_file(tiny_dirs):
    m = hf.load(tiny_dirs["bert"])
    w = m.params["encoder.layer.0.attention.self.query.weight"]
    assert isinstance(w.base, np.ndarray) and not w.flags.writeable
    assert w.shape == (tc.HIDDEN, tc.HIDDEN)
    raw = tc.weights("bert")["encoder.layer.0.attention.self.query.weight"]
    np.testing.assert_array_equal(w, raw.T)  # stored [out, in], read as [in, out]


def _numpy_pool(h, mask, mode):
    m = mask[..., None].astype(np.float64)
    if mode == "cls_token":
        return h[:, 0]
    if mode == "max_tokens":
        return np.where(m > 0, h, -1e9).max(1)
    s = (h * m).sum(1)
    return s / np.sqrt(m.sum(1)) if mode == "mean_sqrt_len_tokens" else s / m.sum(1)


@pytest.mark.parametrize("mode", ["cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens"])
def test_sentence_transformers_pooling_modes(tiny_dirs, tmp_path, mode):
    """Pooling over transformers' hidden states (NumPy oracle), normalized by the Normalize
    module; sentence_bert_config.json's max_seq_length (16) truncates the long text."""
    d = st_layout(tiny_dirs["bert"], tmp_path / "st", [mode], normalize=True)
    enc = SentenceEncoder(d, num_threads=1)
    assert enc.normalize_default and enc.max_length == 16
    texts = [t for t in tc.SENTENCES if len(t.split()) + 2 <= 16]  # no truncation here
    ref = tiny_ref("bert")
    keep = [list(tc.SENTENCES).index(t) for t in texts]
    want = _numpy_pool(ref["last_hidden_state"][keep], ref["attention_mask"][keep], mode)
    raw = enc.encode(texts, normalize=False)
    assert np.abs(raw - want).max() <= 1e-5
    got = enc.encode(texts)
    assert np.abs(got - want / np.linalg.norm(want, axis=1, keepdims=True)).max() <= 1e-5
    long_ids = enc.model.inputs([tc.SENTENCES[3]])["input_ids"]
    assert long_ids.shape == (1, 16) and long_ids[0, -1] == 3  # truncated, ends in [SEP]


def test_encode_batches_and_buckets(tiny_dirs):
    enc = SentenceEncoder(tiny_dirs["bert"], num_threads=1)
    ref = tiny_ref("bert")["mean_pooled"]
    texts = list(tc.SENTENCES)
    outs = list(enc.encode_batches([texts[:2], [], texts[2:]]))
    assert [o.shape for o in outs] == [(2, 32), (0, 32), (3, 32)]
    assert np.abs(np.concatenate(outs) - ref).max() <= 1e-5
    # buckets (multiples of 8 up to 24 = max_length here): many lengths, few plans
    corpus = [" ".join(["cat"] * n) for n in range(1, 30)]
    assert enc.buckets == (8, 16, 24)
    before = {tuple(sorted(p.items())) for p in enc.compiled.shape_plans}
    enc.encode(corpus, batch_size=4)
    new = {tuple(sorted(p.items())) for p in enc.compiled.shape_plans} - before
    # 8 batches, longest first (n + 2 tokens, at most 24): 4 x 24 (four batches), 4 x 16
    # (two), 4 x 8 (one) and the last single text x 8
    assert {dict(p)["seq"] for p in new} <= {8, 16, 24}
    assert new == {
        (("batch", 4), ("seq", 24)),
        (("batch", 4), ("seq", 16)),
        (("batch", 4), ("seq", 8)),
        (("batch", 1), ("seq", 8)),
    }


def _patched_copy(src, dst, config=None, rename=None):
    import shutil

    shutil.copytree(src, dst)
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        cfg = {k: v for k, v in cfg.items() if v is not None}
        (dst / "config.json").write_text(json.dumps(cfg))
    if rename is not None:
        fam = json.loads((dst / "config.json").read_text())["model_type"].replace("xlm-", "")
        w = {rename(k): v for k, v in tc.weights(fam).items()}
        (dst / "model.safetensors").unlink()
        tc.write_weights(w, dst)
    return dst


@pytest.mark.parametrize(
    ("family", "config", "rename"),
    [
        ("roberta", {"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta"}, None),
        ("distilbert", {"architectures": None}, None),  # read by model_type
        ("bert", None, lambda k: "bert." + k),  # saved from a BertFor... task model
        ("roberta", None, lambda k: "roberta." + k),
        (
            "bert",
            None,
            lambda k: k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                "LayerNorm.bias", "LayerNorm.beta"
            ),
        ),
    ],
    ids=["xlm-roberta", "model-type-only", "bert-prefix", "roberta-prefix", "gamma-beta"],
)
def test_checkpoint_naming_variants(tiny_dirs, tmp_path, family, config, rename):
    d = _patched_copy(tiny_dirs[family], tmp_path / "m", config, rename)
    ref = tiny_ref(family)
    _, _, h = _hidden(d, ref)
    assert np.abs(h - ref["last_hidden_state"]).max() <= 1e-5


def test_progress_bar(tiny_dirs, capsys):
    pytest.importorskip("tqdm", reason="the bar is optional: tqdm is not installed")
    enc = SentenceEncoder(tiny_dirs["bert"], num_threads=1)
    texts = list(tc.SENTENCES) * 2
    enc.encode(texts, batch_size=1, progress=False)
    assert "encode" not in capsys.readouterr().err
    enc.encode(texts, batch_size=1, progress=True)
    assert "10/10" in capsys.readouterr().err
    enc.encode(texts[:3], batch_size=1)  # 3 batches: below the threshold, no bar
    assert "encode" not in capsys.readouterr().err


def test_int8_with_user_calibration_texts(tiny_dirs):
    texts = list(tc.SENTENCES)
    enc = SentenceEncoder(
        tiny_dirs["bert"],
        precision="int8",
        num_threads=1,
        calibration_texts=texts,
        quantize_options={"activations": "static"},  # the default (dynamic) calibrates nothing
    )
    rep = enc.quantization_report
    assert rep.calibration_batches == 1 and len(rep.quantized) == 6 * tc.LAYERS
    assert rep.eval_batches == 1
    got = enc.encode(texts)
    assert cosines(got, tiny_ref("bert")["mean_pooled"]).min() >= 0.95


def test_bf16_tiny(tiny_dirs):
    enc = SentenceEncoder(tiny_dirs["roberta"], precision="bf16", num_threads=1)
    got = enc.encode(list(tc.SENTENCES))
    assert cosines(got, tiny_ref("roberta")["mean_pooled"]).min() >= 0.999


def test_int8_empty_calibration_refused(tiny_dirs):
    with pytest.raises(ModelError, match="calibration texts are empty"):
        SentenceEncoder(tiny_dirs["bert"], precision="int8", calibration_texts=[])


def test_int8_quantize_options_reach_rlx_quantize(tiny_dirs):
    keep = "encoder.layer.1.output.dense.weight"
    enc = SentenceEncoder(tiny_dirs["bert"], precision="int8", quantize_options={"exclude": [keep]})
    assert keep not in enc.quantization_report.quantized
    assert len(enc.quantization_report.quantized) == 6 * tc.LAYERS - 1


def test_example_inputs(tiny_dirs):
    m = hf.load(tiny_dirs["roberta"])
    inp = m.example_inputs(3, 7, seed=1)
    assert set(inp) == {"input_ids", "attention_mask", "token_type_ids"}
    ids = inp["input_ids"]
    assert ids.shape == (3, 7) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < m.config.vocab_size and not (ids == 1).any()  # pad 1
    assert inp["attention_mask"].all()
    assert m.compile().run(inp)[0].shape == (3, 7, tc.HIDDEN)
    with pytest.raises(ModelError, match="2 <= seq <= 40"):
        m.example_inputs(1, 41)


def test_compile_overrides_any_option_including_the_thread_count(tiny_dirs):
    """``HFModel.compile(num_threads=...)`` used to raise a TypeError (the thread count
    was passed twice to CompileOptions)."""
    m = hf.load(tiny_dirs["bert"], num_threads=2)
    c = m.compile(num_threads=1, use_cache=False)
    assert c.num_threads == 1 and m.options().num_threads == 2
