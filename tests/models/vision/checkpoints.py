"""Tiny random CLIP, SigLIP and ViT-classification checkpoints written by transformers,
with a WordLevel ``tokenizer.json`` built by the tokenizers library (CLIP: ``<bos> text
<eos>``; SigLIP: ``text <eos>``) and the ``preprocessor_config.json`` of transformers'
PIL image processor. Images are 30 x 30 in patches of 6."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FAMILIES = ("clip", "siglip", "vit")
WORDS = (
    "a photo of cat dog red blue green car tree house on the with and small big "
    "two three bird flying in sky over river boat sunset night city street"
).split()
VOCAB = 99
UNK, PAD, BOS, EOS = 0, 1, 97, 98
SIZE, PATCH, MAX_POS = 30, 6, 16


def _tower(**kw: object) -> dict[str, object]:
    base = dict(
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
    )
    return {**base, **kw}


def tokenizer(family: str, path: Path) -> None:
    """A WordLevel tokenizer.json over :data:`WORDS` with the family's template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": UNK, "<pad>": PAD, "<bos>": BOS, "<eos>": EOS}
    for i, w in enumerate(WORDS):
        vocab[w] = 2 + i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if family == "clip":
        tmpl = processors.TemplateProcessing(
            single="<bos> $A <eos>", special_tokens=[("<bos>", BOS), ("<eos>", EOS)]
        )
    else:
        tmpl = processors.TemplateProcessing(single="$A <eos>", special_tokens=[("<eos>", EOS)])
    tok.post_processor = tmpl
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": MAX_POS}))


def build(family: str, path: Path, seed: int = 0, **over: object) -> Path:
    """Write the tiny ``family`` checkpoint to ``path``; ``over`` overrides config fields
    (of the text config for ``text_*`` keys, of the vision config for ``vision_*``)."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    text = {k[5:]: v for k, v in over.items() if k.startswith("text_")}
    vision = {k[7:]: v for k, v in over.items() if k.startswith("vision_")}
    vis = _tower(image_size=SIZE, patch_size=PATCH, **vision)
    if family == "clip":
        txt = _tower(**{"vocab_size": VOCAB, "max_position_embeddings": MAX_POS,
                        "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, **text})  # fmt: skip
        model = tf.CLIPModel(tf.CLIPConfig(text_config=txt, vision_config=vis, projection_dim=24))
        proc = tf.CLIPImageProcessorPil(
            size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE}
        )
    elif family == "siglip":
        txt = _tower(**{"vocab_size": VOCAB, "max_position_embeddings": MAX_POS,
                        "pad_token_id": PAD, "eos_token_id": EOS, **text})  # fmt: skip
        model = tf.SiglipModel(tf.SiglipConfig(text_config=txt, vision_config=vis))
        with torch.no_grad():  # the default init leaves them 0 / randn: make them matter
            model.logit_scale.fill_(1.3)
            model.logit_bias.fill_(-2.5)
        proc = tf.SiglipImageProcessorPil(size={"height": SIZE, "width": SIZE})
    else:
        labels = {i: f"kind_{i}" for i in range(5)}
        model = tf.ViTForImageClassification(
            tf.ViTConfig(**vis, id2label=labels, label2id={v: k for k, v in labels.items()})
        )
        proc = tf.ViTImageProcessorPil(size={"height": SIZE, "width": SIZE})
    model.eval().save_pretrained(path)
    proc.save_pretrained(path)
    if family != "vit":
        tokenizer(family, path)
    return path


def images(seed: int = 0) -> list:
    """PIL images of odd sizes: RGB of several aspect ratios (smaller and larger than the
    model's 30 pixels), an RGBA and a grayscale one."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        for h, w in ((37, 53), (61, 29), (30, 30), (17, 23), (45, 45))
    ]
    out.append(Image.fromarray(rng.integers(0, 256, (41, 33, 4), dtype=np.uint8), "RGBA"))
    out.append(Image.fromarray(rng.integers(0, 256, (27, 39), dtype=np.uint8), "L"))
    return out
