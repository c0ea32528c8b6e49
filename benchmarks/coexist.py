"""rlx next to other runtimes' thread pools in one process, written to benchmarks/results/BENCHMARKS_coexist.md.

Measures the MiniLM-sized encoder (``rlx.models.synthetic.encoder``, 6 layers, hidden 384,
batch x seq 8x128 by default) on ``--threads`` threads (2) in a fresh worker process per
setting, rounds interleaved:

* ``alone``: only rlx is imported;
* ``peers first``: torch and onnxruntime are imported first (torch's ``libgomp.so.1`` is
  then the one rlx's kernels bind to, with libgomp's default wait policy), an ONNX
  Runtime session and a torch model (both an MLP 384 -> 1536 -> 384 on 64 rows, their
  default spinning pools, the same thread count) run, then rlx compiles; every timed rlx
  run comes right after one ORT run and one torch run, so their pools have just been used
  (ORT's workers then spin for ~24 ms of CPU here); after every 4th such run, 3 more rlx
  runs follow back to back ("later runs": the peers loaded but idle);
* ``rlx first``: the same with rlx's first native library loaded before torch is imported
  (then torch runs on rlx's libgomp and its wait policy).

Reported: rlx's time per run (min and median of ``--runs`` per round; the median of the
later runs), the ratios to ``alone`` from the same round, the pools each worker saw (``rlx.backends.cpu.threads.
pool_info``), the CPU flags, BLAS and the load average. Target (issue 13): rlx within 1.2x
of its time alone.

Usage: ``python benchmarks/coexist.py [--rounds 3] [--runs 20] [--threads 2] [--batch 8]
[--seq 128] [--python PATH] [--out benchmarks/results/BENCHMARKS_coexist.md]``. The workers need torch and
onnxruntime: ``--python`` defaults to this interpreter when it has both, else
``/tmp/rlx/peers/bin/python``; the repository root is put on their ``sys.path``.
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed from the environment first.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import RESULTS, ROOT, reexec_without_blas_pins, removed_blas_pins

reexec_without_blas_pins()  # must happen before NumPy loads OpenBLAS

MODES = ("alone", "peers first", "rlx first")
PEERS_PYTHON = "/tmp/rlx/peers/bin/python"
HIDDEN, FFN, ROWS = 384, 1536, 64


def _peers() -> tuple[object, object, object]:
    """An ORT session and a torch MLP (384 -> 1536 -> 384) on 64 rows, and the input."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((HIDDEN, FFN)).astype(np.float32) / HIDDEN**0.5
    w2 = rng.standard_normal((FFN, HIDDEN)).astype(np.float32) / FFN**0.5
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, HIDDEN])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    torch.set_num_threads(THREADS)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(HIDDEN, FFN), torch.nn.GELU(), torch.nn.Linear(FFN, HIDDEN)
    ).eval()
    x = rng.standard_normal((ROWS, HIDDEN)).astype(np.float32)
    xt = torch.from_numpy(x)
    onnx.checker.check_model(model)

    def ort_run() -> None:
        sess.run(None, {"x": x})

    def torch_run() -> None:
        with torch.no_grad():
            mlp(xt)

    return ort_run, torch_run, x


def worker(mode: str, runs: int, batch: int, seq: int) -> dict[str, object]:
    """One process: set up as ``mode`` says, then time ``runs`` rlx runs."""
    sys.path.insert(0, str(ROOT))
    peers = None
    if mode == "rlx first":
        from rlx.backends.cpu import native

        src = "#include <omp.h>\nint rlx_coexist(void){return omp_get_max_threads();}\n"
        native.load(native.build(src, native.Isa.PLAIN, "coexist")).rlx_coexist()
    if mode != "alone":
        peers = _peers()
    import numpy as np

    import rlx
    from rlx.backends.cpu import threads
    from rlx.models import synthetic
    from rlx.options import CompileOptions

    g = synthetic.encoder(batch=batch, seq=seq)
    cg = rlx.Session("cpu").compile(
        g, params=synthetic.random_params(g), options=CompileOptions(num_threads=THREADS)
    )
    inputs = synthetic.random_inputs(g)
    for _ in range(3):
        cg.run(inputs)
    ts, tail = [], []
    for i in range(runs):
        if peers is not None:
            peers[0]()  # ORT, then torch: their pools have just been used
            peers[1]()
        t0 = time.perf_counter()
        cg.run(inputs)
        ts.append(time.perf_counter() - t0)
        if i % 4 == 3:  # then a few runs more, the peers' pools left alone
            for _ in range(3):
                t0 = time.perf_counter()
                cg.run(inputs)
                tail.append(time.perf_counter() - t0)
    info = threads.pool_info()
    return {
        "mode": mode,
        "min_ms": min(ts) * 1e3,
        "median_ms": statistics.median(ts) * 1e3,
        "later_median_ms": statistics.median(tail) * 1e3 if tail else float("nan"),
        "pools": {
            "wait_policy": info["wait_policy"],
            "openmp": [i["filepath"] for i in info["openmp"]],
            "libgomp mapped": _mapped("libgomp"),
            "blas": [(i.get("architecture"), i["num_threads"]) for i in info["blas"]],
        },
        "loadavg": os.getloadavg(),
        "numpy": np.__version__,
    }


