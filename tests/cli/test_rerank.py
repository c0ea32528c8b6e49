"""``rlx rerank``: the ranking of a tiny random cross-encoder (tests/models/st_checkpoints.py)
against sentence-transformers' ``CrossEncoder.rank``, the text and JSON outputs, documents
from a file, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli.conftest import run
from tests.models import st_checkpoints as sc

QUERY = "the cat sat"
DOCS = ["the cat sat on the mat", "a dog runs", "music is playing in the park", "hello"]


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sc.classifier("bert", tmp_path_factory.mktemp("cli_rerank") / "bert")


def _want(path: Path, top_k: int | None = None) -> list[dict]:
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(str(path), device="cpu")
    return ce.rank(QUERY, DOCS, top_k=top_k, return_documents=True)


def test_rerank_json_matches_cross_encoder(reranker_dir) -> None:
    r = run(["rerank", str(reranker_dir), QUERY, *DOCS, "--json", "--threads", "1"])
    assert r.code == 0, r.err
    got, want = json.loads(r.out), _want(reranker_dir)
    assert [g["corpus_id"] for g in got] == [w["corpus_id"] for w in want]
    assert [g["text"] for g in got] == [w["text"] for w in want]
    np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want], atol=1e-5)


def test_rerank_text_from_file_top_k(reranker_dir, tmp_path) -> None:
    f = tmp_path / "docs.txt"
    f.write_text("\n".join(DOCS[1:]) + "\n\n", encoding="utf-8")
    r = run(["rerank", str(reranker_dir), QUERY, DOCS[0], "--docs-file", str(f), "--top-k", "2"])
    assert r.code == 0, r.err
    lines = r.out.strip().splitlines()
    want = _want(reranker_dir, top_k=2)
    assert len(lines) == 2
    for i, (line, w) in enumerate(zip(lines, want), 1):
        rank, score, cid, *text = line.split()
        assert rank == f"{i}." and cid == f"#{w['corpus_id']}" and " ".join(text) == w["text"]
        assert abs(float(score) - w["score"]) <= 1e-5
    assert "scored 4 document(s)" in r.err


def _error(r, code: int, *needles: str) -> None:
    assert r.code == code, (r.code, r.out, r.err)
    last = r.err.strip().splitlines()[-1]
    assert last.startswith("rlx: error: ") and "Traceback" not in r.err
    for n in needles:
        assert n in last, (n, last)


def test_rerank_errors_are_one_line(reranker_dir, tiny_bert, tmp_path) -> None:
    _error(run(["rerank", str(reranker_dir), QUERY]), 2, "no document given")
    _error(run(["rerank", str(tmp_path / "nope"), QUERY, "a"]), 1, "neither a directory")
    _error(
        run(["rerank", str(tiny_bert), QUERY, "a"]),
        1,
        '["BertModel"] is not supported as a reranker',
        "BertForSequenceClassification",
    )
    _error(run(["rerank", str(reranker_dir), QUERY, "a", "--top-k", "0"]), 2, "--top-k")
