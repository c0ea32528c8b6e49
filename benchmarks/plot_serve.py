"""Throughput and p99 latency against concurrency, from benchmarks/serve.py's saved JSON.

    python benchmarks/plot_serve.py [--results benchmarks/results] [--out serve_embeddings.png]

Needs matplotlib (not a dependency of rlx: run it from any venv that has it, e.g.
``python3 -m venv /tmp/plot && /tmp/plot/bin/pip install matplotlib``). Reads
``serve_embeddings.json`` (one line per server: requests/s and p99 ms at each
concurrency) and, when present, ``serve_generation.json`` (a bar per server: aggregate
tokens/s and p50 time to first token). Only the standard library and matplotlib are
imported, so it runs outside the project's venv.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def series(rec: dict[str, Any]) -> tuple[list[int], list[float], list[float]]:
    """concurrency levels, median requests/s over rounds, p99 ms over pooled requests."""
    by: dict[int, list[dict[str, Any]]] = {}
    for rnd in rec["rounds"]:
        for s in rnd:
            by.setdefault(int(s["concurrency"]), []).append(s)
    cs = sorted(by)
    rps = [statistics.median(s["throughput_rps"] for s in by[c]) for c in cs]
    p99 = [_pct([x for s in by[c] for x in s["latencies_ms"]], 99) for c in cs]
    return cs, rps, p99


def plot_embeddings(d: dict[str, Any], out: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rec in d["engines"].items():
        cs, rps, p99 = series(rec)
        ax1.plot(cs, rps, marker="o", label=name)
        ax2.plot(cs, p99, marker="o", label=name)
    for ax, title in ((ax1, "throughput (requests/s)"), (ax2, "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    ax2.set_yscale("log")
    ax1.legend()
    fig.suptitle(f"all-MiniLM-L6-v2 embeddings, {d['threads']} threads, {d['date']}")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    print(f"wrote {out}")


def plot_generation(d: dict[str, Any], out: Path) -> None:
    names = list(d["engines"])
    tps = [statistics.median(s["tokens_per_s"] for r in d["engines"][n]["rounds"] for s in r)
           for n in names]  # fmt: skip
    ttft = [statistics.median(s["ttft_p50_ms"] for r in d["engines"][n]["rounds"] for s in r)
            for n in names]  # fmt: skip
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(names, tps)
    ax1.set_title("aggregate tokens/s")
    ax2.bar(names, ttft)
    ax2.set_title("p50 time to first token (ms)")
    fig.suptitle(f"gemma3-270m Q4_K_M, streaming, {d['threads']} threads, {d['date']}")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--out", type=Path, default=Path("serve_embeddings.png"))
    ap.add_argument("--out-generation", type=Path, default=Path("serve_generation.png"))
    a = ap.parse_args()
    emb = a.results / "serve_embeddings.json"
    if not emb.exists():
        raise SystemExit(f"no {emb}: run benchmarks/serve.py embeddings first")
    plot_embeddings(json.loads(emb.read_text()), a.out)
    gen = a.results / "serve_generation.json"
    if gen.exists():
        plot_generation(json.loads(gen.read_text()), a.out_generation)


if __name__ == "__main__":
    main()
