"""``rlx convert SRC DEST``: a Hugging Face decoder directory to a GGUF file, or a GGUF
file to a Hugging Face directory (:mod:`rlx.frontends.convert`). In: the source (a
directory or a ``.gguf`` file), the destination, ``--type`` and ``--force``. Out: the
file or directory written atomically, a progress bar on stderr, and on stdout one line
per written tensor type with its count."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

from rlx.cli.common import CONTEXT

__all__ = ["command"]

_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_k_m"]


@click.command(
    "convert",
    context_settings=CONTEXT,
    short_help="Convert a Hugging Face decoder directory to GGUF, or a GGUF file to one.",
)
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dest", type=click.Path(path_type=Path))
@click.option(
    "--type", "kind", type=click.Choice(_TYPES), default=None,
    help="Weight type written: to GGUF f32|f16|bf16|q8_0|q4_k_m (default f16); "
    "to a Hugging Face directory f32|f16|bf16 (default f32).",
)  # fmt: skip
@click.option("--force", is_flag=True, help="Replace DEST when it exists.")
def command(src: Path, dest: Path, kind: str | None, force: bool) -> None:
    """Convert SRC (a Hugging Face directory: Llama / Mistral, Qwen2, Qwen3, Gemma 3) to
    the GGUF file DEST, or SRC (a GGUF file of those) to the Hugging Face directory DEST."""
    from rlx.frontends.convert import convert

    res = convert(src, dest, type=kind, force=force)
    counts = Counter(res.tensors.values())
    click.echo(f"wrote {res.path} ({res.architecture}, {len(res.tensors)} tensors)")
    for t, n in sorted(counts.items()):
        click.echo(f"  {t}: {n}")
