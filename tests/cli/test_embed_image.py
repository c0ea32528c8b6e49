"""``rlx embed MODEL --image FILE``: the saved matrix (images then texts) equals
transformers' ``get_image_features`` / ``get_text_features`` on a tiny SigLIP written by
the test, and a corrupt image is one error line naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.cli.conftest import run
from tests.models.vision import checkpoints as ck


def test_embed_images_and_texts_match_transformers(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = ck.build("siglip", tmp_path / "siglip")
    images = ck.images()[:3]
    files = []
    for i, im in enumerate(images):
        files += ["--image", str(tmp_path / f"im{i}.png")]
        im.save(tmp_path / f"im{i}.png")
    texts = ["a photo of a cat", "two dogs"]
    out = tmp_path / "emb.npy"
    r = run(["embed", str(model), *files, *texts, "--out", str(out)])
    assert r.code == 0, r.err
    assert "3 image(s) -> [3, 32] float32" in r.out and "logits_per_image" in r.out
    got = np.load(out)
    m = transformers.SiglipModel.from_pretrained(model).eval()
    proc = transformers.SiglipImageProcessorPil.from_pretrained(model)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(model / "tokenizer.json"), pad_token="<pad>"
    )
    ids = tok(texts, padding="max_length", max_length=ck.MAX_POS, return_tensors="pt")
    with torch.no_grad():
        pv = torch.from_numpy(proc(images, return_tensors="np")["pixel_values"])
        img = m.get_image_features(pixel_values=pv).pooler_output.numpy()
        txt = m.get_text_features(input_ids=ids["input_ids"]).pooler_output.numpy()
    np.testing.assert_allclose(got, np.concatenate([img, txt]), rtol=1e-4, atol=1e-4)


def test_embed_corrupt_image_is_one_line(tmp_path: Path) -> None:
    model = ck.build("clip", tmp_path / "clip")
    bad = tmp_path / "not_a_picture.jpg"
    bad.write_bytes(b"plain text, not an image")
    r = run(["embed", str(model), "--image", str(bad)])
    assert r.code != 0
    assert "not_a_picture.jpg" in r.err and "Traceback" not in r.err
