"""Native fused attention vs the BLAS attention kernel vs torch's scaled_dot_product_attention.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/attention.py \\
        [--threads 1 2] [--rounds 9] [--quick] [--cases NAME ...] [--out benchmarks/results/BENCHMARKS_attention.md]

Cases: the attention op alone at all-MiniLM-L6-v2's shapes (H=12, D=32; B x S = 1x16,
8x128, 32x128; no mask, and 8x128 with a BERT padding mask: a custom additive f32
[B,1,1,S] mask, a quarter of the keys hidden by -1e30), a long causal sequence
(B=1, S=2048, H=8, D=64) and a grouped-query decode step (one query against 2048 keys,
H=32, Hkv=8, D=128); and end to end the MiniLM-sized encoder
(``rlx.models.synthetic.encoder()``, 6 layers, hidden 384; its spelled-out attention
fuses into ``attention`` nodes) at 1x16, 8x128 and 32x128 (rlx engines only).

Engines, each in its own process (one per engine and thread count), all alive during the
run: ``native`` (rlx, the default kernels: the native fused attention), ``blas`` (rlx with
the native attention declined, so the BLAS kernel with its native softmax runs: the
kernel before it), ``torch`` (``torch.nn.functional.scaled_dot_product_attention`` on
[B,H,S,D] views, GQA-free; run by /tmp/rlx/peers/bin/python or ``--torch-python``).
Workers get OMP_NUM_THREADS / MKL_NUM_THREADS / OPENBLAS_NUM_THREADS = the thread count;
torch.set_num_threads and rlx's ``num_threads`` too. The parent interleaves rounds: each
round asks every engine in turn (the starting engine rotates) for one untimed call and
``inner`` timed calls; the figure is the median over rounds of the per-call time, and
ratios are from the same run. Outputs are checked against the native engine's (max abs
difference over the non-NaN entries). CPU flags, the native target and each worker's
BLAS (threadpoolctl) are recorded.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PEERS_PY = "/tmp/rlx/peers/bin/python"
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

# name -> (kind, B, Sq, Skv, H, Hkv, D, mask)
CASES: dict[str, tuple[str, int, int, int, int, int, int, str]] = {
    "att 1x16": ("op", 1, 16, 16, 12, 12, 32, "none"),
    "att 8x128": ("op", 8, 128, 128, 12, 12, 32, "none"),
    "att 8x128 padding mask": ("op", 8, 128, 128, 12, 12, 32, "padding"),
    "att 32x128": ("op", 32, 128, 128, 12, 12, 32, "none"),
    "att 1x2048 causal H8 D64": ("op", 1, 2048, 2048, 8, 8, 64, "causal"),
    "decode 1 of 2048 H32 Hkv8 D128": ("op", 1, 1, 2048, 32, 8, 128, "none"),
    "encoder 1x16": ("encoder", 1, 16, 16, 12, 12, 32, "none"),
    "encoder 8x128": ("encoder", 8, 128, 128, 12, 12, 32, "none"),
    "encoder 32x128": ("encoder", 32, 128, 128, 12, 12, 32, "none"),
}
QUICK = ("att 1x16", "att 8x128", "encoder 8x128")


def _inputs(b: int, sq: int, skv: int, h: int, hkv: int, d: int, mask: str) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = {"q": rng.standard_normal((b, sq, h * d), dtype=np.float32)}
    x |= {n: rng.standard_normal((b, skv, hkv * d), dtype=np.float32) for n in "kv"}
    if mask == "padding":
        keep = np.ones((b, 1, 1, skv), np.float32)
        keep[..., skv - skv // 4 :] = 0.0
        x["m"] = (keep - 1.0) * np.float32(1e30)
    return x


# ---- workers -----------------------------------------------------------------------------


def _rlx_runner(engine: str, case: str, threads: int) -> tuple[Any, Any]:
    import rlx
    from rlx.backends.cpu.kernels import KernelCtx, ScratchPool, load_kernels
    from rlx.backends.cpu.kernels import nn as knn
    from rlx.models import synthetic
    from rlx.ops.nn import MaskKind
    from rlx.options import CompileOptions

    load_kernels()
    kind, b, s, skv, h, hkv, d, mask = CASES[case]
    if kind == "encoder":
        if engine == "blas":
            knn.native_attention = lambda *a: None  # the kernel as it was before
        g = synthetic.encoder(seq=rlx.sym("seq"), batch=rlx.sym("batch"))
        opts = CompileOptions(num_threads=threads)
        cg = rlx.Session("cpu").compile(g, opts, params=synthetic.random_params(g, 0))
        x = np.random.default_rng(0).standard_normal((b, s, 384), dtype=np.float32)
        notes = [r.notes for r in cg.report().kernels if r.op == "attention"]
        return (lambda: cg.run({"x": x})[0]), notes
    # the op alone: its kernel closure, made by the factory as the executor makes it
    g = rlx.Graph("att")
    q = g.input("q", (b, s, h * d))
    k, v = (g.input(n, (b, skv, hkv * d)) for n in "kv")
    kw: dict[str, Any] = {"mask": MaskKind.causal()} if mask == "causal" else {}
    if mask == "padding":
        kw["mask_input"] = g.input("m", (b, 1, 1, skv))
    g.set_outputs([g.attention(q, k, v, h, d, num_kv_heads=hkv, **kw)])
    node = g.nodes[g.outputs[0]]
    feed = _inputs(b, s, skv, h, hkv, d, mask)
    arrays = [feed[n] for n in ("q", "k", "v", "m") if n in feed]
    out = np.empty((b, s, h * d), np.float32)
    ctx = KernelCtx(node, g, {}, {}, {}, ScratchPool(), num_threads=threads)
    factory = knn.native_attention if engine == "native" else knn.blas_attention
    fn = factory(node, arrays, out, ctx)
    assert fn is not None, ctx.notes

    def run() -> np.ndarray:
        fn()
        return out

    return run, [ctx.kind.value, *ctx.notes]


def _torch_runner(case: str, threads: int) -> tuple[Any, Any]:
    import torch

    torch.set_num_threads(threads)
    _, b, s, skv, h, hkv, d, mask = CASES[case]
    x = {n: torch.from_numpy(a) for n, a in _inputs(b, s, skv, h, hkv, d, mask).items()}
    qh = x["q"].view(b, s, h, d).transpose(1, 2)
    kh, vh = (x[n].view(b, skv, hkv, d).transpose(1, 2) for n in "kv")
    m = x.get("m")
    causal = mask == "causal"  # only with Sq == Skv (torch aligns it to the top left)

    def run() -> Any:
        with torch.inference_mode():
            o = torch.nn.functional.scaled_dot_product_attention(
                qh, kh, vh, attn_mask=m, is_causal=causal, enable_gqa=hkv != h
            )
            return o.transpose(1, 2).reshape(b, s, h * d).numpy()

    return run, [f"torch {torch.__version__}"]


def worker(engine: str, threads: int) -> None:
    """Serve JSON requests on stdin: {"case", "inner", "save"?} -> {"t", "cpu"} per call."""
    runners: dict[str, Any] = {}
    out = sys.stdout
    sys.stdout = sys.stderr  # only the protocol on the real stdout
    facts: dict[str, Any] = {"engine": engine, "threads": threads}
    for line in sys.stdin:
        req = json.loads(line)
        case = req["case"]
        if case not in runners:
            if engine == "torch":
                runners[case] = _torch_runner(case, threads)
            else:
                runners[case] = _rlx_runner(engine, case, threads)
        fn, notes = runners[case]
        y = fn()
        if req.get("save"):
            np.save(req["save"], np.asarray(y, dtype=np.float32))
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(req["inner"]):
            fn()
        n = req["inner"]
        rep = {"t": (time.perf_counter() - t0) / n, "cpu": (time.process_time() - c0) / n}
        if req.get("facts"):
            from threadpoolctl import threadpool_info

            facts["blas"] = [
                {k: i.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
                for i in threadpool_info()
                if i.get("user_api") == "blas"
            ]
            facts["notes"] = notes
            if engine != "torch":
                from rlx.backends.cpu import native

                facts["target"] = native.target_description()
            rep["facts"] = facts
        out.write(json.dumps(rep) + "\n")
        out.flush()


# ---- parent ------------------------------------------------------------------------------


class Worker:
    def __init__(self, engine: str, threads: int, torch_python: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in BLAS_ENV}
        n = str(threads)
        env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
        py = torch_python if engine == "torch" else sys.executable
        cmd = [py, str(Path(__file__).resolve()), "--worker", engine, n]
        self.p = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )

    def ask(self, **req: Any) -> dict[str, Any]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.p.args} died")
        return json.loads(line)

    def close(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.close()
        self.p.wait(timeout=60)


def _cpu_facts() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    info = {
        k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in out.splitlines() if ":" in ln)
    }
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile",
                       "asimd", "asimddp", "i8mm", "bf16", "sve")
           if f in info.get("Flags", "").split()]  # fmt: skip
    caches = [f"{k} {info[k]}" for k in ("L1d cache", "L2 cache", "L3 cache") if k in info]
    return ", ".join([info.get("Model name", "?"), f"{os.cpu_count()} CPUs", *caches]) + (
        f"; ISA {' '.join(isa)}"
    )


def _table(
    threads: int, rows: list[tuple[str, dict[str, tuple[float, float, float]], dict[str, float]]]
) -> list[str]:
    """Markdown rows: per engine the median and best wall ms and the median process CPU
    ms per call; ratios (engine / native) of the medians, wall and CPU."""
    out = ["", f"## {threads} thread{'s' if threads > 1 else ''}", ""]
    out += [
        "| case | native ms (best; cpu) | blas ms (best; cpu) | torch ms (best; cpu) "
        "| blas / native wall, cpu | torch / native wall, cpu | max\\|diff\\| blas, torch |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for case, st, dmax in rows:

        def cell(e: str, st: dict[str, tuple[float, float, float]] = st) -> str:
            if e not in st:
                return "-"
            w, b, c = st[e]
            return f"{w * 1e3:.3f} ({b * 1e3:.3f}; {c * 1e3:.3f})"

        def ratio(e: str, st: dict[str, tuple[float, float, float]] = st) -> str:
            nat = st["native"]
            if e not in st:
                return "-"
            return f"{st[e][0] / nat[0]:.2f}, {st[e][2] / nat[2]:.2f}"

        diffs = ", ".join(f"{dmax[e]:.1e}" if e in dmax else "-" for e in ("blas", "torch"))
        out.append(
            f"| {case} | {cell('native')} | {cell('blas')} | {cell('torch')} | "
            f"{ratio('blas')} | {ratio('torch')} | {diffs} |"
        )
    return out


def _inner(case: str) -> int:
    kind, b, s, skv, h, _, d, _ = CASES[case]
    flops = 4 * b * h * s * skv * d * (24 if kind == "encoder" else 1)
    return max(1, min(200, int(3e8 / flops)))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="three cases, 3 rounds")
    ap.add_argument("--cases", nargs="+", choices=list(CASES), help="a subset of the cases")
    ap.add_argument("--torch-python", default=PEERS_PY)
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results" / "BENCHMARKS_attention.md"
    )
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.worker[0], int(a.worker[1]))
        return
    cases = a.cases or list(QUICK if a.quick else CASES)
    rounds = 3 if a.quick else a.rounds
    has_torch = Path(a.torch_python).exists()
    lines = [
        "# Native attention vs BLAS attention vs torch SDPA",
        "",
        f"`{' '.join(['env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE', '.venv/bin/python', 'benchmarks/attention.py', *sys.argv[1:]])}`",
        f"run {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, load average at start "
        f"{os.getloadavg()[0]:.1f}; CPU: {_cpu_facts()}",
        "",
        "Median over rounds of wall ms per call (each engine its own process, rounds "
        "interleaved), the best round in brackets with the median process CPU ms per call "
        "(at 1 thread a figure the other jobs of a shared machine disturb less); ratio = "
        "engine / native of the medians, wall and CPU (> 1: native faster). max|diff|: "
        "against native's output (non-NaN entries).",
    ]
    facts: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for threads in a.threads:
            engines = ["native", "blas"] + (["torch"] if has_torch else [])
            workers = {e: Worker(e, threads, a.torch_python) for e in engines}
            rows = []
            told: set[str] = set()
            try:
                for case in cases:
                    es = [e for e in engines if not (e == "torch" and CASES[case][0] == "encoder")]
                    diffs = {}
                    for e in es:
                        path = str(Path(tmp, f"{e}-{threads}-{len(rows)}.npy"))
                        r = workers[e].ask(case=case, inner=1, save=path, facts=e not in told)
                        told.add(e)
                        if "facts" in r:
                            facts.append(r["facts"])
                        diffs[e] = path
                    ref = np.load(diffs["native"])
                    dmax = {}
                    for e in es:
                        y = np.load(diffs[e])
                        ok = ~(np.isnan(ref) | np.isnan(y))
                        dmax[e] = float(np.max(np.abs(y[ok] - ref[ok]), initial=0.0))
                    times: dict[str, list[float]] = {e: [] for e in es}
                    cpu: dict[str, list[float]] = {e: [] for e in es}
                    for rnd in range(rounds):
                        for i in range(len(es)):
                            e = es[(rnd + i) % len(es)]
                            r = workers[e].ask(case=case, inner=_inner(case))
                            times[e].append(r["t"])
                            cpu[e].append(r["cpu"])
                    med = {e: statistics.median(times[e]) for e in es}
                    stats = {e: (med[e], min(times[e]), statistics.median(cpu[e])) for e in es}
                    rows.append((case, stats, dmax))
                    print(
                        f"[{threads} thr] {case}: "
                        + ", ".join(f"{e} {med[e] * 1e3:.3f} ms" for e in es),
                        file=sys.stderr,
                    )
            finally:
                for w in workers.values():
                    w.close()
            lines += _table(threads, rows)
    lines += ["", "## Workers", ""]
    for f in facts:
        lines.append(f"- {f['engine']} ({f['threads']} thr): BLAS {f.get('blas')}; "
                     f"attention notes {f.get('notes')}; {f.get('target', '')}")  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    a.out.write_text(text)


if __name__ == "__main__":
    main()