def _mapped(name: str) -> list[str]:
    """Paths of the shared objects whose name contains ``name`` mapped in this process."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    return sorted({ln.split()[-1] for ln in maps if name in ln.rsplit("/", 1)[-1]})


def _python(given: str | None) -> str:
    if given:
        return given
    if all(importlib.util.find_spec(m) for m in ("torch", "onnxruntime", "onnx")):
        return sys.executable
    return PEERS_PYTHON


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):  # x86-64 / aarch64
                keep = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
                keep += ("asimd", "asimddp", "i8mm", "bf16", "sve")
                return " ".join(f for f in line.split(":", 1)[1].split() if f in keep)
    except OSError:
        pass
    return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--python", default=None)
    ap.add_argument("--out", default=str(RESULTS / "BENCHMARKS_coexist.md"))
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global THREADS
    THREADS = args.threads
    if args.worker:
        print(json.dumps(worker(args.worker, args.runs, args.batch, args.seq)))
        return
    py = _python(args.python)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS"):
        env.pop(k, None)  # every pool at its defaults
    results: list[list[dict]] = []
    load0 = os.getloadavg()
    for r in range(args.rounds):
        row = []
        order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
        for mode in order:
            cmd = [py, __file__, "--worker", mode, "--runs", str(args.runs)]
            cmd += ["--threads", str(args.threads), "--batch", str(args.batch)]
            cmd += ["--seq", str(args.seq)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            row.append(res)
            print(
                f"round {r + 1} {mode:>11}: min {res['min_ms']:.2f} ms, "
                f"median {res['median_ms']:.2f} ms (load {res['loadavg'][0]:.2f})",
                flush=True,
            )
        results.append(sorted(row, key=lambda x: MODES.index(x["mode"])))
    write(args, py, results, load0)


THREADS = 2


def write(args: argparse.Namespace, py: str, results: list[list[dict]], load0: tuple) -> None:
    lines = [
        "# rlx next to ONNX Runtime and torch in one process (`benchmarks/coexist.py`)",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
        f"command: `python benchmarks/coexist.py --rounds {args.rounds} --runs {args.runs} "
        f"--threads {args.threads} --batch {args.batch} --seq {args.seq}`; workers: `{py}`",
        f"- CPU flags: {_cpu_flags()}; BLAS pins removed: {removed_blas_pins() or 'none'}; "
        f"load average at start {load0[0]:.2f}",
        f"- model: MiniLM-sized encoder (6 layers, hidden 384, ffn 1536), "
        f"{args.batch}x{args.seq}, {args.threads} threads; peers: ORT session and torch MLP "
        f"384->1536->384 on {ROWS} rows, run once each right before every timed rlx run",
        "",
        "| round | mode | min ms | median ms | median / alone | later runs median ms "
        "| later / alone | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r, row in enumerate(results):
        base = next(x for x in row if x["mode"] == "alone")
        alone, later = base["median_ms"], base["later_median_ms"]
        for x in row:
            lines.append(
                f"| {r + 1} | {x['mode']} | {x['min_ms']:.2f} | {x['median_ms']:.2f} | "
                f"{x['median_ms'] / alone:.2f} | {x['later_median_ms']:.2f} | "
                f"{x['later_median_ms'] / later:.2f} | {x['loadavg'][0]:.2f} |"
            )
    lines += ["", "Pools seen by each worker (last round):", ""]
    for x in results[-1]:
        lines.append(f"- {x['mode']}: {json.dumps(x['pools'])}")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
