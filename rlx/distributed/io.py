"""Readers and writers of the Ray embedding pipeline. In: text files (Parquet, JSON lines,
plain text). Out: rows with stable ids, embedding shards written atomically, the
``manifest.json`` that lists them, and :func:`read_embeddings` to load the result.

A *unit* is the piece one read task reads: a whole text / JSON-lines file, or one row group
of a Parquet file. Every row carries its id: ``source`` (the file path as given) and
``row`` (the 0-based line number of a text or JSON-lines file, the row index of a Parquet
file); blank lines and null / empty texts are skipped, their numbers stay unused. A shard's
name is a hash of the sorted ids it holds, so a retried task that embeds the same rows
writes the same file again (temp file + ``os.replace``: a reader sees the whole old file
or the whole new one, never a part).

Shard formats: ``parquet`` (one file, columns ``source``, ``row``, ``embedding``
fixed-size list of f32) or ``npy`` (``<name>.npy`` f32 ``[n, dim]`` and
``<name>.ids.npy``, a structured array of ``source`` (unicode) and ``row`` (int64)).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import DistributedError, InputError

__all__ = [
    "TEXT_SUFFIXES",
    "plan_units",
    "read_unit",
    "shard_name",
    "write_shard",
    "write_manifest",
    "read_manifest",
    "read_ids",
    "read_embeddings",
    "Embeddings",
    "MANIFEST",
    "is_output_file",
]

#: Suffixes a directory is searched for (anything else given by name is read as plain text).
TEXT_SUFFIXES = (".parquet", ".jsonl", ".json", ".txt")
MANIFEST = "manifest.json"
FORMATS = ("parquet", "npy")


def _kind(path: str) -> str:
    suffix = Path(path).suffix.lower()
    return {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}.get(suffix, "text")


def _expand(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise InputError("embed: no input paths given")
    files: list[str] = []
    for item in items:
        p = str(item)
        if os.path.isdir(p):
            found = sorted(
                str(f) for f in Path(p).rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES
            )
            if not found:
                raise InputError(f"embed: directory {p!r} holds no {'/'.join(TEXT_SUFFIXES)} file")
            files += found
        elif os.path.isfile(p):
            files.append(p)
        else:
            matched = sorted(f for f in glob.glob(p) if os.path.isfile(f))
            if not matched:
                raise InputError(f"embed: input {p!r} is not a file, directory or matching glob")
            files += matched
    if len(set(files)) != len(files):
        dup = sorted({f for f in files if files.count(f) > 1})
        raise InputError(f"embed: input file(s) given twice: {dup[:3]}")
    return files


def plan_units(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """The read units of ``paths`` (files, directories, globs): one per text / JSON-lines
    file, one per Parquet row group; each ``{key, source, kind, part, offset}``."""
    units: list[dict[str, Any]] = []
    for f in _expand(paths):
        kind = _kind(f)
        if kind != "parquet":
            units.append({"key": f, "source": f, "kind": kind, "part": 0, "offset": 0})
            continue
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(f).metadata
        offset = 0
        for rg in range(meta.num_row_groups):
            key = f"{f}#{rg}"
            units.append({"key": key, "source": f, "kind": kind, "part": rg, "offset": offset})
            offset += meta.row_group(rg).num_rows
    return units


def _text_of(obj: Any, column: str, where: str) -> str | None:
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        value = obj.get(column)
        if value is None or isinstance(value, str):
            return value
        raise InputError(f"{where}: field {column!r} is {type(value).__name__}, expected a string")
    raise InputError(f"{where}: expected a JSON object with a {column!r} field or a JSON string")


def read_unit(unit: dict[str, Any], text_column: str = "text") -> dict[str, list[Any]]:
    """The non-empty rows of one unit: columns ``source``, ``row``, ``text``."""
    source, kind = unit["source"], unit["kind"]
    rows: list[int] = []
    texts: list[str] = []
    if kind == "parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(source).read_row_group(unit["part"], columns=[text_column])
        for i, t in enumerate(table.column(text_column).to_pylist()):
            if t is not None and not isinstance(t, str):
                where = f"{source} row {unit['offset'] + i}"
                raise InputError(f"{where}: column {text_column!r} is {type(t).__name__}")
            if t:
                rows.append(unit["offset"] + i)
                texts.append(t)
    else:
        with open(source, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                text = line.rstrip("\r\n")
                if not text.strip():
                    continue
                if kind == "jsonl":
                    try:
                        obj = json.loads(text)
                    except json.JSONDecodeError as e:
                        raise InputError(f"{source} line {i + 1}: not JSON ({e.msg})") from None
                    got = _text_of(obj, text_column, f"{source} line {i + 1}")
                    if not got:
                        continue
                    text = got
                rows.append(i)
                texts.append(text)
    return {"source": [source] * len(rows), "row": rows, "text": texts}


def shard_name(sources: Sequence[str], rows: Sequence[int]) -> str:
    """``part-<hash>``: a hash of the sorted (source, row) ids (order-independent)."""
    h = hashlib.sha1()
    for s, r in sorted(zip(map(str, sources), map(int, rows))):
        h.update(f"{s}\0{r}\n".encode())
    return f"part-{h.hexdigest()[:24]}"


def is_output_file(name: str) -> bool:
    """Whether a file name is one :func:`write_shard` / :func:`write_manifest` write (or
    their temp files)."""
    return name == MANIFEST or name.startswith(("part-", ".part-", f".{MANIFEST}."))


def _atomic(path: Path, write: Any) -> None:
    """``write(tmp_path)`` then rename onto ``path`` (same directory, so same filesystem)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_shard(
    out_dir: Path, name: str, fmt: str, sources: Sequence[str], rows: Sequence[int], emb: np.ndarray
) -> list[str]:
    """Write one shard atomically; returns its file names (ids first, then embeddings)."""
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = pa.array(np.ascontiguousarray(emb, np.float32).reshape(-1))
        table = pa.table(
            {
                "source": pa.array(list(map(str, sources)), pa.string()),
                "row": pa.array(np.asarray(rows, np.int64)),
                "embedding": pa.FixedSizeListArray.from_arrays(flat, emb.shape[1]),
            }
        )
        _atomic(out_dir / f"{name}.parquet", lambda p: pq.write_table(table, p))
        return [f"{name}.parquet"]
    if fmt == "npy":
        width = max([len(str(s)) for s in sources] + [1])
        ids = np.empty(len(rows), dtype=[("source", f"<U{width}"), ("row", "<i8")])
        ids["source"] = list(map(str, sources))
        ids["row"] = rows
        _atomic(out_dir / f"{name}.ids.npy", lambda p: _np_save(p, ids))
        _atomic(out_dir / f"{name}.npy", lambda p: _np_save(p, emb.astype(np.float32)))
        return [f"{name}.ids.npy", f"{name}.npy"]
    raise InputError(f"embed: output format must be one of {FORMATS}, got {fmt!r}")


