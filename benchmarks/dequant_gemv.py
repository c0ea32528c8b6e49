"""Weight-only DequantMatMul on packed bytes vs the memory-bandwidth bound, in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/dequant_gemv.py \\
        [--threads 1 2] [--rounds 3] [--reps 5] [--working-set-mb 1024] [--out FILE.md] \\
        [--act auto|q8|f32]

Engines, each in its own process, rounds interleaved (round r runs every engine once):

* ``stream``: the bandwidth probe, ``rlx_dq_stream_read`` (csrc/dqgemm.c): vector loads
  summing a ``--working-set-mb`` f32 buffer (larger than the L3 cache) on 1 and 2 threads.
* ``rlx <scheme>``: decode-style batch-1 ``y = x @ dequant(W).T`` (the kernel a
  DequantMatMul node runs, ``DqGemmLib.bind``, activations as ``--act``: ``auto`` quantizes
  them to int8 for Q8_0 / Q5_0 / Q4_K / Q6_K at batch < 4, as RLX_DQ_ACT's default) at Gemma-3-270M's shapes (d 640, 4 x 256
  query heads, 1 x 256 KV head, FFN 2048, vocab 262144 tied embedding / logits) and
  4096 x 4096. Each call reads another copy of the packed weight, cycling through copies
  that together fill ``--working-set-mb``, so the weight comes from DRAM as in a real
  decode step (each weight read once per token), not from cache. Shapes whose K is not a
  multiple of the scheme's block are skipped (K-quants need K % 256 == 0: llama.cpp stores
  Gemma's 640-wide rows as Q5_0 / Q8_0 for that reason). Also prefill (M = 128): the tiled
  kernel on one copy.
* ``sgemm``: NumPy f32 ``x @ W`` (OpenBLAS / the BLAS threadpoolctl reports, limited to
  the thread count) at the prefill shapes.

Figures: the best (least disturbed) of ``--reps`` timings within a process, then the best
over rounds. ``GB/s`` = packed weight bytes / time; ``x bound`` = time / (bytes / stream
GB/s of the same thread count, best over rounds): the target is <= 1.5.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import time

from _common import reexec_without_blas_pins, removed_blas_pins

reexec_without_blas_pins()

import numpy as np  # noqa: E402

D = 640
SHAPES = [  # name, K, N (y[N] = W[N, K] x[K])
    ("attn_q", D, 1024),
    ("attn_k/v", D, 256),
    ("attn_output", 1024, D),
    ("ffn_gate/up", D, 2048),
    ("ffn_down", 2048, D),
    ("logits (tied embd)", D, 262144),
    ("square", 4096, 4096),
]
PREFILL = [("ffn_gate/up", D, 2048), ("ffn_down", 2048, D), ("square", 4096, 4096)]
SCHEMES = ["GgufQ4K", "GgufQ8_0", "GgufQ6K", "GgufQ5_0", "Int8Block", "Int4Block"]
M_PREFILL = 128


def _scheme(name: str):  # noqa: ANN202
    from rlx.formats import schemes as S

    return S.Int8Block(32) if name == "Int8Block" else S.Int4Block(32) if name == "Int4Block" else getattr(S, name)()  # fmt: skip


def _weights(scheme, n: int, k: int, rng: np.random.Generator):  # noqa: ANN001, ANN202
    """Valid packed weights (finite scales) of an [n, k] weight, from random f32 values."""
    from rlx.quant.pack import pack

    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    return pack(scheme, w)


def _copies(ws, nbytes_target: int) -> list:  # noqa: ANN001
    per = sum(a.nbytes for a in ws)
    count = max(2, -(-nbytes_target // per))
    return [ws] + [tuple(a.copy() for a in ws) for _ in range(count - 1)]


def _time_cycle(calls: list, reps: int) -> float:
    """Seconds per call: best over reps of one pass through every call (each reads its own
    weight copy)."""
    for c in calls[:2]:
        c()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for c in calls:
            c()
        best = min(best, (time.perf_counter() - t0) / len(calls))
    return best


def worker_stream(args: argparse.Namespace) -> dict:
    from rlx.backends.cpu.native.dqgemm import dqgemm_lib

    lib = dqgemm_lib()
    a = np.ones(args.working_set_mb * 1024 * 1024 // 4, np.float32)
    out = {}
    for t in args.threads:
        lib.stream_read(a, t)
        best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            lib.stream_read(a, t)
            best = min(best, time.perf_counter() - t0)
        out[str(t)] = a.nbytes / best / 1e9
    return out


def worker_rlx(args: argparse.Namespace, name: str) -> dict:
    from rlx.backends.cpu.native.dqgemm import dqgemm_lib

    lib = dqgemm_lib()
    scheme = _scheme(name)
    rng = np.random.default_rng(0)
    res: dict = {"decode": {}, "prefill": {}, "bytes": {}}
    for sname, k, n in SHAPES:
        if k % scheme.block_size:
            continue
        ws = _weights(scheme, n, k, rng)
        res["bytes"][sname] = sum(a.nbytes for a in ws)
        copies = _copies(ws, args.working_set_mb * 1024 * 1024)
        x = rng.standard_normal((1, k)).astype(np.float32)
        y = np.empty((1, n), np.float32)
        for t in args.threads:
            calls = [lib.bind(scheme, x, c, y, num_threads=t, act=args.act) for c in copies]
            res["decode"][f"{sname}|{t}"] = _time_cycle(calls, args.reps)
        del copies
        if (sname, k, n) in PREFILL:
            xp = rng.standard_normal((M_PREFILL, k)).astype(np.float32)
            yp = np.empty((M_PREFILL, n), np.float32)
            for t in args.threads:
                call = lib.bind(scheme, xp, ws, yp, num_threads=t, act=args.act)
                res["prefill"][f"{sname}|{t}"] = _time_cycle([call], args.reps)
    return res


def worker_sgemm(args: argparse.Namespace) -> dict:
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    res = {}
    for sname, k, n in PREFILL:
        x = rng.standard_normal((M_PREFILL, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        y = np.empty((M_PREFILL, n), np.float32)
        for t in args.threads:
            with threadpool_limits(t, user_api="blas"):
                call = functools.partial(np.matmul, x, w, out=y)
                res[f"{sname}|{t}"] = _time_cycle([call], args.reps)
    return res


def _blas_desc() -> str:
    from threadpoolctl import threadpool_info

    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(
        f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')}, {i.get('num_threads')} threads)"
        for i in libs
    )


def _run_worker(engine: str, argv: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--worker", engine, *argv]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"worker {engine} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--working-set-mb", type=int, default=1024)
    ap.add_argument("--schemes", nargs="+", default=SCHEMES)
    ap.add_argument("--act", default="auto", choices=["auto", "q8", "f32"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None)
    args = ap.parse_args()
    if args.worker is not None:
        if args.worker == "stream":
            out = worker_stream(args)
        elif args.worker == "sgemm":
            out = worker_sgemm(args)
        else:
            out = worker_rlx(args, args.worker)
        print(json.dumps(out))
        return
    argv = [
        "--threads", *map(str, args.threads), "--reps", str(args.reps),
        "--working-set-mb", str(args.working_set_mb), "--act", args.act,
    ]  # fmt: skip
    engines = ["stream", *args.schemes, "sgemm"]
    rounds: dict[str, list[dict]] = {e: [] for e in engines}
    for r in range(args.rounds):
        for e in engines:
            print(f"round {r + 1}/{args.rounds}: {e}", file=sys.stderr, flush=True)
            rounds[e].append(_run_worker(e, argv))
    report(args, rounds)


def _best(dicts: list[dict], key: str) -> float:
    return min(d[key] for d in dicts)


def report(args: argparse.Namespace, rounds: dict[str, list[dict]]) -> None:
    from rlx.backends.cpu import native
    from rlx.info import cpu_model

    bw = {str(t): max(d[str(t)] for d in rounds["stream"]) for t in args.threads}
    lines = [
        "## Weight-only DequantMatMul vs the memory-bandwidth bound",
        "",
        "Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python "
        f"benchmarks/dequant_gemv.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        f"CPU: {cpu_model()} ({platform.machine()}, {os.cpu_count()} logical CPUs); native "
        f"target: {native.target_description()}; BLAS: {_blas_desc()}; removed BLAS pins: "
        f"{removed_blas_pins() or 'none'}. {args.rounds} rounds interleaved, best of "
        f"{args.reps} per round, best round; working set {args.working_set_mb} MiB; "
        f"activations: --act {args.act} (auto: int8 for Q8_0 / Q5_0 / Q4_K / Q6_K at "
        "batch < 4).",
        "",
        "Streaming read bandwidth (the bound): "
        + ", ".join(f"{bw[str(t)]:.1f} GB/s on {t} thread(s)" for t in args.threads),
        "",
        "### Decode (batch 1): time per matmul, weight bytes / time, time / bound time",
        "",
        "| scheme | shape (K x N) | MB | "
        + " | ".join(f"{t}T us | {t}T GB/s | {t}T x bound" for t in args.threads)
        + " |",
        "|---|---|---|" + "---|---|---|" * len(args.threads),
    ]
    worst = 0.0
    for name in args.schemes:
        res = rounds[name]
        for sname, k, n in SHAPES:
            if sname not in res[0]["bytes"]:
                continue
            nb = res[0]["bytes"][sname]
            cells = []
            for t in args.threads:
                sec = min(d["decode"][f"{sname}|{t}"] for d in res)
                ratio = sec / (nb / (bw[str(t)] * 1e9))
                worst = max(worst, ratio)
                cells.append(f"{sec * 1e6:.1f} | {nb / sec / 1e9:.1f} | {ratio:.2f}")
            lines.append(
                f"| {name} | {sname} {k}x{n} | {nb / 1e6:.2f} | " + " | ".join(cells) + " |"
            )
    lines += [
        "",
        f"Worst time / bound: {worst:.2f} (target <= 1.5).",
        "",
        f"### Prefill (M = {M_PREFILL}): rlx tiled kernel on packed bytes vs f32 sgemm",
        "",
        "| scheme | shape (K x N) | " + " | ".join(f"{t}T rlx ms | {t}T sgemm ms | {t}T sgemm/rlx" for t in args.threads) + " |",
        "|---|---|" + "---|---|---|" * len(args.threads),
    ]  # fmt: skip
    sg = rounds["sgemm"]
    for name in args.schemes:
        res = rounds[name]
        for sname, k, n in PREFILL:
            key0 = f"{sname}|{args.threads[0]}"
            if key0 not in res[0]["prefill"]:
                continue
            cells = []
            for t in args.threads:
                a = min(d["prefill"][f"{sname}|{t}"] for d in res)
                b = _best(sg, f"{sname}|{t}")
                cells.append(f"{a * 1e3:.2f} | {b * 1e3:.2f} | {b / a:.2f}")
            lines.append(f"| {name} | {sname} {k}x{n} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
