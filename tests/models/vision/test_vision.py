"""rlx.models.vision against transformers (the oracle): preprocessing equal to its PIL
image processors, image / text embeddings and logits equal to CLIPModel / SiglipModel,
ViT classification logits equal to ViTForImageClassification, on tiny random
checkpoints it writes; and the errors on bad input."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx.errors import InputError, ModelError
from rlx.models.vision import (
    Family,
    ImageClassifier,
    ImageTextEncoder,
    preprocess,
    read_processing,
    read_vision_config,
)
from tests.models.vision import checkpoints as ck
from tests.models.vision.conftest import hf_model, hf_processor

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = [
    "a photo of a cat",
    "two dogs",
    "a red car on the street with a small tree and a big house in the city at night over river",
    "",
    "blue bird flying in the sky",
]


def _oracle_pixels(family: str, path: Path, images: list) -> np.ndarray:
    return hf_processor(family, path)(images, return_tensors="np")["pixel_values"]


def _rgb_only(family: str, images: list) -> list:
    # ViTImageProcessor does not convert to RGB: transformers fails on RGBA / grayscale
    return [im for im in images if im.mode == "RGB"] if family == "vit" else images


@pytest.mark.parametrize("family", ck.FAMILIES)
def test_preprocessing_equals_transformers(family: str, vision_dirs: dict[str, Path]) -> None:
    path = vision_dirs[family]
    images = _rgb_only(family, ck.images())
    want = _oracle_pixels(family, path, images)
    cfg = read_vision_config(path)
    got = preprocess(images, read_processing(path, cfg.family), cfg.vision.image_size)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def _files(tmp_path: Path, images: list) -> list:
    """The images as a mix of inputs: PNG paths, JPEG-free PNG bytes and PIL images."""
    out: list = []
    for i, im in enumerate(images):
        if i % 3 == 0:
            p = tmp_path / f"img{i}.png"
            im.save(p)
            out.append(str(p))
        elif i % 3 == 1:
            buf = io.BytesIO()
            im.save(buf, format="PNG")
            out.append(buf.getvalue())
        else:
            out.append(im)
    return out


@pytest.fixture(scope="module")
def encoders(vision_dirs: dict[str, Path]) -> dict[str, ImageTextEncoder]:
    return {f: ImageTextEncoder(vision_dirs[f]) for f in ("clip", "siglip")}


def _text_ids(family: str, path: Path, texts: list[str]) -> dict:
    """transformers' tokenization of ``texts`` with the checkpoint's tokenizer.json: CLIP
    padded to the longest, SigLIP to max_length (its processor's usage)."""
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"), pad_token="<pad>"
    )
    pad = {"padding": True} if family == "clip" else {"padding": "max_length"}
    enc = tok(texts, truncation=True, max_length=ck.MAX_POS, return_tensors="pt", **pad)
    if family == "siglip":  # SigLIP's tokenizer returns no attention mask
        return {"input_ids": enc["input_ids"]}
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def _pooled(out: object) -> np.ndarray:
    t = out.pooler_output if hasattr(out, "pooler_output") else out  # type: ignore[attr-defined]
    return t.detach().numpy()


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_image_embeddings_equal_transformers(
    family: str, vision_dirs: dict[str, Path], encoders: dict, tmp_path: Path
) -> None:
    path, enc = vision_dirs[family], encoders[family]
    images = ck.images(1)
    m = hf_model(family, path)
    with torch.no_grad():
        pv = torch.from_numpy(_oracle_pixels(family, path, images))
        want = _pooled(m.get_image_features(pixel_values=pv))
    got = enc.encode_images(_files(tmp_path, images), batch_size=3)
    assert got.shape == (len(images), enc.dim) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    unit = enc.encode_images(images, normalize=True)
    np.testing.assert_allclose(
        unit, want / np.linalg.norm(want, axis=1, keepdims=True), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_text_embeddings_equal_transformers(
    family: str, vision_dirs: dict[str, Path], encoders: dict
) -> None:
    path, enc = vision_dirs[family], encoders[family]
    m = hf_model(family, path)
    with torch.no_grad():
        want = _pooled(m.get_text_features(**_text_ids(family, path, TEXTS)))
    got = enc.encode_texts(TEXTS, batch_size=2)
    assert got.shape == (len(TEXTS), enc.dim) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert enc.encode_texts([]).shape == (0, enc.dim)
    assert enc.encode_images([]).shape == (0, enc.dim)


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_logits_equal_transformers(
    family: str, vision_dirs: dict[str, Path], encoders: dict
) -> None:
    path, enc = vision_dirs[family], encoders[family]
    images = ck.images(2)[:4]
    m = hf_model(family, path)
    with torch.no_grad():
        pv = torch.from_numpy(_oracle_pixels(family, path, images))
        out = m(pixel_values=pv, **_text_ids(family, path, TEXTS))
    got = enc.logits(images, TEXTS)
    assert got.shape == (len(images), len(TEXTS))
    np.testing.assert_allclose(got, out.logits_per_image.numpy(), rtol=1e-4, atol=1e-4)
    assert enc.logit_scale == pytest.approx(float(m.logit_scale.detach().exp()), rel=1e-6)


def test_clip_legacy_eos_pools_the_largest_id(tmp_path: Path) -> None:
    """Configs older than transformers#24773 say eos_token_id=2: the pooled token is then
    the largest id (the EOS of the original vocabulary)."""
    path = ck.build("clip", tmp_path / "legacy", seed=3, text_eos_token_id=2)
    m = hf_model("clip", path)
    with torch.no_grad():
        want = _pooled(m.get_text_features(**_text_ids("clip", path, TEXTS)))
    got = ImageTextEncoder(path).encode_texts(TEXTS)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_vit_classifier_equals_transformers(vision_dirs: dict[str, Path], tmp_path: Path) -> None:
    path = vision_dirs["vit"]
    images = _rgb_only("vit", ck.images(4))
    m = hf_model("vit", path)
    with torch.no_grad():
        pv = torch.from_numpy(_oracle_pixels("vit", path, images))
        want = m(pixel_values=pv).logits.numpy()
    clf = ImageClassifier(path)
    got = clf.predict(_files(tmp_path, images))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    probs = torch.softmax(torch.from_numpy(want), -1).numpy()
    top = clf.top_k(images, k=3)
    for row, p in zip(top, probs, strict=True):
        idx = np.argsort(-p, kind="stable")[:3]
        assert [t.label for t in row] == [m.config.id2label[int(i)] for i in idx]
        np.testing.assert_allclose([t.score for t in row], p[idx], rtol=1e-4)


def test_config_defaults_are_transformers(tmp_path: Path) -> None:
    """A config.json that keeps only what differs from the defaults reads as transformers
    reads it: rlx's default table equals the config classes' defaults."""
    from rlx.models.vision.config import DEFAULTS

    classes = {
        (Family.CLIP, "text"): transformers.CLIPTextConfig(),
        (Family.CLIP, "vision"): transformers.CLIPVisionConfig(),
        (Family.CLIP, "top"): transformers.CLIPConfig(),
        (Family.SIGLIP, "text"): transformers.SiglipTextConfig(),
        (Family.SIGLIP, "vision"): transformers.SiglipVisionConfig(),
        (Family.VIT, "vision"): transformers.ViTConfig(),
    }
    for key, cfg in classes.items():
        for field, value in DEFAULTS[key].items():
            if field == "projection_size" and value is None:  # None: the hidden size
                value = cfg.hidden_size
            assert getattr(cfg, field) == value, (key, field)


def test_corrupt_image_is_an_input_error_naming_the_file(
    vision_dirs: dict[str, Path], encoders: dict, tmp_path: Path
) -> None:
    bad = tmp_path / "broken_photo.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    enc = encoders["clip"]
    with pytest.raises(InputError, match="broken_photo.jpg"):
        enc.encode_images([ck.images()[0], bad])
    truncated = tmp_path / "half.png"
    buf = io.BytesIO()
    ck.images()[0].save(buf, format="PNG")
    truncated.write_bytes(buf.getvalue()[:60])
    with pytest.raises(InputError, match="half.png"):
        enc.encode_images([str(truncated)])
    with pytest.raises(InputError, match="missing.png"):
        enc.encode_images([tmp_path / "missing.png"])
    with pytest.raises(InputError, match=r"images\[1\]"):
        enc.encode_images([ck.images()[0], b"garbage bytes"])
    with pytest.raises(InputError, match="images must be a list"):
        enc.encode_images(str(bad))
    with pytest.raises(InputError, match=r"images\[0\] is a int"):
        ImageClassifier(vision_dirs["vit"]).predict([3])


def _edit(src: Path, dst: Path, name: str, **fields: object) -> Path:
    shutil.copytree(src, dst)
    data = json.loads((dst / name).read_text())
    for k, v in fields.items():
        if "." in k:
            outer, inner = k.split(".")
            data[outer][inner] = v
        else:
            data[k] = v
    (dst / name).write_text(json.dumps(data))
    return dst


def test_unsupported_values_are_model_errors(vision_dirs: dict[str, Path], tmp_path: Path) -> None:
    clip = vision_dirs["clip"]
    p = _edit(clip, tmp_path / "a", "config.json", architectures=["BlipModel"])
    with pytest.raises(ModelError, match="CLIPModel, SiglipModel, ViTForImageClassification"):
        ImageTextEncoder(p)
    p = _edit(clip, tmp_path / "b", "config.json", **{"vision_config.hidden_act": "swish"})
    with pytest.raises(ModelError, match="hidden_act 'swish' is not supported; supported: gelu"):
        ImageTextEncoder(p)
    p = _edit(clip, tmp_path / "c", "preprocessor_config.json", resample=7)
    with pytest.raises(ModelError, match=r"resample 7 is not supported; supported: 0 \(NEAREST\)"):
        ImageTextEncoder(p)
    p = _edit(clip, tmp_path / "d", "preprocessor_config.json", size={"longest_edge": 30})
    with pytest.raises(ModelError, match="shortest_edge"):
        ImageTextEncoder(p)
    p = _edit(
        clip, tmp_path / "e", "preprocessor_config.json", crop_size={"height": 24, "width": 24}
    )
    with pytest.raises(ModelError, match="makes 24x24 images but config.json's image_size is 30"):
        ImageTextEncoder(p)
    p = _edit(clip, tmp_path / "g", "preprocessor_config.json", do_center_crop=False)
    enc = ImageTextEncoder(p)  # the size depends on the image: checked per image
    with pytest.raises(ModelError, match=r"gives 30x42 pixels but the model takes 30x30"):
        enc.encode_images(ck.images()[:1])
    with pytest.raises(ModelError, match="this class loads ViTForImageClassification"):
        ImageClassifier(clip)
    with pytest.raises(ModelError, match="this class loads CLIPModel, SiglipModel"):
        ImageTextEncoder(vision_dirs["vit"])
    p = _edit(vision_dirs["siglip"], tmp_path / "f", "config.json",
              **{"vision_config.vision_use_head": False})  # fmt: skip
    with pytest.raises(ModelError, match="vision_use_head"):
        ImageTextEncoder(p)
    (p := tmp_path / "h").mkdir()
    for f in clip.iterdir():
        if f.name != "tokenizer.json":
            shutil.copy(f, p / f.name)
    with pytest.raises(ModelError, match="no tokenizer.json"):
        ImageTextEncoder(p)


def test_missing_pillow_names_the_extra(
    vision_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ModelError, match=r"pip install 'rlx\[vision\]'"):
        ImageClassifier(vision_dirs["vit"])


def test_sharded_bf16_checkpoint_equals_transformers_f32(tmp_path: Path) -> None:
    """Weights in bf16 across several safetensors shards: rlx widens them to f32 as
    transformers does when loading with dtype=float32."""
    src = ck.build("siglip", tmp_path / "src", seed=5)
    m = hf_model("siglip", src).to(torch.bfloat16)
    dst = tmp_path / "bf16"
    m.save_pretrained(dst, max_shard_size="40KB")
    for f in ("preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, dst / f)
    assert (dst / "model.safetensors.index.json").is_file()
    ref = transformers.SiglipModel.from_pretrained(dst, dtype=torch.float32).eval()
    images = ck.images(6)[:3]
    with torch.no_grad():
        pv = torch.from_numpy(_oracle_pixels("siglip", dst, images))
        out = ref(pixel_values=pv, **_text_ids("siglip", dst, TEXTS))
    got = ImageTextEncoder(dst).logits(images, TEXTS)
    np.testing.assert_allclose(got, out.logits_per_image.numpy(), rtol=1e-4, atol=1e-4)


LEGACY = {  # preprocessor_config.json as older hub checkpoints keep them: int sizes
    "clip": {
        "feature_extractor_type": "CLIPFeatureExtractor",
        "crop_size": ck.SIZE,
        "do_center_crop": True,
        "do_normalize": True,
        "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "resample": 3,
        "size": ck.SIZE,
    },
    "vit": {
        "feature_extractor_type": "ViTFeatureExtractor",
        "do_normalize": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "resample": 2,
        "size": ck.SIZE,
    },
}


@pytest.mark.parametrize("family", sorted(LEGACY))
def test_legacy_preprocessor_config_equals_transformers(family: str, tmp_path: Path) -> None:
    """An int ``size`` is the shortest edge for CLIP and a square for ViT, as
    transformers reads it."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(LEGACY[family]))
    images = _rgb_only(family, ck.images(7))
    want = _oracle_pixels(family, tmp_path, images)
    fam = {"clip": Family.CLIP, "vit": Family.VIT}[family]
    got = preprocess(images, read_processing(tmp_path, fam), ck.SIZE)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
