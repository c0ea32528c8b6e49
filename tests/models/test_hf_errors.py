"""Bad model directories and bad texts: clear rlx errors naming the problem, raised before
anything is built."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

import rlx.models.hf as hf
from rlx.errors import InputError, ModelError
from rlx.models import SentenceEncoder
from tests.models import tiny_checkpoints as tc
from tests.models.conftest import st_layout


@pytest.fixture
def bert_dir(tiny_dirs, tmp_path):
    """A private copy of the tiny BERT checkpoint, free to damage."""
    return shutil.copytree(tiny_dirs["bert"], tmp_path / "bert")


def _edit_config(d, **fields):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(fields)
    (d / "config.json").write_text(json.dumps(cfg))


def _rewrite_weights(d, edit):
    w = tc.weights("bert")
    edit(w)
    (d / "model.safetensors").unlink()
    tc.write_weights(w, d)


def test_not_a_directory(tmp_path):
    with pytest.raises(ModelError, match="does not exist or is not a directory"):
        hf.load(tmp_path / "nope")


def test_no_config_json(bert_dir):
    (bert_dir / "config.json").unlink()
    with pytest.raises(ModelError, match=r"config: .*config\.json does not exist"):
        hf.load(bert_dir)


def test_config_not_json(bert_dir):
    (bert_dir / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="is not valid JSON"):
        hf.load(bert_dir)


def test_unsupported_architecture(bert_dir):
    _edit_config(bert_dir, architectures=["T5EncoderModel"], model_type="t5")
    with pytest.raises(
        ModelError,
        match=r'architectures: \["T5EncoderModel"\] is not supported; supported: BertModel, '
        r"RobertaModel, XLMRobertaModel, DistilBertModel",
    ):
        hf.load(bert_dir)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("position_embedding_type", "relative_key"),
        ("hidden_act", "relu"),
        ("is_decoder", True),
    ],
)
def test_unsupported_config_value(bert_dir, field, value):
    _edit_config(bert_dir, **{field: value})
    with pytest.raises(ModelError, match=rf"BertModel config {field}={value!r} is not supported"):
        hf.load(bert_dir)


def test_heads_do_not_divide_hidden(bert_dir):
    _edit_config(bert_dir, num_attention_heads=5)
    with pytest.raises(ModelError, match="hidden size 32 is not divisible by .* heads 5"):
        hf.load(bert_dir)


def test_no_safetensors(bert_dir):
    (bert_dir / "model.safetensors").rename(bert_dir / "pytorch_model.bin")
    with pytest.raises(ModelError, match=r"no model\.safetensors.*pytorch_model\.bin"):
        hf.load(bert_dir)


def test_truncated_safetensors(bert_dir):
    f = bert_dir / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelError, match=r"model\.safetensors: not a valid safetensors file"):
        hf.load(bert_dir)


def test_wrong_shape_tensor(bert_dir):
    name = "encoder.layer.1.intermediate.dense.weight"

    def edit(w):
        w[name] = np.zeros((tc.FFN, tc.HIDDEN + 1), np.float32)

    _rewrite_weights(bert_dir, edit)
    with pytest.raises(
        ModelError, match=rf"tensor '{name}' has shape \[64, 33\], expected \[64, 32\]"
    ):
        hf.load(bert_dir)


def test_missing_tensor(bert_dir):
    name = "encoder.layer.0.attention.self.key.bias"
    _rewrite_weights(bert_dir, lambda w: w.pop(name))
    with pytest.raises(ModelError, match=rf"missing tensor '{name}'"):
        hf.load(bert_dir)


def test_extra_tensor(bert_dir):
    def edit(w):
        w["encoder.layer.0.attention.self.rotary.weight"] = np.zeros(3, np.float32)

    _rewrite_weights(bert_dir, edit)
    with pytest.raises(
        ModelError, match="unexpected tensor 'encoder.layer.0.attention.self.rotary.weight'"
    ):
        hf.load(bert_dir)


def test_missing_shard(tiny_dirs, tmp_path):
    d = tc.build("bert", tmp_path / "sharded", shards=2)
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelError, match=r"lists shards that do not exist.*00002-of-00002"):
        hf.load(d)


def test_missing_tokenizer(bert_dir):
    (bert_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match=r"tokenizer: .*tokenizer\.json does not exist"):
        hf.load(bert_dir)


@pytest.mark.parametrize("package", ["safetensors", "tokenizers"])
def test_missing_extra_names_the_pip_command(bert_dir, monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # makes `import package` fail
    with pytest.raises(
        ModelError, match=rf"needs the '{package}' package.*pip install 'rlx\[hf\]'"
    ):
        hf.load(bert_dir)


def test_bad_precision(bert_dir):
    with pytest.raises(ModelError, match=r"precision 'fp8' is not supported; choose one of"):
        hf.load(bert_dir, precision="fp8")


def test_unsupported_sentence_transformers_module(bert_dir):
    mods = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    (bert_dir / "modules.json").write_text(json.dumps(mods))
    with pytest.raises(
        ModelError,
        match=r"module '1' of type 'sentence_transformers.models.Dense' is not supported",
    ):
        SentenceEncoder(bert_dir)


def test_two_pooling_modes_refused(tiny_dirs, tmp_path):
    d = st_layout(tiny_dirs["bert"], tmp_path / "st", ["mean_tokens", "max_tokens"], False)
    with pytest.raises(
        ModelError, match=r"pooling modes \['pooling_mode_mean_tokens', 'pooling_mode_max_tokens'\]"
    ):
        SentenceEncoder(d)


@pytest.fixture(scope="module")
def encoder(tiny_dirs):
    return SentenceEncoder(tiny_dirs["bert"], num_threads=1)


def test_empty_text_list_gives_empty_array(encoder):
    out = encoder.encode([])
    assert out.shape == (0, 32) and out.dtype == np.float32


def test_non_string_text_names_its_index(encoder):
    with pytest.raises(InputError, match=r"texts\[2\] is a int \(7\), expected a str"):
        encoder.encode(["a", "b", 7])
    with pytest.raises(InputError, match=r"texts\[0\] is a NoneType"):
        list(encoder.encode_batches([[None]]))


def test_single_string_refused(encoder):
    with pytest.raises(InputError, match="texts must be a list of strings, got a single str"):
        encoder.encode("hello world")


def test_bad_batch_size(encoder):
    with pytest.raises(InputError, match="batch_size must be an int >= 1, got 0"):
        encoder.encode(["a"], batch_size=0)
