"""``rlx embed MODEL [TEXT ...]``: sentence embeddings. In: a model directory or known name
(``all-MiniLM-L6-v2``), texts as arguments and/or a file of one text per line (``-``:
stdin; blank lines are skipped). Out: a short summary on stdout (or one JSON object per
text with ``--format jsonl``), the ``[n, dim]`` float32 matrix in ``--out FILE.npy``.
Status lines and the progress bar go to stderr. ``--ray`` embeds ``--input`` files on
Ray Data into a shard directory ``--out DIR`` (``rlx/cli/embed_ray.py``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any

import click
import numpy as np

from rlx.cli.common import CONTEXT, load_encoder, precision_option, threads_option

__all__ = ["command", "read_texts"]


def read_texts(texts: tuple[str, ...], file: IO[str] | None) -> list[str]:
    """The argument texts, then the non-blank lines of ``file`` (newlines stripped)."""
    out = list(texts)
    if file is not None:
        try:
            out += [line.rstrip("\r\n") for line in file if line.strip()]
        except UnicodeDecodeError as e:
            name = getattr(file, "name", "?")
            raise click.BadParameter(
                f"{name} is not UTF-8 text ({e.reason} at byte {e.start})", param_hint="--file"
            ) from None
    return out


def _summary(texts: list[str], emb: np.ndarray, normalized: bool, show: int = 5) -> str:
    n, dim = emb.shape
    lines = [
        f"{n} text(s) -> [{n}, {dim}] float32, {'L2-normalized' if normalized else 'not normalized'}"
    ]
    for t, v in list(zip(texts, emb))[:show]:
        head = " ".join(f"{x:+.4f}" for x in v[:4])
        short = t if len(t) <= 48 else t[:45] + "..."
        lines.append(f"  {short!r:<52} |v|={np.linalg.norm(v):.4f}  [{head} ...]")
    if n > show:
        lines.append(f"  ... and {n - show} more")
    if 1 < n <= 8:
        unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        sim = unit @ unit.T
        np.fill_diagonal(sim, -np.inf)
        i, j = np.unravel_index(int(np.argmax(sim)), sim.shape)
        lines.append(f"  most similar pair: #{i} and #{j}, cosine {sim[i, j]:.4f}")
    return "\n".join(lines)


@click.command(
    "embed",
    context_settings=CONTEXT,
    short_help="Sentence embeddings of texts (summary, JSON lines, .npy).",
)
@click.argument("model")
@click.argument("texts", nargs=-1)
@click.option(
    "--file",
    "-f",
    "file",
    type=click.File("r", encoding="utf-8"),
    help="Read texts from this file, one per line ('-' for stdin).",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    help="Write the embeddings as a .npy file ([n, dim] float32); with --ray a directory.",
)
@precision_option()
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@threads_option()
@click.option(
    "--normalize/--no-normalize",
    default=None,
    help="L2-normalize the vectors (default: as the model's modules.json says).",
)
@click.option(
    "--prompt-name",
    default=None,
    help="Prepend the model's prompt of this name (config_sentence_transformers.json).",
)
@click.option(
    "--prompt",
    default=None,
    help="Prepend this text to each input (default: the model's default prompt, if any).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["summary", "jsonl", "none"]),
    default="summary",
    show_default=True,
    help="stdout: a summary, one JSON object per text {text, embedding}, or nothing.",
)
@click.option(
    "--ray",
    "use_ray",
    is_flag=True,
    help="Embed a corpus on Ray Data (--input files, --out DIR of shards; rlx[distributed]).",
)
@click.option(
    "--input",
    "-i",
    "inputs",
    multiple=True,
    help="With --ray: input files, directories or globs (Parquet, JSON lines, text).",
)
@click.option("--ray-address", default=None, help="With --ray: a cluster address (default: local).")
@click.option(
    "--actors",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --ray: actors in the pool, each one compiled model with --threads CPUs.",
)
@click.option(
    "--shard-rows",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="With --ray: rows per output shard (one actor call).",
)
@click.option(
    "--shard-format",
    type=click.Choice(["parquet", "npy"]),
    default="parquet",
    show_default=True,
    help="With --ray: the shard files (.npy: <name>.npy and <name>.ids.npy).",
)
@click.option("--overwrite", is_flag=True, help="With --ray: replace a non-empty --out DIR.")
@click.option(
    "--image",
    "images",
    multiple=True,
    help="Embed this image file with a CLIP / SigLIP MODEL (repeatable; TEXTs then share "
    "its space).",
)
def command(
    model: str,
    texts: tuple[str, ...],
    file: IO[str] | None,
    out: Path | None,
    precision: str,
    batch_size: int,
    threads: int | None,
    normalize: bool | None,
    fmt: str,
    prompt_name: str | None = None,
    prompt: str | None = None,
    use_ray: bool = False,
    inputs: tuple[str, ...] = (),
    ray_address: str | None = None,
    actors: int = 1,
    shard_rows: int = 1024,
    shard_format: str = "parquet",
    overwrite: bool = False,
    images: tuple[str, ...] = (),
) -> int:
    """Embed texts with a sentence-embedding MODEL (a directory, or a known name such as
    all-MiniLM-L6-v2).

    \b
    Examples:
      rlx embed all-MiniLM-L6-v2 "A man plays a guitar." "Someone plays music."
      rlx embed ./my-model --file corpus.txt --out corpus.npy --precision int8
      cat corpus.txt | rlx embed all-MiniLM-L6-v2 -f - --format jsonl > vectors.jsonl
      rlx embed all-MiniLM-L6-v2 --ray -i corpus/ --out vectors/ --actors 4
      rlx embed ./clip-dir --image cat.jpg --image dog.png "a cat" "a dog"
    """
    if images:
        from rlx.cli import embed_image

        if use_ray or prompt is not None or prompt_name is not None or precision != "f32":
            raise click.UsageError("--image takes none of --ray, --prompt, --precision")
        items = read_texts(texts, file)
        return embed_image.run(model, list(images), items, out, batch_size, threads, normalize, fmt)
    if use_ray and (prompt is not None or prompt_name is not None):
        raise click.UsageError("--prompt / --prompt-name do not apply with --ray")
    if use_ray:
        from rlx.cli import embed_ray

        paths = list(inputs) + ([file.name] if file is not None and file.name != "<stdin>" else [])
        return embed_ray.run(
            model, paths, out, precision=precision, batch_size=batch_size, threads=threads,
            normalize=normalize, address=ray_address, actors=actors, shard_rows=shard_rows,
            shard_format=shard_format, overwrite=overwrite,
        )  # fmt: skip
    if out is not None and out.is_dir():
        raise click.BadParameter(
            f"{out} is a directory (a directory is for --ray)", param_hint="--out"
        )
    items = read_texts(texts, file)
    if not items:
        raise click.UsageError("no text given: pass TEXT arguments or --file FILE ('-' for stdin)")
    enc = load_encoder(model, precision, threads)
    t0 = time.perf_counter()
    emb = enc.encode(
        items,
        batch_size=batch_size,
        normalize=normalize,
        progress=None,
        prompt_name=prompt_name,
        prompt=prompt,
    )
    dt = time.perf_counter() - t0
    normalized = enc.normalize_default if normalize is None else normalize
    if fmt == "jsonl":
        for t, v in zip(items, emb):
            click.echo(json.dumps({"text": t, "embedding": [round(float(x), 7) for x in v]}))
    elif fmt == "summary":
        click.echo(_summary(items, emb, normalized))
    click.echo(
        f"encoded {len(items)} text(s) in {dt * 1e3:.1f} ms ({len(items) / dt:.1f} texts/s, "
        f"precision {precision}, batch size {batch_size})",
        err=fmt != "summary",
    )
    if out is not None:
        saved = _save(out, emb)
        click.echo(f"wrote {saved}", err=fmt != "summary")
    return 0


def _save(path: Path, emb: np.ndarray) -> Any:
    """``np.save`` (which appends ``.npy`` to a name without it); returns the file written."""
    target = path if path.suffix == ".npy" else path.with_name(path.name + ".npy")
    np.save(target, emb)
    return target
