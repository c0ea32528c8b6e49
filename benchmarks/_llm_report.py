"""The markdown report of benchmarks/llm.py. In: the argparse namespace, the per-round
worker results (``engine|threads`` -> list of dicts) and the model path. Out: the text."""

from __future__ import annotations

import os
import platform
import statistics
import sys

FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni")
FLAGS += ("amx_tile", "amx_int8")
FLAGS += ("asimd", "asimddp", "i8mm", "bf16", "sve")  # aarch64: its /proc/cpuinfo "Features"


def _cpu() -> tuple[str, str]:
    model, flags = platform.processor() or "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, " ".join(fl for fl in FLAGS if fl in flags)


def _med(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else None


def _span(rows: list[dict], key: str) -> str:
    vals = [r[key] for r in rows if key in r]
    if not vals:
        err = next((r["error"] for r in rows if "error" in r), "no result")
        return f"n/a ({err})"
    return f"{statistics.median(vals):.1f} ({min(vals):.1f}-{max(vals):.1f})"


def _prefill(rows: list[dict], n: int) -> list[float]:
    return [r["prefill"][str(n)] for r in rows if str(n) in r.get("prefill", {})]


def _pspan(rows: list[dict], n: int) -> str:
    vals = _prefill(rows, n) or ([r["prefill_tps"] for r in rows if "prefill_tps" in r]
                                 if n == 0 else [])  # fmt: skip
    if not vals:
        return "n/a"
    return f"{statistics.median(vals):.1f} ({min(vals):.1f}-{max(vals):.1f})"


def report(a, runs: dict[str, list[dict]], started: str, path: str) -> str:  # noqa: ANN001
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rlx.backends.cpu import native

    model, flags = _cpu()
    size = os.path.getsize(path)
    bw = {t: statistics.median(r[str(t)] for r in runs.get("stream", []) if str(t) in r)
          for t in a.threads} if runs.get("stream") else {}  # fmt: skip
    first = lambda key, field: next(  # noqa: E731
        (r[field] for rows in [runs.get(key, [])] for r in rows if field in r), "n/a"
    )
    lines = [
        f"## {os.path.basename(path)}: rlx vs llama-cpp-python vs PyTorch eager",
        "",
        "Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python "
        f"benchmarks/llm.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        "",
        f"Run {started} on {model} ({os.cpu_count()} logical CPUs; flags: {flags}); load "
        f"average at the end {os.getloadavg()[0]:.1f}. rlx native target: "
        f"{native.target_description()}. BLAS (threadpoolctl): rlx process "
        f"{first(f'rlx|{a.threads[0]}', 'blas')}; torch process "
        f"{first(f'torch|{a.threads[0]}', 'blas')} (torch {first(f'torch|{a.threads[0]}', 'version')}). "
        f"llama-cpp-python {first(f'llama|{a.threads[0]}', 'version')}: "
        f"`{first(f'llama|{a.threads[0]}', 'system_info')}`. "
        f"{a.rounds} rounds, engines interleaved, each (engine, threads) its own process; "
        f"median over rounds (min-max in brackets). Prompts of "
        f"{' and '.join(map(str, a.prompt_tokens))} tokens, "
        f"{a.decode_tokens} greedy decode steps. File: {size / 1e6:.1f} MB.",
        "",
        "Streaming read bandwidth: "
        + ", ".join(f"{bw[t]:.1f} GB/s on {t} thread(s)" for t in bw)
        + "; decode bound (file bytes / bandwidth): "
        + ", ".join(f"{bw[t] * 1e9 / size:.1f} tokens/s on {t}" for t in bw),
        "",
        "| threads | engine | decode tokens/s | "
        + " | ".join(f"prefill {n} tokens/s" for n in a.prompt_tokens)
        + " | decode / llama.cpp | "
        + " | ".join(f"prefill {n} / llama.cpp" for n in a.prompt_tokens)
        + " | decode / bound |",
        "|---|---|---|" + "---|" * (2 * len(a.prompt_tokens)) + "---|---|",
    ]
    for t in a.threads:
        ref = runs.get(f"llama|{t}", [])
        ld = _med(ref, "decode_tps")
        for e in ("rlx", "rlx-q8grp", "rlx-fma", "rlx-q8", "rlx-norepack", "llama", "torch"):
            rows = runs.get(f"{e}|{t}")
            if rows is None:
                continue
            d = _med(rows, "decode_tps")
            rd = f"{d / ld:.2f}" if d and ld else "n/a"
            pre, rp = [], []
            for i, n in enumerate(a.prompt_tokens):
                mine = _prefill(rows, n) or (
                    [r["prefill_tps"] for r in rows if "prefill_tps" in r] if i == 0 else []
                )
                theirs = _prefill(ref, n)
                p = statistics.median(mine) if mine else None
                lp = statistics.median(theirs) if theirs else None
                pre.append(
                    _pspan(rows, n) if _prefill(rows, n) else _pspan(rows, 0 if i == 0 else n)
                )
                rp.append(f"{p / lp:.2f}" if p and lp else "n/a")
            rb = f"{d / (bw[t] * 1e9 / size):.2f}" if d and t in bw else "n/a"
            name = {
                "rlx": "rlx", "rlx-q8": "rlx (RLX_DQ_ACT=q8)", "rlx-fma": "rlx (RLX_DQ_BF16=0)",
                "rlx-norepack": "rlx (RLX_DQ_REPACK=0)", "llama": "llama.cpp",
                "rlx-q8grp": "rlx (RLX_DQ_Q8_DIGITS=0)",
                "torch": "PyTorch eager",
            }[e]  # fmt: skip
            lines.append(
                f"| {t} | {name} | {_span(rows, 'decode_tps')} | {' | '.join(pre)} "
                f"| {rd} | {' | '.join(rp)} | {rb} |"
            )
    # GEMV seconds per step (rlx-split: each GEMV timed) over the untimed step's wall time
    fracs = {
        t: _med(runs[f"rlx-split|{t}"], "gemv_s_per_step") * _med(runs[f"rlx|{t}"], "decode_tps")
        for t in a.threads
        if runs.get(f"rlx-split|{t}") and runs.get(f"rlx|{t}")
        and _med(runs[f"rlx-split|{t}"], "gemv_s_per_step") and _med(runs[f"rlx|{t}"], "decode_tps")
    }  # fmt: skip
    if fracs:
        lines += [
            "",
            "rlx decode step (wall time of `model.step` + argmax, untimed run) spent in the "
            "packed GEMVs (their seconds per step from the `rlx-split` run, each GEMV timed): "
            + ", ".join(f"{f * 100:.0f} % on {t} thread(s)" for t, f in fracs.items())
            + "; outside the GEMVs: "
            + ", ".join(f"{(1 - f) * 100:.0f} % on {t} thread(s)" for t, f in fracs.items())
            + ".",
        ]
    if any(runs.get(f"gemv|{t}") for t in a.threads):
        act = first(f"gemv|{a.threads[0]}", "act")
        lines += [
            "",
            f"### Packed DequantMatMul at batch 1 vs the bandwidth bound (RLX_DQ_ACT={act})",
            "",
            "The GEMVs of one decode step (every 2-D tensor of the file, real bytes, in file "
            "order), summed per tensor type: time per step, bytes / time, time / (bytes / "
            "bandwidth of the same thread count). Target: x bound <= 1.5.",
            "",
            "| type | tensors | MB / step | "
            + " | ".join(f"{t}T ms | {t}T GB/s | {t}T x bound" for t in a.threads)
            + " |",
            "|---|---|---|" + "---|---|---|" * len(a.threads),
        ]
        rows0 = [r for r in runs[f"gemv|{a.threads[0]}"] if "types" in r]
        for ty in sorted(rows0[0]["types"], key=lambda k: -rows0[0]["types"][k]["bytes"]):
            nb = rows0[0]["types"][ty]["bytes"]
            cells = []
            for t in a.threads:
                vals = [r["types"][ty]["s"] for r in runs[f"gemv|{t}"] if "types" in r]
                s = statistics.median(vals)
                cells.append(f"{s * 1e3:.2f} | {nb / s / 1e9:.1f} | {s * bw[t] * 1e9 / nb:.2f}")
            lines.append(
                f"| {ty} | {rows0[0]['counts'][ty]} | {nb / 1e6:.1f} | " + " | ".join(cells) + " |"
            )
        steps = []
        for t in a.threads:
            s = statistics.median(r["step_s"] for r in runs[f"gemv|{t}"] if "step_s" in r)
            steps.append(f"{s * 1e3:.1f} ms = {1 / s:.1f} steps/s on {t} thread(s)")
        lines += ["", "All GEMVs of a step: " + ", ".join(steps) + "."]
    return "\n".join(lines)
