"""``rlx embed MODEL --ray --input PATH ... --out DIR``: the corpus path of ``rlx embed``
on Ray Data (:func:`rlx.distributed.embed`). In: input files, directories or globs
(Parquet, JSON lines, plain text), a model, the pool size. Out: the shard directory and its
manifest in ``--out``; a summary line on stdout. Without the ``distributed`` extra: a
one-line error naming ``pip install 'rlx[distributed]'``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rlx.cli.common import model_dir, status

__all__ = ["run"]


def run(
    model: str,
    inputs: list[str],
    out: Path | None,
    *,
    precision: str,
    batch_size: int,
    threads: int | None,
    normalize: bool | None,
    address: str | None,
    actors: int,
    shard_rows: int,
    shard_format: str,
    overwrite: bool,
) -> int:
    """Run the Ray pipeline; ``threads`` is the CPUs (threads) of each actor (default 1)."""
    from rlx.distributed import require

    require("ray", "pyarrow", "ray.data", what="rlx embed --ray")
    if not inputs:
        raise click.UsageError("--ray needs input files: --input PATH (files, dirs or globs)")
    if out is None:
        raise click.UsageError("--ray needs an output directory: --out DIR")
    from rlx.distributed import embed

    where = address or "a local Ray instance"
    status(f"embedding {', '.join(inputs)} on {where} with {actors} actor(s) ...")
    res: Any = embed(
        inputs,
        model_dir(model),
        output=out,
        precision=precision,
        batch_size=batch_size,
        shard_rows=shard_rows,
        num_actors=actors,
        threads_per_actor=threads or 1,
        normalize=normalize,
        fmt=shard_format,
        address=address,
        overwrite=overwrite,
    )
    click.echo(
        f"embedded {res.rows} row(s) -> {res.shards} {shard_format} shard(s) of dim {res.dim} "
        f"in {res.output} ({res.seconds:.1f} s incl. Ray start-up, {res.rows_per_s:.1f} rows/s; "
        f"manifest.json lists them)"
    )
    return 0
