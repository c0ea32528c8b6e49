"""``SentenceEncoder`` against ``SentenceTransformer`` on tiny checkpoints written by
sentence-transformers (tests/models/st_checkpoints.py): every pooling mode of its Pooling
module, its prompts (``prompt_name``, ``prompt``, the default prompt) and the errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from rlx.errors import InputError, ModelError
from rlx.models import SentenceEncoder
from rlx.models.hf.layout import Pooling
from tests.models import st_checkpoints as sc
from tests.models import tiny_checkpoints as tc

TEXTS = list(tc.SENTENCES) + ["unknownword", "cat"]
MODES = ["mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]
PROMPTS = {"query": "the ", "passage": "music is "}


def _st(path: Path) -> object:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


@pytest.mark.parametrize(
    ("mode", "family"),
    [(m, "bert") for m in MODES] + [("lasttoken", "roberta"), ("weightedmean", "distilbert")],
)
def test_pooling_mode_matches_sentence_transformers(tmp_path, mode, family) -> None:
    d = sc.sentence_transformer(tmp_path / "st", mode, family=family, normalize=mode == "cls")
    enc = SentenceEncoder(d, num_threads=1)
    assert enc.layout.pooling is Pooling(
        mode if mode != "mean_sqrt_len_tokens" else "mean_sqrt_len"
    )
    want = _st(d).encode(TEXTS, batch_size=3)
    got = enc.encode(TEXTS, batch_size=3)
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5


def test_prompts_match_sentence_transformers(tmp_path) -> None:
    d = sc.sentence_transformer(
        tmp_path / "st", "mean", prompts=PROMPTS, default_prompt_name="query", normalize=True
    )
    st, enc = _st(d), SentenceEncoder(d, num_threads=1)
    assert PROMPTS.items() <= enc.prompts.items()
    for kw in [{}, {"prompt_name": "passage"}, {"prompt": "a dog "}, {"prompt": ""}]:
        want = st.encode(TEXTS, **kw)
        assert np.abs(enc.encode(TEXTS, **kw) - want).max() <= 1e-5, kw
    plain = enc.encode(TEXTS, prompt="")
    assert np.abs(enc.encode(TEXTS) - plain).max() > 1e-3  # the default prompt applied
    with pytest.raises(InputError, match=r"prompt_name 'nope' is not one of .*'query'"):
        enc.encode(TEXTS, prompt_name="nope")
    with pytest.raises(InputError, match="prompt must be a str"):
        enc.encode(TEXTS, prompt=3)  # type: ignore[arg-type]


def _pooling_config(tmp_path: Path, src: Path, **cfg: object) -> Path:
    d = tmp_path / "edited"
    shutil.copytree(src, d)
    (d / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 32, **cfg}))
    return d


@pytest.fixture(scope="module")
def st_mean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sc.sentence_transformer(tmp_path_factory.mktemp("st_mean") / "st", "mean")


def test_legacy_pooling_flags_still_read(tmp_path, st_mean) -> None:
    d = _pooling_config(
        tmp_path, st_mean, pooling_mode_lasttoken=True, pooling_mode_mean_tokens=False
    )
    assert SentenceEncoder(d, num_threads=1).layout.pooling is Pooling.LAST_TOKEN


@pytest.mark.parametrize(
    ("cfg", "shown"),
    [
        ({"pooling_mode": "median"}, "['median']"),
        ({"pooling_mode": ["mean", "max"]}, "['mean', 'max']"),
        ({"pooling_mode_mean_tokens": False}, "none"),
    ],
    ids=["unknown", "two-modes", "no-mode"],
)
def test_unsupported_pooling_lists_the_supported(tmp_path, st_mean, cfg, shown) -> None:
    d = _pooling_config(tmp_path, st_mean, **cfg)
    with pytest.raises(ModelError) as e:
        SentenceEncoder(d)
    assert f"pooling modes {shown} are not supported" in str(e.value)
    for mode in MODES:
        assert repr(mode) in str(e.value)


@pytest.mark.parametrize(
    ("mode", "family"),
    [(m, "bert") for m in ["mean", "cls", "max", "weightedmean", "lasttoken"]]
    + [("weightedmean", "roberta")],
)
def test_prompt_left_out_of_pooling(tmp_path, mode, family) -> None:
    """include_prompt: false (instruction models): the prompt's tokens reach attention but
    not the pooling, as in sentence-transformers."""
    d = sc.sentence_transformer(
        tmp_path / "st", mode, family=family, prompts=PROMPTS, include_prompt=False
    )
    enc = SentenceEncoder(d, num_threads=1)
    assert not enc.layout.include_prompt
    assert enc._prompt_tokens(PROMPTS["passage"]) == 3  # [CLS] music is, not the [SEP]
    st = _st(d)
    for kw in [{"prompt_name": "passage"}, {"prompt": "the "}, {}]:
        want = st.encode(TEXTS, batch_size=3, **kw)
        assert np.abs(enc.encode(TEXTS, batch_size=3, **kw) - want).max() <= 1e-5, kw


@pytest.mark.parametrize("mode", ["cls", "lasttoken", "weightedmean"])
def test_left_padding_pools_the_real_tokens(tmp_path, mode) -> None:
    """A tokenizer that pads on the left (RoBERTa: positions count real tokens only, so the
    vectors do not depend on how far each library pads)."""
    d = sc.sentence_transformer(tmp_path / "st", mode, family="roberta")
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["padding"] = {**(tj.get("padding") or {}), "direction": "Left"}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    tcfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**tcfg, "padding_side": "left"}))
    enc = SentenceEncoder(d, num_threads=1)
    assert enc.model.tokenizer.pad_left
    st = _st(d)
    want = st.encode(TEXTS, batch_size=4)
    assert np.abs(enc.encode(TEXTS, batch_size=4) - want).max() <= 1e-5


def test_prompt_left_out_of_pooling_int8(tmp_path) -> None:
    """The int8 path calibrates and evaluates the graph with its pooling-mask input."""
    d = sc.sentence_transformer(tmp_path / "st", "mean", prompts=PROMPTS, include_prompt=False)
    enc = SentenceEncoder(d, precision="int8", num_threads=1)
    want = _st(d).encode(TEXTS, prompt_name="query")
    got = enc.encode(TEXTS, prompt_name="query")
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.99
