"""One engine of ``benchmarks/onnx_models.py`` in its own process.

    python _onnx_worker.py serve --engine rlx|ort --threads N --work DIR
        answers JSON-line commands on stdin, one reply per line on the process's original
        stdout (stdout itself is pointed at stderr, so a library's print cannot corrupt the
        protocol):
        {"op": "build", "cases": [{"id", "file", "inputs", "dims"}, ...]} -> imports /
          compiles (rlx) or opens a session (ort) for each case, runs it once and saves the
          output to work/out_<engine>_<id>_<threads>t.npy; replies the import, compile
          (session) times and, for rlx, whether the dims stayed symbolic;
        {"op": "time", "case": id, "inner": k} -> one untimed call, then k timed: {"ms": [..]};
        {"op": "profile", "case": id} -> rlx only: the per-kernel-kind time of one run;
        {"op": "stats"} -> versions, BLAS/OpenMP pools (threadpoolctl), peak RSS;
        {"op": "quit"}.
    python _onnx_worker.py compile-time --file F
        imports and compiles F with rlx in this fresh process, twice (the second with the
        compile cache off), and prints the times (the native kernel cache on disk is warm
        by then).

Inputs of a case are ``work/<inputs>.npz``, the same arrays for both engines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common
import numpy as np


def _load_inputs(work: Path, name: str) -> dict[str, np.ndarray]:
    with np.load(work / f"{name}.npz") as z:
        return {k: z[k] for k in z.files}


def _rlx_case(case: dict[str, Any], feeds: dict[str, np.ndarray], threads: int) -> tuple:
    import rlx

    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        m = rlx.onnx.load(case["file"])
        info["dims"] = "symbolic"
    except (rlx.onnx.OnnxUnsupportedError, rlx.onnx.NeedsConstantError) as e:
        # dynamic axes that the importer cannot keep symbolic: import at this case's dims
        m = rlx.onnx.load(case["file"], input_dims=case["dims"])
        info["dims"] = f"static ({type(e).__name__}: {str(e)[:120]})"
    t1 = time.perf_counter()
    c = m.compile(num_threads=threads)
    info["import_s"], info["compile_s"] = t1 - t0, time.perf_counter() - t1
    feeds = m.feeds(feeds)
    return (lambda: c.run(feeds)[0]), info, (c, feeds)


def _ort_case(case: dict[str, Any], feeds: dict[str, np.ndarray], threads: int) -> tuple:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    t0 = time.perf_counter()
    sess = ort.InferenceSession(case["file"], so, providers=["CPUExecutionProvider"])
    info = {"session_s": time.perf_counter() - t0}
    names = [i.name for i in sess.get_inputs()]
    feed = {k: feeds[k] for k in names}
    return (lambda: sess.run(None, feed)[0]), info, sess


def _profile(compiled: Any, feeds: dict[str, np.ndarray], runs: int = 5) -> dict[str, Any]:
    """rlx: the best of ``runs`` profiled runs, as ms per op (with its kernel kind) and
    the run's wall time, plus the full report text."""
    best = None
    for _ in range(runs):
        t0 = time.perf_counter()
        compiled.run(feeds, profile=True)
        wall = time.perf_counter() - t0
        rep = compiled.report()
        if best is None or rep.total_seconds < best[0].total_seconds:
            best = (rep, wall)
    assert best is not None
    rep, wall = best
    per: dict[str, float] = {}
    for k in rep.kernels:
        if k.seconds is not None and not k.prologue:
            key = f"{k.op} ({k.kind.value})"
            per[key] = per.get(key, 0.0) + k.seconds * 1e3
    return {
        "wall_ms": wall * 1e3,
        "kernel_ms": rep.total_seconds * 1e3,
        "ops": per,
        "report": str(rep),
    }


def stats() -> dict[str, Any]:
    return _common.process_stats(("numpy", "rlx", "onnxruntime", "onnx"))


def serve(engine: str, threads: int, work: Path) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    calls: dict[str, Callable[[], np.ndarray]] = {}
    objs: dict[str, Any] = {}
    make = _rlx_case if engine == "rlx" else _ort_case
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "quit":
                proto.write(json.dumps({"ok": True}) + "\n")
                break
            if op == "build":
                infos = {}
                for case in cmd["cases"]:
                    feeds = _load_inputs(work, case["inputs"])
                    fn, info, obj = make(case, feeds, threads)
                    out = np.asarray(fn())
                    np.save(work / f"out_{engine}_{case['id']}_{threads}t.npy", out)
                    calls[case["id"]], objs[case["id"]] = fn, obj
                    infos[case["id"]] = info
                reply: dict[str, Any] = {"ok": True, "cases": infos}
            elif op == "time":
                fn = calls[cmd["case"]]
                fn()
                ms = []
                for _ in range(int(cmd["inner"])):
                    t0 = time.perf_counter()
                    fn()
                    ms.append((time.perf_counter() - t0) * 1e3)
                reply = {"ok": True, "ms": ms}
            elif op == "profile":
                reply = {"ok": True, **_profile(*objs[cmd["case"]])}
            elif op == "stats":
                reply = {"ok": True, **stats()}
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as e:  # reported to the driver, which marks the engine as failed
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        proto.write(json.dumps(reply) + "\n")


def compile_time(file: str, threads: int) -> None:
    """Print the import and compile times of ``file``: the first in this fresh process
    (after rlx, onnx and NumPy are imported: ``libs_s``), then a second one with the
    in-process compile cache off (``warm_*``)."""
    t0 = time.perf_counter()
    import rlx
    from rlx.options import CompileOptions

    _ = rlx.onnx  # the importer package and onnx
    out: dict[str, float] = {"libs_s": time.perf_counter() - t0}
    for prefix in ("", "warm_"):
        t1 = time.perf_counter()
        m = rlx.onnx.load(file)
        t2 = time.perf_counter()
        m.compile(CompileOptions(num_threads=threads, use_cache=False))
        out[f"{prefix}import_s"], out[f"{prefix}compile_s"] = t2 - t1, time.perf_counter() - t2
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["serve", "compile-time"])
    ap.add_argument("--engine", choices=["rlx", "ort"], default="rlx")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--file")
    a = ap.parse_args()
    if a.what == "serve":
        serve(a.engine, a.threads, a.work)
    else:
        compile_time(a.file, a.threads)


if __name__ == "__main__":
    main()
