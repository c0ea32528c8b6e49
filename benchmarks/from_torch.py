"""rlx.from_torch vs PyTorch eager vs torch.compile on the same modules (issue 17).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/from_torch.py \\
        [--models mlp bert] [--threads 1 2] [--rounds 7] [--out benchmarks/results/BENCHMARKS_from_torch.md]

Models (seeded random weights, the same in every engine): an MLP 512 -> 1024 -> 1024 -> 16
with GELU at batch 1 and 64, and a BERT encoder (transformers BertModel: 4 layers, hidden
256, 4 heads, FFN 1024) at 1 x 128 and 8 x 128 tokens with an attention mask (half the
batch padded). rlx imports each once with a dynamic batch, so one compiled graph serves
both shapes.

Method: per thread count, one worker process per engine (``benchmarks/_torch_worker.py``;
``torch.set_num_threads`` and rlx ``num_threads`` = threads, OMP / MKL / OpenBLAS thread
counts set, OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE removed). Each builds every case (the
first call timed: rlx import + compile + run, torch.compile's compile + run, eager's run)
and saves its outputs, compared with eager's. Then ``--rounds`` interleaved rounds (the
engine that starts rotates) time ``inner`` calls per case after one untimed call.
Reported: median ms per call, the ratios rlx / eager and rlx / torch.compile from the same
run, the max abs difference to eager, the first-call seconds, CPU flags and the BLAS /
OpenMP pools each process loaded (threadpoolctl)."""

from __future__ import annotations

import _common  # noqa: F401  (puts the repository on sys.path; import before NumPy)

_common.reexec_without_blas_pins()

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = _common.ROOT
WORKER = Path(__file__).resolve().parent / "_torch_worker.py"
ENGINES = ("rlx", "eager", "compile")
SHAPES = {"mlp": [[1, 0], [64, 0]], "bert": [[1, 128], [8, 128]]}
INNER = {"mlp_1x0": 400, "mlp_64x0": 100, "bert_1x128": 40, "bert_8x128": 10}


class Worker:
    def __init__(self, engine: str, threads: int, work: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _common.BLAS_PINS}
        n = str(threads)
        env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n)
        self.engine = engine
        self.log = open(work / f"log_{engine}_{threads}t.txt", "w")  # noqa: SIM115
        cmd = [sys.executable, str(WORKER), "--engine", engine, "--threads", n, "--work", str(work)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=env, cwd=str(ROOT),
        )  # fmt: skip

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"ok": False, "error": "worker exited"}

    def close(self) -> None:
        try:
            self.ask({"op": "quit"})
        except (OSError, ValueError):
            pass
        self.proc.wait(timeout=60)


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if "model name" in ln), ""
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    keep = [f for f in flags if f.startswith(("avx", "fma", "amx"))]
    return f"{model}; {' '.join(sorted(keep))}"


def run(models: list[str], threads: int, rounds: int, work: Path) -> dict[str, Any]:
    load = [os.getloadavg()[0]]
    workers = {e: Worker(e, threads, work) for e in ENGINES}
    first: dict[tuple[str, str], float] = {}
    errors: dict[str, str] = {}
    for m in models:
        for e, w in workers.items():
            r = w.ask({"op": "build", "model": m, "shapes": SHAPES[m]})
            if r["ok"]:
                first[(e, m)] = r["first_s"]
            else:
                errors[f"{e}/{m}"] = r["error"]
    cases = [f"{m}_{b}x{s}" for m in models for b, s in SHAPES[m]]
    ms: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        order = ENGINES[r % 3 :] + ENGINES[: r % 3]
        for e in order:
            for c in cases:
                if f"{e}/{c.split('_')[0]}" in errors:
                    continue
                rep = workers[e].ask({"op": "time", "case": c, "inner": INNER[c]})
                if rep["ok"]:
                    ms.setdefault((e, c), []).append(rep["ms"])
            time.sleep(0.05)
    pools = {e: workers[e].ask({"op": "stats"}) for e in ENGINES}
    for w in workers.values():
        w.close()
    diff = {}
    for e in ("rlx", "compile"):
        for c in cases:
            a = work / f"out_{e}_{c}_{threads}t.npy"
            b = work / f"out_eager_{c}_{threads}t.npy"
            if a.exists() and b.exists():
                diff[(e, c)] = float(np.abs(np.load(a) - np.load(b)).max())
    med = {k: statistics.median(v) for k, v in ms.items()}
    load.append(os.getloadavg()[0])
    return {
        "load": load,
        "first": first,
        "med": med,
        "diff": diff,
        "errors": errors,
        "pools": pools,
        "cases": cases,
    }


def report(res: dict[int, dict[str, Any]], rounds: int) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# rlx.from_torch vs PyTorch eager vs torch.compile",
        "",
        f"`benchmarks/from_torch.py`, {now}, {rounds} interleaved rounds, median ms per call.",
        f"CPU: {cpu_flags()}; {os.cpu_count()} logical CPUs (shared VM, noisy).",
        "",
        "| threads | case | rlx ms | eager ms | compile ms | rlx/eager | rlx/compile "
        "| max abs diff rlx (compile) vs eager |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t, r in res.items():
        for c in r["cases"]:
            v = {e: r["med"].get((e, c)) for e in ENGINES}
            f = {e: (f"{x:.3f}" if x is not None else "-") for e, x in v.items()}
            ratio = [
                f"{v['rlx'] / v[o]:.2f}" if v["rlx"] and v[o] else "-" for o in ("eager", "compile")
            ]
            d = r["diff"]
            dd = (
                f"{d.get(('rlx', c), float('nan')):.1e} ({d.get(('compile', c), float('nan')):.1e})"
            )
            lines.append(
                f"| {t} | {c} | {f['rlx']} | {f['eager']} | {f['compile']} | {ratio[0]} "
                f"| {ratio[1]} | {dd} |"
            )
    lines += [
        "",
        "First call (s): rlx = from_torch + compile + run; compile = torch.compile + run.",
        "",
    ]
    lines += ["| threads | model | rlx | eager | torch.compile |", "|---|---|---|---|---|"]
    for t, r in res.items():
        for m in sorted({c.split("_")[0] for c in r["cases"]}):
            v = [r["first"].get((e, m)) for e in ENGINES]
            lines.append(f"| {t} | {m} | " + " | ".join(f"{x:.2f}" if x else "-" for x in v) + " |")
    loads = ", ".join(
        f"{t} threads {r['load'][0]:.1f} -> {r['load'][1]:.1f}" for t, r in res.items()
    )
    lines += ["", f"1-minute load average at the start -> end of each part: {loads}."]
    for t, r in res.items():
        if r["errors"]:
            lines += ["", f"Errors at {t} threads: {r['errors']}"]
        lines += ["", f"Pools at {t} threads (threadpoolctl):"]
        for e, p in r["pools"].items():
            pools = ", ".join(
                f"{q['internal_api']} {q['num_threads']}t {q.get('architecture') or ''}".strip()
                for q in p.get("pools", [])
            )
            lines.append(f"- {e}: {pools}")
    vers = next(iter(res.values()))["pools"]["rlx"]
    lines += [
        "",
        f"Versions: torch {vers.get('torch')}, numpy {vers.get('numpy')}, rlx {vers.get('rlx')}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "bert"], choices=sorted(SHAPES))
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    res = {}
    with tempfile.TemporaryDirectory(prefix="rlx_from_torch_") as d:
        for t in a.threads:
            res[t] = run(a.models, t, a.rounds, Path(d))
            print(f"threads {t} done", flush=True)
    text = report(res, a.rounds)
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
