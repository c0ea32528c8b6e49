"""Training step time and memory: rlx TrainStep vs PyTorch eager vs torch.compile (issue 16).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/train.py \\
        [--cases mlp_digits mlp_large minilm] [--threads 1 2] [--rounds 5] \\
        [--out benchmarks/results/BENCHMARKS_train.md]

Cases (seeded weights and batches, the same in every engine; one step = forward +
backward + AdamW update of every param, lr 1e-4, weight decay 0.01, cycling through 8
batches): ``mlp_digits`` 64 -> 256 -> 256 -> 10 ReLU MLP, batch 64, cross entropy;
``mlp_large`` 784 -> 1024 -> 1024 -> 10, batch 128; ``minilm`` the real all-MiniLM-L6-v2
(22.7 M params) with the multiple-negatives ranking loss on mean-pooled, normalized
embeddings, 16 rows (8 pairs) x 64 tokens.

Method: per thread count, one worker process per engine (``benchmarks/_train_worker.py``;
``torch.set_num_threads`` and rlx ``num_threads`` = threads, OMP / MKL / OpenBLAS thread
counts set, OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE removed). Each builds every case (the
first step timed: compile + run) and reports its first 3 losses (compared across engines)
and its memory (see the worker's docstring: RSS deltas read from /proc, peak through
VmHWM after clear_refs, and the engine's own count of its state). Then ``--rounds``
interleaved rounds (the engine that starts rotates) time ``inner`` steps per case after one
untimed step. Reported: median ms per step, rlx / best-of-torch from the same run, CPU flags,
load average and the BLAS / OpenMP pools each process loaded (threadpoolctl).
"""

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
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = _common.ROOT
WORKER = Path(__file__).resolve().parent / "_train_worker.py"
ENGINES = ("rlx", "eager", "compile")
CASES = ("mlp_digits", "mlp_large", "minilm")
INNER = {"mlp_digits": 100, "mlp_large": 20, "minilm": 2}


def start(engine: str, threads: int, log: Path) -> _common.Worker:
    env = {k: v for k, v in os.environ.items() if k not in _common.BLAS_PINS}
    n = str(threads)
    env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n)
    cmd = [sys.executable, str(WORKER), "--engine", engine, "--threads", n]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
        env=env, cwd=str(ROOT),
    )  # fmt: skip
    return _common.Worker(engine, proc)


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = text.splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if "model name" in ln), "")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    keep = [f for f in flags if f.startswith(("avx", "fma", "amx"))]
    return f"{model}; {' '.join(sorted(keep))}"


def run(cases: list[str], threads: int, rounds: int, logdir: Path) -> dict[str, Any]:
    load = [os.getloadavg()[0]]
    workers = {e: start(e, threads, logdir / f"train_{e}_{threads}t.log") for e in ENGINES}
    built: dict[tuple[str, str], dict[str, Any]] = {}
    errors: dict[str, str] = {}
    for c in cases:
        for e, w in workers.items():
            r = w.ask({"op": "build", "case": c})
            if r["ok"]:
                built[(e, c)] = r
            else:
                errors[f"{e}/{c}"] = r["error"]
                w.error = None  # a failed case does not stop the worker's other cases
    ms: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        order = ENGINES[r % 3 :] + ENGINES[: r % 3]
        for e in order:
            for c in cases:
                if (e, c) not in built:
                    continue
                rep = workers[e].ask({"op": "time", "case": c, "inner": INNER[c]})
                if rep["ok"]:
                    ms.setdefault((e, c), []).append(rep["ms"])
                else:
                    errors[f"{e}/{c} time"] = rep["error"]
                    workers[e].error = None
            time.sleep(0.05)
    pools = {e: workers[e].ask({"op": "stats"}) for e in ENGINES}
    for w in workers.values():
        w.close()
    load.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in ms.items()}
    return {"load": load, "built": built, "med": med, "errors": errors, "pools": pools}


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def report(res: dict[int, dict[str, Any]], cases: list[str], rounds: int) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Training step: rlx vs PyTorch eager vs torch.compile",
        "",
        "Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python "
        "benchmarks/train.py --out benchmarks/results/BENCHMARKS_train.md` (cases and method: the script's "
        "docstring; where rlx's time goes: `benchmarks/train_profile.py`).",
        "",
        "## Step time",
        "",
        f"`benchmarks/train.py`, {now}, {rounds} interleaved rounds, median ms per training "
        "step (forward + backward + AdamW).",
        f"CPU: {cpu_flags()}; {os.cpu_count()} logical CPUs (shared VM, noisy).",
        "",
        "| threads | case | rlx ms | eager ms | compile ms | rlx / best torch |",
        "|---|---|---|---|---|---|",
    ]
    for t, r in res.items():
        for c in cases:
            v = {e: r["med"].get((e, c)) for e in ENGINES}
            torch_best = min((x for e, x in v.items() if e != "rlx" and x), default=None)
            ratio = v["rlx"] / torch_best if v["rlx"] and torch_best else None
            out.append(
                f"| {t} | {c} | {_f(v['rlx'])} | {_f(v['eager'])} | {_f(v['compile'])} "
                f"| {_f(ratio)} |"
            )
    out += [
        "",
        "## Memory (MiB) and first losses",
        "",
        "resident = RSS after the warm-up steps minus RSS before the build; step peak = peak "
        "RSS (VmHWM, reset through /proc/self/clear_refs) during 3 steps minus RSS before "
        "the build; state = what the engine counts (torch: params + grads + AdamW state "
        "tensors; rlx: the compiled step's planned arena + params + optimizer state).",
        "",
        "| threads | case | engine | first step s | resident | step peak | state | losses 1-3 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t, r in res.items():
        for c in cases:
            for e in ENGINES:
                b = r["built"].get((e, c))
                if b is None:
                    continue
                losses = ", ".join(f"{x:.6f}" for x in b["losses"])
                out.append(
                    f"| {t} | {c} | {e} | {_f(b['first_s'])} | {_f(b['resident_mb'], '{:.1f}')} "
                    f"| {_f(b['step_peak_mb'], '{:.1f}')} | {_f(b['state_mb'], '{:.1f}')} "
                    f"| {losses} |"
                )
    loads = ", ".join(
        f"{t} threads {r['load'][0]:.2f} -> {r['load'][1]:.2f}" for t, r in res.items()
    )
    out += ["", f"1-minute load average at the start -> end of each part: {loads}."]
    for t, r in res.items():
        if r["errors"]:
            out += ["", f"Errors at {t} threads:"]
            out += [f"- {k}: {v}" for k, v in r["errors"].items()]
        out += ["", f"Pools at {t} threads (threadpoolctl):"]
        for e, p in r["pools"].items():
            pools = ", ".join(
                f"{q['internal_api']} {q['num_threads']}t {q.get('architecture') or ''}".strip()
                for q in p.get("pools", [])
            )
            out.append(f"- {e}: {pools}; versions {p.get('versions')}")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--logdir", type=Path, default=Path("/tmp"))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    res = {}
    for t in a.threads:
        res[t] = run(a.cases, t, a.rounds, a.logdir)
        print(f"threads {t} done: {json.dumps({str(k): v for k, v in res[t]['med'].items()})}")
    text = report(res, a.cases, a.rounds)
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
