"""Recompute the references with PyTorch (scripts/make_hf_references.py) and compare rlx
to them and to the stored copies. Needs torch, transformers and sentence-transformers,
which rlx and its CI do not install: without them the stored arrays (tests/data/hf,
checked by the other tests) are the oracle."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from tests.models import tiny_checkpoints as tc
from tests.models.conftest import DATA, cosines

_WHY = "optional oracle: torch / transformers / sentence-transformers are not installed"
pytest.importorskip("torch", reason=_WHY)
pytest.importorskip("transformers", reason=_WHY)
pytest.importorskip("sentence_transformers", reason=_WHY)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_hf_references.py"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("make_hf_references", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("refs")
    meta = mod._versions()
    mod.minilm(out, meta)
    mod.tiny(out, meta)
    return out


@pytest.mark.slow
def test_stored_references_are_reproduced(fresh):
    """The committed arrays are what today's torch stack computes (to float noise)."""
    for name in ["minilm", *(f"tiny_{f}" for f in tc.FAMILIES)]:
        new, old = np.load(fresh / f"{name}.npz"), np.load(DATA / f"{name}.npz")
        for key in new.files:
            if key == "meta" or new[key].dtype.kind in "UiS":
                if key != "meta":
                    np.testing.assert_array_equal(new[key], old[key])
                continue
            assert np.abs(new[key] - old[key]).max() <= 1e-5, (name, key)


@pytest.mark.slow
def test_rlx_matches_fresh_torch(fresh, minilm_encoders, tiny_dirs):
    import rlx.models.hf as hf

    ref = np.load(fresh / "minilm.npz")
    texts = [str(t) for t in ref["texts"]]
    got = minilm_encoders["f32"].encode(texts, batch_size=len(texts))
    assert cosines(got, ref["hf_embeddings"]).min() >= 0.99999
    assert np.abs(got - ref["st_embeddings"]).max() <= 1e-5
    assert "torch" in json.loads(str(ref["meta"]))
    for fam in tc.FAMILIES:
        r = np.load(fresh / f"tiny_{fam}.npz")
        m = hf.load(tiny_dirs[fam], num_threads=1)
        h = m.compile().run(m.inputs(list(tc.SENTENCES), pad_to=r["input_ids"].shape[1]))[0]
        assert np.abs(h - r["last_hidden_state"]).max() <= 1e-5, fam
