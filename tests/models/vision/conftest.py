"""Fixtures of the image-model tests: the tiny checkpoints of ``checkpoints.py``, built
once per session, and transformers' models and processors loaded from them (the oracle)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.models.vision import checkpoints as ck


@pytest.fixture(scope="session")
def vision_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> its tiny checkpoint directory."""
    root = tmp_path_factory.mktemp("tiny_vision")
    return {fam: ck.build(fam, root / fam) for fam in ck.FAMILIES}


def hf_model(family: str, path: Path):  # noqa: ANN201 - a torch module
    import transformers as tf

    cls = {
        "clip": tf.CLIPModel,
        "siglip": tf.SiglipModel,
        "vit": tf.ViTForImageClassification,
    }[family]
    return cls.from_pretrained(path).eval()


def hf_processor(family: str, path: Path):  # noqa: ANN201 - transformers' processor
    import transformers as tf

    cls = {
        "clip": tf.CLIPImageProcessorPil,
        "siglip": tf.SiglipImageProcessorPil,
        "vit": tf.ViTImageProcessorPil,
    }[family]
    return cls.from_pretrained(path)
