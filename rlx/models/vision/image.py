"""Images -> ``pixel_values``. In: images (a path, bytes of an encoded file, or a
``PIL.Image.Image``) and a checkpoint's ``preprocessor_config.json``. Out: f32
``[n, 3, S, S]``, as transformers' PIL image processor computes it.

The steps, each as the config says (missing fields take the defaults of the processor
class it names, :data:`PROCESSOR_DEFAULTS`): convert to RGB (transparency composited
onto white), resize with Pillow and the ``resample`` filter (``size``: ``shortest_edge``
keeps the aspect ratio, the long side ``int(size * long / short)``; ``height`` /
``width`` is a fixed size), center crop to ``crop_size`` (padding with zeros when the
image is smaller), rescale (``x * rescale_factor`` in f64, then f32), normalize
(``(x - mean) / std`` in f32). Decoding needs Pillow (the ``vision`` extra); a file that
cannot be read or decoded is an InputError naming it.
"""

from __future__ import annotations

import enum
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import InputError, ModelError
from rlx.models.hf.config import read_json
from rlx.models.vision.config import Family

__all__ = [
    "Resample",
    "ImageProcessing",
    "read_processing",
    "load_image",
    "preprocess",
    "pil",
    "PROCESSOR_DEFAULTS",
]

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_HALF = (0.5, 0.5, 0.5)


class Resample(enum.IntEnum):
    """Pillow's resampling filters, by the numbers configs store (``PILImageResampling``)."""

    NEAREST = 0
    LANCZOS = 1
    BILINEAR = 2
    BICUBIC = 3
    BOX = 4
    HAMMING = 5


#: Defaults of the processor classes: ``image_processor_type`` -> fields. A config
#: naming another class is read with its family's defaults.
PROCESSOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "CLIPImageProcessor": {
        "do_convert_rgb": True,
        "do_resize": True,
        "size": {"shortest_edge": 224},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _CLIP_MEAN,
        "image_std": _CLIP_STD,
        "default_to_square": False,
    },
    "SiglipImageProcessor": {
        "do_convert_rgb": True,
        "do_resize": True,
        "size": {"height": 224, "width": 224},
        "resample": 3,
        "do_center_crop": False,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _HALF,
        "image_std": _HALF,
        "default_to_square": False,
    },
    "ViTImageProcessor": {
        "do_convert_rgb": True,
        "do_resize": True,
        "size": {"height": 224, "width": 224},
        "resample": 2,
        "do_center_crop": False,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _HALF,
        "image_std": _HALF,
        "default_to_square": True,
    },
}
_FAMILY_PROCESSOR = {
    Family.CLIP: "CLIPImageProcessor",
    Family.SIGLIP: "SiglipImageProcessor",
    Family.VIT: "ViTImageProcessor",
}


def pil() -> Any:
    """The ``PIL.Image`` module; ModelError saying how to install it when it is missing."""
    try:
        from PIL import Image
    except ImportError:
        raise ModelError(
            "decoding images needs Pillow, which is not installed; install it with: "
            "pip install 'rlx[vision]'"
        ) from None
    return Image


@dataclass(frozen=True)
class ImageProcessing:
    """The preprocessing steps (module docstring). ``shortest_edge`` > 0 resizes keeping
    the aspect ratio, else to ``(height, width)``; ``crop`` is ``(height, width)`` or
    None (no crop)."""

    convert_rgb: bool
    resize: bool
    shortest_edge: int
    height: int
    width: int
    resample: Resample
    crop: tuple[int, int] | None
    rescale: float | None
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None

    def output_size(self, h: int, w: int) -> tuple[int, int]:
        """(height, width) of the result for an image of ``h`` x ``w``."""
        if self.crop is not None:
            return self.crop
        if not self.resize:
            return h, w
        return self.resize_to(h, w)

    def fixed_size(self) -> tuple[int, int] | None:
        """(height, width) of every result, or None when it depends on the image (a
        shortest-edge resize, or no resize, without a crop)."""
        if self.crop is not None:
            return self.crop
        if self.resize and not self.shortest_edge:
            return self.height, self.width
        return None

    def resize_to(self, h: int, w: int) -> tuple[int, int]:
        """(height, width) an ``h`` x ``w`` image is resized to (transformers' rule)."""
        if not self.shortest_edge:
            return self.height, self.width
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
        return (new_long, new_short) if w <= h else (new_short, new_long)


