"""Image models. In: a Hugging Face directory (``config.json``, safetensors weights,
``preprocessor_config.json`` and, for CLIP / SigLIP, ``tokenizer.json``). Out:
:class:`ImageTextEncoder` (CLIP, SigLIP: image and text embeddings in one space, and
their similarity logits) and :class:`ImageClassifier` (ViT classification: logits and
top-k labels), each computing with rlx-compiled graphs (``graph.py``).

Equal to transformers: ``encode_images`` is ``get_image_features``, ``encode_texts`` is
``get_text_features`` of the ids transformers' tokenizer gives (CLIP: padded to the
longest text; the causal mask makes padding irrelevant, the pooled token is the first
EOS, or the largest id when ``eos_token_id`` is 2 as in old configs. SigLIP: padded to
the maximum length, as its processor is used with ``padding="max_length"``, pooled at
the last token), ``logits`` is ``logits_per_image``. Needs the ``vision`` extra
(Pillow, safetensors, tokenizers).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import InputError, ModelError
from rlx.models.hf.config import read_json
from rlx.models.hf.tokenizer import Tokenizer, check_texts
from rlx.models.vision.config import (
    SUPPORTED_ARCHITECTURES,
    Family,
    VisionModelConfig,
    read_vision_config,
)
from rlx.models.vision.graph import image_graph, text_graph
from rlx.models.vision.image import ImageProcessing, preprocess, read_processing
from rlx.models.vision.weights import load_vision_weights

__all__ = ["ImageTextEncoder", "ImageClassifier", "Prediction"]


def _need(*names: str) -> None:
    """ModelError naming the ``vision`` extra when one of the packages is missing."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            raise ModelError(
                f"image models need the {name!r} package, which is not installed; install "
                "it with: pip install 'rlx[vision]'"
            ) from None