def _np_save(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as fh:  # a file object: np.save would append .npy to the name
        np.save(fh, arr, allow_pickle=False)


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> Path:
    """``manifest.json`` in ``out_dir``, written atomically."""
    text = json.dumps(manifest, indent=1, sort_keys=True)
    path = out_dir / MANIFEST
    _atomic(path, lambda p: p.write_text(text))
    return path


def read_manifest(out_dir: str | os.PathLike) -> dict[str, Any]:
    """The manifest of an embedding output directory (DistributedError when absent)."""
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise DistributedError(
            f"{out_dir}: no {MANIFEST}; the embedding run did not finish (its shards are not "
            "a complete output)"
        )
    return json.loads(path.read_text())


def read_ids(out_dir: Path, shard: dict[str, Any], fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(source, row) arrays of one shard."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        t = pq.read_table(out_dir / shard["files"][0], columns=["source", "row"])
        return np.asarray(t.column("source").to_pylist(), dtype=str), t.column("row").to_numpy()
    ids = np.load(out_dir / shard["files"][0], allow_pickle=False)
    return ids["source"].astype(str), ids["row"].astype(np.int64)


def _read_emb(out_dir: Path, shard: dict[str, Any], fmt: str) -> np.ndarray:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        col = pq.read_table(out_dir / shard["files"][0], columns=["embedding"]).column(0)
        col = col.combine_chunks()
        dim = col.type.list_size
        return col.values.to_numpy(zero_copy_only=False).reshape(-1, dim).astype(np.float32)
    return np.load(out_dir / shard["files"][1], allow_pickle=False)


@dataclass(frozen=True)
class Embeddings:
    """A loaded output: ids ``source`` (str) and ``row`` (int64), ``embedding`` f32
    ``[n, dim]``, sorted by (source, row)."""

    source: np.ndarray
    row: np.ndarray
    embedding: np.ndarray

    def __len__(self) -> int:
        return len(self.row)


def read_embeddings(out_dir: str | os.PathLike) -> Embeddings:
    """The embeddings of a finished :func:`rlx.distributed.embed` output directory."""
    root = Path(out_dir)
    man = read_manifest(root)
    fmt = man["shard_format"]
    parts = [(*read_ids(root, s, fmt), _read_emb(root, s, fmt)) for s in man["shards"]]
    if not parts:
        dim = int(man["dim"])
        return Embeddings(np.array([], str), np.array([], np.int64), np.zeros((0, dim), np.float32))
    source = np.concatenate([p[0] for p in parts])
    row = np.concatenate([p[1] for p in parts]).astype(np.int64)
    emb = np.concatenate([p[2] for p in parts])
    order = np.lexsort((row, source))
    return Embeddings(source[order], row[order], emb[order])
