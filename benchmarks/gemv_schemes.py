"""Decode GEMV (M = 1) of every GGUF scheme x native target x threads x activation mode,
in GB/s of packed weight bytes, against the streaming read bandwidth measured in the same
run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/gemv_schemes.py \\
        [--targets avx512 avx2] [--threads 1 2] [--acts f32 q8 f32fma] [--rounds 2] [--reps 3] \\
        [--working-set-mb 256] [--rows 1 R] [--json FILE] [--baseline FILE] [--out FILE.md]

One process per target (``dqgemm_lib(target)``: the kernels ``RLX_ISA=<target>`` builds),
rounds interleaved over targets. Per scheme and shape, ``DqGemmLib.bind`` at M = 1 with
each ``--acts`` mode (``f32``: the exact path, RLX_DQ_ACT's default; ``q8``: int8
activations, for the schemes of ``dqgemm.Q8_SCHEMES`` only; ``f32fma``: the exact path
with RLX_DQ_BF16=0, the f32 FMA kernels instead of the bf16 dot-product one; ``f32grp``:
Q8_0's exact path with RLX_DQ_Q8_DIGITS=0, its f32 group kernel instead of the VNNI digit
one), each call reading another copy of the packed weight, cycling through copies that fill ``--working-set-mb`` (weights come
from DRAM as in a decode step: each byte read once per token). Shapes (y[N] = W[N, K] x):
2048 x 2048 and Gemma-3-270M's FFN down projection K 2048 x N 640 (K a multiple of 256,
so every scheme runs it); ``--shapes ... lm_head`` adds Gemma's tied LM head, K 640 x
N 262144. Bandwidth peak: ``rlx_dq_stream_read`` (csrc/dqgemm.c) over a
``--working-set-mb`` f32 buffer with the same target and thread count.

Figures: best of ``--reps`` passes within a process, then best over rounds. ``%`` is GB/s
over the stream bandwidth of the same target and thread count. ``--json`` writes the raw
figures; ``--baseline`` (such a JSON from an earlier build) adds a "before" column.
``--rows``: the weight as stored (1) and repacked with rows interleaved (``R``: the
target's ``dqgemm.repack_rows``, as a model load does; or 4 / 8), one column each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime

from _common import reexec_without_blas_pins, removed_blas_pins

reexec_without_blas_pins()

import numpy as np  # noqa: E402

SCHEMES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
SHAPES = [("square", 2048, 2048), ("ffn_down", 2048, 640)]  # name, K, N
#: more shapes for --shapes: Gemma-3-270M's tied LM head (K 640 x N 262144)
MORE_SHAPES = [("lm_head", 640, 262144)]
#: activation modes that run the exact path with one environment switch set during the calls
ACT_ENV = {"f32fma": ("RLX_DQ_BF16", "0"), "f32grp": ("RLX_DQ_Q8_DIGITS", "0")}


def _scheme(name: str):  # noqa: ANN202
    from rlx.formats import schemes as S

    return S.GGUF_SCHEMES[name]()


#: byte offsets of each block layout's f16 scale fields (ggml's block structs)
F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
              "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # fmt: skip


def _weights(name: str, n: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A packed [n, k] weight: random code bytes, small finite f16 scales (rlx packs only
    some schemes; the kernels' speed does not depend on the values)."""
    cls = _scheme(name)
    b = rng.integers(0, 256, (n * k // cls.block_size, cls.block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        h = rng.uniform(0.001, 0.05, len(b)).astype("<f2")
        b[:, off : off + 2] = h.view(np.uint8).reshape(-1, 2)
    return (b.reshape(n, -1),)


def _time_cycle(calls: list, reps: int) -> float:
    for c in calls[:2]:
        c()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for c in calls:
            c()
        best = min(best, (time.perf_counter() - t0) / len(calls))
    return best


def worker(args: argparse.Namespace, target_name: str) -> dict:
    from rlx.backends.cpu.native import cpu
    from rlx.backends.cpu.native.dqgemm import dqgemm_lib, repack, repack_rows, uses_q8

    lib = dqgemm_lib(cpu.Target(target_name))
    ws_bytes = args.working_set_mb * 1024 * 1024
    out: dict = {"stream": {}, "gemv": {}, "bytes": {}}
    a = np.ones(ws_bytes // 4, np.float32)
    for t in args.threads:
        lib.stream_read(a, t)
        best = min(_timed(lib.stream_read, a, t) for _ in range(args.reps))
        out["stream"][str(t)] = a.nbytes / best / 1e9
    del a
    rng = np.random.default_rng(0)
    for name in args.schemes:
        scheme = _scheme(name)
        for sname, k, n in _shapes(args):
            ws = _weights(name, n, k, rng)
            nb = sum(w.nbytes for w in ws)
            out["bytes"][f"{name}|{sname}"] = nb
            copies = [ws] + [
                tuple(w.copy() for w in ws) for _ in range(max(1, -(-ws_bytes // nb)) - 1)
            ]
            x = rng.standard_normal((1, k)).astype(np.float32)
            y = np.empty((1, n), np.float32)
            for rows in args.rows:
                r = repack_rows(lib.target) if rows == "R" else int(rows)
                cs = copies if r == 1 else [(repack(scheme, c[0], n, k, r),) for c in copies]
                for t in args.threads:
                    for act in args.acts:
                        if act == "q8" and not uses_q8(scheme, 1, act):
                            continue
                        # f32fma: the exact path on the f32 FMA kernels (RLX_DQ_BF16=0);
                        # f32grp: Q8_0 on the f32 group kernel (RLX_DQ_Q8_DIGITS=0)
                        env = ACT_ENV.get(act)
                        prev = os.environ.get(env[0]) if env else None
                        if env:
                            os.environ[env[0]] = env[1]
                        mode = "f32" if env else act
                        calls = [
                            lib.bind(scheme, x, c, y, num_threads=t, act=mode, rows=r) for c in cs
                        ]
                        sec = _time_cycle(calls, args.reps)
                        if env:
                            os.environ.pop(env[0])
                            if prev is not None:
                                os.environ[env[0]] = prev
                        out["gemv"][_key(name, sname, t, act, rows)] = nb / sec / 1e9
                del cs
            del copies
    return out


def _key(name: str, shape: str, threads: int, act: str, rows: str = "1") -> str:
    """The JSON key of one figure (f32 plain keys as in earlier runs, for --baseline)."""
    return (
        f"{name}|{shape}|{threads}"
        + ("" if act == "f32" else f"|{act}")
        + ("" if rows == "1" else f"|r{rows}")
    )


def _timed(fn, *args) -> float:  # noqa: ANN001, ANN002
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def _run_worker(target: str, argv: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--worker", target, *argv]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"worker {target} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _merge(rounds: list[dict]) -> dict:
    """Best over rounds of every figure (all are rates: higher is better)."""
    out: dict = {}
    for part in ("stream", "gemv", "bytes"):
        out[part] = {k: max(r[part][k] for r in rounds) for k in rounds[0][part]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from rlx.backends.cpu.native import cpu

    # default: the two best targets this CPU runs (avx512 avx2 / i8mm dotprod)
    best = [t.value for t in cpu.runnable_targets()[::-1][:2]]
    ap.add_argument("--targets", nargs="+", default=best)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument(
        "--acts", nargs="+", default=["f32", "q8"], choices=["f32", "q8", "f32fma", "f32grp"]
    )
    names = [s[0] for s in SHAPES + MORE_SHAPES]
    ap.add_argument("--shapes", nargs="+", default=[s[0] for s in SHAPES], choices=names)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--working-set-mb", type=int, default=256)
    ap.add_argument("--schemes", nargs="+", default=SCHEMES)
    ap.add_argument("--rows", nargs="+", default=["1", "R"], choices=["1", "4", "8", "R"])
    ap.add_argument("--json", default=None)
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args, args.worker)))
        return
    argv = [
        "--threads", *map(str, args.threads), "--acts", *args.acts, "--reps", str(args.reps),
        "--working-set-mb", str(args.working_set_mb), "--schemes", *args.schemes,
        "--rows", *args.rows, "--shapes", *args.shapes,
    ]  # fmt: skip
    rounds: dict[str, list[dict]] = {t: [] for t in args.targets}
    for r in range(args.rounds):
        for t in args.targets:
            print(f"round {r + 1}/{args.rounds}: {t}", file=sys.stderr, flush=True)
            rounds[t].append(_run_worker(t, argv))
    res = {t: _merge(rs) for t, rs in rounds.items()}
    res["_meta"] = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    "load": os.getloadavg()}  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    base = None
    if args.baseline:
        with open(args.baseline) as f:
            base = json.load(f)
    report(args, res, base)


def _shapes(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """The (name, K, N) shapes ``--shapes`` names, in SHAPES / MORE_SHAPES order."""
    return [s for s in SHAPES + MORE_SHAPES if s[0] in args.shapes]


def _r(target: str, rows: str) -> str:
    """The R a ``--rows`` value stands for on ``target``."""
    if rows != "R":
        return rows
    from rlx.backends.cpu.native import cpu
    from rlx.backends.cpu.native.dqgemm import repack_rows

    return str(repack_rows(cpu.Target(target)))


def report(args: argparse.Namespace, res: dict, base: dict | None) -> None:
    from rlx.info import cpu_model

    meta = res["_meta"]
    lines = [
        "## Decode GEMV (M = 1) per GGUF scheme, target, thread count and activation mode",
        "",
        "Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python "
        f"benchmarks/gemv_schemes.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        f"Date: {meta['date']}. CPU: {cpu_model()} ({platform.machine()}, {os.cpu_count()} "
        f"logical CPUs); removed BLAS pins: {removed_blas_pins() or 'none'}; load average "
        f"at the end: {', '.join(f'{v:.1f}' for v in meta['load'])} (a shared machine). "
        f"{args.rounds} rounds, best of {args.reps} per round; working set "
        f"{args.working_set_mb} MiB.",
        "",
        "Streaming read bandwidth (the bound, same run): "
        + "; ".join(
            f"{t}: " + ", ".join(f"{res[t]['stream'][str(n)]:.1f} GB/s on {n}T" for n in args.threads)
            for t in args.targets
        ),
        "",
    ]  # fmt: skip
    for sname, k, n in _shapes(args):
        lines += [f"### {sname}: K {k} x N {n}, GB/s of packed weight (% of stream)", ""]
        cols = [
            (t, n, a, r)
            for t in args.targets
            for n in args.threads
            for a in args.acts
            for r in args.rows
        ]
        names = [f"{t} {n}T {a}" + ("" if r == "1" else f" R={_r(t, r)}") for t, n, a, r in cols]
        head = "| scheme | MB | " + " | ".join(
            (f"{c} before | {c} after" if base else c) for c in names
        )
        lines += [head + " |", "|---|---|" + "---|" * (len(cols) * (2 if base else 1))]
        for name in args.schemes:
            nb = res[args.targets[0]]["bytes"][f"{name}|{sname}"]
            cells = []
            for t, th, act, rows in cols:
                key, bw = _key(name, sname, th, act, rows), res[t]["stream"][str(th)]
                if base:
                    b = base.get(t, {}).get("gemv", {}).get(key)
                    cells.append("-" if b is None else f"{b:.1f}")
                g = res[t]["gemv"].get(key)
                cells.append("-" if g is None else f"{g:.1f} ({100 * g / bw:.0f} %)")
            lines.append(f"| {name} | {nb / 1e6:.2f} | " + " | ".join(cells) + " |")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
