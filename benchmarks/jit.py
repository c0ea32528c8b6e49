"""rlx.jit vs jax.jit vs torch.compile on the same functions, written to benchmarks/results/BENCHMARKS_jit.md.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/jit.py \\
        [--threads 1 2] [--rounds 15] [--out benchmarks/results/BENCHMARKS_jit.md]

Workloads (benchmarks/_jit_worker.py): a jitted MLP and a jitted pre-norm transformer
block (causal attention), each at a small (latency-bound) and a moderate size, taking
``(params, x)``. Engines: rlx.jit (.venv), jax.jit (the peer venv /tmp/rlx/peers, JAX is
never a dependency of rlx) and torch.compile (inductor, .venv).

Method. Steady state, per thread count: one worker process per engine (OMP / MKL /
OpenBLAS thread variables and XLA_FLAGS set for the count, no OPENBLAS_CORETYPE /
OPENBLAS_L2_SIZE), every workload compiled and warmed up; then rounds: each round visits
every workload and, for each, every engine once (the starting engine rotates), timing
``inner`` calls (chosen per workload for ~5 ms of the fastest engine's work) after one untimed call. The
figure is the median over rounds of the per-call time, with the best round beside it
(on a shared machine the best round is the one least disturbed by other jobs); ``ratio``
= rlx time / the best peer's (< 1: rlx faster). First call: a fresh process per engine and workload times the
first call (trace + compile + one run) with its disk caches warm (rlx's native kernel
cache, inductor's FX graph cache: a user's second session; JAX keeps none by default),
and again cold (an empty RLX_CACHE_DIR; TORCHINDUCTOR_FORCE_DISABLE_CACHES=1).
Outputs are cross-checked against rlx's (max abs difference).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _jit_worker import WORKLOADS  # noqa: E402
from peers import _cpu_facts, _xla_flags  # noqa: E402

PYTHON = {
    "rlx": str(ROOT / ".venv/bin/python"),
    "jax": "/tmp/rlx/peers/bin/python",
    "torch.compile": str(ROOT / ".venv/bin/python"),
}
ENGINES = list(PYTHON)
WORKER = str(ROOT / "benchmarks/_jit_worker.py")
INNER_TARGET_S = 0.005  # short rounds: on a loaded machine some escape preemption


def _env(threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    }
    n = str(threads)
    env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n)
    env["XLA_FLAGS"] = _xla_flags(threads)
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra or {})
    return env


def first_calls(threads: int) -> dict[str, dict[str, dict[str, float]]]:
    """workload -> engine -> {"warm": s, "cold": s, "diff": max abs diff vs rlx}."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for wl in WORKLOADS:
            res: dict[str, dict[str, float]] = {}
            ref = None
            for engine in ENGINES:
                row: dict[str, float] = {}
                for mode in ("warm", "cold"):
                    extra = {}
                    if mode == "cold":
                        cache = Path(tmp) / f"rlx-cache-{wl}"
                        cache.mkdir(exist_ok=True)
                        extra = {
                            "RLX_CACHE_DIR": str(cache),
                            "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",
                        }
                    path = Path(tmp) / f"{engine}-{wl}-{mode}.json"
                    cmd = [PYTHON[engine], WORKER, engine, str(threads), "first", wl, str(path)]
                    subprocess.run(cmd, env=_env(threads, extra), check=True, capture_output=True)
                    data = json.loads(path.read_text())
                    row[mode] = data["first_s"]
                    if mode == "warm":
                        if engine == "rlx":
                            ref = data["out"]
                        row["diff"] = max(
                            abs(a - b) for a, b in zip(ref or data["out"], data["out"])
                        )
                res[engine] = row
                print(f"first call {wl:14s} {engine:14s} warm {row['warm']:.3f} s cold {row['cold']:.3f} s", flush=True)  # fmt: skip
            out[wl] = res
    return out


