"""Image models from Hugging Face checkpoints: CLIP and SigLIP image / text embeddings in
one space (:class:`ImageTextEncoder`) and ViT classification (:class:`ImageClassifier`),
images decoded by Pillow and preprocessed as ``preprocessor_config.json`` says. Needs the
``vision`` extra (``pip install 'rlx[vision]'``: Pillow, safetensors, tokenizers)."""

from __future__ import annotations

from rlx.models.vision.config import (
    ACTIVATIONS,
    SUPPORTED_ARCHITECTURES,
    Family,
    VisionModelConfig,
    read_vision_config,
)
from rlx.models.vision.graph import image_graph, text_graph
from rlx.models.vision.image import ImageProcessing, Resample, preprocess, read_processing
from rlx.models.vision.model import ImageClassifier, ImageTextEncoder, Prediction

__all__ = [
    "ImageTextEncoder",
    "ImageClassifier",
    "Prediction",
    "Family",
    "VisionModelConfig",
    "SUPPORTED_ARCHITECTURES",
    "ACTIVATIONS",
    "ImageProcessing",
    "Resample",
    "read_vision_config",
    "read_processing",
    "preprocess",
    "image_graph",
    "text_graph",
]
