"""``rlx.models.Reranker`` against sentence-transformers' ``CrossEncoder`` on tiny random
``...ForSequenceClassification`` checkpoints written by transformers
(tests/models/st_checkpoints.py): scores, activations, rank order, truncation, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlx.errors import InputError, ModelError
from rlx.models import Reranker
from rlx.models.rerank import Activation
from tests.models import st_checkpoints as sc

DOCS = [p[1] for p in sc.PAIRS] + ["unknownword dog", "the mat"]
QUERY = "the cat sat"


@pytest.fixture(scope="module")
def classifiers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rerankers")
    return {fam: sc.classifier(fam, root / fam) for fam in sc.CLASSIFIERS}


def _cross_encoder(path: Path) -> object:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(path), device="cpu")


@pytest.mark.parametrize("family", list(sc.CLASSIFIERS))
def test_scores_and_rank_match_cross_encoder(classifiers, family) -> None:
    ce = _cross_encoder(classifiers[family])
    rr = Reranker(classifiers[family], num_threads=1)
    assert rr.activation is Activation.SIGMOID and rr.num_labels == 1
    want = ce.predict(sc.PAIRS, batch_size=2)
    got = rr.predict(sc.PAIRS, batch_size=2)
    assert got.shape == want.shape == (len(sc.PAIRS),) and got.dtype == np.float32
    assert np.abs(got - want).max() <= 1e-5
    assert len(set(np.round(want, 4))) > 1  # the checkpoint tells pairs apart
    for top_k, docs in [(None, False), (3, True)]:
        w = ce.rank(QUERY, DOCS, top_k=top_k, return_documents=docs)
        g = rr.rank(QUERY, DOCS, top_k=top_k, return_documents=docs)
        assert [r["corpus_id"] for r in g] == [r["corpus_id"] for r in w]
        assert all(set(a) == set(b) for a, b in zip(g, w))
        np.testing.assert_allclose([r["score"] for r in g], [r["score"] for r in w], atol=1e-5)
        if docs:
            assert [r["text"] for r in g] == [DOCS[r["corpus_id"]] for r in g]


def test_pairs_are_truncated_together(classifiers) -> None:
    rr = Reranker(classifiers["bert"], num_threads=1)
    (ids, types), *_ = rr.model.tokenizer.tokenize_pairs([sc.PAIRS[-1]])
    assert len(ids) == rr.max_length == 24 and set(types) == {0, 1}
    ce = _cross_encoder(classifiers["bert"])
    assert np.abs(rr.predict([sc.PAIRS[-1]]) - ce.predict([sc.PAIRS[-1]])).max() <= 1e-5


def test_single_pair_gives_a_scalar(classifiers) -> None:
    rr = Reranker(classifiers["roberta"], num_threads=1)
    ce = _cross_encoder(classifiers["roberta"])
    got = rr.predict(sc.PAIRS[0])
    assert got.shape == () and abs(float(got) - float(ce.predict(sc.PAIRS[0]))) <= 1e-5
    assert rr.predict([]).shape == (0,)


def test_bert_tokenizer_without_token_type_ids(tmp_path) -> None:
    """A tokenizer_config whose model_input_names leave token_type_ids out: transformers
    feeds zeros, and so does rlx."""
    d = sc.classifier("bert", tmp_path / "m", token_types=False)
    want = _cross_encoder(d).predict(sc.PAIRS)
    assert np.abs(Reranker(d, num_threads=1).predict(sc.PAIRS) - want).max() <= 1e-5


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, "identity"),
        ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}}, "tanh"),
        ({"sbert_ce_default_activation_function": "mypkg.Custom"}, "sigmoid"),  # untrusted
    ],
    ids=["legacy-identity", "st-tanh", "untrusted"],
)
def test_activation_from_config_as_cross_encoder(tmp_path, extra, expected) -> None:
    d = sc.classifier("distilbert", tmp_path / "m", **extra)
    ce = _cross_encoder(d)
    rr = Reranker(d, num_threads=1)
    assert rr.activation is Activation(expected)
    assert np.abs(rr.predict(sc.PAIRS) - ce.predict(sc.PAIRS)).max() <= 1e-5


def test_activation_saved_by_cross_encoder(tmp_path) -> None:
    """config_sentence_transformers.json (a CrossEncoder saved with an activation) wins."""
    import torch
    from sentence_transformers import CrossEncoder

    d = sc.classifier("bert", tmp_path / "m")
    CrossEncoder(str(d), device="cpu", activation_fn=torch.nn.Identity()).save(str(tmp_path / "s"))
    ce = CrossEncoder(str(tmp_path / "s"), device="cpu")
    rr = Reranker(tmp_path / "s", num_threads=1)
    assert rr.activation is Activation.IDENTITY
    assert np.abs(rr.predict(sc.PAIRS) - ce.predict(sc.PAIRS)).max() <= 1e-5


def test_multi_label_logits_and_softmax(tmp_path) -> None:
    d = sc.classifier("xlm-roberta", tmp_path / "m", num_labels=3)
    ce = _cross_encoder(d)
    rr = Reranker(d, num_threads=1)
    assert rr.num_labels == 3 and rr.activation is Activation.IDENTITY
    got, want = rr.predict(sc.PAIRS), ce.predict(sc.PAIRS)
    assert got.shape == want.shape == (len(sc.PAIRS), 3)
    assert np.abs(got - want).max() <= 1e-5
    soft = rr.predict(sc.PAIRS, apply_softmax=True)
    assert np.abs(soft - ce.predict(sc.PAIRS, apply_softmax=True)).max() <= 1e-5
    with pytest.raises(ModelError, match="num_labels=3"):
        rr.rank(QUERY, DOCS)


def test_bad_inputs_are_input_errors(classifiers) -> None:
    rr = Reranker(classifiers["distilbert"], num_threads=1)
    with pytest.raises(InputError, match="documents is empty"):
        rr.rank(QUERY, [])
    with pytest.raises(InputError, match=r"texts\[1\] is a int"):
        rr.rank(QUERY, ["a dog", 3])
    with pytest.raises(InputError, match="query is a bytes"):
        rr.rank(b"q", ["a dog"])  # type: ignore[arg-type]
    with pytest.raises(InputError, match="top_k"):
        rr.rank(QUERY, ["a dog"], top_k=0)
    with pytest.raises(InputError, match=r"pairs\[1\] must be a pair"):
        rr.predict([("a", "b"), ("a", "b", "c")])
    with pytest.raises(InputError, match=r"pairs\[0\]\[1\] is a NoneType"):
        rr.predict([("a", None)])
    with pytest.raises(InputError, match="pairs must be a list"):
        rr.predict("a dog")
    with pytest.raises(InputError, match="activation must be an Activation"):
        rr.predict([("a", "b")], activation="sigmoid")  # type: ignore[arg-type]


def test_unsupported_architecture_lists_the_supported(tmp_path, classifiers) -> None:
    import shutil

    d = tmp_path / "m"
    shutil.copytree(classifiers["bert"], d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertForMaskedLM"]}))
    with pytest.raises(ModelError) as e:
        Reranker(d)
    for name in sc.CLASSIFIERS.values():
        assert name in str(e.value)
    assert "BertForMaskedLM" in str(e.value)


def test_encoder_checkpoint_is_not_a_reranker(tmp_path) -> None:
    from tests.models import tiny_checkpoints as tc

    d = tc.build("bert", tmp_path / "enc")
    with pytest.raises(ModelError, match="BertModel.*not supported as a reranker"):
        Reranker(d)


def test_unsupported_activation_is_a_model_error(tmp_path) -> None:
    d = sc.classifier(
        "distilbert", tmp_path / "m", sbert_ce_default_activation_function="torch.nn.ReLU"
    )
    with pytest.raises(
        ModelError, match="torch.nn.ReLU.*supported: torch.nn.modules.activation.Sigmoid"
    ):
        Reranker(d)


def test_prompts_as_cross_encoder(tmp_path) -> None:
    """Prompts saved with a CrossEncoder are prepended to the query of each pair."""
    from sentence_transformers import CrossEncoder

    d = sc.classifier("bert", tmp_path / "m")
    prompts = {"cat": "the cat ", "dog": "a dog "}
    CrossEncoder(str(d), device="cpu", prompts=prompts, default_prompt_name="cat").save(
        str(tmp_path / "s")
    )
    ce = CrossEncoder(str(tmp_path / "s"), device="cpu")
    rr = Reranker(tmp_path / "s", num_threads=1)
    assert rr.prompts == prompts and rr.default_prompt_name == "cat"
    for kw in [{}, {"prompt_name": "dog"}, {"prompt": "music "}, {"prompt": ""}]:
        want = ce.predict(sc.PAIRS, **kw)
        assert np.abs(rr.predict(sc.PAIRS, **kw) - want).max() <= 1e-5, kw
        w, g = ce.rank(QUERY, DOCS, **kw), rr.rank(QUERY, DOCS, **kw)
        assert [r["corpus_id"] for r in g] == [r["corpus_id"] for r in w]
    with pytest.raises(InputError, match=r"prompt_name 'x' is not one of .*'cat'"):
        rr.predict(sc.PAIRS, prompt_name="x")


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_precision_close_to_cross_encoder(classifiers, precision) -> None:
    rr = Reranker(classifiers["xlm-roberta"], precision=precision, num_threads=1)
    want = _cross_encoder(classifiers["xlm-roberta"]).predict(sc.PAIRS)
    assert np.abs(rr.predict(sc.PAIRS) - want).max() <= 0.01