def _size(v: Any, square: bool, where: str, field: str) -> tuple[int, int, int]:
    """``(shortest_edge, height, width)`` of a size field (a dict or, in old files, an int)."""
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return (0, v, v) if square else (v, 0, 0)
    if isinstance(v, dict):
        keys = set(v)
        ok = [x for x in v.values() if isinstance(x, int) and not isinstance(x, bool) and x > 0]
        if keys == {"shortest_edge"} and len(ok) == 1:
            return v["shortest_edge"], 0, 0
        if keys == {"height", "width"} and len(ok) == 2:
            return 0, v["height"], v["width"]
    raise ModelError(
        f"{where}: {field} {v!r} is not supported; supported: {{'shortest_edge': n}}, "
        "{'height': h, 'width': w} or an int"
    )


def _triple(v: Any, where: str, field: str) -> tuple[float, float, float]:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v] * 3
    if (
        isinstance(v, (list, tuple))
        and len(v) == 3
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    ):
        return (float(v[0]), float(v[1]), float(v[2]))
    raise ModelError(f"{where}: {field} must be 3 numbers (one per RGB channel), got {v!r}")


def read_processing(model_dir: Path, family: Family) -> ImageProcessing:
    """The steps ``model_dir/preprocessor_config.json`` gives (the family's processor
    defaults when the file is absent)."""
    path = model_dir / "preprocessor_config.json"
    raw = read_json(path, "preprocessor config") if path.is_file() else {}
    where = str(path)
    kind = str(raw.get("image_processor_type") or raw.get("feature_extractor_type") or "")
    kind = (
        kind.removesuffix("Fast").removesuffix("Pil").replace("FeatureExtractor", "ImageProcessor")
    )
    base = PROCESSOR_DEFAULTS.get(kind, PROCESSOR_DEFAULTS[_FAMILY_PROCESSOR[family]])
    c = {**base, **{k: v for k, v in raw.items() if v is not None}}
    resample = c["resample"]
    if resample not in [r.value for r in Resample] or isinstance(resample, bool):
        raise ModelError(
            f"{where}: resample {resample!r} is not supported; supported: "
            + ", ".join(f"{r.value} ({r.name})" for r in Resample)
        )
    square = bool(c.get("default_to_square", True))
    edge, h, w = _size(c["size"], square, where, "size")
    crop = None
    if c.get("do_center_crop"):
        _, ch, cw = _size(c.get("crop_size", c["size"]), True, where, "crop_size")
        crop = (ch, cw)
    factor = c.get("rescale_factor")
    if c.get("do_rescale") and (isinstance(factor, bool) or not isinstance(factor, (int, float))):
        raise ModelError(f"{where}: rescale_factor must be a number, got {factor!r}")
    norm = bool(c.get("do_normalize"))
    return ImageProcessing(
        convert_rgb=bool(c.get("do_convert_rgb", True)),
        resize=bool(c.get("do_resize")),
        shortest_edge=edge,
        height=h,
        width=w,
        resample=Resample(resample),
        crop=crop,
        rescale=float(factor) if c.get("do_rescale") and factor is not None else None,
        mean=_triple(c["image_mean"], where, "image_mean") if norm else None,
        std=_triple(c["image_std"], where, "image_std") if norm else None,
    )


def _name(image: Any, i: int) -> str:
    if isinstance(image, (str, Path)):
        return f"image file {str(image)!r}"
    return f"images[{i}] ({type(image).__name__})"


