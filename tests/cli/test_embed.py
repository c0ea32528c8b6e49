"""``rlx embed``: vectors against transformers' references (tiny BERT: its mean-pooled
last hidden state, tests/data/hf/tiny_bert.npz; all-MiniLM-L6-v2 by name: the
sentence-transformers embeddings in tests/data/hf/minilm.npz), the .npy and JSON-lines
outputs, texts from a file and stdin, and every user error as one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlx.models import known
from tests.cli.conftest import run
from tests.models import tiny_checkpoints as tc

TEXTS = list(tc.SENTENCES)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_embed_args_to_npy_matches_transformers(tiny_bert, tiny_bert_ref, tmp_path) -> None:
    out = tmp_path / "emb.npy"
    r = run(["embed", str(tiny_bert), *TEXTS, "--out", str(out), "--batch-size", "2"])
    assert r.code == 0, r.err
    emb = np.load(out)
    assert emb.shape == (len(TEXTS), tc.HIDDEN) and emb.dtype == np.float32
    # no modules.json: mean pooling, not normalized (as sentence-transformers does)
    np.testing.assert_allclose(emb, tiny_bert_ref["mean_pooled"], atol=1e-5, rtol=0)
    assert f"{len(TEXTS)} text(s) -> [{len(TEXTS)}, {tc.HIDDEN}] float32" in r.out
    assert "not normalized" in r.out and f"wrote {out}" in r.out
    assert "Traceback" not in r.err


def test_embed_jsonl_from_stdin_normalized(tiny_bert, tiny_bert_ref, tmp_path) -> None:
    stdin = "\n".join(TEXTS[:3]) + "\n\n"  # a blank line is skipped
    r = run(
        ["embed", str(tiny_bert), "--file", "-", "--format", "jsonl", "--normalize"],
        input=stdin,
    )
    assert r.code == 0, r.err
    rows = [json.loads(line) for line in r.out.splitlines()]
    assert [row["text"] for row in rows] == TEXTS[:3]
    got = np.array([row["embedding"] for row in rows])
    want = _unit(tiny_bert_ref["mean_pooled"][:3].astype(np.float64))
    np.testing.assert_allclose(got, want, atol=2e-6)
    assert "encoded 3 text(s)" in r.err  # status lines stay off stdout


def test_embed_file_and_args_keep_order(tiny_bert, tiny_bert_ref, tmp_path) -> None:
    f = tmp_path / "texts.txt"
    f.write_text("\n".join(TEXTS[2:]) + "\n", encoding="utf-8")
    out = tmp_path / "both"  # no suffix: .npy is added
    r = run(["embed", str(tiny_bert), *TEXTS[:2], "-f", str(f), "-o", str(out), "--format", "none"])
    assert r.code == 0, r.err
    assert r.out == ""
    np.testing.assert_allclose(
        np.load(tmp_path / "both.npy"), tiny_bert_ref["mean_pooled"], atol=1e-5, rtol=0
    )


def test_embed_known_name_matches_sentence_transformers(minilm_ref_cli) -> None:
    texts = [str(t) for t in minilm_ref_cli["texts"][:3]]
    r = run(["embed", "all-MiniLM-L6-v2", *texts, "--format", "jsonl", "--threads", "1"])
    assert r.code == 0, r.err
    got = np.array([json.loads(line)["embedding"] for line in r.out.splitlines()])
    want = minilm_ref_cli["st_embeddings"][:3].astype(np.float64)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.99999
    assert np.abs(got - want).max() <= 1e-5


@pytest.fixture(scope="module")
def minilm_ref_cli() -> dict[str, np.ndarray]:
    return dict(np.load(Path(__file__).resolve().parents[1] / "data" / "hf" / "minilm.npz"))


def _one_line_error(r, code: int, *needles: str) -> None:
    assert r.code == code, (r.code, r.out, r.err)
    lines = r.err.strip().splitlines()  # status lines ("loading ...") may come first
    errors = [ln for ln in lines if ln.startswith("rlx: error: ")]
    assert errors == lines[-1:], r.err
    for n in needles:
        assert n in errors[0], (n, errors[0])
    assert "Traceback" not in r.err


def test_embed_user_errors_are_one_line(tiny_bert, tmp_path) -> None:
    _one_line_error(run(["embed", str(tmp_path / "nope"), "hi"]), 1, "nope", "neither a directory")
    empty = tmp_path / "empty_model"
    empty.mkdir()
    _one_line_error(run(["embed", str(empty), "hi"]), 1, "config.json")
    _one_line_error(run(["embed", str(tiny_bert)]), 2, "no text given")
    _one_line_error(
        run(["embed", str(tiny_bert), "hi", "--precision", "fp8"]), 2, "--precision", "fp8"
    )
    _one_line_error(run(["embed", str(tiny_bert), "hi", "--batch-size", "0"]), 2, "--batch-size")
    _one_line_error(
        run(["embed", str(tiny_bert), "hi", "--file", str(tmp_path / "missing.txt")]),
        2,
        "missing.txt",
    )
    _one_line_error(
        run(["embed", str(tiny_bert), "hi", "--out", str(tmp_path / "no" / "dir" / "e.npy")]),
        1,
        "e.npy",
    )


def test_model_not_installed_says_how_to_get_it(monkeypatch) -> None:
    fake = known.KnownModel("acme/tiny-encoder", "rlx_no_such_model_pkg", "acme-tiny-encoder")
    monkeypatch.setattr(known, "KNOWN", (*known.KNOWN, fake))
    r = run(["embed", "acme/tiny-encoder", "hi"])
    _one_line_error(r, 1, "'acme/tiny-encoder' is not installed")
    assert "pip install --no-deps acme-tiny-encoder" in r.err


def test_debug_shows_the_traceback(tmp_path) -> None:
    r = run(["--debug", "embed", str(tmp_path / "nope"), "hi"])
    assert r.code == 1
    assert "Traceback (most recent call last)" in r.err and "ModelError" in r.err
    assert r.err.strip().splitlines()[-1].startswith("rlx: error: ")


def test_embed_file_not_utf8(tiny_bert, tmp_path) -> None:
    f = tmp_path / "latin1.txt"
    f.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    _one_line_error(run(["embed", str(tiny_bert), "-f", str(f)]), 2, "--file", "not UTF-8")


def test_progress_without_tqdm(monkeypatch) -> None:
    import sys

    from rlx.cli.common import progress

    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import tqdm.auto fails
    assert list(progress(iter([1, 2, 3]), 3, "x")) == [1, 2, 3]


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_embed_reduced_precision_close_to_transformers(tiny_bert, tiny_bert_ref, precision) -> None:
    r = run(["embed", str(tiny_bert), *TEXTS, "--precision", precision, "--format", "jsonl"])
    assert r.code == 0, r.err
    got = np.array([json.loads(line)["embedding"] for line in r.out.splitlines()])
    want = tiny_bert_ref["mean_pooled"].astype(np.float64)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.999, cos  # measured: bf16 0.99997, int8 0.99979


def test_embed_prompt_options_match_sentence_transformers(tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    from tests.models import st_checkpoints as sc

    d = sc.sentence_transformer(
        tmp_path / "st", "mean", prompts={"q": "the "}, default_prompt_name="q"
    )
    st = SentenceTransformer(str(d), device="cpu")
    for opts, kw in [([], {}), (["--prompt", "music "], {"prompt": "music "})]:
        r = run(["embed", str(d), *TEXTS[:3], "--format", "jsonl", *opts])
        assert r.code == 0, r.err
        got = np.array([json.loads(line)["embedding"] for line in r.out.splitlines()])
        assert np.abs(got - st.encode(TEXTS[:3], **kw)).max() <= 1e-5
    _one_line_error(run(["embed", str(d), "hi", "--prompt-name", "zz"]), 1, "prompt_name 'zz'")
