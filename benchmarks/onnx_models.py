"""Models imported from ONNX: rlx vs ONNX Runtime on the same .onnx file (issue 15, "Speed").

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/onnx_models.py \\
        [--models mlp cnn bert minilm resnet18 mobilenet_v2] [--exporters torchscript dynamo] [--threads 1 2] \\
        [--rounds 7] [--ort-python PY] [--work DIR] [--out benchmarks/results/BENCHMARKS_onnx.md]

Models come from ``scripts/onnx_export_models.py`` (``export_model(name, exporter,
out_dir)``: an MLP, a small CNN with conv / batchnorm / pooling, a random-weight BERT
encoder and the real all-MiniLM-L6-v2, exported by PyTorch's TorchScript and dynamo
exporters with dynamic batch / sequence axes) and from ``tests/frontends/onnx/torch_cnns.py``
(``resnet18``, ``mobilenet_v2``: torchvision-style, written in plain torch.nn, random
weights, batch 1 at 224 x 224, TorchScript exporter); they are exported once into ``--work``.
Each model runs at the shapes of :data:`SHAPES` (the encoders at two), with the same input
arrays for both engines.

Method: for each thread count, one rlx worker process and one ONNX Runtime worker process
(``benchmarks/_onnx_worker.py``; ORT from ``--ort-python``, default this interpreter, with
``intra_op_num_threads`` = threads, ``inter_op_num_threads`` = 1, ORT_ENABLE_ALL; rlx
``compile(num_threads=threads)``; OMP / MKL / OpenBLAS thread counts set, OPENBLAS_CORETYPE
/ OPENBLAS_L2_SIZE removed). Both build every case (rlx: import + compile; the outputs are
compared), then ``--rounds`` interleaved rounds (the engine that starts rotates; 50 ms pause
between engines) each time ``inner`` calls per case after one untimed call. Reported: the
median ms per call, rlx / ORT (target <= 0.80), and the max abs difference of the outputs.
Then the import + compile time of each encoder in a fresh process (the native cache on disk
warm, median of ``--compile-repeat``) and rlx's per-op profile of the slowest ratios.
"""

from __future__ import annotations

import _common  # noqa: F401  (puts the repository on sys.path; import before NumPy)

_common.reexec_without_blas_pins()

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = _common.ROOT
WORKER = Path(__file__).resolve().parent / "_onnx_worker.py"
#: model -> (batch, seq) shapes; seq is ignored by the MLP and the CNN. The random BERT has
#: 64 positions; all-MiniLM-L6-v2 is the full-size encoder (6 x 384, 512 positions).
SHAPES: dict[str, list[tuple[int, int]]] = {
    "mlp": [(64, 0)],
    "cnn": [(16, 0)],
    "bert": [(1, 64), (8, 64)],
    "minilm": [(1, 128), (8, 128)],
    "resnet18": [(1, 0)],
    "mobilenet_v2": [(1, 0)],
}
#: torchvision-style CNNs at 224 x 224 (tests/frontends/onnx/torch_cnns.py: plain torch.nn,
#: random weights), exported by the TorchScript exporter only
CNNS = ("resnet18", "mobilenet_v2")
#: the output file keeps what follows this line across runs (the analysis, written by hand)
ANALYSIS = "<!-- analysis: kept by benchmarks/onnx_models.py -->"
#: calls per round per case, by model (about 50-200 ms of work per engine and round)
INNER = {"mlp": 200, "cnn": 100, "bert": 50, "minilm": 10, "resnet18": 3, "mobilenet_v2": 10}


@dataclass(frozen=True)
class Case:
    model: str
    exporter: str
    batch: int
    seq: int

    @property
    def id(self) -> str:
        shape = f"{self.batch}x{self.seq}" if self.seq else f"b{self.batch}"
        return f"{self.model}-{self.exporter}-{shape}"

    @property
    def shape(self) -> str:
        return f"{self.batch} x {self.seq}" if self.seq else f"batch {self.batch}"


Worker = _common.Worker


def child_env(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _common.BLAS_PINS}
    n = str(threads)
    env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def start(engine: str, threads: int, py: str, work: Path) -> Worker:
    cmd = [py, str(WORKER), "serve", "--engine", engine, "--threads", str(threads)]
    cmd += ["--work", str(work)]
    log = open(work / f"log_{engine}_{threads}t.txt", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
        env=child_env(threads), cwd=str(ROOT),
    )  # fmt: skip
    return Worker(engine, proc)


