"""What a new input shape costs, and the memory of encoding a corpus (issue 13 "a new
input shape must be cheap", issue 20's peak RSS), written to benchmarks/results/BENCHMARKS_shapes.md.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/shapes.py \\
        [--threads 1] [--sentences 2000] [--out benchmarks/results/BENCHMARKS_shapes.md] [--src DIR ...]

Measures, each in its own process, for each rlx source tree given with ``--src`` (default:
this checkout; give an older checkout's directory to compare before / after):

1. ``new``: the MiniLM-sized synthetic encoder (symbolic batch and seq) and the real
   all-MiniLM-L6-v2 sentence graph (``SentenceEncoder``): for 40 bindings never seen,
   the first ``run`` minus a repeated ``run`` of the same inputs (median), and building
   the schedule alone (``CompiledGraph._executor``, median);
2. ``evict``: the real model, cycling batch 4 through twice as many lengths as the
   CompiledGraph keeps schedules (``max_shape_plans``) for 3 rounds: median and max of
   the first run minus a repeated one, per round (round 1+ are re-creations);
3. ``encode``: ``SentenceEncoder.encode`` of ``--sentences`` generated sentences (the
   generator of benchmarks/embed.py, batch 32): seconds and peak RSS (``ru_maxrss``) of
   the process, which loads nothing else.

The machine may be shared (load average recorded): medians over many shapes.
"""

from __future__ import annotations

import _common  # first: re-executes without the OpenBLAS pins (before NumPy loads)

if __name__ == "__main__":
    _common.reexec_without_blas_pins()

import argparse  # noqa: E402
import datetime as _dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent

WORKER = r"""
import json, resource, statistics, sys, time
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, sys.argv[2])
import numpy as np
from rlx.models import SentenceEncoder, encoder, random_params
from rlx.models.known import resolve
from rlx.options import CompileOptions
from rlx.runtime.session import Session
from rlx.shape import Sym
what, threads, n_sent = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
out = {}

def new_shape_costs(cg, feed, shapes):
    extra, build = [], []
    for b, s in shapes:
        f = feed(b, s)
        t0 = time.perf_counter(); cg.run(f); t1 = time.perf_counter(); cg.run(f)
        t2 = time.perf_counter()
        extra.append((t1 - t0) - (t2 - t1))
    for b, s in shapes:  # the schedule build alone, at bindings never seen
        t0 = time.perf_counter(); cg._executor({"batch": b + 100, "seq": s}); build.append(time.perf_counter() - t0)
    return statistics.median(extra) * 1e3, statistics.median(build) * 1e3, min(build) * 1e3

if what == "new":
    g = encoder(batch=Sym("batch"), seq=Sym("seq"))
    cg = Session("cpu").compile(g, CompileOptions(num_threads=threads, max_shape_plans=1024), params=random_params(g))
    cg.run({"x": np.zeros((2, 16, 384), np.float32)})
    shapes = [(1 + k % 4, 5 + 3 * k) for k in range(40)]
    out["synthetic"] = new_shape_costs(cg, lambda b, s: {"x": np.ones((b, s, 384), np.float32)}, shapes)

def hf():
    enc = SentenceEncoder(resolve("all-MiniLM-L6-v2"), num_threads=threads)
    cg = enc.compiled
    def feed(b, s):
        ids = np.full((b, s), 2023, np.int64); ids[:, 0] = 101; ids[:, -1] = 102
        f = {"input_ids": ids, "attention_mask": np.ones((b, s), np.int64), "token_type_ids": np.zeros((b, s), np.int64)}
        return {k: v for k, v in f.items() if k in cg.input_names}
    return enc, cg, feed

if what == "new":
    enc, cg, feed = hf()
    cg.run(feed(2, 16))
    shapes = [(1 + k % 4, 5 + 3 * k) for k in range(40)]
    out["minilm"] = new_shape_costs(cg, feed, shapes)
elif what == "evict":
    enc, cg, feed = hf()
    keep = cg.options.max_shape_plans
    lengths = [20 + 2 * k for k in range(2 * keep)]
    rounds = []
    for r in range(3):
        extra = []
        for s in lengths:
            f = feed(4, s)
            t0 = time.perf_counter(); cg.run(f); t1 = time.perf_counter(); cg.run(f)
            t2 = time.perf_counter()
            extra.append(((t1 - t0) - (t2 - t1)) * 1e3)
        rounds.append((statistics.median(extra), max(extra)))
    out["evict"] = {"max_shape_plans": keep, "lengths": len(lengths), "rounds": rounds}
elif what == "encode":
    sys.path.insert(0, sys.argv[6])
    from embed import sentences
    texts = sentences(n_sent)
    enc, cg, feed = hf()
    t0 = time.perf_counter()
    emb = enc.encode(texts, batch_size=32, progress=False)
    out["encode"] = {"seconds": time.perf_counter() - t0, "rows": int(emb.shape[0]),
                     "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
print("RESULT " + json.dumps(out))
"""


def run(src: Path, what: str, threads: int, n_sent: int) -> dict:
    """One worker process on the rlx tree ``src``; its JSON result."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    }
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-c", WORKER, str(src), str(HERE), what, str(threads), str(n_sent)]
    cmd.append(str(src / "benchmarks"))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if r.returncode or line is None:
        raise SystemExit(f"worker {what} on {src} failed:\n{r.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def git_rev(src: Path) -> str:
    r = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return r.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", nargs="*", type=Path, default=[HERE.parent])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sentences", type=int, default=2000)
    ap.add_argument("--out", default=str(_common.RESULTS / "BENCHMARKS_shapes.md"))
    ap.add_argument("--what", nargs="*", default=["new", "evict", "encode"])
    args = ap.parse_args()
    load = os.getloadavg()[0]
    rows = []
    for src in args.src:
        res = {}
        for what in args.what:
            res.update(run(src.resolve(), what, args.threads, args.sentences))
        rows.append((src, git_rev(src), res))
        print(src, json.dumps(res), flush=True)
    if sorted(args.what) != ["encode", "evict", "new"]:
        return  # a partial run: the JSON lines above, no table
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# New input shapes and encode memory",
        "",
        f"Command: `python benchmarks/shapes.py --threads {args.threads} --sentences "
        f"{args.sentences}` ({now}); {os.cpu_count()} logical CPUs, load average {load:.1f} at "
        "the start; each measurement in its own process.",
        "",
        "| rlx tree (commit) | synthetic encoder: new shape extra / schedule build (min) | "
        "all-MiniLM-L6-v2: new shape extra / schedule build (min) | evicted lengths re-run "
        "(median / max extra, rounds 0, 1, 2) | encode: s / peak RSS MB |",
        "|---|---|---|---|---|",
    ]
    for src, rev, r in rows:
        ev = r["evict"]
        rounds = ", ".join(f"{m:.1f} / {x:.1f}" for m, x in ev["rounds"])
        lines.append(
            f"| {src.name} ({rev}) | {r['synthetic'][0]:.1f} / {r['synthetic'][1]:.1f} "
            f"({r['synthetic'][2]:.1f}) ms | {r['minilm'][0]:.1f} / {r['minilm'][1]:.1f} "
            f"({r['minilm'][2]:.1f}) ms | {rounds} ms "
            f"({ev['lengths']} lengths, {ev['max_shape_plans']} kept) | "
            f"{r['encode']['seconds']:.1f} s / {r['encode']['maxrss_mb']:.0f} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
