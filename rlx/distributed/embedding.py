"""Corpus-scale sentence embedding on Ray Data. In: text files (Parquet, JSON lines, plain
text: paths, directories or globs) or a ``ray.data.Dataset`` with a text and an integer id
column; a sentence-embedding model directory. Out: an output directory of embedding shards
(Parquet or .npy, each row with its ids) and ``manifest.json``; an :class:`EmbedResult`.

The pipeline: the read units (``io.plan_units``: a file, or a Parquet row group) become one
Ray Data block each; a read task turns its unit into rows ``(source, row, text)``; then
``map_batches`` with an actor pool (``ActorPoolStrategy(size=num_actors)``, ``num_cpus=
threads_per_actor``) whose actors each hold one compiled :class:`rlx.models.SentenceEncoder`
(compiled once, in the actor's constructor, with as many threads as the CPUs Ray gave it).
An actor call takes ``shard_rows`` rows, tokenizes and embeds them (sorted by length and
padded per ``batch_size`` batch, as ``SentenceEncoder.encode``) and writes one shard.

Exactly once: a shard's name is a hash of the ids it holds and it is written atomically,
so a task that Ray retries (its actor died; Ray Data restarts actors and retries their
tasks) rewrites the same file. The driver collects one record per shard from the tasks that
finished; shard files no finished task reported (left by a killed attempt whose rows a
retry regrouped) are deleted; the per-unit row counts of the records must add up to what
the read tasks read, and (``verify=True``) the ids read back from the shards must be unique
and as many as the rows. Only then is ``manifest.json`` written; readers go through it.

Ray: ``address=None`` starts a local Ray instance for the call (and shuts it down at the
end); an address (``"auto"``, ``"ray://..."``, ``"host:port"``) joins an existing cluster,
whose nodes must see the model directory, the inputs and ``output`` at the same paths.
When Ray is already initialized in the process, the call uses that and leaves it running.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.data

from rlx.distributed import io
from rlx.errors import DistributedError, InputError

__all__ = ["embed", "EmbedResult", "EmbedActor"]

#: CPUs a read task asks Ray for: reading is light, and a value other than the actors'
#: keeps Ray Data from fusing the read into the actor stage.
READ_CPUS = 0.5


@dataclass(frozen=True)
class EmbedResult:
    """What :func:`embed` wrote: ``output`` (the directory), ``rows`` embedded,
    ``shards`` written, ``dim``, ``seconds`` (wall time of the pipeline, Ray start-up
    and actor compiles included), ``orphans`` (files of killed attempts, removed),
    ``pids`` (the worker processes that wrote shards)."""

    output: Path
    rows: int
    shards: int
    dim: int
    seconds: float
    orphans: int
    pids: tuple[int, ...]

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def _assigned_cpus() -> int:
    """CPUs Ray assigned to the calling actor (at least 1)."""
    res = ray.get_runtime_context().get_assigned_resources()
    return max(1, int(res.get("CPU", 1)))


class EmbedActor:
    """The actor-pool UDF: one compiled SentenceEncoder per actor; a batch of rows in,
    one shard written, its record out."""

    def __init__(
        self,
        model_dir: str,
        precision: str,
        batch_size: int,
        normalize: bool | None,
        out_dir: str,
        fmt: str,
    ):
        from rlx.models import SentenceEncoder

        self.threads = _assigned_cpus()
        self.encoder = SentenceEncoder(model_dir, precision, num_threads=self.threads)
        self.batch_size = batch_size
        self.normalize = normalize
        self.out_dir = Path(out_dir)
        self.fmt = fmt

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sources = [str(s) for s in batch["source"]]
        rows = [int(r) for r in batch["row"]]
        texts = list(batch["text"])
        for s, r, t in zip(sources, rows, texts):
            if not isinstance(t, str):
                raise InputError(f"embed: row {r} of {s!r}: the text is {t!r}, not a string")
        t0 = time.perf_counter()
        emb = self.encoder.encode(
            texts, batch_size=self.batch_size, normalize=self.normalize, progress=False
        )
        name = io.shard_name(sources, rows)
        files = io.write_shard(self.out_dir, name, self.fmt, sources, rows, emb)
        units = Counter(str(u) for u in batch["unit"])
        totals = {str(u): int(n) for u, n in zip(batch["unit"], batch["unit_rows"])}
        record = {
            "name": name,
            "files": files,
            "rows": len(rows),
            "pid": os.getpid(),
            "units": {u: [c, totals[u]] for u, c in units.items()},
            "encode_s": round(time.perf_counter() - t0, 6),  # tokenize + model + write
            "done": time.time(),  # wall clock when the shard was in place
        }
        return {"record": np.array([json.dumps(record)])}


def _read_units(batch: dict[str, np.ndarray], text_column: str) -> dict[str, np.ndarray]:
    """Read task: unit descriptions in, their rows out (with the unit key and row count)."""
    cols: dict[str, list[Any]] = {k: [] for k in ("source", "row", "text", "unit", "unit_rows")}
    for unit_json in batch["unit"]:
        unit = json.loads(str(unit_json))
        got = io.read_unit(unit, text_column)
        n = len(got["row"])
        for k in ("source", "row", "text"):
            cols[k] += got[k]
        cols["unit"] += [unit["key"]] * n
        cols["unit_rows"] += [n] * n
    return {
        "source": np.array(cols["source"], dtype=object),
        "row": np.array(cols["row"], dtype=np.int64),
        "text": np.array(cols["text"], dtype=object),
        "unit": np.array(cols["unit"], dtype=object),
        "unit_rows": np.array(cols["unit_rows"], dtype=np.int64),
    }


def _from_dataset(
    ds: ray.data.Dataset, text_column: str, id_column: str
) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    names = ds.schema().names if ds.schema() is not None else []
    missing = [c for c in (text_column, id_column) if c not in names]
    if missing:
        raise InputError(
            f"embed: the dataset has columns {names}; it needs a text column {text_column!r} "
            f"and an integer id column {id_column!r} (stable ids make a retried task "
            f"rewrite the same rows; add one, e.g. the row number of the source), missing "
            f"{missing}"
        )

    def rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(batch[id_column])
        src = batch["source"] if "source" in batch else np.array([""] * n, dtype=object)
        return {
            "source": np.asarray(src, dtype=object),
            "row": np.asarray(batch[id_column], dtype=np.int64),
            "text": np.asarray(batch[text_column], dtype=object),
            "unit": np.array([""] * n, dtype=object),
            "unit_rows": np.full(n, -1, np.int64),
        }

    return rows


@contextmanager
def ray_session(address: str | None, num_cpus: int) -> Iterator[None]:
    """Ray for the duration of a call: the running instance if Ray is initialized; else
    a new local instance (``address=None``, ``num_cpus`` logical CPUs) or a connection to
    the cluster at ``address``, shut down (disconnected) at the end."""
    if ray.is_initialized():
        yield
        return
    if address is None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _check_int(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(f"embed: {name} must be an int >= {low}, got {value!r}")
    return value


def embed(
    data: str | os.PathLike | Sequence[str | os.PathLike] | ray.data.Dataset,
    model_dir: str | os.PathLike,
    *,
    output: str | os.PathLike,
    precision: str = "f32",
    batch_size: int = 32,
    shard_rows: int = 1024,
    num_actors: int = 1,
    threads_per_actor: int = 1,
    normalize: bool | None = None,
    fmt: str = "parquet",
    text_column: str = "text",
    id_column: str = "id",
    address: str | None = None,
    verify: bool = True,
    overwrite: bool = False,
    on_shard: Callable[[dict[str, Any]], None] | None = None,
    timeout_s: float | None = None,
) -> EmbedResult:
    """Embed every row of ``data`` with the model at ``model_dir`` into ``output`` (see
    the module docstring); ``on_shard(record)`` is called in the driver as each shard is
    reported (``name``, ``files``, ``rows``, ``pid``, ``units``, ``encode_s``: seconds the
    actor spent tokenizing, embedding and writing it, ``done``: ``time.time()`` then).
    ``timeout_s``: a DistributedError when the run is not done after that many seconds
    (checked as shard records arrive). ``overwrite``: replace a non-empty ``output``."""
    from rlx.models.hf import check_precision
    from rlx.models.hf.config import read_config
    from rlx.models.hf.layout import read_layout
    from rlx.models.known import resolve

    check_precision(precision)
    for name, value in (
        ("batch_size", batch_size),
        ("shard_rows", shard_rows),
        ("num_actors", num_actors),
        ("threads_per_actor", threads_per_actor),
    ):
        _check_int(name, value)
    if fmt not in io.FORMATS:
        raise InputError(f"embed: fmt must be one of {io.FORMATS}, got {fmt!r}")
    model = resolve(model_dir)
    read_config(read_layout(model).transformer_dir)  # a ModelError here, not in each actor
    is_dataset = isinstance(data, ray.data.Dataset)
    units = [] if is_dataset else io.plan_units(data)  # type: ignore[arg-type]
    out = Path(output).absolute()
    _clear(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with ray_session(address, num_actors * threads_per_actor + 1):
        if is_dataset:
            rows = data.map_batches(  # type: ignore[union-attr]
                _from_dataset(data, text_column, id_column), batch_format="numpy"
            )
        else:
            plan = ray.data.from_items(
                [{"unit": json.dumps(u)} for u in units], override_num_blocks=max(1, len(units))
            )
            rows = plan.map_batches(  # its own tasks (not fused into the actors, which
                _read_units,  # then take rows, not whole files, in shard_rows batches)
                fn_kwargs={"text_column": text_column},
                batch_size=1,
                batch_format="numpy",
                num_cpus=READ_CPUS,
            )
        shards = rows.map_batches(
            EmbedActor,
            fn_constructor_kwargs={
                "model_dir": str(model),
                "precision": precision,
                "batch_size": batch_size,
                "normalize": normalize,
                "out_dir": str(out),
                "fmt": fmt,
            },
            batch_size=shard_rows,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=num_actors),
            num_cpus=threads_per_actor,
        )
        records = _collect(shards, on_shard, t0, timeout_s, out)
        expected = data.count() if is_dataset else None  # type: ignore[union-attr]
    seconds = time.perf_counter() - t0
    orphans = _finish(out, records, fmt, expected, verify)
    dim = _dim(out, records, fmt, model)
    manifest = {
        "format": "rlx-embeddings/1",
        "model": str(model),
        "precision": precision,
        "normalize": normalize,
        "dim": dim,
        "rows": sum(r["rows"] for r in records),
        "shard_format": fmt,
        "shards": sorted(
            ({"name": r["name"], "files": r["files"], "rows": r["rows"]} for r in records),
            key=lambda s: s["name"],
        ),
        "units": {u["key"]: u["source"] for u in units},
    }
    io.write_manifest(out, manifest)
    return EmbedResult(
        output=out,
        rows=manifest["rows"],
        shards=len(records),
        dim=dim,
        seconds=seconds,
        orphans=orphans,
        pids=tuple(sorted({r["pid"] for r in records})),
    )


def _clear(out: Path, overwrite: bool) -> None:
    """Check that ``out`` is empty or absent; with ``overwrite``, remove a previous output
    (only its shard, temp and manifest files: any other file is an InputError)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise InputError(f"embed: output {str(out)!r} is a file, not a directory")
    found = list(out.iterdir())
    if not found:
        return
    if not overwrite:
        raise InputError(f"embed: output {str(out)!r} is not empty (pass overwrite=True)")
    ours = [p for p in found if p.is_file() and io.is_output_file(p.name)]
    other = sorted(p.name for p in found if p not in ours)
    if other:
        raise InputError(
            f"embed: output {str(out)!r} holds files that are not an rlx embedding output "
            f"({other[:3]}); overwrite removes only shards and manifest.json"
        )
    for p in ours:
        p.unlink()