def prepare(models: list[str], exporters: list[str], work: Path) -> list[Case]:
    """Export the models (once) and write each case's inputs; the cases, in order."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from onnx_export_models import export_model  # noqa: E402

    from tests.frontends.onnx.torch_cnns import cnn_example, export_cnn
    from tests.frontends.onnx.torch_models import build, example

    cases = []
    for name in models:
        model = None
        if name in CNNS:
            path = work / f"{name}-torchscript.onnx"
            if not path.exists():
                t0 = time.perf_counter()
                export_cnn(name, work)
                print(f"exported {path.name} in {time.perf_counter() - t0:.1f} s", flush=True)
            for b, s in SHAPES[name]:
                np.savez(work / f"in_{name}_{b}x{s}.npz", **cnn_example(b, 224))
                cases.append(Case(name, "torchscript", b, s))
            continue
        for exp in exporters:
            path = work / f"{name}-{exp}.onnx"
            if not path.exists():
                model = build(name) if model is None else model
                t0 = time.perf_counter()
                export_model(name, exp, work, model=model)
                print(f"exported {path.name} in {time.perf_counter() - t0:.1f} s", flush=True)
            for b, s in SHAPES[name]:
                case = Case(name, exp, b, s)
                np.savez(work / f"in_{name}_{b}x{s}.npz", **example(name, batch=b, seq=s or 8))
                cases.append(case)
    return cases


def spec(case: Case, work: Path) -> dict[str, Any]:
    feeds = np.load(work / f"in_{case.model}_{case.batch}x{case.seq}.npz")
    return {
        "id": case.id,
        "file": str(work / f"{case.model}-{case.exporter}.onnx"),
        "inputs": f"in_{case.model}_{case.batch}x{case.seq}",
        "dims": {k: list(feeds[k].shape) for k in feeds.files},
    }


def run_threads(
    cases: list[Case], threads: int, a: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """Build both engines at ``threads``, time every case in interleaved rounds."""
    workers = [
        start("rlx", threads, sys.executable, work),
        start("ort", threads, a.ort_python, work),
    ]
    try:
        built = {
            w.engine: w.ask({"op": "build", "cases": [spec(c, work) for c in cases]})
            for w in workers
        }
        for w in workers:
            if not built[w.engine]["ok"]:
                raise SystemExit(f"{w.engine} failed to build: {built[w.engine]['error']}")
        times: dict[str, dict[str, list[float]]] = {c.id: {"rlx": [], "ort": []} for c in cases}
        for r in range(a.rounds):
            for c in cases:
                order = workers if (r + cases.index(c)) % 2 == 0 else workers[::-1]
                for w in order:
                    rep = w.ask({"op": "time", "case": c.id, "inner": INNER[c.model]})
                    if not rep["ok"]:
                        raise SystemExit(f"{w.engine} failed timing {c.id}: {rep['error']}")
                    times[c.id][w.engine] += rep["ms"]
                    time.sleep(0.05)
            print(f"  {threads}t round {r + 1}/{a.rounds} done", flush=True)
        out: dict[str, Any] = {"cases": {}, "stats": {}}
        for c in cases:
            y_r = np.load(work / f"out_rlx_{c.id}_{threads}t.npy")
            y_o = np.load(work / f"out_ort_{c.id}_{threads}t.npy")
            med = {e: statistics.median(v) for e, v in times[c.id].items()}
            out["cases"][c.id] = {
                "rlx_ms": med["rlx"],
                "ort_ms": med["ort"],
                "ratio": med["rlx"] / med["ort"],
                "diff": float(np.max(np.abs(y_r.astype(np.float64) - y_o))),
                "build": {e: built[e]["cases"][c.id] for e in built},
            }
        ratios = sorted(cases, key=lambda c: -out["cases"][c.id]["ratio"])
        for c in ratios[: a.profile_top]:
            prof = workers[0].ask({"op": "profile", "case": c.id})
            if prof["ok"]:
                out["cases"][c.id]["profile"] = {
                    k: prof[k] for k in ("wall_ms", "kernel_ms", "ops")
                }
                (work / f"profile_{c.id}_{threads}t.txt").write_text(prof["report"])
        out["stats"] = {w.engine: w.ask({"op": "stats"}) for w in workers}
        return out
    finally:
        for w in workers:
            w.close()


def compile_times(cases: list[Case], a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Import + compile of each encoder case in fresh processes (median of the repeats)."""
    out: dict[str, Any] = {}
    seen = set()
    for c in cases:
        key = f"{c.model}-{c.exporter}"
        if c.model not in ("bert", "minilm") or key in seen:
            continue
        seen.add(key)
        s = spec(c, work)
        runs = []
        for _ in range(a.compile_repeat):
            cmd = [sys.executable, str(WORKER), "compile-time", "--file", s["file"]]
            cmd += ["--threads", "1"]
            res = subprocess.run(
                cmd, capture_output=True, text=True, env=child_env(1), cwd=str(ROOT), check=True
            )
            runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
        out[key] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def report(data: dict[str, Any]) -> str:
    """benchmarks/results/BENCHMARKS_onnx.md from the measurements of :func:`main`."""
    from peers import _cpu_facts

    lines = [
        "# Models imported from ONNX: rlx vs ONNX Runtime (issue 15, Speed)",
        "",
        f"Measured {data['date']} ({data['seconds']:.0f} s), load average before / after "
        f"{data['load_before']} / {data['load_after']}.",
        "",
        "```",
        "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/onnx_models.py "
        + " ".join(data["argv"]),
        "```",
        "",
        f"- CPU: {_cpu_facts()}; {os.cpu_count()} logical CPUs, shared with other jobs",
        f"- OS: {platform.platform()}",
    ]
    for t, r in data["threads"].items():
        for e, st in r["stats"].items():
            pools = "; ".join(
                f"{p['internal_api']} {p.get('version') or ''} {p.get('architecture') or ''} "
                f"({p['file']}, {p['num_threads']} threads)"
                for p in st.get("pools", [])
            )
            vers = ", ".join(f"{k} {v}" for k, v in sorted(st["versions"].items()))
            lines.append(f"- {e} worker at {t} threads: {vers}; pools (threadpoolctl): {pools}")
    lines += [
        "",
        "Median ms per call (same .onnx file and inputs for both engines, own process each, "
        "interleaved rounds); ratio = rlx / ORT (target <= 0.80); diff = max |rlx - ORT| of "
        "the output; dims = whether rlx kept the dynamic axes symbolic.",
        "",
        "| model | exporter | shape | threads | rlx ms | ORT ms | rlx / ORT | target | diff | dims |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for t, r in data["threads"].items():
        for cid, v in r["cases"].items():
            c = data["cases"][cid]
            dims = v["build"]["rlx"].get("dims", "?").split(" (")[0]
            lines.append(
                f"| {c['model']} | {c['exporter']} | {c['shape']} | {t} | {v['rlx_ms']:.3f} | "
                f"{v['ort_ms']:.3f} | {v['ratio']:.2f} | {_met(v['ratio'] <= 0.8)} | "
                f"{v['diff']:.1e} | {dims} |"
            )
    lines += [
        "",
        "Import (`rlx.onnx.load`, dynamic axes kept symbolic) + compile (`compile(num_threads"
        "=1)`), seconds, median of "
        f"{data['compile_repeat']} fresh processes with the native kernel cache warm on disk: "
        "first in the process (after importing rlx, onnx and NumPy: libs), then again in the "
        "same process with the compile cache off (warm). Target: < 2 s warm for the BERT "
        "encoder.",
        "",
        "| model | libs | import | compile | first total | warm import | warm compile | "
        "warm total | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for k, v in data["compile"].items():
        first = v["import_s"] + v["compile_s"]
        warm = v["warm_import_s"] + v["warm_compile_s"]
        lines.append(
            f"| {k} | {v['libs_s']:.2f} | {v['import_s']:.2f} | {v['compile_s']:.2f} | "
            f"{first:.2f} | {v['warm_import_s']:.2f} | {v['warm_compile_s']:.2f} | "
            f"{warm:.2f} | {_met(warm < 2)} |"
        )
    lines += ["", "rlx's profile of the highest ratios (best of 5 profiled runs, ms per op):", ""]
    for t, r in data["threads"].items():
        for cid, v in r["cases"].items():
            p = v.get("profile")
            if not p:
                continue
            top = sorted(p["ops"].items(), key=lambda kv: -kv[1])[:6]
            ops = ", ".join(f"{k} {ms:.3f}" for k, ms in top)
            lines.append(
                f"- {cid} at {t} threads: run {p['wall_ms']:.3f} ms, kernels {p['kernel_ms']:.3f} "
                f"ms: {ops}"
            )
    return "\n".join(lines) + "\n"


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(SHAPES))
    ap.add_argument("--exporters", nargs="+", default=["torchscript", "dynamo"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--compile-repeat", type=int, default=3)
    ap.add_argument("--profile-top", type=int, default=3)
    ap.add_argument("--ort-python", default=sys.executable)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rlx_onnx_bench"))
    ap.add_argument("--out", type=Path, default=_common.RESULTS / "BENCHMARKS_onnx.md")
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    data: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "argv": sys.argv[1:] if argv is None else argv,
        "load_before": _load(),
        "compile_repeat": a.compile_repeat,
    }
    cases = prepare(a.models, a.exporters, a.work)
    data["cases"] = {
        c.id: {"model": c.model, "exporter": c.exporter, "shape": c.shape} for c in cases
    }
    data["threads"] = {}
    for t in a.threads:
        data["threads"][str(t)] = run_threads(cases, t, a, a.work)
    data["compile"] = compile_times(cases, a, a.work)
    data["load_after"] = _load()
    data["seconds"] = time.time() - t0
    (a.work / "onnx_models.json").write_text(json.dumps(data, indent=1))
    text = report(data)
    if a.out.exists() and ANALYSIS in a.out.read_text():  # keep the hand-written analysis
        text += "\n" + ANALYSIS + a.out.read_text().split(ANALYSIS, 1)[1]
    a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