def _batch_size(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(f"batch_size must be an int >= 1, got {v!r}")
    return v


def _l2(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` divided by their L2 norm (f32)."""
    return (x / np.sqrt(np.sum(np.square(x), axis=-1, keepdims=True))).astype(np.float32)


class _Loaded:
    """What both model classes read: config, preprocessing, params, compiled image graph."""

    def __init__(self, path: str | Path, num_threads: int | None, want: tuple[Family, ...]):
        _need("PIL", "safetensors")
        self.path = Path(path)
        if not self.path.is_dir():
            raise ModelError(
                f"model directory {str(self.path)!r} does not exist or is not a directory"
            )
        self.config: VisionModelConfig = read_vision_config(self.path)
        if self.config.family not in want:
            names = [a for a, f in SUPPORTED_ARCHITECTURES.items() if f in want]
            raise ModelError(
                f"{self.path}: {self.config.architecture} is not supported here; this class "
                f"loads {', '.join(names)}"
            )
        self.processing: ImageProcessing = read_processing(self.path, self.config.family)
        size, fixed = self.config.vision.image_size, self.processing.fixed_size()
        if fixed is not None and fixed != (size, size):
            raise ModelError(
                f"{self.path}: preprocessor_config.json makes {fixed[0]}x{fixed[1]} images but "
                f"config.json's image_size is {size}: rlx needs {size}x{size} (position "
                "embeddings are not interpolated)"
            )
        self.params = load_vision_weights(self.path, self.config)
        self.num_threads = num_threads
        self.image_compiled = self.compile(image_graph(self.config))

    def compile(self, graph: Any) -> Any:
        from rlx.options import CompileOptions
        from rlx.runtime.session import Session

        params = {k: self.params[k] for k in graph.param_names}
        opts = CompileOptions(num_threads=self.num_threads, max_shape_plans=16)
        return Session("cpu").compile(graph, opts, params=params)

    def run_images(self, images: Sequence[Any], batch_size: int) -> np.ndarray:
        size = self.config.vision.image_size
        pixels = preprocess(images, self.processing, size)
        out = np.zeros((len(pixels), self.config.embed_dim), np.float32)
        for i in range(0, len(pixels), _batch_size(batch_size)):
            res = self.image_compiled.run({"pixel_values": pixels[i : i + batch_size]})[0]
            out[i : i + batch_size] = np.asarray(res, np.float32)
        return out


class ImageTextEncoder:
    """Image and text embeddings of the CLIP or SigLIP checkpoint in directory ``path``.

    ``num_threads``: threads of the compiled graphs (None: rlx's default).
    """

    def __init__(self, path: str | Path, num_threads: int | None = None) -> None:
        _need("tokenizers")
        self._m = _Loaded(path, num_threads, (Family.CLIP, Family.SIGLIP))
        cfg = self._m.config
        assert cfg.text is not None
        self.config = cfg
        self.path = self._m.path
        scale = self._m.params.pop("logit_scale")
        bias = self._m.params.pop("logit_bias", None)
        #: The learned temperature (``exp`` of the checkpoint's ``logit_scale``) and bias.
        self.logit_scale = float(np.exp(np.float32(scale.reshape(-1)[0])))
        self.logit_bias = 0.0 if bias is None else float(bias.reshape(-1)[0])
        self.max_length = self._text_limit()
        if not (self.path / "tokenizer.json").is_file():
            raise ModelError(
                f"{self.path}: no tokenizer.json (rlx reads the tokenizers library's file); "
                "write one with transformers: AutoTokenizer.from_pretrained(dir)"
                ".save_pretrained(dir)"
            )
        self.tokenizer = Tokenizer(
            self.path / "tokenizer.json", self.max_length, cfg.text.pad_token_id, token_types=False
        )
        self.text_compiled = self._m.compile(text_graph(cfg))

    def _text_limit(self) -> int:
        """tokenizer_config.json's ``model_max_length`` capped by the position table."""
        cfg = self.config.text
        assert cfg is not None
        limit = None
        tc = self.path / "tokenizer_config.json"
        if tc.is_file():
            limit = read_json(tc, "tokenizer config").get("model_max_length")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 2:
            return cfg.max_positions
        return min(limit, cfg.max_positions)

    @property
    def dim(self) -> int:
        """Size of an embedding."""
        return self.config.embed_dim

    def encode_images(
        self, images: Sequence[Any], batch_size: int = 32, normalize: bool = False
    ) -> np.ndarray:
        """f32 ``[len(images), dim]`` embeddings of ``images`` (file paths, bytes of image
        files or PIL images), L2-normalized when ``normalize``. A file that cannot be
        decoded is an InputError naming it."""
        out = self._m.run_images(images, batch_size)
        return _l2(out) if normalize and len(out) else out

    def text_inputs(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The text graph's inputs for ``texts``: ``input_ids`` and ``pool_index``."""
        cfg = self.config.text
        assert cfg is not None
        encs = self.tokenizer.tokenize(texts)
        clip = self.config.family is Family.CLIP
        n = max(len(ids) for ids, _ in encs) if clip else self.max_length
        ids = self.tokenizer.pad(encs, n)["input_ids"]
        if not clip:
            pos = np.full(len(encs), n - 1, np.int64)
        elif cfg.eos_token_id == 2:
            pos = ids.argmax(axis=1)
        else:
            pos = (ids == cfg.eos_token_id).argmax(axis=1)
        return {"input_ids": ids, "pool_index": np.arange(len(encs), dtype=np.int64) * n + pos}

    def encode_texts(
        self, texts: Sequence[str], batch_size: int = 32, normalize: bool = False
    ) -> np.ndarray:
        """f32 ``[len(texts), dim]`` embeddings of ``texts``, L2-normalized when
        ``normalize``; texts longer than :attr:`max_length` tokens are truncated."""
        items = check_texts(texts)
        out = np.zeros((len(items), self.dim), np.float32)
        bs = _batch_size(batch_size)
        for i in range(0, len(items), bs):
            res = self.text_compiled.run(self.text_inputs(items[i : i + bs]))[0]
            out[i : i + bs] = np.asarray(res, np.float32)
        return _l2(out) if normalize and len(out) else out

    def similarity(self, image_embeds: np.ndarray, text_embeds: np.ndarray) -> np.ndarray:
        """f32 ``[n_images, n_texts]`` logits of embeddings (as from :meth:`encode_images`
        and :meth:`encode_texts`): cosine similarity times :attr:`logit_scale`, plus
        :attr:`logit_bias` (SigLIP), as transformers' ``logits_per_image``. CLIP's
        probabilities are a softmax over texts; SigLIP's a sigmoid of each logit."""
        img, txt = np.asarray(image_embeds, np.float32), np.asarray(text_embeds, np.float32)
        for name, a in (("image_embeds", img), ("text_embeds", txt)):
            if a.ndim != 2 or a.shape[1] != self.dim:
                raise InputError(f"{name} must be [n, {self.dim}], got {list(a.shape)}")
        per_text = (_l2(txt) @ _l2(img).T) * np.float32(self.logit_scale) + np.float32(
            self.logit_bias
        )
        return np.ascontiguousarray(per_text.T, dtype=np.float32)

    def logits(self, images: Sequence[Any], texts: Sequence[str]) -> np.ndarray:
        """:meth:`similarity` of the embeddings of ``images`` and ``texts``."""
        return self.similarity(self.encode_images(images), self.encode_texts(texts))

    def __repr__(self) -> str:
        c = self.config
        return (
            f"ImageTextEncoder({c.architecture}, dim={self.dim}, image_size="
            f"{c.vision.image_size}, max_length={self.max_length}, path={str(self.path)!r})"
        )


@dataclass(frozen=True)
class Prediction:
    """One label of an image: its id, its name (``id2label``) and its softmax probability."""

    index: int
    label: str
    score: float


class ImageClassifier:
    """Class logits of the ``ViTForImageClassification`` checkpoint in directory ``path``.

    ``num_threads``: threads of the compiled graph (None: rlx's default).
    """

    def __init__(self, path: str | Path, num_threads: int | None = None) -> None:
        self._m = _Loaded(path, num_threads, (Family.VIT,))
        self.config = self._m.config
        self.path = self._m.path

    @property
    def labels(self) -> tuple[str, ...]:
        """Label names in id order."""
        return self.config.labels

    def predict(self, images: Sequence[Any], batch_size: int = 32) -> np.ndarray:
        """f32 ``[len(images), num_labels]`` logits, as transformers' ``logits``."""
        return self._m.run_images(images, batch_size)

    def top_k(
        self, images: Sequence[Any], k: int = 5, batch_size: int = 32
    ) -> list[list[Prediction]]:
        """The ``k`` most probable labels of each image, best first (softmax of the
        logits; ties keep the id order)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"k must be an int >= 1, got {k!r}")
        logits = self.predict(images, batch_size)
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = e / e.sum(axis=1, keepdims=True)
        out = []
        for row in probs:
            order = np.argsort(-row, kind="stable")[:k]
            out.append([Prediction(int(i), self.labels[i], float(row[i])) for i in order])
        return out

    def __repr__(self) -> str:
        c = self.config
        return (
            f"ImageClassifier({c.architecture}, labels={len(c.labels)}, image_size="
            f"{c.vision.image_size}, path={str(self.path)!r})"
        )