def _collect(
    shards: ray.data.Dataset,
    on_shard: Callable[[dict[str, Any]], None] | None,
    t0: float,
    timeout_s: float | None,
    out: Path,
) -> list[dict[str, Any]]:
    """Run the pipeline: the shard records, as the tasks finish. A task that fails for
    good (not a dead actor: an error raised in it) is a DistributedError with its cause."""
    records = []
    try:
        for item in shards.iter_rows():
            rec = json.loads(item["record"])
            records.append(rec)
            if on_shard is not None:
                on_shard(rec)
            if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                raise DistributedError(f"embed: not done after {timeout_s:.0f} s ({out})")
    except ray.exceptions.RayError as e:
        cause = _cause(e)
        raise DistributedError(f"embed: the Ray pipeline failed ({out}): {cause}") from e
    return records


def _cause(e: BaseException) -> str:
    """The line of a Ray error that names the original exception (an rlx error first)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception): ", ln)]
    ours = [ln for ln in errors if ln.startswith("rlx.errors.")]
    return (ours or errors or lines or [type(e).__name__])[-1]


def _finish(
    out: Path, records: list[dict[str, Any]], fmt: str, expected: int | None, verify: bool
) -> int:
    """Remove orphan shard files; check counts (per unit, total) and, with ``verify``,
    that the ids read back are unique. Returns the number of files removed."""
    names = [r["name"] for r in records]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise DistributedError(f"embed: shard(s) {dup[:3]} reported twice; output {out}")
    keep = {f for r in records for f in r["files"]}
    orphans = [p for p in out.iterdir() if p.is_file() and p.name not in keep]
    for p in orphans:
        p.unlink()
    seen: Counter[str] = Counter()
    totals: dict[str, int] = {}
    for r in records:
        for unit, (count, total) in r["units"].items():
            seen[unit] += count
            totals[unit] = total
    bad = {u: (seen[u], t) for u, t in totals.items() if t >= 0 and seen[u] != t}
    if bad:
        u, (got, want) = next(iter(bad.items()))
        raise DistributedError(
            f"embed: {len(bad)} input unit(s) embedded the wrong number of times, e.g. "
            f"{u!r}: {got} rows written, {want} read; output {out}"
        )
    total = sum(r["rows"] for r in records)
    if expected is not None and total != expected:
        raise DistributedError(f"embed: {total} rows written, the dataset has {expected}")
    if verify and records:
        ids = [io.read_ids(out, r, fmt) for r in records]
        src = np.concatenate([i[0] for i in ids])
        row = np.concatenate([i[1] for i in ids])
        _, codes = np.unique(src, return_inverse=True)
        keys = np.stack([codes.astype(np.int64), row.astype(np.int64)], axis=1)
        uniq = np.unique(keys, axis=0)
        if len(uniq) != total:
            raise DistributedError(
                f"embed: the shards hold {total} rows but {len(uniq)} distinct ids; output {out}"
            )
    return len(orphans)


def _dim(out: Path, records: list[dict[str, Any]], fmt: str, model: Path) -> int:
    if not records:  # nothing to embed: the model's hidden size
        from rlx.models.hf.layout import read_layout

        cfg = read_layout(model).transformer_dir / "config.json"
        return int(json.loads(cfg.read_text()).get("hidden_size", 0))
    first = records[0]
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return int(pq.read_schema(out / first["files"][0]).field("embedding").type.list_size)
    return int(np.load(out / first["files"][1], mmap_mode="r").shape[1])
