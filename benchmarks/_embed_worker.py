"""One engine of ``benchmarks/embed.py`` in its own process, and the ONNX preparation step.

Runs under either interpreter (the rlx venv for the rlx engines, ``--peer-python`` for the
others), so it imports only the standard library and NumPy at the top and each engine's
libraries when that engine is built.

    python _embed_worker.py prepare --model-dir DIR --work DIR
        export the transformers model to ONNX (``torch.onnx.export``, TorchScript exporter,
        eager attention so that the BERT fusions match), apply onnxruntime.transformers'
        BERT fusions, and ``quantize_dynamic`` both; writes ``prepare.json`` with the
        fusion counts.
    python _embed_worker.py serve --engine NAME --threads N --model-dir DIR --work DIR
        build engine NAME, then answer JSON-line commands on stdin (one reply per line on
        the process's original stdout; stdout itself is pointed at stderr so that a
        library's print cannot corrupt the protocol):
        {"op": "build", "shapes": ["8x128", ...]} -> runs each shape once, saves the
          output to work/out_<engine>_<shape>_<threads>t.npy;
        {"op": "time", "shape": "8x128", "inner": k} -> one untimed call, then k timed
          calls: {"ms": [..]};
        {"op": "encode_build"} -> one untimed encode of work/sentences.json (saved as
          work/enc_<engine>.npy);
        {"op": "encode"} -> {"s": seconds of one encode};
        {"op": "stats"} -> versions, BLAS/OpenMP libraries (threadpoolctl), peak RSS;
        {"op": "quit"}.

Inputs per shape are ``work/inputs_<b>x<s>.npz`` (``input_ids``, ``attention_mask``,
``token_type_ids``, i64), written by embed.py, the same arrays for every engine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common
import numpy as np

NAMES = ("input_ids", "attention_mask", "token_type_ids")
#: Engine name -> (interpreter: "rlx" or "peer", precision / kind).
ENGINES: dict[str, str] = {
    "rlx f32": "rlx",
    "rlx bf16": "rlx",
    "rlx int8": "rlx",
    "torch eager": "peer",
    "torch.compile": "peer",
    "ORT f32": "peer",
    "ORT f32 fused": "peer",
    "ORT int8": "peer",
    "ORT int8 fused": "peer",
    "jax.jit": "peer",
    "sentence-transformers": "peer",
}
ONNX_FILES = {
    "ORT f32": "model.onnx",
    "ORT f32 fused": "model_fused.onnx",
    "ORT int8": "model_int8.onnx",
    "ORT int8 fused": "model_fused_int8.onnx",
}
MAX_SEQ = 256  # sentence_bert_config.json's max_seq_length of all-MiniLM-L6-v2


def safe_name(engine: str) -> str:
    return engine.replace(" ", "_").replace(".", "_")


def load_inputs(work: Path, shape: str) -> dict[str, np.ndarray]:
    with np.load(work / f"inputs_{shape}.npz") as z:
        return {k: z[k] for k in NAMES}


# ---- model latency: a forward of the encoder (last hidden state) --------------------------

Forward = Callable[[dict[str, np.ndarray]], Callable[[], np.ndarray]]


def rlx_forward(precision: str, threads: int, model_dir: Path) -> Forward:
    """rlx.models.hf.load + HFModel.compile (int8: rlx.quantize, dynamic activations)."""
    from rlx.backends.cpu import threads as rlx_threads
    from rlx.models.hf import load

    compiled = load(model_dir, precision=precision, num_threads=threads).compile()
    rlx_threads.ensure_blas_threads(threads)
    return lambda feed: lambda: compiled.run(feed)[0]


def torch_forward(compiled: bool, model_dir: Path) -> Forward:
    """transformers AutoModel (its default attention) eager, or torch.compile'd
    (inductor, default mode, dynamic=False: one static graph per shape)."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir)).eval()
    fn: Any = torch.compile(model, dynamic=False) if compiled else model

    def make(feed: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
        t = {k: torch.from_numpy(v) for k, v in feed.items()}
        return lambda: fn(**t).last_hidden_state.numpy()

    return make


def ort_session(path: Path, threads: int) -> Any:
    """An InferenceSession on the CPU EP: ORT_ENABLE_ALL, sequential, ``threads`` intra-op."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_forward(engine: str, threads: int, work: Path) -> Forward:
    sess = ort_session(work / ONNX_FILES[engine], threads)
    names = {i.name for i in sess.get_inputs()}
    return lambda feed: lambda: sess.run(None, {k: v for k, v in feed.items() if k in names})[0]


def jax_forward(model_dir: Path) -> Forward:
    """BERT written in jax.numpy (transformers' eager computation: erf GELU, additive mask
    at the f32 minimum, post-norm) on the checkpoint's tensors, under jax.jit."""
    import jax
    import jax.numpy as jnp
    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    raw = load_file(str(model_dir / "model.safetensors"))
    w = {
        k: jnp.asarray(v.T if v.ndim == 2 and ".encoder." in f".{k}" else v)
        for k, v in raw.items()
        if v.dtype == np.float32
    }
    L, H, eps = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
    D = cfg["hidden_size"]
    hd = D // H

    def ln(x: Any, p: str) -> Any:
        mu = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + eps) * w[f"{p}.weight"] + w[f"{p}.bias"]

    def lin(x: Any, p: str) -> Any:
        return x @ w[f"{p}.weight"] + w[f"{p}.bias"]

    def f(ids: Any, mask: Any, tt: Any) -> Any:
        B, S = ids.shape
        e = "embeddings"
        x = w[f"{e}.word_embeddings.weight"][ids] + w[f"{e}.token_type_embeddings.weight"][tt]
        x = ln(x + w[f"{e}.position_embeddings.weight"][:S][None], f"{e}.LayerNorm")
        add = (1.0 - mask[:, None, None, :].astype(jnp.float32)) * jnp.finfo(jnp.float32).min
        for i in range(L):
            p = f"encoder.layer.{i}"

            def heads(n: str, x: Any = x, p: str = p) -> Any:
                return lin(x, f"{p}.attention.self.{n}").reshape(B, S, H, hd).transpose(0, 2, 1, 3)

            q, k, v = heads("query"), heads("key"), heads("value")
            s = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(hd)) + add
            a = (jax.nn.softmax(s, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(B, S, D)
            x = ln(lin(a, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
            h = jax.nn.gelu(lin(x, f"{p}.intermediate.dense"), approximate=False)
            x = ln(lin(h, f"{p}.output.dense") + x, f"{p}.output.LayerNorm")
        return x

    jf = jax.jit(f)

    def make(feed: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
        args = [jax.device_put(feed[k]) for k in NAMES]
        return lambda: np.asarray(jf(*args).block_until_ready())

    return make


def build_forward(engine: str, threads: int, model_dir: Path, work: Path) -> Forward:
    if engine.startswith("rlx "):
        return rlx_forward(engine.split()[1], threads, model_dir)
    if engine in ("torch eager", "torch.compile"):
        return torch_forward(engine == "torch.compile", model_dir)
    if engine in ONNX_FILES:
        return ort_forward(engine, threads, work)
    if engine == "jax.jit":
        return jax_forward(model_dir)
    raise ValueError(f"engine {engine!r} has no model-latency runner")


# ---- encode: texts -> normalized sentence embeddings --------------------------------------

Encode = Callable[[list[str]], np.ndarray]


def rlx_encode(precision: str, threads: int, model_dir: Path) -> Encode:
    """rlx.models.SentenceEncoder(...).encode(texts, batch_size=32)."""
    from rlx.backends.cpu import threads as rlx_threads
    from rlx.models import SentenceEncoder

    enc = SentenceEncoder(model_dir, precision=precision, num_threads=threads)
    rlx_threads.ensure_blas_threads(threads)
    return lambda texts: enc.encode(texts, batch_size=32, progress=False)


def st_encode(model_dir: Path) -> Encode:
    """sentence_transformers.SentenceTransformer(model_dir, device="cpu").encode."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir), device="cpu")
    return lambda texts: st.encode(
        texts, batch_size=32, show_progress_bar=False, convert_to_numpy=True
    )


def ort_encode(engine: str, threads: int, model_dir: Path, work: Path) -> Encode:
    """tokenizers (truncation at 256) + sort by token count (longest first) + batches of 32
    padded to their longest + ORT + mean pooling + L2 normalize, order restored."""
    from tokenizers import Tokenizer

    sess = ort_session(work / ONNX_FILES[engine], threads)
    names = {i.name for i in sess.get_inputs()}
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(MAX_SEQ)
    tok.no_padding()
    hidden = json.loads((model_dir / "config.json").read_text())["hidden_size"]

    def encode(texts: list[str]) -> np.ndarray:
        encs = tok.encode_batch(texts)
        order = np.argsort(-np.array([len(e.ids) for e in encs]), kind="stable")
        out = np.empty((len(texts), hidden), np.float32)
        for i in range(0, len(texts), 32):
            idx = order[i : i + 32]
            n = max(len(encs[j].ids) for j in idx)
            feed = {k: np.zeros((len(idx), n), np.int64) for k in NAMES}
            for r, j in enumerate(idx):
                e = encs[j]
                feed["input_ids"][r, : len(e.ids)] = e.ids
                feed["attention_mask"][r, : len(e.ids)] = 1
                feed["token_type_ids"][r, : len(e.ids)] = e.type_ids
            h = sess.run(None, {k: v for k, v in feed.items() if k in names})[0]
            m = feed["attention_mask"][:, :, None].astype(np.float32)
            pooled = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
            out[idx] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return out

    return encode


def build_encode(engine: str, threads: int, model_dir: Path, work: Path) -> Encode:
    if engine.startswith("rlx "):
        return rlx_encode(engine.split()[1], threads, model_dir)
    if engine == "sentence-transformers":
        return st_encode(model_dir)
    if engine in ONNX_FILES:
        return ort_encode(engine, threads, model_dir, work)
    raise ValueError(f"engine {engine!r} has no encode runner")


# ---- serve -------------------------------------------------------------------------------


def _set_threads(engine: str, threads: int) -> None:
    if ENGINES.get(engine) == "peer" and not engine.startswith(("ORT", "jax")):
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        torch.set_grad_enabled(False)


DISTS = (
    "numpy",
    "rlx",
    "torch",
    "transformers",
    "sentence-transformers",
    "onnxruntime",
    "onnx",
    "jax",
    "jaxlib",
    "tokenizers",
    "safetensors",
)


def versions() -> dict[str, str]:
    return _common.versions(DISTS)


def stats() -> dict[str, Any]:
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "XLA_FLAGS")}
    return _common.process_stats(DISTS) | {"env": env}


def serve(engine: str, threads: int, model_dir: Path, work: Path) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _set_threads(engine, threads)
    fwd: Forward | None = None
    calls: dict[str, Callable[[], np.ndarray]] = {}
    enc: Encode | None = None
    texts: list[str] = []
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        reply: dict[str, Any] = {"ok": True}
        try:
            if op == "build":
                t0 = time.perf_counter()
                fwd = fwd or build_forward(engine, threads, model_dir, work)
                for shape in cmd["shapes"]:
                    calls[shape] = fwd(load_inputs(work, shape))
                    out = np.asarray(calls[shape](), np.float32)
                    np.save(work / f"out_{safe_name(engine)}_{shape}_{threads}t.npy", out)
                reply["setup_s"] = time.perf_counter() - t0
            elif op == "time":
                call, ms = calls[cmd["shape"]], []
                call()
                for _ in range(cmd["inner"]):
                    t0 = time.perf_counter()
                    call()
                    ms.append((time.perf_counter() - t0) * 1e3)
                reply["ms"] = ms
            elif op == "encode_build":
                t0 = time.perf_counter()
                texts = json.loads((work / "sentences.json").read_text())
                enc = build_encode(engine, threads, model_dir, work)
                np.save(work / f"enc_{safe_name(engine)}.npy", np.asarray(enc(texts), np.float32))
                reply["setup_s"] = time.perf_counter() - t0
            elif op == "encode":
                assert enc is not None, "encode before encode_build"
                t0 = time.perf_counter()
                enc(texts)
                reply["s"] = time.perf_counter() - t0
            elif op == "stats":
                reply |= stats()
            elif op == "quit":
                proto.write(json.dumps(reply) + "\n")
                return
        except Exception as e:  # reported to the coordinator, which marks the engine not run
            import traceback

            traceback.print_exc()
            reply = {
                "ok": False,
                "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300],
            }
        proto.write(json.dumps(reply) + "\n")


# ---- prepare: the ONNX models ------------------------------------------------------------


def prepare(model_dir: Path, work: Path) -> None:
    """Export, fuse and quantize the ONNX models into ``work``; write prepare.json."""
    import torch
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer
    from transformers import AutoModel

    torch.set_grad_enabled(False)
    cfg = json.loads((model_dir / "config.json").read_text())
    # eager attention: the graph onnxruntime.transformers' BERT fusion patterns expect
    model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class Hidden(torch.nn.Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.m(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    ex = tuple(torch.ones(2, 16, dtype=torch.long) for _ in NAMES)
    t0 = time.perf_counter()
    # .eval() on the wrapper too: export restores the wrapper's training flag recursively
    torch.onnx.export(
        Hidden(model).eval(),
        ex,
        str(work / ONNX_FILES["ORT f32"]),
        dynamo=False,
        input_names=list(NAMES),
        output_names=["last_hidden_state"],
        dynamic_axes={k: {0: "batch", 1: "seq"} for k in (*NAMES, "last_hidden_state")},
        opset_version=17,
    )
    opt = optimizer.optimize_model(
        str(work / ONNX_FILES["ORT f32"]),
        model_type="bert",
        num_heads=cfg["num_attention_heads"],
        hidden_size=cfg["hidden_size"],
        opt_level=0,
    )
    fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    opt.save_model_to_file(str(work / ONNX_FILES["ORT f32 fused"]))
    for src, dst in (("ORT f32", "ORT int8"), ("ORT f32 fused", "ORT int8 fused")):
        quantize_dynamic(
            str(work / ONNX_FILES[src]),
            str(work / ONNX_FILES[dst]),
            weight_type=QuantType.QInt8,
            # the fused model's contrib ops defeat ONNX shape inference; their outputs are f32
            extra_options={"DefaultTensorType": TensorProto.FLOAT},
        )
    info = {"fused_ops": fused, "seconds": time.perf_counter() - t0, "versions": versions()}
    (work / "prepare.json").write_text(json.dumps(info))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["prepare", "serve"])
    ap.add_argument("--engine", choices=list(ENGINES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    a = ap.parse_args()
    if a.what == "prepare":
        prepare(a.model_dir, a.work)
    else:
        serve(a.engine, a.threads, a.model_dir, a.work)


if __name__ == "__main__":
    main()