def steady(threads: int, rounds: int) -> dict[str, dict[str, tuple[float, float]]]:
    """workload -> engine -> (median, best) seconds per call over interleaved rounds."""
    names = ",".join(WORKLOADS)
    procs = {}
    for engine in ENGINES:
        cmd = [PYTHON[engine], WORKER, engine, str(threads), "serve", names]
        procs[engine] = subprocess.Popen(
            cmd, env=_env(threads), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
    for engine, p in procs.items():
        line = p.stdout.readline().strip()  # type: ignore[union-attr]
        if line != "ready":
            raise RuntimeError(f"{engine} worker did not start: {line!r}")

    def ask(engine: str, wl: str, inner: int) -> float:
        p = procs[engine]
        p.stdin.write(f"{wl} {inner}\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
        return float(p.stdout.readline())  # type: ignore[union-attr]

    inner = {}
    for wl in WORKLOADS:
        probe = min(ask(e, wl, 3) for e in ENGINES)
        inner[wl] = max(3, min(5000, int(INNER_TARGET_S / max(probe, 1e-7))))
    times: dict[str, dict[str, list[float]]] = {wl: {e: [] for e in ENGINES} for wl in WORKLOADS}
    for r in range(rounds):
        order = ENGINES[r % len(ENGINES) :] + ENGINES[: r % len(ENGINES)]
        for wl in WORKLOADS:
            for engine in order:
                times[wl][engine].append(ask(engine, wl, inner[wl]))
    for p in procs.values():
        p.stdin.write("quit\n")  # type: ignore[union-attr]
        p.stdin.close()  # type: ignore[union-attr]
        p.wait()
    return {
        wl: {e: (statistics.median(v), min(v)) for e, v in d.items()} for wl, d in times.items()
    }


def _fmt_t(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _blas() -> str:
    code = (
        "import numpy, json, threadpoolctl; print(json.dumps([{k: i.get(k) for k in "
        "('internal_api','version','architecture')} for i in threadpoolctl.threadpool_info() "
        "if i.get('user_api') == 'blas']))"
    )
    r = subprocess.run([PYTHON["rlx"], "-c", code], env=_env(1), capture_output=True, text=True)
    return r.stdout.strip()


def _versions() -> str:
    code = "import {m}; print({m}.__version__)"
    parts = []
    for eng, mod in (("rlx", "rlx"), ("jax", "jax"), ("torch.compile", "torch")):
        r = subprocess.run([PYTHON[eng], "-c", code.format(m=mod)], capture_output=True, text=True)
        parts.append(f"{mod} {r.stdout.strip()} ({PYTHON[eng]})")
    return "; ".join(parts)


def report(args: argparse.Namespace, steady_res: dict, firsts: dict) -> str:
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# rlx.jit vs jax.jit vs torch.compile",
        "",
        f"Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/jit.py "
        f"--threads {' '.join(map(str, args.threads))} --rounds {args.rounds}`, run {now}.",
        "",
        f"- CPU (lscpu): {_cpu_facts()}; {os.cpu_count()} logical CPUs, shared with other "
        f"jobs (load average at start {args.load0[0]:.1f}, at end {os.getloadavg()[0]:.1f})",
        f"- BLAS (threadpoolctl, rlx's process): {_blas()}",
        f"- versions: {_versions()}",
        "- method: see the docstring of benchmarks/jit.py (own process per engine, rounds "
        "interleaved, median over rounds; ratio = rlx / best peer, < 1 means rlx is faster)",
        "",
        "Workloads: " + "; ".join(f"`{k}` {v}" for k, v in WORKLOADS.items()),
        "",
    ]
    for threads, res in steady_res.items():
        lines += [
            f"## Steady state, {threads} thread(s): time per call, median over rounds (best round)",
            "",
            "| workload | " + " | ".join(ENGINES) + " | rlx / best peer: median (best) |",
            "|---|" + "---|" * (len(ENGINES) + 1),
        ]
        for wl, d in res.items():
            peers = [e for e in ENGINES if e != "rlx"]
            med = d["rlx"][0] / min(d[e][0] for e in peers)
            best = d["rlx"][1] / min(d[e][1] for e in peers)
            cells = " | ".join(f"{_fmt_t(d[e][0])} ({_fmt_t(d[e][1])})" for e in ENGINES)
            lines.append(f"| {wl} | {cells} | {med:.2f} ({best:.2f}) |")
        lines.append("")
    for threads, res in firsts.items():
        lines += [
            f"## First call (trace + compile + run), {threads} thread(s), fresh process",
            "",
            "| workload | " + " | ".join(f"{e} warm / cold" for e in ENGINES)
            + " | rlx / torch.compile (warm, cold) | max abs diff vs rlx |",
            "|---|" + "---|" * (len(ENGINES) + 2),
        ]  # fmt: skip
        for wl, d in res.items():
            cells = " | ".join(f"{d[e]['warm']:.3f} s / {d[e]['cold']:.3f} s" for e in ENGINES)
            tc = d["torch.compile"]
            r = f"{d['rlx']['warm'] / tc['warm']:.2f}, {d['rlx']['cold'] / tc['cold']:.2f}"
            diffs = ", ".join(f"{e} {d[e]['diff']:.1e}" for e in ENGINES if e != "rlx")
            lines.append(f"| {wl} | {cells} | {r} | {diffs} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--first-threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results" / "BENCHMARKS_jit.md")
    args = ap.parse_args()
    args.load0 = os.getloadavg()
    steady_res = {}
    for n in args.threads:
        steady_res[n] = steady(n, args.rounds)
        for wl, d in steady_res[n].items():
            print(f"steady {n}T {wl:14s} " + "  ".join(f"{e} {_fmt_t(t[0])} ({_fmt_t(t[1])})" for e, t in d.items()), flush=True)  # fmt: skip
    firsts = {args.first_threads: first_calls(args.first_threads)}
    text = report(args, steady_res, firsts)
    args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
