"""rlx.distributed.embed on a local Ray cluster (a head and two worker nodes, one CPU each,
started by ray.cluster_utils.Cluster and shut down by the fixture) with the real
all-MiniLM-L6-v2: every row embedded exactly once and equal to the single-process
SentenceEncoder.encode within f32 noise; a worker killed mid-run by its pid is restarted,
its task retried, and the output is still complete and identical. The shard bookkeeping
(names, atomic writes, the count and id checks) is tested without Ray first."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa  # the distributed extra: CI installs it (tests/distributed/
import pyarrow.parquet  # noqa: F401  test_missing_extra.py covers its absence)
import pytest

from rlx.distributed import io
from rlx.distributed.embedding import _finish
from rlx.errors import DistributedError, InputError

WORDS = (
    "the a man woman dog cat plays guitar runs park city music quickly slowly red blue river "
    "bright old small large song bird flies over under"
).split()
N_FILES = 6  # two text, two JSON-lines, two Parquet (two row groups each): 8 read units
PER_FILE = 50


def corpus(root: Path) -> dict[tuple[str, int], str]:
    """Writes the input files; returns (source, row) -> text, the expected ids."""
    rnd = random.Random(18)
    want: dict[tuple[str, int], str] = {}
    for k in range(N_FILES):
        texts = [" ".join(rnd.choices(WORDS, k=rnd.randint(2, 30))) for _ in range(PER_FILE)]
        if k % 3 == 2:
            path = root / f"part{k}.parquet"
            pa.parquet.write_table(pa.table({"text": texts}), path, row_group_size=30)
            want.update({(str(path), i): t for i, t in enumerate(texts)})
            continue
        path = root / (f"part{k}.txt" if k % 3 == 0 else f"part{k}.jsonl")
        lines = list(texts) if k % 3 == 0 else [json.dumps({"text": t}) for t in texts]
        lines.insert(7, "")  # a blank line: skipped, its number unused
        path.write_text("\n".join(lines) + "\n")
        rows = [i for i in range(len(lines)) if i != 7]
        want.update({(str(path), r): t for r, t in zip(rows, texts)})
    return want


def test_plan_and_read_units(tmp_path: Path) -> None:
    want = corpus(tmp_path)
    units = io.plan_units(tmp_path)
    assert len(units) == 8
    got = {}
    for u in units:
        r = io.read_unit(u)
        got.update({(s, i): t for s, i, t in zip(r["source"], r["row"], r["text"])})
    assert got == want


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a file, directory or matching glob"):
        io.plan_units(tmp_path / "nope*.txt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": 3}\n')
    with pytest.raises(InputError, match=r"bad.jsonl line 2: field 'text' is int"):
        io.read_unit(io.plan_units(bad)[0])
    bad.write_text("not json\n")
    with pytest.raises(InputError, match="line 1: not JSON"):
        io.read_unit(io.plan_units(bad)[0])


def test_embed_bad_arguments_change_nothing(tmp_path: Path, minilm_dir: Path) -> None:
    import rlx.distributed as d
    from rlx.errors import ModelError

    (tmp_path / "a.txt").write_text("hello\n")
    out = tmp_path / "out"
    for kw, match in (
        ({"num_actors": 0}, "num_actors must be an int >= 1, got 0"),
        ({"fmt": "csv"}, "fmt must be one of"),
        ({"precision": "f16"}, "f16"),
    ):
        with pytest.raises(InputError if "precision" not in kw else ModelError, match=match):
            d.embed(tmp_path / "a.txt", minilm_dir, output=out, **kw)
    with pytest.raises(InputError, match="not a file, directory or matching glob"):
        d.embed(tmp_path / "missing.txt", minilm_dir, output=out)
    with pytest.raises(ModelError):
        d.embed(tmp_path / "a.txt", tmp_path, output=out)  # not a model directory
    assert not out.exists()
    out.mkdir()
    (out / "x").write_text("")
    with pytest.raises(InputError, match="is not empty"):
        d.embed(tmp_path / "a.txt", minilm_dir, output=out)
    with pytest.raises(InputError, match=r"not an rlx embedding output \(\['x'\]\)"):
        d.embed(tmp_path / "a.txt", minilm_dir, output=out, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["x"]


def test_shard_name_is_order_independent() -> None:
    a = io.shard_name(["f", "f", "g"], [3, 1, 0])
    assert a == io.shard_name(["g", "f", "f"], [0, 3, 1])
    assert a != io.shard_name(["f", "f", "g"], [3, 2, 0])


@pytest.mark.parametrize("fmt", ["parquet", "npy"])
def test_finish_removes_orphans_and_catches_duplicates(tmp_path: Path, fmt: str) -> None:
    emb = np.arange(12, dtype=np.float32).reshape(3, 4)
    recs = []
    for src, rows in (("a", [0, 1]), ("b", [5])):
        name = io.shard_name([src] * len(rows), rows)
        files = io.write_shard(tmp_path, name, fmt, [src] * len(rows), rows, emb[: len(rows)])
        recs.append({"name": name, "files": files, "rows": len(rows), "units": {src: [2, 2]}})
    recs[1]["units"] = {"b": [1, 1]}
    # a killed attempt's shard (rows that a retry regrouped into recs[0])
    io.write_shard(tmp_path, "part-orphan", fmt, ["a"], [1], emb[:1])
    assert _finish(tmp_path, recs, fmt, 3, verify=True) == (1 if fmt == "parquet" else 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f for r in recs for f in r["files"])
    assert not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(DistributedError, match=r"'a': 4 rows written, 2 read"):
        _finish(tmp_path, [recs[0], dict(recs[0], name="x")], fmt, None, verify=False)
    with pytest.raises(DistributedError, match="3 rows but 2 distinct ids"):
        dup = dict(recs[1], units={"a": [0, 2]}, files=recs[0]["files"], rows=1)
        _finish(tmp_path, [recs[0], dict(dup, name="y")], fmt, None, verify=True)


# ---- on a local Ray cluster ------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    """A head node and two worker nodes (one CPU each) on this machine; always shut down."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    try:
        for _ in range(2):
            c.add_node(num_cpus=1)
        c.wait_for_nodes(timeout=60)
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory, minilm_dir: Path):
    from rlx.models import SentenceEncoder

    root = tmp_path_factory.mktemp("corpus")
    want = corpus(root)
    keys = sorted(want)
    ref = SentenceEncoder(minilm_dir, num_threads=1).encode([want[k] for k in keys], progress=False)
    return root, keys, ref