def load_image(image: Any, i: int = 0) -> Any:
    """A decoded ``PIL.Image.Image`` from a path, encoded bytes or a PIL image; InputError
    naming the file (or ``images[i]``) when it cannot be read or decoded."""
    Image = pil()
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, (str, Path)):
        src: Any = str(image)
    elif isinstance(image, (bytes, bytearray, memoryview)):
        src = io.BytesIO(bytes(image))
    else:
        raise InputError(
            f"images[{i}] is a {type(image).__name__}; expected a file path, the bytes of an "
            "image file or a PIL.Image.Image"
        )
    try:
        img = Image.open(src)
        img.load()
    except FileNotFoundError:
        raise InputError(f"{_name(image, i)} does not exist") from None
    except Exception as e:  # Pillow raises UnidentifiedImageError, OSError, SyntaxError...
        raise InputError(
            f"{_name(image, i)} could not be decoded as an image ({type(e).__name__}: {e})"
        ) from None
    return img


def _rgb(img: Any) -> Any:
    """RGB, compositing transparency onto white (transformers' ``convert_to_rgb``)."""
    Image = pil()
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def _center_crop(x: np.ndarray, ch: int, cw: int) -> np.ndarray:
    """``x[C, H, W]`` cropped (zero-padded first when smaller) to ``ch`` x ``cw``."""
    h, w = x.shape[1:]
    top, left = (h - ch) // 2, (w - cw) // 2
    if top >= 0 and left >= 0 and top + ch <= h and left + cw <= w:
        return x[:, top : top + ch, left : left + cw]
    nh, nw = max(ch, h), max(cw, w)
    big = np.zeros((x.shape[0], nh, nw), x.dtype)
    tp, lp = math.ceil((nh - h) / 2), math.ceil((nw - w) / 2)
    big[:, tp : tp + h, lp : lp + w] = x
    top, left = top + tp, left + lp
    return big[:, max(0, top) : min(nh, top + ch), max(0, left) : min(nw, left + cw)]


def preprocess_one(img: Any, steps: ImageProcessing) -> np.ndarray:
    """f32 ``[3, H, W]`` of one decoded image (module docstring)."""
    if steps.convert_rgb or img.mode != "RGB":
        img = _rgb(img)
    if steps.resize:
        h, w = steps.resize_to(img.height, img.width)
        img = img.resize((w, h), resample=int(steps.resample))
    x = np.moveaxis(np.asarray(img), -1, 0)
    if steps.crop is not None:
        x = _center_crop(x, *steps.crop)
    y = (x.astype(np.float64) * steps.rescale).astype(np.float32) if steps.rescale else x
    y = y.astype(np.float32)
    if steps.mean is not None and steps.std is not None:
        mean = np.array(steps.mean, np.float32)[:, None, None]
        std = np.array(steps.std, np.float32)[:, None, None]
        y = (y - mean) / std
    return np.ascontiguousarray(y, dtype=np.float32)


def preprocess(
    images: Sequence[Any], steps: ImageProcessing, size: int | None = None
) -> np.ndarray:
    """f32 ``[n, 3, H, W]`` of ``images`` (paths, bytes or PIL images). With ``size``, an
    image whose result is not ``size`` x ``size`` is a ModelError (the config's steps do
    not produce what the model takes)."""
    if isinstance(images, (str, bytes, Path)) or not isinstance(images, Sequence):
        raise InputError(
            f"images must be a list of images (paths, bytes or PIL images), got "
            f"{type(images).__name__}"
        )
    out = [preprocess_one(load_image(im, i), steps) for i, im in enumerate(images)]
    for i, x in enumerate(out):
        if size is not None and x.shape[1:] != (size, size):
            raise ModelError(
                f"preprocessing {_name(images[i], i)} gives {x.shape[1]}x{x.shape[2]} pixels but "
                f"the model takes {size}x{size}: preprocessor_config.json's size / crop_size "
                "disagree with config.json's image_size"
            )
    if not out:
        return np.zeros((0, 3, size or 0, size or 0), np.float32)
    return np.stack(out)
