"""rlx side by side with PyTorch eager, torch.compile, ONNX Runtime and jax.jit, in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/peers.py \\
        [--threads 2 1] [--workloads mlp encoder chain] [--rounds-scale 1.0] \\
        [--out benchmarks/results/BENCHMARKS_peers.md]

Workloads (benchmarks/_peers_models.py): an MLP (batch 32, 1024 -> 4096 -> 1024, gelu),
the MiniLM-sized encoder of rlx/models/synthetic.py and a 100-op elementwise chain. Every
engine gets the same params (``random_params(graph, 0)``) and the same input.

Engines: rlx (default CompileOptions), rlx with ``fuse=False``, rlx with
``optimize=False``, torch eager, torch.compile (inductor), onnxruntime (CPU EP, graph
built with onnx.helper, ORT_ENABLE_ALL) and jax.jit. A peer that cannot be imported or
built is reported with the reason and left out.

Method, per thread count: one child process (XLA reads its thread flags at start-up;
the child gets OMP_NUM_THREADS / MKL_NUM_THREADS / XLA_FLAGS for that count and no
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE), in which torch.set_num_threads, ORT
intra_op_num_threads, XLA intra_op_parallelism_threads and rlx num_threads all get the
same count. For each workload: build every engine, check its output against rlx (max
abs diff), warm up, then interleaved rounds: each round visits every engine once (the
starting engine rotates), running one untimed call and then ``inner`` timed calls. The
reported time is the median over rounds of the per-call time; ``ratio`` = engine time /
rlx time (> 1: rlx is faster). ``cpu/wall`` is the process CPU time over wall time
during the timed calls (about the number of busy threads; spinning threads count).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import enum
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _peers_models import WORKLOADS, Workload, WorkloadKind  # noqa: E402

BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


class Engine(enum.Enum):
    """The engines, in table order; the value is the name shown in the report."""

    RLX = "rlx"
    RLX_NO_FUSE = "rlx fuse=False"
    RLX_NO_OPTIMIZE = "rlx optimize=False"
    TORCH = "torch eager"
    TORCH_COMPILE = "torch.compile"
    ORT = "onnxruntime"
    JAX = "jax.jit"

    @property
    def rlx_overrides(self) -> dict[str, bool] | None:
        """CompileOptions fields this rlx variant changes (None: not rlx)."""
        return {
            Engine.RLX: {},
            Engine.RLX_NO_FUSE: {"fuse": False},
            Engine.RLX_NO_OPTIMIZE: {"optimize": False},
        }.get(self)


@dataclass(frozen=True)
class Plan:
    """How much to run per workload: untimed warm-up calls, interleaved rounds, timed
    calls per engine per round."""

    warmup: int
    rounds: int
    inner: int


PLANS: dict[WorkloadKind, Plan] = {
    WorkloadKind.MLP: Plan(3, 60, 1),
    WorkloadKind.ENCODER: Plan(2, 40, 1),
    WorkloadKind.CHAIN: Plan(20, 80, 25),
}


@dataclass(frozen=True)
class EngineResult:
    """One engine on one workload: per-round ms per call, or the error that stopped it."""

    engine: Engine
    times_ms: tuple[float, ...] = ()
    setup_s: float = 0.0
    max_abs_diff: float | None = None
    cpu_ratio: float | None = None
    error: str | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self) | {"name": self.engine.value}
        d.pop("engine")
        d["median_ms"] = statistics.median(self.times_ms) if self.times_ms else None
        return d


@dataclass(frozen=True)
class Runner:
    """One ready engine: ``call()`` runs one inference, ``fetch(result)`` -> NumPy;
    ``profile()`` (rlx only) -> kernel ms per op."""

    call: Callable[[], Any]
    fetch: Callable[[Any], Any]
    note: str = ""
    profile: Callable[[], dict[str, float]] | None = None


# ---- child: build and time the engines -------------------------------------------------


def _xla_flags(threads: int) -> str:
    eigen = "true" if threads > 1 else "false"
    return f"--xla_cpu_multi_thread_eigen={eigen} intra_op_parallelism_threads={threads}"


def _rlx_runner(w: Workload, threads: int, overrides: dict[str, bool]) -> Runner:
    import rlx

    opts = rlx.CompileOptions(num_threads=threads, **overrides)
    c = rlx.Session("cpu").compile(w.graph, opts, params=dict(w.params))
    feed = {"x": w.x}
    kinds = ", ".join(f"{n} {k.value}" for k, n in c.report().kind_counts().items())
    return Runner(
        lambda: c.run(feed)[0],
        lambda r: r,
        note=f"graph of {len(c.graph.nodes)} nodes; kernels: {kinds}",
        profile=lambda: _rlx_profile(c, feed),
    )


def _rlx_profile(c: Any, feed: dict[str, Any], runs: int = 7) -> dict[str, float]:
    """Median over ``runs`` profiled runs of the kernel ms summed per op (with its fused
    activation, if any) and kernel kind."""
    per_op: dict[str, list[float]] = {}
    for _ in range(runs):
        c.run(feed, profile=True)
        agg: dict[str, float] = {}
        for k in c.report().kernels:
            if k.seconds is not None:
                act = getattr(c.graph.nodes[k.node].op, "act", None)
                key = f"{k.op}{f'[{act.value}]' if act is not None else ''} ({k.kind.value})"
                agg[key] = agg.get(key, 0.0) + k.seconds * 1e3
        for key, ms in agg.items():
            per_op.setdefault(key, []).append(ms)
    return {key: statistics.median(v) for key, v in per_op.items()}


def _torch_runner(w: Workload, compiled: bool) -> Runner:
    import torch
    from _peers_models import torch_forward

    f = torch_forward(w)
    if compiled:
        f = torch.compile(f)
    xt = torch.from_numpy(w.x.copy())
    return Runner(lambda: f(xt), lambda r: r.numpy())


def _ort_runner(w: Workload, threads: int) -> Runner:
    import onnxruntime as ort
    from _peers_models import onnx_model

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if os.environ.get("RLX_BENCH_NO_SPIN"):
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    model = onnx_model(w).SerializeToString()
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    feed = {"x": w.x}
    return Runner(lambda: sess.run(["y"], feed)[0], lambda r: r)


def _jax_runner(w: Workload) -> Runner:
    import jax
    import numpy as np
    from _peers_models import jax_forward

    f, p = jax_forward(w)
    jf = jax.jit(f)
    xj = jax.device_put(w.x)
    return Runner(lambda: jf(p, xj).block_until_ready(), lambda r: np.asarray(r))


def _build(engine: Engine, w: Workload, threads: int) -> Runner:
    overrides = engine.rlx_overrides
    if overrides is not None:
        return _rlx_runner(w, threads, overrides)
    if engine is Engine.TORCH or engine is Engine.TORCH_COMPILE:
        return _torch_runner(w, compiled=engine is Engine.TORCH_COMPILE)
    if engine is Engine.ORT:
        return _ort_runner(w, threads)
    return _jax_runner(w)


def interleave(
    runners: dict[Engine, Runner], plan: Plan, rounds: int
) -> dict[Engine, tuple[list[float], float]]:
    """Warm up each engine, then ``rounds`` rounds visiting every engine (the first one
    rotating); at each visit one untimed call (wakes this engine's thread pool after the
    previous engine's) and ``plan.inner`` timed calls. Returns per engine the ms per call
    of each round and CPU time / wall time over the timed calls."""
    order = list(runners)
    for e in order:
        for _ in range(plan.warmup):
            runners[e].call()
    times: dict[Engine, list[float]] = {e: [] for e in order}
    cpu = dict.fromkeys(order, 0.0)
    wall = dict.fromkeys(order, 0.0)
    for i in range(rounds):
        k = i % len(order)
        for e in order[k:] + order[:k]:
            call = runners[e].call
            call()
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(plan.inner):
                call()
            dt = time.perf_counter() - t0
            cpu[e] += time.process_time() - c0
            wall[e] += dt
            times[e].append(dt / plan.inner * 1e3)
    return {e: (times[e], cpu[e] / wall[e] if wall[e] > 0 else 0.0) for e in order}


def run_workload(
    kind: WorkloadKind, threads: int, scale: float, unavailable: dict[Engine, str]
) -> dict[str, Any]:
    """Build every engine for workload ``kind``, check outputs against rlx, time them."""
    import numpy as np

    w = WORKLOADS[kind]()
    plan = PLANS[kind]
    rounds = max(3, round(plan.rounds * scale))
    built: dict[Engine, tuple[Runner, float, float]] = {}
    failed: dict[Engine, str] = dict(unavailable)
    ref = None
    for engine in Engine:
        if engine in failed:
            continue
        try:
            t0 = time.perf_counter()
            r = _build(engine, w, threads)
            out = np.asarray(r.fetch(r.call()))  # first call: jit compiles happen here
            setup = time.perf_counter() - t0
        except Exception as e:  # a peer that fails to build is reported, not fatal
            first = str(e).splitlines()[0] if str(e) else ""
            failed[engine] = f"{type(e).__name__}: {first}"[:300]
            traceback.print_exc()
            continue
        ref = out if ref is None else ref
        diff = (
            float(np.max(np.abs(out.astype(np.float64) - ref)))
            if out.shape == ref.shape
            else float("inf")
        )
        built[engine] = (r, setup, diff)
        print(
            f"  [{threads}t {kind.value}] {engine.value}: setup {setup:.2f} s, max|diff| vs rlx {diff:.3g}",
            flush=True,
        )
    timed = interleave({e: b[0] for e, b in built.items()}, plan, rounds)
    results = []
    for engine in Engine:
        if engine in failed:
            results.append(EngineResult(engine, error=failed[engine]))
            continue
        r, setup, diff = built[engine]
        ts, cpu_ratio = timed[engine]
        results.append(EngineResult(engine, tuple(ts), setup, diff, cpu_ratio, note=r.note))
    prof = built[Engine.RLX][0].profile if Engine.RLX in built else None
    return {
        "kind": kind.value,
        "title": w.title,
        "rounds": rounds,
        "plan": asdict(plan),
        "engines": [r.to_json() for r in results],
        "rlx_profile": prof() if prof is not None else {},
    }


def _versions_and_imports(threads: int) -> tuple[dict[str, str], dict[Engine, str]]:
    """Import each peer (setting its thread count); returns versions and, per engine
    that cannot run, the reason."""
    import numpy as np

    versions = {"python": platform.python_version(), "numpy": np.__version__}
    unavailable: dict[Engine, str] = {}
    try:
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        torch.set_grad_enabled(False)
        versions["torch"] = torch.__version__
    except Exception as e:
        for n in (Engine.TORCH, Engine.TORCH_COMPILE):
            unavailable[n] = f"torch not importable: {e}"
    try:
        import onnx
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
        versions["onnx"] = onnx.__version__
    except Exception as e:
        unavailable[Engine.ORT] = f"onnx/onnxruntime not importable: {e}"
    try:
        import jax
        import jaxlib

        versions["jax"] = jax.__version__
        versions["jaxlib"] = jaxlib.__version__
        versions["jax backend"] = jax.default_backend()
    except Exception as e:
        unavailable[Engine.JAX] = f"jax not importable: {e}"
    return versions, unavailable


def child(threads: int, kinds: list[WorkloadKind], scale: float, out: Path) -> None:
    """Run every workload at ``threads`` threads and write the results as JSON."""
    from threadpoolctl import threadpool_info

    import rlx  # noqa: F401

    versions, unavailable = _versions_and_imports(threads)
    from rlx.backends.cpu import threads as rlx_threads

    rlx_threads.ensure_blas_threads(threads)
    data = {
        "threads": threads,
        "versions": versions,
        "unavailable": {e.value: why for e, why in unavailable.items()},
        "loadavg_start": os.getloadavg(),
        "workloads": [run_workload(k, threads, scale, unavailable) for k in kinds],
        # after the runs: rlx sets OMP_WAIT_POLICY when it loads its native kernels
        "env": {
            k: os.environ.get(k)
            for k in (
                "OMP_NUM_THREADS",
                "MKL_NUM_THREADS",
                "XLA_FLAGS",
                "OMP_WAIT_POLICY",
                *BLAS_ENV,
            )
        },
        "loadavg_end": os.getloadavg(),
        "blas": [
            {
                k: i.get(k)
                for k in ("filepath", "internal_api", "version", "architecture", "num_threads")
            }
            for i in threadpool_info()
            if i.get("user_api") == "blas"
        ],
    }
    out.write_text(json.dumps(data, indent=1))


# ---- parent: one child per thread count, then the report -------------------------------


def _cpu_facts() -> str:
    """lscpu's model name, cores, caches and the vector ISA flags that matter here."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    info = {k.strip(): v.strip() for k, v in info.items()}
    isa = [
        f
        for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
        + ("asimd", "asimddp", "i8mm", "bf16", "sve")  # aarch64 (lscpu prints them there too)
        if f in info.get("Flags", "").split()
    ]
    parts = [info.get("Model name", "unknown CPU")]
    parts += [
        f"{info[k]} {k.lower()}" for k in ("Core(s) per socket", "Thread(s) per core") if k in info
    ]
    parts += [f"{k} {info[k]}" for k in ("L1d cache", "L2 cache", "L3 cache") if k in info]
    return ", ".join(parts) + (f"; ISA {' '.join(isa)}" if isa else "")


def _child_env(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in BLAS_ENV}
    n = str(threads)
    env.update(
        OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, XLA_FLAGS=_xla_flags(threads)
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(wl: dict[str, Any]) -> list[str]:
    """Markdown rows for one workload at one thread count."""
    engines = wl["engines"]
    base = next(
        (e["median_ms"] for e in engines if e["name"] == Engine.RLX.value and e["times_ms"]), None
    )
    rows = [
        "| engine | median ms | ratio to rlx | p25-p75 ms | min ms | max abs diff vs rlx | cpu/wall | setup s | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for e in engines:
        if e["error"] is not None:
            rows.append(f"| {e['name']} | not run | | | | | | | {e['error']} |")
            continue
        t = sorted(e["times_ms"])
        q = statistics.quantiles(t, n=4) if len(t) >= 2 else [t[0], t[0], t[0]]
        ratio = e["median_ms"] / base if base else None
        rows.append(
            f"| {e['name']} | {e['median_ms']:.3f} | {_fmt(ratio, '.2f')} | {q[0]:.3f}-{q[2]:.3f} | {t[0]:.3f} | "
            f"{_fmt(e['max_abs_diff'], '.2e')} | {_fmt(e['cpu_ratio'], '.2f')} | {e['setup_s']:.2f} | {e['note']} |"
        )
    return rows


def profile_rows(wl: dict[str, Any]) -> list[str]:
    """The rlx (default options) kernel time per op, largest first."""
    prof = wl.get("rlx_profile") or {}
    if not prof:
        return []
    total = sum(prof.values())
    top = sorted(prof.items(), key=lambda kv: -kv[1])
    cells = "; ".join(f"{op} {ms:.3f} ms ({ms / total:.0%})" for op, ms in top[:8])
    more = f"; {len(top) - 8} more ops" if len(top) > 8 else ""
    return [
        f"rlx kernel time by op (median of 7 profiled runs, total {total:.3f} ms): {cells}{more}.",
        "",
    ]


def summary(wl: dict[str, Any]) -> str:
    """One factual sentence: the ranking by median time."""
    done = sorted((e for e in wl["engines"] if e["times_ms"]), key=lambda e: e["median_ms"])
    if not done:
        return "No engine ran."
    order = ", ".join(f"{e['name']} {e['median_ms']:.3g} ms" for e in done)
    rank = next((i + 1 for i, e in enumerate(done) if e["name"] == Engine.RLX.value), None)
    text = f"Fastest first: {order}. rlx (default options) ranks {rank} of {len(done)}."
    by_name = {e["name"]: e for e in done}
    a, b = by_name.get(Engine.RLX.value), by_name.get(Engine.RLX_NO_OPTIMIZE.value)
    if a is not None and b is not None and a["note"] == b["note"]:
        text += (
            f" Noise check: rlx and rlx optimize=False run the same compiled graph here "
            f"({a['note']}); their medians differ by a factor {b['median_ms'] / a['median_ms']:.2f}."
        )
    return text


def report(
    results: list[dict[str, Any]], command: str, started: str, removed: dict[str, str]
) -> str:
    first = results[0]
    v = first["versions"]
    lines = [
        "# rlx vs peers (PyTorch eager, torch.compile, ONNX Runtime, jax.jit)",
        "",
        f"Command: `{command}`",
        "",
        f"Date (UTC): {started}",
        "",
        "Machine and software:",
        "",
        f"- CPU (lscpu): {_cpu_facts()}; {os.cpu_count()} logical CPUs, shared with other jobs "
        "(absolute times drift 10-30 % between runs; compare ratios within one table)",
        f"- OS: {platform.platform()}",
        "- " + ", ".join(f"{k} {val}" for k, val in v.items()),
    ]
    for b in first["blas"]:
        lines.append(
            f"- BLAS loaded (threadpoolctl; rlx's matmuls go through numpy's): {b['internal_api']} {b['version']}, "
            f"kernel {b['architecture']}, {Path(b['filepath']).name}"
        )
    lines.append(
        "- OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE: "
        + (
            ", ".join(f"{k}={val} (unset for the run)" for k, val in removed.items())
            if removed
            else "not set"
        )
    )
    for r in results:
        lines.append(
            f"- {r['threads']} thread(s): env {r['env']}; load average (1, 5, 15 min) at start "
            f"{tuple(round(x, 2) for x in r['loadavg_start'])}, at end {tuple(round(x, 2) for x in r['loadavg_end'])}"
        )
    lines += ["", "Method: see the docstring of benchmarks/peers.py and benchmarks/README.md.", ""]
    for wi, wl0 in enumerate(first["workloads"]):
        lines += [f"## {wl0['title']}", ""]
        for r in results:
            wl = r["workloads"][wi]
            p = wl["plan"]
            lines += [
                f"### {r['threads']} thread(s): {wl['rounds']} interleaved rounds, {p['inner']} timed call(s) per engine per round",
                "",
                *table(wl),
                "",
                summary(wl),
                "",
                *profile_rows(wl),
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    names = [k.value for k in WorkloadKind]
    ap.add_argument("--workloads", nargs="+", default=names, choices=names)
    ap.add_argument(
        "--rounds-scale", type=float, default=1.0, help="multiply every workload's rounds"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results" / "BENCHMARKS_peers.md")
    ap.add_argument(
        "--no-spin",
        action="store_true",
        help="ask every engine's thread pool to sleep instead of spin between calls "
        "(OMP_WAIT_POLICY=PASSIVE for libgomp users, ORT session.intra_op.allow_spinning=0), "
        "so one engine's idle threads do not steal the cores of the next in a round",
    )
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child is not None:
        child(a.child, [WorkloadKind(k) for k in a.workloads], a.rounds_scale, a.json)
        return
    started = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M")
    removed = {k: os.environ[k] for k in BLAS_ENV if k in os.environ}
    prefix = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "
    command = prefix + shlex.join(
        [os.path.relpath(sys.executable, ROOT), "benchmarks/peers.py", *sys.argv[1:]]
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for t in a.threads:
            js = Path(tmp) / f"peers_{t}.json"
            cmd = [
                sys.executable,
                __file__,
                "--child",
                str(t),
                "--json",
                str(js),
                "--rounds-scale",
                str(a.rounds_scale),
            ]
            cmd += ["--workloads", *a.workloads]
            print(f"== {t} thread(s)", flush=True)
            env = _child_env(t)
            if a.no_spin:
                env.update(OMP_WAIT_POLICY="PASSIVE", RLX_BENCH_NO_SPIN="1")
            subprocess.run(cmd, env=env, check=True)
            results.append(json.loads(js.read_text()))
    text = report(results, command, started, removed)
    a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
