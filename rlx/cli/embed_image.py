"""``rlx embed MODEL --image FILE [--image FILE ...] [TEXT ...]``: image embeddings with a
CLIP or SigLIP checkpoint (:class:`rlx.models.vision.ImageTextEncoder`), and the texts'
embeddings in the same space when texts are given, with their similarity logits. Out: a
summary on stdout (or one JSON object per image / text with ``--format jsonl``); ``--out
FILE.npy`` holds the ``[n_images + n_texts, dim]`` float32 matrix, images first."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import numpy as np

from rlx.cli.common import model_dir, status

__all__ = ["run"]


def run(
    model: str,
    images: list[str],
    texts: list[str],
    out: Path | None,
    batch_size: int,
    threads: int | None,
    normalize: bool | None,
    fmt: str,
) -> int:
    """Embed ``images`` (and ``texts``) with the image-text model ``model``; print and
    save as the module docstring says. Returns the exit code."""
    from rlx.models.vision import ImageTextEncoder

    path = model_dir(model)
    status(f"loading {path} and compiling ...")
    t0 = time.perf_counter()
    enc = ImageTextEncoder(path, num_threads=threads)
    status(f"ready in {time.perf_counter() - t0:.1f} s")
    norm = bool(normalize)
    t0 = time.perf_counter()
    img = enc.encode_images(images, batch_size=batch_size, normalize=norm)
    txt = enc.encode_texts(texts, batch_size=batch_size, normalize=norm)
    dt = time.perf_counter() - t0
    if fmt == "jsonl":
        for name, v in zip(images, img, strict=True):
            click.echo(json.dumps({"image": name, "embedding": [round(float(x), 7) for x in v]}))
        for t, v in zip(texts, txt, strict=True):
            click.echo(json.dumps({"text": t, "embedding": [round(float(x), 7) for x in v]}))
    elif fmt == "summary":
        state = "L2-normalized" if norm else "not normalized"
        click.echo(f"{len(images)} image(s) -> [{len(images)}, {enc.dim}] float32, {state}")
        if texts:
            click.echo(f"{len(texts)} text(s) -> [{len(texts)}, {enc.dim}] float32, {state}")
            logits = enc.similarity(img, txt)
            click.echo(
                f"logits_per_image (scale {enc.logit_scale:.4g}, bias {enc.logit_bias:.4g}):"
            )
            for name, row in zip(images, logits, strict=True):
                best = int(np.argmax(row))
                click.echo(
                    f"  {Path(name).name:<32} best: #{best} {texts[best]!r:.40} ({row[best]:.3f})"
                )
    click.echo(
        f"encoded {len(images)} image(s) and {len(texts)} text(s) in {dt * 1e3:.1f} ms",
        err=fmt != "summary",
    )
    if out is not None:
        target = out if out.suffix == ".npy" else out.with_name(out.name + ".npy")
        np.save(target, np.concatenate([img, txt]) if len(txt) else img)
        click.echo(f"wrote {target}", err=fmt != "summary")
    return 0
