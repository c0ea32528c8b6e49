"""The Markdown of benchmarks/serve.py (``BENCHMARKS_serve.md``) from the saved JSON
(``serve_embeddings.json``, ``serve_generation.json``); a missing file is reported as not
run. Several rounds: the median throughput per level, latency percentiles over the pooled
requests of every round."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from _load import percentile


def _levels(rec: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """concurrency -> merged summary over rounds."""
    by: dict[int, list[dict[str, Any]]] = {}
    for rnd in rec["rounds"]:
        for s in rnd:
            by.setdefault(int(s["concurrency"]), []).append(s)
    out = {}
    for c, ss in sorted(by.items()):
        lat = [x for s in ss for x in s.get("latencies_ms", [])]
        m: dict[str, Any] = {
            "rps": statistics.median(s["throughput_rps"] for s in ss),
            "p50": percentile(lat, 50),
            "p99": percentile(lat, 99),
            "errors": sum(s["errors"] for s in ss),
            "n": sum(s["ok"] for s in ss),
        }
        if "server_cpu_ms_per_request" in ss[0]:
            m["cpu_ms"] = statistics.median(s["server_cpu_ms_per_request"] for s in ss)
            m["cpus"] = statistics.median(s["server_cpu_share"] for s in ss)
            m["cpu_s"] = sum(s["server_cpu_s"] for s in ss)
        if "tokens_per_s" in ss[0]:
            m["tps"] = statistics.median(s["tokens_per_s"] for s in ss)
            m["tokens"] = sum(s["tokens"] for s in ss)
            m["ttft50"] = statistics.median(s["ttft_p50_ms"] for s in ss)
            m["ttft99"] = max(s["ttft_p99_ms"] for s in ss)
        out[c] = m
    return out


def _machine(d: dict[str, Any]) -> list[str]:
    lines = [
        f"- Command: `{d['command']}`",
        f"- Date: {d['date']}; threads per server: {d['threads']}",
        f"- CPU (lscpu): {d['machine']['cpu']}; {d['machine']['cpus']} logical CPUs, shared "
        "with other jobs during the run (the load generator runs on the same 2 CPUs)",
    ]
    native = d["machine"].get("native") or {}
    if native:
        isa = "; ".join(f"{k}: {v}" for k, v in native.items())
        lines.append(f"- rlx native code (`rlx info`): {isa}")
    pins = d.get("removed_blas_pins") or {}
    lines.append(
        "- OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE: "
        + (f"removed ({pins})" if pins else "not set (unset by the command)")
    )
    for name, rec in d["engines"].items():
        pools = "; ".join(
            f"{p.get('internal_api')} {p.get('version')} kernel {p.get('architecture')} "
            f"({Path(str(p.get('filepath'))).name}, {p.get('num_threads')} threads)"
            if "error" not in p
            else f"probe failed: {p['error'].strip().splitlines()[-1]}"
            for p in rec.get("pools", [])
        )
        libs = ", ".join(rec.get("libraries", []))
        lines.append(
            f"- {name}: `{' '.join(rec.get('argv', []))}`; ready after "
            f"{rec.get('startup_s')} s; BLAS/OpenMP (threadpoolctl, same env): "
            f"{pools or 'none'}; mapped into the server: {libs or 'none'}"
        )
        if rec.get("system_info"):
            lines.append(f"  - {name} system info (llama.cpp's ISA paths): `{rec['system_info']}`")
    return lines


def embeddings_section(d: dict[str, Any]) -> list[str]:
    names = list(d["engines"])
    lv = {n: _levels(d["engines"][n]) for n in names}
    rlx = next((n for n in names if n.startswith("rlx")), None)
    peer = next((n for n in names if not n.startswith("rlx")), None)
    head = "| concurrency |"
    sep = "|---:|"
    for n in names:
        head += f" {n} req/s | p50 ms | p99 ms | errors | CPU ms/req | CPUs used |"
        sep += "---:|---:|---:|---:|---:|---:|"
    if rlx and peer:
        head += " rlx / peer |"
        sep += "---:|"
    rows = [head, sep]
    cs = sorted({c for n in names for c in lv[n]})
    for c in cs:
        row = f"| {c} |"
        for n in names:
            m = lv[n].get(c)
            row += (
                f" {m['rps']:.1f} | {m['p50']:.1f} | {m['p99']:.1f} | {m['errors']} |"
                f" {m.get('cpu_ms', float('nan')):.1f} | {m.get('cpus', float('nan')):.2f} |"
                if m
                else " - | - | - | - | - | - |"
            )
        if rlx and peer and c in lv[rlx] and c in lv[peer]:
            row += f" {lv[rlx][c]['rps'] / lv[peer][c]['rps']:.2f}x |"
        rows.append(row)
    out = [
        f"## Embeddings: all-MiniLM-L6-v2, one mixed-length sentence per request, "
        f"{d['threads']} thread(s) per server ({d['date']})",
        "",
    ]
    out += _machine(d) + ["", *rows, ""]
    if rlx and lv[rlx]:
        lo, hi = min(lv[rlx]), max(lv[rlx])
        scale = lv[rlx][hi]["rps"] / lv[rlx][lo]["rps"]
        ok = "met" if scale >= 3 else "NOT met"
        out.append(f"- rlx at concurrency {hi} / at {lo}: {scale:.2f}x (target >= 3x: {ok})")
        if peer and lv[peer]:
            both = [c for c in lv[rlx] if c in lv[peer]]
            best_r = max(lv[rlx][c]["rps"] for c in both)
            best_p = max(lv[peer][c]["rps"] for c in both)
            ratio_hi = lv[rlx][hi]["rps"] / lv[peer][hi]["rps"] if hi in lv[peer] else 0.0
            ok2 = "met" if best_r / best_p >= 1.25 else "NOT met"
            out.append(
                f"- rlx / {peer}: peak {best_r:.1f} vs {best_p:.1f} req/s = "
                f"{best_r / best_p:.2f}x; at concurrency {hi}: {ratio_hi:.2f}x "
                f"(target >= 1.25x: {ok2})"
            )
            eff = [
                f"{c}: {lv[peer][c]['cpu_ms'] / lv[rlx][c]['cpu_ms']:.2f}x"
                for c in both
                if lv[rlx][c].get("cpu_ms") and lv[peer][c].get("cpu_ms")
            ]
            if eff:
                out.append(
                    "- server CPU time per request, peer / rlx (> 1: rlx spends less CPU per "
                    "request; independent of how much of the shared machine each server got), "
                    "by concurrency: " + ", ".join(eff)
                )
    return out + [""]


def generation_section(d: dict[str, Any]) -> list[str]:
    names = list(d["engines"])
    rows = [
        "| server | streams | requests ok | errors | completion tokens | aggregate tok/s "
        "| TTFT p50 ms | TTFT p99 ms | request p50 ms | server CPU ms/token | CPUs used |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lv = {n: _levels(d["engines"][n]) for n in names}
    for n in names:
        for c, m in lv[n].items():
            rows.append(
                f"| {n} | {c} | {m['n']} | {m['errors']} | {m.get('tokens', 0)} | "
                f"{m.get('tps', 0):.1f} | {m.get('ttft50', float('nan')):.0f} | "
                f"{m.get('ttft99', float('nan')):.0f} | {m['p50']:.0f} | "
                f"{1e3 * m.get('cpu_s', float('nan')) / max(m.get('tokens', 0), 1):.1f} | "
                f"{m.get('cpus', float('nan')):.2f} |"
            )
    out = [
        f"## Generation: gemma3-270m Q4_K_M GGUF, streaming /v1/completions, greedy ({d['date']})",
        "",
    ]
    out += _machine(d) + ["", *rows, ""]
    rlx = next((n for n in names if n.startswith("rlx")), None)
    peer = next((n for n in names if not n.startswith("rlx")), None)
    if rlx and peer and lv[rlx] and lv[peer]:
        c = max(lv[rlx])
        r, p = lv[rlx][c], lv[peer].get(c)
        if p:
            ok = "met" if r.get("tps", 0) >= p.get("tps", 0) else "NOT met"
            ok2 = "met" if r.get("ttft50", 1e18) <= p.get("ttft50", 0) else "NOT met"
            out.append(
                f"- aggregate tokens/s rlx / {peer}: {r.get('tps', 0) / max(p.get('tps', 0), 1e-9):.2f}x "
                f"(target >= 1: {ok}); p50 TTFT {r.get('ttft50', 0):.0f} vs "
                f"{p.get('ttft50', 0):.0f} ms (target no worse: {ok2})"
            )
    return out + [""]


def write_report(results: Path, report: Path) -> None:
    parts = [
        "# Serving benchmarks: `rlx serve` vs sentence-transformers + FastAPI and "
        "llama-cpp-python's server",
        "",
        "Made by `benchmarks/serve.py` (see its docstring); plot: `benchmarks/plot_serve.py`. "
        "Raw results: `serve_*.json`. Each server runs in its own process; all of a table's "
        "servers are started first and sit idle while another is measured, and each level "
        "visits them in an order that rotates. The numbers of one table come from one run on "
        "a shared, noisy 2-vCPU machine: compare ratios within a table.",
        "",
    ]
    for kind, section in (("embeddings", embeddings_section), ("generation", generation_section)):
        paths = sorted(results.glob(f"serve_{kind}*.json"))
        for path in paths:
            parts += section(json.loads(path.read_text()))
            parts[-1:-1] = [f"(raw: `{path.name}`)"]
        if not paths:
            parts += [f"## {kind.capitalize()}", "", "Not run yet.", ""]
    notes = results / "serve_notes.md"  # the reading, written by hand after a run
    if notes.exists():
        parts += [notes.read_text()]
    report.write_text("\n".join(parts))