def check_output(out: Path, keys: list[tuple[str, int]], ref: np.ndarray) -> None:
    """Every expected row exactly once (in the shards themselves, not only the manifest)
    and its embedding equal to the single-process one within f32 noise."""
    man = io.read_manifest(out)
    files = {f for s in man["shards"] for f in s["files"]}
    assert {p.name for p in out.iterdir()} == files | {io.MANIFEST}
    ids = [io.read_ids(out, s, man["shard_format"]) for s in man["shards"]]
    pairs = [(str(s), int(r)) for src, row in ids for s, r in zip(src, row)]
    assert len(pairs) == len(set(pairs)) == len(keys)
    assert sorted(pairs) == keys
    got = io.read_embeddings(out)
    assert [(str(s), int(r)) for s, r in zip(got.source, got.row)] == keys
    np.testing.assert_allclose(got.embedding, ref, rtol=0, atol=2e-5)


@pytest.mark.slow
def test_embed_on_cluster_every_row_once(cluster, data, minilm_dir, tmp_path) -> None:
    import rlx.distributed as d

    root, keys, ref = data
    res = d.embed(
        root, minilm_dir, output=tmp_path / "out", shard_rows=16, batch_size=8,
        num_actors=2, address=cluster.address, timeout_s=100,
    )  # fmt: skip
    assert res.rows == len(keys) and res.dim == 384 and res.orphans == 0
    assert len(res.pids) == 2  # both actors wrote shards
    check_output(res.output, keys, ref)


@pytest.mark.slow
def test_killed_worker_is_retried(cluster, data, minilm_dir, tmp_path) -> None:
    import rlx.distributed as d

    root, keys, ref = data
    killed: list[int] = []

    def kill_first_writer(rec: dict) -> None:
        if not killed:
            killed.append(rec["pid"])
            os.kill(rec["pid"], signal.SIGKILL)

    res = d.embed(
        root, minilm_dir, output=tmp_path / "out", shard_rows=16, batch_size=8, fmt="npy",
        num_actors=2, address=cluster.address, on_shard=kill_first_writer, timeout_s=100,
    )  # fmt: skip
    assert killed and res.rows == len(keys)
    # the killed actor was restarted (a new process) and ran its retried task: two
    # original actors plus the restart wrote shards
    assert len(res.pids) >= 3 and killed[0] in res.pids
    check_output(res.output, keys, ref)


@pytest.mark.slow
def test_embed_a_ray_dataset(cluster, data, minilm_dir, tmp_path) -> None:
    import ray

    import rlx.distributed as d

    root, keys, ref = data
    texts = io.read_unit(io.plan_units(root / "part0.txt")[0])
    n = len(texts["row"])
    want = [i for i, k in enumerate(keys) if k[0] == str(root / "part0.txt")]
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        ds = ray.data.from_items(
            [{"id": r, "text": t} for r, t in zip(texts["row"], texts["text"])]
        )
        with pytest.raises(InputError, match="integer id column 'key'"):
            d.embed(ds, minilm_dir, output=tmp_path / "bad", id_column="key")
        res = d.embed(ds, minilm_dir, output=tmp_path / "out", shard_rows=16, timeout_s=60)
        bad = ray.data.from_items([{"id": 0, "text": "fine"}, {"id": 1, "text": None}])
        with pytest.raises(DistributedError, match="Ray pipeline failed.*[Ff]ield text"):
            d.embed(bad, minilm_dir, output=tmp_path / "bad", timeout_s=60)
        assert ray.is_initialized()  # the caller's session is left running
    finally:
        ray.shutdown()
    got = io.read_embeddings(res.output)
    assert res.rows == n and list(got.row) == texts["row"] and set(got.source) == {""}
    np.testing.assert_allclose(got.embedding, ref[want], rtol=0, atol=2e-5)


@pytest.mark.slow
def test_cli_embed_ray(cluster, data, minilm_dir, tmp_path, capsys) -> None:
    from rlx.cli import main

    root, keys, ref = data
    out = tmp_path / "out"
    argv = ["embed", str(minilm_dir), "--ray", "-i", str(root), "--out", str(out)]
    assert main(argv + ["--ray-address", cluster.address, "--shard-rows", "128"]) == 0
    assert f"embedded {len(keys)} row(s)" in capsys.readouterr().out
    check_output(out, keys, ref)
    assert main(argv) == 1  # out is not empty: a one-line error, nothing changed
    assert "is not empty (pass overwrite=True)" in capsys.readouterr().err
    check_output(out, keys, ref)
